//! Checks that a client hears of each sensor's connection in the order it was made,
//! whichever lanes carry it, and nothing twice or stale (issue #68): a site's event and a
//! sensor's own wait for each other's older notifications, a dead letter sent again drops
//! what a newer one told, a client told at a silence's end is not owed again.

use super::silences::RULES;
use super::site_edges::{fill, kinds, move_to, told};
use super::*;
use crate::domain::silence::Match;

/// Claims notification `id` for node `n1` at `now`.
async fn claim_one(s: &Subject, id: &str, now: Millis) -> Claim {
    s.claim(vec![id.to_string()], "n1".into(), now, now + 20_000, None)
        .await
        .unwrap()
        .remove(0)
}

/// Records one attempt of `id` for `client` at `now` with `verdict`.
async fn record_one(s: &Subject, id: &str, client: &str, verdict: Verdict, now: Millis) {
    s.record(
        vec![Outcome {
            notification_id: id.to_string(),
            client_id: client.into(),
            attempt: Some(Attempt {
                notification_id: id.to_string(),
                at: now,
                status_code: Some(if verdict == Verdict::Delivered {
                    200
                } else {
                    500
                }),
                error: None,
                duration_ms: 3,
            }),
            attempts: 1,
            verdict,
            node: "n1".into(),
            batch_id: None,
        }],
        now,
        NEVER,
    )
    .await
    .unwrap();
}

/// A site's event waits for an older notification about the connection of a sensor it
/// names, still pending in that sensor's own lane: a client hears of each sensor's
/// connection in the order it was made (simulation seed 2125: a reminder held up in its
/// lane reached the client after the site's return had named the sensor back).
pub(super) async fn a_site_event_waits_for_an_older_own_event_of_a_sensor_it_names(s: &Subject) {
    fill(s, "ow", &["ow1", "ow2", "ow3", "ow4", "ow5"], "owc").await;
    s.create_sensor(sensor("ow6")).await.unwrap();
    s.link("owc".into(), sid("ow6"), 1).await.unwrap();
    // ow6, in no site, is lost: its own loss, pending.
    let own = s
        .commit(liveness("ow6", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    assert_eq!(
        kinds(&own),
        [("owc".into(), sid("ow6"), EventKind::ConnectionLost)]
    );
    // It joins the site lost, two more go quiet: the site goes down naming all three.
    move_to(s, "ow6", Some("ow"), 6_000).await;
    for id in ["ow1", "ow2"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 6_000), 6_000)
            .await
            .unwrap();
    }
    let loss = s.decide_sites(RULES, 40_000).await.unwrap().made;
    assert_eq!(
        kinds(&loss),
        [("owc".into(), sid("ow1"), EventKind::SiteConnectionLost)]
    );
    assert!(
        matches!(claim_one(s, &loss[0].id, 41_000).await, Claim::Later { .. }),
        "the site's loss waits for ow6's own, older"
    );
    let Claim::Send(_) = claim_one(s, &own[0].id, 41_000).await else {
        panic!("ow6's own loss goes first");
    };
    assert!(
        matches!(claim_one(s, &loss[0].id, 41_100).await, Claim::Later { .. }),
        "and while it is in flight"
    );
    record_one(s, &own[0].id, "owc", Verdict::Delivered, 41_200).await;
    assert!(
        matches!(claim_one(s, &loss[0].id, 41_300).await, Claim::Send(_)),
        "then the site's loss"
    );
}

