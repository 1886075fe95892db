//! Checks of silences at their edges (issue #68): a silence that ends while a site's grace
//! holds a loss, one that outlasts notification retention, a silenced site loss, and a
//! silence by site whose sensor moved away before its end.

use super::silences::{RULES, silence};
use super::site_edges::fill;
use super::*;
use crate::domain::silence::Match;

fn for_client(c: &str) -> Match {
    Match {
        client_id: Some(c.into()),
        ..Match::default()
    }
}

/// Every notification of `c` for sensor `x`, oldest first: kind, status, data.
async fn lane(s: &Subject, c: &str, x: &str) -> Vec<(EventKind, Status, Option<bool>)> {
    let f = NotificationFilter {
        client_id: Some(c.into()),
        sensor_id: Some(sid(x)),
        ..Default::default()
    };
    let mut items = s.list_notifications(f, page(100)).await.unwrap().items;
    items.sort_by_key(|n| n.seq);
    items
        .into_iter()
        .map(|n| (n.kind, n.status, n.data))
        .collect()
}

/// A silence that ends while the sensor's loss waits in its site's grace tells nothing of
/// it: the site's decision does, once.
pub(super) async fn a_silence_ending_in_a_grace_leaves_the_loss_to_the_site(s: &Subject) {
    fill(s, "sg-a", &["sg1", "sg2", "sg3", "sg4"], "gc1").await;
    s.create_silence(silence("q1", for_client("gc1"), 1_000, 20_000))
        .await
        .unwrap();
    // A change kept from gc1, then the sensor lost: held for the grace.
    assert!(
        s.commit(change("sg1", true, None, 5_000), 5_000)
            .await
            .unwrap()
            .is_empty()
    );
    let held = s
        .commit(liveness("sg1", EventKind::ConnectionLost, 15_000), 15_000)
        .await
        .unwrap();
    assert!(held.is_empty());
    let made = s.reconcile_silences(20_000, 26_000).await.unwrap();
    assert!(made.is_empty(), "the grace will tell it: {made:?}");
    let decided = s.decide_sites(RULES, 46_000).await.unwrap();
    let kinds: Vec<EventKind> = decided.made.iter().map(|n| n.kind).collect();
    assert_eq!(kinds, [EventKind::ConnectionLost]);
    let lost: Vec<EventKind> = lane(s, "gc1", "sg1")
        .await
        .into_iter()
        .filter(|(_, st, _)| *st == Status::Pending)
        .map(|(k, _, _)| k)
        .collect();
    assert_eq!(lost, [EventKind::ConnectionLost], "told once");
}

