//! Checks of sites and silences (issue #50): a site's sensors counted by connection, and a
//! silence that keeps matching notifications from being sent and brings each client it
//! kept something from up to date, once, at its end.

use super::*;
use crate::domain::silence::{Match, Silence, SilenceState};
use crate::domain::site::{Site, SiteCounts};

pub(super) fn site(id: &str, gateway: Option<&str>) -> Site {
    Site {
        id: id.into(),
        name: Some(format!("site {id}")),
        address: None,
        gateway_sensor_id: gateway.map(sid),
        created_at: 1_000,
        updated_at: 1_000,
    }
}

pub(super) fn silence(id: &str, matcher: Match, starts_at: Millis, ends_at: Millis) -> Silence {
    Silence {
        id: id.into(),
        matcher,
        starts_at,
        ends_at,
        comment: "planned work".into(),
        created_at: starts_at,
        updated_at: starts_at,
        reconciled_at: None,
        schedule_id: None,
        ended_at: None,
    }
}

async fn statuses(
    s: &Subject,
    client: &str,
    sensor: &str,
) -> Vec<(EventKind, Status, Option<bool>)> {
    let f = NotificationFilter {
        client_id: Some(client.into()),
        sensor_id: Some(sid(sensor)),
        ..Default::default()
    };
    s.list_notifications(f, page(100))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| (n.kind, n.status, n.data))
        .collect()
}