/// A dead letter sent again after a newer notification about the same sensor's
/// connection reached the client says no more what is so: a sensor's own is superseded,
/// and a site's event goes without the sensors a newer one told of (simulation seed
/// 1684: a site's return replayed after the sensor's own return listed it still lost).
pub(super) async fn a_replayed_dead_letter_tells_nothing_a_newer_one_overtook(s: &Subject) {
    // A sensor's own: its loss failed; it joins a site whose loss, naming it, is
    // delivered; the own loss replayed is stale.
    s.create_client(client("rpc", "http://r/")).await.unwrap();
    s.create_sensor(sensor("rpx")).await.unwrap();
    s.link("rpc".into(), sid("rpx"), 1).await.unwrap();
    let lost = s
        .commit(liveness("rpx", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    let Claim::Send(_) = claim_one(s, &lost[0].id, 5_100).await else {
        panic!("the loss goes out");
    };
    record_one(s, &lost[0].id, "rpc", Verdict::Failed, 5_200).await;
    fill(s, "rq", &["rq1", "rq2", "rq3", "rq4"], "rpc").await;
    move_to(s, "rpx", Some("rq"), 6_000).await;
    for id in ["rq1", "rq2"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 6_000), 6_000)
            .await
            .unwrap();
    }
    let site_loss = s.decide_sites(RULES, 40_000).await.unwrap().made;
    assert_eq!(site_loss.len(), 1, "{site_loss:?}");
    let Claim::Send(_) = claim_one(s, &site_loss[0].id, 40_100).await else {
        panic!("the site's loss goes out: the own loss is a dead letter");
    };
    record_one(s, &site_loss[0].id, "rpc", Verdict::Delivered, 40_200).await;
    s.retry_notification(lost[0].id.clone(), 40_300)
        .await
        .unwrap();
    assert!(
        matches!(
            claim_one(s, &lost[0].id, 40_400).await,
            Claim::Done {
                status: Status::Superseded,
                ..
            }
        ),
        "the site's loss told the client of it since"
    );

    // A site's: its return names rp2 still lost; it fails; rp2's own return is
    // delivered; the site's return replayed names rp3 alone still lost.
    fill(s, "rp", &["rp1", "rp2", "rp3", "rp4", "rp5"], "rpc").await;
    for id in ["rp1", "rp2", "rp3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 10_000), 10_000)
            .await
            .unwrap();
    }
    let loss = s.decide_sites(RULES, 81_000).await.unwrap().made;
    assert_eq!(loss.len(), 1, "{loss:?}");
    let Claim::Send(_) = claim_one(s, &loss[0].id, 81_100).await else {
        panic!("the site's loss goes out");
    };
    record_one(s, &loss[0].id, "rpc", Verdict::Delivered, 81_200).await;
    s.commit(
        liveness("rp1", EventKind::ConnectionRestored, 82_000),
        82_000,
    )
    .await
    .unwrap();
    let up = s.decide_sites(RULES, 83_000).await.unwrap().made;
    assert_eq!(
        kinds(&up),
        [("rpc".into(), sid("rp1"), EventKind::SiteConnectionRestored)]
    );
    let Claim::Send(_) = claim_one(s, &up[0].id, 83_100).await else {
        panic!("the site's return goes out");
    };
    record_one(s, &up[0].id, "rpc", Verdict::Failed, 83_200).await;
    let own = s
        .commit(
            liveness("rp2", EventKind::ConnectionRestored, 84_000),
            84_000,
        )
        .await
        .unwrap();
    let Claim::Send(_) = claim_one(s, &own[0].id, 84_100).await else {
        panic!("rp2's return goes out: the site's return is a dead letter");
    };
    record_one(s, &own[0].id, "rpc", Verdict::Delivered, 84_200).await;
    s.retry_notification(up[0].id.clone(), 85_000)
        .await
        .unwrap();
    let Claim::Send(sent) = claim_one(s, &up[0].id, 85_100).await else {
        panic!("the site's return goes out again");
    };
    let ids = |body: &str, list: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect()
    };
    let body = sent.notification.body.clone().unwrap();
    assert_eq!(ids(&body, "restored"), ["rp1"]);
    assert_eq!(
        ids(&body, "still_lost"),
        ["rp3"],
        "rp2's own return told it back"
    );
    let (stored, _) = s.get_notification(up[0].id.clone()).await.unwrap().unwrap();
    assert_eq!(
        stored.body.as_deref(),
        Some(body.as_str()),
        "what was sent is kept"
    );
}

/// A client a silence's end told of a site's loss (`site::retell`) had, before, the
/// returns the site released to it as the sensors' own; a sensor that then leaves the
/// site does not give it its return again (simulation seed 2189).
pub(super) async fn a_sensor_leaving_gives_a_retold_client_nothing_twice(s: &Subject) {
    let ids = ["rt1", "rt2", "rt3", "rt4", "rt5", "rt6"];
    fill(s, "rt", &ids, "rtc").await;
    fill(s, "rt", &[], "rtk").await;
    for x in ids {
        s.link("rtk".into(), sid(x), 1).await.unwrap();
    }
    let kept = Match {
        client_id: Some("rtk".into()),
        ..Match::default()
    };
    s.create_silence(super::silences::silence("rts", kept, 1_000, 37_000))
        .await
        .unwrap();
    for x in ["rt1", "rt2", "rt3", "rt4"] {
        s.commit(liveness(x, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    let down = s.decide_sites(RULES, 36_000).await.unwrap().made;
    assert_eq!(
        kinds(&down),
        [("rtc".into(), sid("rt1"), EventKind::SiteConnectionLost)],
        "kept from rtk"
    );
    // The silence over, rt2 is back: held for rtc, released to rtk as its own.
    s.commit(
        liveness("rt2", EventKind::ConnectionRestored, 38_000),
        38_000,
    )
    .await
    .unwrap();
    let released = s.decide_sites(RULES, 39_000).await.unwrap().made;
    assert_eq!(
        kinds(&released),
        [("rtk".into(), sid("rt2"), EventKind::ConnectionRestored)]
    );
    // The silence's end: rtk is told the site's loss, of what is still lost.
    let retold = s.reconcile_silences(37_000, 45_000).await.unwrap();
    assert_eq!(
        kinds(&retold),
        [("rtk".into(), sid("rt1"), EventKind::SiteConnectionLost)]
    );
    // rt2 moves away: its return is owed to rtc alone.
    let made = move_to(s, "rt2", None, 46_000).await;
    assert_eq!(
        kinds(&made),
        [("rtc".into(), sid("rt2"), EventKind::ConnectionRestored)],
        "rtk had it"
    );
    let returns = told(s, "rtk", "rt2").await;
    assert_eq!(
        returns
            .iter()
            .filter(|k| **k == EventKind::ConnectionRestored)
            .count(),
        1,
        "once: {returns:?}"
    );
}