/// A silence that outlasts notification retention still brings its client up to date at
/// its end: what it kept is not deleted while it waits.
pub(super) async fn a_silence_longer_than_retention_still_reconciles(s: &Subject) {
    s.create_client(client("rc1", "http://r/")).await.unwrap();
    s.create_sensor(sensor("rt1")).await.unwrap();
    s.link("rc1".into(), sid("rt1"), 1).await.unwrap();
    s.create_silence(silence("q2", for_client("rc1"), 1_000, 100_000))
        .await
        .unwrap();
    assert!(
        s.commit(change("rt1", true, None, 2_000), 2_000)
            .await
            .unwrap()
            .is_empty()
    );
    let keep = Retention {
        history_before: None,
        notifications_before: Some(60_000),
        audit_unshipped_kept: false,
    };
    s.maintain(70_000, keep).await.unwrap();
    assert_eq!(
        lane(s, "rc1", "rt1").await,
        [(EventKind::StateChanged, Status::Silenced, Some(true))],
        "kept while its silence lasts"
    );
    let made = s.reconcile_silences(100_000, 106_000).await.unwrap();
    let got: Vec<(EventKind, Option<bool>)> = made.iter().map(|n| (n.kind, None)).collect();
    assert_eq!(got, [(EventKind::StateChanged, None)]);
    let (n, _) = s
        .get_notification(made[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((n.data, n.previous), (Some(true), None));
}

/// A site's loss kept from a client, the site still down at the silence's end: one
/// `site.connection_lost` naming its sensors still lost (a building pages once), nothing for
/// the sensor back with the data it had (not a state change from the site event's null),
/// and the site's return then goes to the client too.
pub(super) async fn a_silenced_site_loss_is_told_once_at_the_end(s: &Subject) {
    let ids = ["sq1", "sq2", "sq3", "sq4", "sq5"];
    fill(s, "sq-a", &ids, "qc1").await;
    // A second client the same silence keeps it from: each is told, neither undoes the
    // other's being told.
    fill(s, "sq-a", &[], "qc2").await;
    for x in ids {
        s.link("qc2".into(), sid(x), 1).await.unwrap();
    }
    let by_site = Match {
        site_id: Some("sq-a".into()),
        ..Match::default()
    };
    s.create_silence(silence("q3", by_site, 1_000, 60_000))
        .await
        .unwrap();
    for x in ["sq1", "sq2", "sq3", "sq4"] {
        s.commit(liveness(x, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    let down = s.decide_sites(RULES, 36_000).await.unwrap();
    assert_eq!(down.changed.len(), 1);
    assert!(down.made.is_empty(), "the site's loss kept from both");
    // sq1 (the event's anchor) back, with the data it had: three of five still lost.
    s.commit(
        liveness("sq1", EventKind::ConnectionRestored, 40_000),
        40_000,
    )
    .await
    .unwrap();
    assert!(s.decide_sites(RULES, 41_000).await.unwrap().made.is_empty());
    let made = s.reconcile_silences(60_000, 66_000).await.unwrap();
    let mut got: Vec<(String, SensorId, EventKind)> = made
        .iter()
        .map(|n| (n.client_id.clone(), n.sensor_id, n.kind))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        [
            ("qc1".into(), sid("sq2"), EventKind::SiteConnectionLost),
            ("qc2".into(), sid("sq2"), EventKind::SiteConnectionLost),
        ],
        "one site loss each, and nothing for sq1 (no state change from the event's null)"
    );
    let (n, _) = s
        .get_notification(made[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    let body: serde_json::Value = serde_json::from_str(n.body.as_deref().unwrap()).unwrap();
    let named: Vec<&str> = body["sensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(named, ["sq2", "sq3", "sq4"]);
    assert!(
        s.reconcile_silences(60_000, 67_000)
            .await
            .unwrap()
            .is_empty(),
        "once"
    );
    // The site back: its return goes to both, listing what its loss named.
    for x in ["sq2", "sq3"] {
        s.commit(liveness(x, EventKind::ConnectionRestored, 70_000), 70_000)
            .await
            .unwrap();
    }
    let back = s.decide_sites(RULES, 71_000).await.unwrap();
    let kinds: Vec<(String, EventKind)> = back
        .made
        .iter()
        .map(|n| (n.client_id.clone(), n.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("qc1".into(), EventKind::SiteConnectionRestored),
            ("qc2".into(), EventKind::SiteConnectionRestored)
        ]
    );
}

/// A silence matched by site reconciles a sensor moved out of the site before its end.
pub(super) async fn a_site_silence_reconciles_a_sensor_that_moved_away(s: &Subject) {
    fill(s, "sm-a", &["sm1", "sm2"], "mc1").await;
    let by_site = Match {
        site_id: Some("sm-a".into()),
        ..Match::default()
    };
    s.create_silence(silence("q4", by_site, 1_000, 30_000))
        .await
        .unwrap();
    assert!(
        s.commit(change("sm1", true, None, 5_000), 5_000)
            .await
            .unwrap()
            .is_empty()
    );
    s.replace_sensor(
        sid("sm1"),
        "elsewhere".into(),
        None,
        None,
        None,
        Default::default(),
        10_000,
    )
    .await
    .unwrap()
    .unwrap();
    let made = s.reconcile_silences(30_000, 36_000).await.unwrap();
    let got: Vec<(SensorId, EventKind)> = made.iter().map(|n| (n.sensor_id, n.kind)).collect();
    assert_eq!(got, [(sid("sm1"), EventKind::StateChanged)]);
}

/// A client told of a sensor's return by its site's `site.connection_restored` (which
/// travels in another sensor's lane) is not told it again at a silence's end: what the
/// site's events named counts as what the client knows.
pub(super) async fn a_silence_end_counts_what_a_site_event_named(s: &Subject) {
    fill(s, "sv-a", &["sv1", "sv2", "sv3", "sv4"], "vc1").await;
    // sv2 lost alone: its own loss, after the grace.
    s.commit(liveness("sv2", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    assert_eq!(s.decide_sites(RULES, 36_000).await.unwrap().made.len(), 1);
    // The rest go: the site down, its loss naming all four.
    for x in ["sv1", "sv3", "sv4"] {
        s.commit(liveness(x, EventKind::ConnectionLost, 40_000), 40_000)
            .await
            .unwrap();
    }
    assert_eq!(
        s.decide_sites(RULES, 71_000).await.unwrap().changed.len(),
        1
    );
    s.create_silence(silence("q5", for_client("vc1"), 72_000, 74_000))
        .await
        .unwrap();
    // sv2 back and changed while vc1 is silenced: its return held for the site's, its
    // change kept by the silence.
    s.commit(
        liveness("sv2", EventKind::ConnectionRestored, 73_000),
        73_000,
    )
    .await
    .unwrap();
    s.commit(change("sv2", false, Some(true), 73_000), 73_000)
        .await
        .unwrap();
    for x in ["sv1", "sv3"] {
        s.commit(liveness(x, EventKind::ConnectionRestored, 75_000), 75_000)
            .await
            .unwrap();
    }
    let back = s.decide_sites(RULES, 76_000).await.unwrap();
    let kinds: Vec<EventKind> = back.made.iter().map(|n| n.kind).collect();
    assert_eq!(kinds, [EventKind::SiteConnectionRestored]);
    let made = s.reconcile_silences(74_000, 80_000).await.unwrap();
    assert!(
        made.is_empty(),
        "the site's return told vc1 sv2 is back, with its data now: {made:?}"
    );
}