/// A site keeps its fields; its sensors are counted by connection, its gateway's loss
/// told apart; deleting it leaves its sensors in no site.
pub(super) async fn sites_count_their_sensors(s: &Subject) {
    s.create_site(site("bldg-1", Some("gw1"))).await.unwrap();
    assert!(matches!(
        s.create_site(site("bldg-1", None)).await,
        Err(Error::Conflict(_))
    ));
    for id in ["gw1", "st1", "st2"] {
        s.create_sensor(Sensor {
            site_id: Some("bldg-1".into()),
            ..sensor(id)
        })
        .await
        .unwrap();
    }
    s.create_sensor(sensor("st3")).await.unwrap();
    s.commit(liveness("st1", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    let (got, counts) = s.get_site("bldg-1".into()).await.unwrap().unwrap();
    assert_eq!(got, site("bldg-1", Some("gw1")));
    assert_eq!(
        (counts.sensors, counts.lost, counts.gateway_lost),
        (3, 1, false)
    );
    s.commit(liveness("gw1", EventKind::ConnectionLost, 6_000), 6_000)
        .await
        .unwrap();
    let (_, counts) = s.get_site("bldg-1".into()).await.unwrap().unwrap();
    assert_eq!((counts.lost, counts.gateway_lost), (2, true));

    // Moved to another site, then that site's fields changed.
    s.create_site(site("bldg-2", None)).await.unwrap();
    s.replace_sensor(
        sid("st2"),
        "x".into(),
        None,
        None,
        Some("bldg-2".into()),
        Default::default(),
        9_000,
    )
    .await
    .unwrap();
    let renamed = Site {
        name: None,
        address: Some("Svobody 23".into()),
        updated_at: 9_000,
        ..site("bldg-2", Some("st2"))
    };
    assert!(s.replace_site(renamed.clone()).await.unwrap());
    let listed = s.list_sites(None, page(1)).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    let rest = s
        .list_sites(
            None,
            PageRequest {
                limit: 10,
                after: listed.next.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(rest.items[0].0, renamed);
    assert_eq!(rest.items[0].1.sensors, 1);

    assert!(
        s.delete_site("bldg-1".into(), 9_500)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        s.delete_site("bldg-1".into(), 9_500)
            .await
            .unwrap()
            .is_none()
    );
    let (st1, _) = s.get_sensor(sid("st1")).await.unwrap().unwrap();
    assert_eq!(st1.site_id, None, "its sensors stay, in no site");
    assert_eq!(
        s.get_sensor(sid("st2")).await.unwrap().unwrap().0.site_id,
        Some("bldg-2".into())
    );
}

/// While a silence is active the notifications it matches are made `silenced`, and only
/// the others are handed on; at its end each pair it kept something from gets one
/// notification if its client's view is wrong, and the end is reconciled once.
pub(super) async fn a_silence_keeps_and_reconciles_once(s: &Subject) {
    for id in ["sl1", "sl2"] {
        s.create_sensor(sensor(id)).await.unwrap();
    }
    for c in ["quiet", "loud"] {
        s.create_client(client(c, "http://r/")).await.unwrap();
        for id in ["sl1", "sl2"] {
            s.link(c.into(), sid(id), 1).await.unwrap();
        }
    }
    // Both told the first states before the silence.
    s.commit(change("sl1", true, None, 1_000), 1_000)
        .await
        .unwrap();
    s.commit(change("sl2", true, None, 1_000), 1_000)
        .await
        .unwrap();
    let matcher = Match {
        client_id: Some("quiet".into()),
        ..Match::default()
    };
    s.create_silence(silence("s1", matcher, 2_000, 10_000))
        .await
        .unwrap();
    let listed = |state| async move {
        s.list_silences(Some(state), 5_000, page(10))
            .await
            .unwrap()
            .items
            .len()
    };
    assert_eq!(listed(SilenceState::Active).await, 1);
    assert_eq!(listed(SilenceState::Pending).await, 0);

    // sl1 flips and flips back; sl2 changes for good.
    let made = s
        .commit(change("sl1", false, Some(true), 3_000), 3_000)
        .await
        .unwrap();
    let made2 = s
        .commit(change("sl1", true, Some(false), 4_000), 4_000)
        .await
        .unwrap();
    let made3 = s
        .commit(change("sl2", false, Some(true), 4_000), 4_000)
        .await
        .unwrap();
    for m in [made, made2, made3] {
        let to: Vec<&str> = m.iter().map(|n| n.client_id.as_str()).collect();
        assert_eq!(
            to,
            ["loud"],
            "only the client no silence matches is handed on"
        );
    }
    assert!(statuses(s, "quiet", "sl2").await.contains(&(
        EventKind::StateChanged,
        Status::Silenced,
        Some(false)
    )));
    assert!(
        !statuses(s, "loud", "sl2")
            .await
            .iter()
            .any(|(_, st, _)| *st == Status::Silenced)
    );

    // Not ended by then: nothing.
    assert!(s.reconcile_silences(9_000, 9_500).await.unwrap().is_empty());
    let made = s.reconcile_silences(10_000, 15_000).await.unwrap();
    let got: Vec<(&str, SensorId, EventKind)> = made
        .iter()
        .map(|n| (n.client_id.as_str(), n.sensor_id, n.kind))
        .collect();
    assert_eq!(
        got,
        [("quiet", sid("sl2"), EventKind::StateChanged)],
        "sl1 is back where the client saw it: nothing for it"
    );
    let n = s
        .get_notification(made[0].id.clone())
        .await
        .unwrap()
        .unwrap()
        .0;
    assert_eq!(
        (n.data, n.previous, n.status),
        (Some(false), Some(true), Status::Pending)
    );
    assert!(
        s.reconcile_silences(20_000, 20_000)
            .await
            .unwrap()
            .is_empty(),
        "once"
    );
    let ended = s.get_silence("s1".into()).await.unwrap().unwrap();
    assert_eq!(ended.reconciled_at, Some(15_000));
    assert!(
        !s.update_silence(Silence {
            ends_at: 30_000,
            ..ended
        })
        .await
        .unwrap(),
        "a reconciled silence is not extended"
    );
}

/// A pair another active silence still holds is left for that one's end; a silence of
/// some types only keeps those.
pub(super) async fn overlapping_silences_reconcile_at_the_last_end(s: &Subject) {
    s.create_sensor(sensor("ov1")).await.unwrap();
    s.create_client(client("ovc", "http://r/")).await.unwrap();
    s.link("ovc".into(), sid("ov1"), 1).await.unwrap();
    s.commit(change("ov1", true, None, 1_000), 1_000)
        .await
        .unwrap();
    let by_sensor = Match {
        sensor_ids: Some(vec![sid("ov1")]),
        ..Match::default()
    };
    let lost_only = Match {
        types: Some(vec![EventKind::ConnectionLost]),
        ..Match::default()
    };
    s.create_silence(silence("a", by_sensor, 2_000, 5_000))
        .await
        .unwrap();
    s.create_silence(silence("b", lost_only, 2_000, 9_000))
        .await
        .unwrap();
    let made = s
        .commit(liveness("ov1", EventKind::ConnectionLost, 3_000), 3_000)
        .await
        .unwrap();
    assert!(made.is_empty());
    assert!(
        s.reconcile_silences(5_000, 6_000).await.unwrap().is_empty(),
        "the other silence still holds the pair"
    );
    // After a's end a change is not silenced: b keeps only losses.
    let made = s
        .commit(change("ov1", false, Some(true), 7_000), 7_000)
        .await
        .unwrap();
    assert_eq!(made.len(), 1);
    let made = s.reconcile_silences(9_000, 10_000).await.unwrap();
    // The change (pending) is what the client will know: the sensor is online with 0.
    assert!(made.is_empty(), "{made:?}");
}

/// The state change a silence's end makes is a newer state like any other: the older
/// state notification still pending in its lane, unleased, is superseded (simulation seed
/// 1764: a site's return, released after a newer state, told the client stale data, so the
/// end made a state change, and the older state went out before it).
pub(super) async fn a_silences_state_change_supersedes_an_older_pending_one(s: &Subject) {
    s.create_sensor(sensor("sp1")).await.unwrap();
    s.create_client(client("spc", "http://r/")).await.unwrap();
    s.link("spc".into(), sid("sp1"), 1).await.unwrap();
    let matcher = Match {
        client_id: Some("spc".into()),
        ..Match::default()
    };
    s.create_silence(silence("sp", matcher, 2_000, 5_000))
        .await
        .unwrap();
    let kept = s
        .commit(change("sp1", true, None, 3_000), 3_000)
        .await
        .unwrap();
    assert!(kept.is_empty(), "kept by the silence: {kept:?}");
    // After the end, before its reconciling: a change, then a return whose data is older
    // than the change's (what a site's release carries).
    let older = s
        .commit(change("sp1", false, Some(true), 6_000), 6_000)
        .await
        .unwrap();
    assert_eq!(older.len(), 1);
    let mut back = liveness("sp1", EventKind::ConnectionRestored, 6_500);
    back.states[0].data = Some(false);
    assert_eq!(s.commit(back, 6_500).await.unwrap().len(), 1);
    let made = s.reconcile_silences(10_000, 10_000).await.unwrap();
    let got: Vec<EventKind> = made.iter().map(|n| n.kind).collect();
    assert_eq!(got, [EventKind::StateChanged]);
    assert_eq!(
        statuses(s, "spc", "sp1").await,
        [
            (EventKind::StateChanged, Status::Silenced, Some(true)),
            (EventKind::StateChanged, Status::Superseded, Some(false)),
            (EventKind::ConnectionRestored, Status::Pending, Some(true)),
            (EventKind::StateChanged, Status::Pending, Some(false)),
        ]
    );
}

pub(super) const RULES: crate::domain::site::decide::Rules = crate::domain::site::decide::Rules {
    grace: 30_000,
    ratio: 0.5,
    min_sensors: 3,
};

/// Losses of a site's sensors wait for the site's decision: a storm becomes one
/// `site.connection_lost` per client naming only its sensors, decided once; their return
/// one `site.connection_restored`; a sensor lost alone in another site goes out as its own
/// after the grace.
pub(super) async fn a_site_decides_once_for_its_sensors(s: &Subject) {
    s.create_site(site("dk-a", None)).await.unwrap();
    s.create_site(site("dk-b", None)).await.unwrap();
    let in_site = |id: &str, site: &str| Sensor {
        site_id: Some(site.into()),
        ..sensor(id)
    };
    for id in ["da1", "da2", "da3", "da4"] {
        s.create_sensor(in_site(id, "dk-a")).await.unwrap();
    }
    for id in ["db1", "db2", "db3", "db4"] {
        s.create_sensor(in_site(id, "dk-b")).await.unwrap();
    }
    for (c, sensors) in [
        ("dc1", &["da1", "da2", "da4", "db1"][..]),
        ("dc2", &["da3"][..]),
    ] {
        s.create_client(client(c, "http://r/")).await.unwrap();
        for id in sensors {
            s.link(c.into(), sid(id), 1).await.unwrap();
        }
    }
    for id in ["da1", "da2", "da3", "db1"] {
        let made = s
            .commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
        assert!(made.is_empty(), "held for the site's decision: {made:?}");
    }
    assert!(
        s.decide_sites(RULES, 20_000).await.unwrap().is_empty(),
        "the grace runs"
    );
    let totals = s.site_totals().await.unwrap();
    assert_eq!(
        (totals.down, totals.held, totals.oldest_grace),
        (0, 4, Some(5_000)),
        "four losses held for two sites' grace"
    );
    let decided = s.decide_sites(RULES, 36_000).await.unwrap();
    let changed: Vec<(&str, EventKind, u64, u64)> = decided
        .changed
        .iter()
        .map(|e| (e.site_id.as_str(), e.kind, e.sensors, e.lost))
        .collect();
    assert_eq!(
        changed,
        [("dk-a", EventKind::SiteConnectionLost, 4, 3)],
        "dk-b stays up"
    );
    let made = decided.made;
    let got: Vec<(&str, SensorId, EventKind)> = made
        .iter()
        .map(|n| (n.client_id.as_str(), n.sensor_id, n.kind))
        .collect();
    assert_eq!(
        got,
        [
            ("dc1", sid("da1"), EventKind::SiteConnectionLost),
            ("dc2", sid("da3"), EventKind::SiteConnectionLost),
            ("dc1", sid("db1"), EventKind::ConnectionLost),
        ]
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
    assert_eq!(named, ["da1", "da2"], "only the client's own sensors");
    assert_eq!(body["sensors_total"], 3);
    assert_eq!(body["site"]["id"], "dk-a");
    assert!(
        s.decide_sites(RULES, 37_000).await.unwrap().is_empty(),
        "decided once"
    );
    let (_, counts) = s.get_site("dk-a".into()).await.unwrap().unwrap();
    assert_eq!(counts.lost, 3);
    let totals = s.site_totals().await.unwrap();
    assert_eq!(
        (totals.down, totals.held, totals.oldest_grace),
        (1, 0, None)
    );
    let ids =
        |p: Page<(Site, SiteCounts)>| p.items.into_iter().map(|(s, _)| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.list_sites(Some(true), page(10)).await.unwrap()),
        ["dk-a"]
    );
    assert_eq!(
        ids(s.list_sites(Some(false), page(10)).await.unwrap()),
        ["dk-b"]
    );
    // Its lost sensors, a page at a time.
    let lost = s
        .site_sensors(
            "dk-a".into(),
            SensorFilter::connection(Some(Connection::Lost)),
            page(2),
        )
        .await
        .unwrap();
    let rest = s
        .site_sensors(
            "dk-a".into(),
            SensorFilter::connection(Some(Connection::Lost)),
            PageRequest {
                limit: 2,
                after: lost.next.clone(),
            },
        )
        .await
        .unwrap();
    let named: Vec<String> = lost
        .items
        .iter()
        .chain(&rest.items)
        .map(|(x, _)| x.id.to_string())
        .collect();
    assert_eq!(named, ["da1", "da2", "da3"]);
    let all = s
        .site_sensors("dk-a".into(), SensorFilter::default(), page(10))
        .await
        .unwrap();
    assert_eq!(all.items.len(), 4, "da4 never reported, and is in the site");

    for id in ["da1", "da2", "da3"] {
        let made = s
            .commit(liveness(id, EventKind::ConnectionRestored, 40_000), 40_000)
            .await
            .unwrap();
        assert!(made.is_empty(), "told by the site: held for its return");
    }
    let decided = s.decide_sites(RULES, 41_000).await.unwrap();
    let changed: Vec<(&str, EventKind, u64)> = decided
        .changed
        .iter()
        .map(|e| (e.site_id.as_str(), e.kind, e.lost))
        .collect();
    assert_eq!(changed, [("dk-a", EventKind::SiteConnectionRestored, 0)]);
    assert_eq!(s.site_totals().await.unwrap().down, 0);
    let made = decided.made;
    let got: Vec<(&str, EventKind)> = made
        .iter()
        .map(|n| (n.client_id.as_str(), n.kind))
        .collect();
    assert_eq!(
        got,
        [
            ("dc1", EventKind::SiteConnectionRestored),
            ("dc2", EventKind::SiteConnectionRestored)
        ]
    );
    let (n, _) = s
        .get_notification(made[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    let body: serde_json::Value = serde_json::from_str(n.body.as_deref().unwrap()).unwrap();
    assert_eq!(body["restored"].as_array().unwrap().len(), 2, "{body}");
    assert!(s.decide_sites(RULES, 42_000).await.unwrap().is_empty());
    // Up again: a restoration of a sensor lost alone goes out at once.
    let made = s
        .commit(
            liveness("db1", EventKind::ConnectionRestored, 43_000),
            43_000,
        )
        .await
        .unwrap();
    assert_eq!(made.len(), 1);
}

/// While a site stays down, what is held of its sensors goes to a client its loss did not
/// tell at the next round, once; the site's return tells the client it told, and gives
/// the other only what it has not had yet.
pub(super) async fn a_site_still_down_releases_to_the_clients_its_loss_did_not_tell(s: &Subject) {
    s.create_site(site("dk-c", None)).await.unwrap();
    let ids = ["dd1", "dd2", "dd3", "dd4"];
    for id in ids {
        let in_site = Sensor {
            site_id: Some("dk-c".into()),
            ..sensor(id)
        };
        s.create_sensor(in_site).await.unwrap();
    }
    let own_only = Client {
        events: Some(vec![
            "sensor.connection_lost".into(),
            "sensor.connection_restored".into(),
        ]),
        ..client("ec2", "http://r/")
    };
    s.create_client(client("ec1", "http://r/")).await.unwrap();
    s.create_client(own_only).await.unwrap();
    for id in ids {
        s.link("ec1".into(), sid(id), 1).await.unwrap();
        s.link("ec2".into(), sid(id), 1).await.unwrap();
    }
    for id in ids {
        s.commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    let got = |made: &[NotificationRef]| -> Vec<(String, SensorId, EventKind)> {
        made.iter()
            .map(|n| (n.client_id.clone(), n.sensor_id, n.kind))
            .collect()
    };
    let down = s.decide_sites(RULES, 36_000).await.unwrap();
    assert_eq!(down.changed.len(), 1);
    assert_eq!(
        got(&down.made).iter().filter(|n| n.0 == "ec2").count(),
        4,
        "its sensors' own losses"
    );
    let made = s
        .commit(
            liveness("dd1", EventKind::ConnectionRestored, 40_000),
            40_000,
        )
        .await
        .unwrap();
    assert!(made.is_empty(), "held: the site's loss told ec1 of dd1");
    let decided = s.decide_sites(RULES, 41_000).await.unwrap();
    assert_eq!(
        got(&decided.made),
        [("ec2".into(), sid("dd1"), EventKind::ConnectionRestored)],
        "three of four still lost: the site stays down, and ec2 hears of dd1 now"
    );
    assert!(decided.changed.is_empty());
    assert!(
        s.decide_sites(RULES, 42_000).await.unwrap().is_empty(),
        "released once"
    );
    assert_eq!(s.site_totals().await.unwrap().down, 1);
    s.commit(
        liveness("dd2", EventKind::ConnectionRestored, 50_000),
        50_000,
    )
    .await
    .unwrap();
    let up = s.decide_sites(RULES, 51_000).await.unwrap();
    assert_eq!(
        got(&up.made),
        [
            ("ec1".into(), sid("dd1"), EventKind::SiteConnectionRestored),
            ("ec2".into(), sid("dd2"), EventKind::ConnectionRestored),
        ],
        "the site's return to ec1; to ec2 only what it had not had"
    );
    assert_eq!(s.site_totals().await.unwrap().down, 0);
}
