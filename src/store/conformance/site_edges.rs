//! Checks of sites at their edges (issue #68): a sensor moved or deleted, a site deleted,
//! while the site holds its events or its loss named it; many sites down at once; a
//! subscription changed while a site is down.

use super::silences::{RULES, site};
use super::*;
use crate::domain::site::decide::Rules;

/// Sensors `ids` in site `site`, each linked to `client` (both made when missing).
pub(super) async fn fill(s: &Subject, site_id: &str, ids: &[&str], client_id: &str) {
    if s.get_site(site_id.into()).await.unwrap().is_none() {
        s.create_site(site(site_id, None)).await.unwrap();
    }
    if s.get_client(client_id.into()).await.unwrap().is_none() {
        s.create_client(client(client_id, "http://r/"))
            .await
            .unwrap();
    }
    for id in ids {
        s.create_sensor(Sensor {
            site_id: Some(site_id.into()),
            ..sensor(id)
        })
        .await
        .unwrap();
        s.link(client_id.into(), sid(id), 1).await.unwrap();
    }
}

/// Moves `id` to `to` (its address as `sensor` gives it) at `now`; answers what it made.
pub(super) async fn move_to(
    s: &Subject,
    id: &str,
    to: Option<&str>,
    now: Millis,
) -> Vec<NotificationRef> {
    let (view, made) = s
        .replace_sensor(
            sid(id),
            format!("address of {id}"),
            None,
            None,
            to.map(str::to_string),
            Default::default(),
            now,
        )
        .await
        .unwrap()
        .expect("the sensor exists");
    assert_eq!(view.0.site_id.as_deref(), to);
    made
}

pub(super) fn kinds(made: &[NotificationRef]) -> Vec<(String, SensorId, EventKind)> {
    made.iter()
        .map(|n| (n.client_id.clone(), n.sensor_id, n.kind))
        .collect()
}

/// Every notification of `client` for `sensor`, oldest first, by kind.
pub(super) async fn told(s: &Subject, client_id: &str, sensor_id: &str) -> Vec<EventKind> {
    let f = NotificationFilter {
        client_id: Some(client_id.into()),
        sensor_id: Some(sid(sensor_id)),
        ..Default::default()
    };
    let mut items = s.list_notifications(f, page(100)).await.unwrap().items;
    items.sort_by_key(|n| n.seq);
    items.into_iter().map(|n| n.kind).collect()
}

/// A loss held in a site's grace goes with its sensor: moved to no site, it is made at
/// once; moved to another site up, that site's grace holds it and its decision tells it.
pub(super) async fn a_moved_sensor_takes_its_held_loss_along(s: &Subject) {
    fill(s, "mv-a", &["ma1", "ma2", "ma3", "ma4"], "mc1").await;
    fill(s, "mv-b", &["mb1", "mb2", "mb3", "mb4"], "mc1").await;
    for id in ["ma1", "ma2"] {
        let made = s
            .commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
        assert!(made.is_empty(), "held for the grace");
    }
    let made = move_to(s, "ma1", None, 10_000).await;
    assert_eq!(
        kinds(&made),
        [("mc1".into(), sid("ma1"), EventKind::ConnectionLost)],
        "in no site now: its loss is told as its own"
    );
    let made = move_to(s, "ma2", Some("mv-b"), 11_000).await;
    assert!(made.is_empty(), "held again, for mv-b's grace: {made:?}");
    // mv-a's grace ends with nothing of it left; mv-b's, begun by the move, tells ma2's
    // loss once.
    let decided = s.decide_sites(RULES, 36_000).await.unwrap();
    assert!(decided.made.is_empty(), "{:?}", decided.made);
    let decided = s.decide_sites(RULES, 41_000).await.unwrap();
    assert_eq!(
        kinds(&decided.made),
        [("mc1".into(), sid("ma2"), EventKind::ConnectionLost)]
    );
    assert!(decided.changed.is_empty(), "neither site is down");
    assert_eq!(told(s, "mc1", "ma1").await, [EventKind::ConnectionLost]);
    assert_eq!(told(s, "mc1", "ma2").await, [EventKind::ConnectionLost]);
    assert_eq!(s.site_totals().await.unwrap().held, 0);
}

/// A site deleted in its grace tells the losses it held as the sensors' own; one deleted
/// while down owes the clients its loss told what it held back from them.
pub(super) async fn a_deleted_site_tells_what_it_held(s: &Subject) {
    fill(s, "dl-a", &["la1", "la2", "la3", "la4"], "lc1").await;
    s.commit(liveness("la1", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    let made = s
        .delete_site("dl-a".into(), 9_000)
        .await
        .unwrap()
        .expect("the site was there");
    assert_eq!(
        kinds(&made),
        [("lc1".into(), sid("la1"), EventKind::ConnectionLost)]
    );
    // A site down: its loss told lc2 of lb1..lb3; lb1 comes back (held for the site's
    // return), then the site is deleted.
    fill(s, "dl-b", &["lb1", "lb2", "lb3", "lb4"], "lc2").await;
    for id in ["lb1", "lb2", "lb3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 20_000), 20_000)
            .await
            .unwrap();
    }
    let down = s.decide_sites(RULES, 51_000).await.unwrap();
    assert_eq!(down.changed.len(), 1);
    let made = s
        .commit(
            liveness("lb1", EventKind::ConnectionRestored, 60_000),
            60_000,
        )
        .await
        .unwrap();
    assert!(made.is_empty(), "held for the site's return");
    let made = s
        .delete_site("dl-b".into(), 61_000)
        .await
        .unwrap()
        .expect("the site was there");
    assert_eq!(
        kinds(&made),
        [("lc2".into(), sid("lb1"), EventKind::ConnectionRestored)],
        "lb1's return, which the site's would have told"
    );
    // In no site now, the others' returns go out as their own.
    let made = s
        .commit(
            liveness("lb2", EventKind::ConnectionRestored, 70_000),
            70_000,
        )
        .await
        .unwrap();
    assert_eq!(kinds(&made).len(), 1);
    assert_eq!(s.site_totals().await.unwrap().down, 0);
}

/// A site down whose named sensors are deleted or moved away is decided again: it comes
/// back, telling the clients its loss told.
pub(super) async fn a_site_whose_lost_sensors_leave_comes_back(s: &Subject) {
    fill(s, "gn-a", &["ga1", "ga2", "ga3", "ga4", "ga5"], "gc1").await;
    for id in ["ga1", "ga2", "ga3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    assert_eq!(
        s.decide_sites(RULES, 36_000).await.unwrap().changed.len(),
        1
    );
    assert!(s.delete_sensor(sid("ga1"), 40_000).await.unwrap());
    assert!(move_to(s, "ga2", None, 41_000).await.is_empty());
    // One of three left is lost: below the minimum of 3.
    let decided = s.decide_sites(RULES, 42_000).await.unwrap();
    let changed: Vec<(&str, EventKind)> = decided
        .changed
        .iter()
        .map(|e| (e.site_id.as_str(), e.kind))
        .collect();
    assert_eq!(changed, [("gn-a", EventKind::SiteConnectionRestored)]);
    assert_eq!(
        kinds(&decided.made),
        [("gc1".into(), sid("ga3"), EventKind::SiteConnectionRestored)]
    );
    let (n, _) = s
        .get_notification(decided.made[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    let body: serde_json::Value = serde_json::from_str(n.body.as_deref().unwrap()).unwrap();
    assert_eq!(body["still_lost"][0]["id"], "ga3", "{body}");
    assert_eq!(body["still_lost"].as_array().unwrap().len(), 1, "{body}");
    let (_, counts) = s.get_site("gn-a".into()).await.unwrap().unwrap();
    assert!(!counts.down);
    assert_eq!(s.site_totals().await.unwrap().down, 0);
}

/// More sites down than a round's call decides on the embedded store (500), each with a
/// return held that leaves it down: every one is decided (its hold released), and then a
/// site past the first 500 still comes back.
pub(super) async fn many_sites_down_starve_none(s: &Subject) {
    let rules = Rules {
        min_sensors: 1,
        ..RULES
    };
    let n = 520;
    s.create_client(client("sc1", "http://r/")).await.unwrap();
    let (mut losses, mut returns) = (CommitBatch::default(), CommitBatch::default());
    for i in 0..n {
        let site_id = format!("sd-{i:03}");
        s.create_site(site(&site_id, None)).await.unwrap();
        for half in ["a", "b"] {
            let id = format!("sd{i:03}{half}");
            s.create_sensor(Sensor {
                site_id: Some(site_id.clone()),
                ..sensor(&id)
            })
            .await
            .unwrap();
            s.link("sc1".into(), sid(&id), 1).await.unwrap();
            let one = liveness(&id, EventKind::ConnectionLost, 5_000);
            losses.states.extend(one.states);
            losses.events.extend(one.events);
            if half == "a" {
                let one = liveness(&id, EventKind::ConnectionRestored, 40_000);
                returns.states.extend(one.states);
                returns.events.extend(one.events);
            }
        }
    }
    let round = async |at: Millis| {
        let mut all = Decided::default();
        for _ in 0..4 {
            let d = s.decide_sites(rules, at).await.unwrap();
            all.changed.extend(d.changed);
            all.made.extend(d.made);
            if !d.more {
                return all;
            }
        }
        panic!("a round's four calls left sites due");
    };
    s.commit(losses, 5_000).await.unwrap();
    assert_eq!(round(36_000).await.changed.len(), n, "every site down");
    // Half of each site back: still down (ratio 0.5), each return held for the site's.
    assert!(s.commit(returns, 40_000).await.unwrap().is_empty());
    assert!(round(41_000).await.is_empty(), "nothing new for sc1 yet");
    assert!(
        round(42_000).await.is_empty() && !s.decide_sites(rules, 42_000).await.unwrap().more,
        "none due any more"
    );
    let last = format!("sd{:03}b", n - 1);
    s.commit(
        liveness(&last, EventKind::ConnectionRestored, 50_000),
        50_000,
    )
    .await
    .unwrap();
    let d = s.decide_sites(rules, 51_000).await.unwrap();
    let changed: Vec<(&str, EventKind)> = d
        .changed
        .iter()
        .map(|e| (e.site_id.as_str(), e.kind))
        .collect();
    assert_eq!(
        changed,
        [(
            format!("sd-{:03}", n - 1).as_str(),
            EventKind::SiteConnectionRestored
        )],
        "decided though {} sites down sort before it",
        n - 1
    );
    assert_eq!(s.site_totals().await.unwrap().down as usize, n - 1);
}

/// A client the site's loss told stops taking site events while the site stays down: the
/// returns held back from it go out as the sensors' own at the next round, not at the
/// site's return.
pub(super) async fn a_subscription_changed_while_down_releases_at_once(s: &Subject) {
    fill(s, "sb-a", &["sa1", "sa2", "sa3", "sa4"], "bc1").await;
    for id in ["sa1", "sa2", "sa3", "sa4"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    assert_eq!(
        s.decide_sites(RULES, 36_000).await.unwrap().changed.len(),
        1
    );
    s.commit(
        liveness("sa1", EventKind::ConnectionRestored, 40_000),
        40_000,
    )
    .await
    .unwrap();
    assert!(
        s.decide_sites(RULES, 41_000).await.unwrap().is_empty(),
        "still down; bc1 waits for the site's return"
    );
    let mut c = s.get_client("bc1".into()).await.unwrap().unwrap();
    c.events = Some(vec![
        "sensor.connection_lost".into(),
        "sensor.connection_restored".into(),
    ]);
    assert!(s.replace_client(c).await.unwrap());
    let d = s.decide_sites(RULES, 42_000).await.unwrap();
    assert_eq!(
        kinds(&d.made),
        [("bc1".into(), sid("sa1"), EventKind::ConnectionRestored)]
    );
    assert!(s.decide_sites(RULES, 43_000).await.unwrap().is_empty());
}

/// The owner's decision (issue #68): a site's event still waiting when a newer one of the
/// same site is made for the client is superseded at its claim — the client hears the
/// site as it is now — while another site's event is not.
pub(super) async fn a_newer_site_event_supersedes_one_waiting(s: &Subject) {
    fill(s, "sp-a", &["sp1", "sp2", "sp3", "sp4", "sp5"], "spc").await;
    fill(s, "sp-b", &["sq1", "sq2", "sq3", "sq4", "sq5"], "spc").await;
    for id in ["sp1", "sp2", "sp3", "sq1", "sq2", "sq3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    let losses = s.decide_sites(RULES, 36_000).await.unwrap().made;
    assert_eq!(losses.len(), 2, "{losses:?}");
    // sp1 comes back: sp-a is up again (two of five lost, under the minimum of three).
    s.commit(
        liveness("sp1", EventKind::ConnectionRestored, 40_000),
        40_000,
    )
    .await
    .unwrap();
    let back = s.decide_sites(RULES, 41_000).await.unwrap().made;
    assert_eq!(
        kinds(&back),
        [("spc".into(), sid("sp1"), EventKind::SiteConnectionRestored)]
    );
    let of = |site: &str| {
        let first = if site == "sp-a" { "sp" } else { "sq" };
        losses
            .iter()
            .find(|n| n.sensor_id.to_string().starts_with(first))
            .expect("a loss per site")
            .id
            .clone()
    };
    let claim = |id: String| async move {
        s.claim(vec![id], "n1".into(), 42_000, 60_000, None)
            .await
            .unwrap()
            .remove(0)
    };
    match claim(of("sp-a")).await {
        Claim::Done { status, .. } => assert_eq!(status, Status::Superseded),
        other => panic!("sp-a's loss: {other:?}"),
    }
    assert!(
        matches!(claim(back[0].id.clone()).await, Claim::Send(_)),
        "the return goes out"
    );
    assert!(
        matches!(claim(of("sp-b")).await, Claim::Send(_)),
        "another site's loss is not superseded by it"
    );
    let (n, _) = s.get_notification(of("sp-a")).await.unwrap().unwrap();
    assert_eq!(n.status, Status::Superseded);
    // A site's notifications are found by their site, and by it only.
    let of_site = |site: &str| NotificationFilter {
        client_id: Some("spc".into()),
        site_id: Some(site.into()),
        ..Default::default()
    };
    let found = s
        .list_notifications(of_site("sp-a"), page(100))
        .await
        .unwrap();
    let kinds: Vec<EventKind> = found.items.iter().map(|n| n.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::SiteConnectionLost,
            EventKind::SiteConnectionRestored
        ]
    );
    let found = s
        .list_notifications(of_site("sp-b"), page(100))
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    assert_eq!(found.items[0].id, of("sp-b"));
}

/// Issue #68 item 12: a site's return that still counts a sensor lost travels in another
/// lane than the sensor's own return; the sensor's return waits until the site's is done,
/// so the client never ends believing the sensor lost.
pub(super) async fn a_sensors_return_waits_for_the_site_event_that_counts_it_lost(s: &Subject) {
    fill(s, "so-a", &["so1", "so2", "so3", "so4", "so5"], "soc").await;
    for id in ["so1", "so2", "so3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    let loss = s.decide_sites(RULES, 36_000).await.unwrap().made;
    assert_eq!(loss.len(), 1, "{loss:?}");
    // so1 comes back: the site is up, its return naming so2 and so3 still lost.
    s.commit(
        liveness("so1", EventKind::ConnectionRestored, 40_000),
        40_000,
    )
    .await
    .unwrap();
    let back = s.decide_sites(RULES, 41_000).await.unwrap().made;
    assert_eq!(
        kinds(&back),
        [("soc".into(), sid("so1"), EventKind::SiteConnectionRestored)]
    );
    // so2's own return, made now the site is up: a lane of its own.
    let own = s
        .commit(
            liveness("so2", EventKind::ConnectionRestored, 42_000),
            42_000,
        )
        .await
        .unwrap();
    assert_eq!(
        kinds(&own),
        [("soc".into(), sid("so2"), EventKind::ConnectionRestored)]
    );
    let claim = |id: String, now: Millis| async move {
        s.claim(vec![id], "n1".into(), now, 60_000, None)
            .await
            .unwrap()
            .remove(0)
    };
    // The site's loss and return both name so2 and wait: so2's return waits for them.
    assert!(
        matches!(claim(own[0].id.clone(), 43_000).await, Claim::Later { .. }),
        "so2's return goes only after the site events naming it"
    );
    assert!(matches!(
        claim(loss[0].id.clone(), 43_000).await,
        Claim::Done {
            status: Status::Superseded,
            ..
        }
    ));
    let Claim::Send(sent) = claim(back[0].id.clone(), 43_000).await else {
        panic!("the site's return goes out");
    };
    assert!(
        matches!(claim(own[0].id.clone(), 43_100).await, Claim::Later { .. }),
        "still in flight"
    );
    s.record(
        vec![Outcome {
            notification_id: sent.notification.id.clone(),
            client_id: "soc".into(),
            attempt: Some(Attempt {
                notification_id: sent.notification.id.clone(),
                at: 43_200,
                status_code: Some(200),
                error: None,
                duration_ms: 3,
            }),
            attempts: 1,
            verdict: Verdict::Delivered,
            node: "n1".into(),
            batch_id: None,
        }],
        43_200,
        NEVER,
    )
    .await
    .unwrap();
    assert!(
        matches!(claim(own[0].id.clone(), 43_300).await, Claim::Send(_)),
        "so2's return follows the site's"
    );
}

/// A site down by its gateway stays down, on the gateway's return, while others of its
/// sensors that went quiet after the loss are lost (its loss did not name them, so their
/// returns are sent at once, not held); their returns ask for the site's decision again,
/// and the site comes back (simulation seed 411: it stayed down for ever, its clients
/// never told).
pub(super) async fn a_site_comes_back_when_sensors_its_loss_did_not_name_return(s: &Subject) {
    s.create_site(super::silences::site("sg", Some("sg0")))
        .await
        .unwrap();
    fill(s, "sg", &["sg0", "sg1", "sg2", "sg3", "sg4"], "sgc").await;
    s.commit(liveness("sg0", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    let loss = s.decide_sites(RULES, 36_000).await.unwrap().made;
    assert_eq!(
        kinds(&loss),
        [("sgc".into(), sid("sg0"), EventKind::SiteConnectionLost)]
    );
    // Three more go quiet while it is down: told to the client by their own losses.
    for id in ["sg1", "sg2", "sg3"] {
        let own = s
            .commit(liveness(id, EventKind::ConnectionLost, 37_000), 37_000)
            .await
            .unwrap();
        assert_eq!(
            kinds(&own),
            [("sgc".into(), sid(id), EventKind::ConnectionLost)]
        );
    }
    // The gateway is back, but three of five are lost: still down.
    s.commit(
        liveness("sg0", EventKind::ConnectionRestored, 38_000),
        38_000,
    )
    .await
    .unwrap();
    s.decide_sites(RULES, 39_000).await.unwrap();
    let (_, counts) = s.get_site("sg".into()).await.unwrap().unwrap();
    assert!(counts.down);
    // The three come back: the site is decided again, and its return told.
    for id in ["sg1", "sg2", "sg3"] {
        s.commit(liveness(id, EventKind::ConnectionRestored, 40_000), 40_000)
            .await
            .unwrap();
    }
    let back = s.decide_sites(RULES, 41_000).await.unwrap().made;
    assert!(
        kinds(&back)
            .iter()
            .any(|(c, _, k)| c == "sgc" && *k == EventKind::SiteConnectionRestored),
        "{back:?}"
    );
    let (_, counts) = s.get_site("sg".into()).await.unwrap().unwrap();
    assert!(!counts.down);
}
