//! Checks of what the console lists and finds: notifications newest first with their
//! filters, sensors by id prefix and address words, clients by name.

use super::*;
use crate::store::{Search, SensorFilter, find_clients};

fn ids(p: &Page<Notification>) -> Vec<i64> {
    p.items.iter().map(|n| n.seq).collect()
}

pub(super) async fn notifications_newest_first_with_filters(s: &Subject) {
    s.create_sensor(sensor("nf1")).await.unwrap();
    s.create_sensor(sensor("nf2")).await.unwrap();
    s.create_client(client("nf-a", "http://a/")).await.unwrap();
    s.link("nf-a".into(), sid("nf1"), 1).await.unwrap();
    s.link("nf-a".into(), sid("nf2"), 1).await.unwrap();
    // Created at 10 s, 20 s, …: one notification per commit, alternating sensors, a lost
    // one among them.
    let mut seqs = Vec::new();
    for i in 0..6i64 {
        let at = (i + 1) * 10_000;
        let id = if i % 2 == 0 { "nf1" } else { "nf2" };
        let batch = if i == 3 {
            liveness(id, EventKind::ConnectionLost, at)
        } else {
            change(id, i % 4 == 0, None, at)
        };
        seqs.push(s.commit(batch, at).await.unwrap()[0].seq);
    }
    // The one of 50 s fails.
    let failed = s
        .list_notifications(
            NotificationFilter {
                created: TimeRange {
                    from: Some(50_000),
                    to: Some(50_001),
                },
                ..Default::default()
            },
            page(10),
        )
        .await
        .unwrap()
        .items
        .remove(0);
    s.record(
        vec![Outcome {
            notification_id: failed.id.clone(),
            client_id: "nf-a".into(),
            attempt: None,
            attempts: 10,
            verdict: Verdict::Failed,
            node: "n1".into(),
            batch_id: None,
        }],
        55_000,
        NEVER,
    )
    .await
    .unwrap();

    let newest = |f: NotificationFilter| NotificationFilter {
        newest_first: true,
        ..f
    };
    let all = newest(NotificationFilter::default());
    let first = s.list_notifications(all.clone(), page(4)).await.unwrap();
    let mut expected: Vec<i64> = seqs.iter().rev().copied().collect();
    assert_eq!(ids(&first), expected[..4], "newest first");
    let rest = s
        .list_notifications(
            all.clone(),
            PageRequest {
                limit: 4,
                after: first.next.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&rest), expected[4..], "the cursor pages towards older");
    assert_eq!(rest.next, None);
    // The default order is as it was: oldest first, and its cursor pages forwards.
    let asc = s
        .list_notifications(NotificationFilter::default(), page(4))
        .await
        .unwrap();
    expected.reverse();
    assert_eq!(ids(&asc), expected[..4]);

    let kind = newest(NotificationFilter {
        kind: Some(EventKind::ConnectionLost),
        ..Default::default()
    });
    assert_eq!(
        ids(&s.list_notifications(kind, page(10)).await.unwrap()),
        [seqs[3]]
    );
    let window = newest(NotificationFilter {
        created: TimeRange {
            from: Some(20_000),
            to: Some(50_000),
        },
        ..Default::default()
    });
    assert_eq!(
        ids(&s.list_notifications(window, page(10)).await.unwrap()),
        [seqs[3], seqs[2], seqs[1]],
        "[from, to) on when they were created"
    );
    // "Failed in the last …": status and a range, with a sensor and a client too.
    let failed_since = newest(NotificationFilter {
        client_id: Some("nf-a".into()),
        sensor_id: Some(sid("nf1")),
        status: Some(Status::Failed),
        created: TimeRange {
            from: Some(30_000),
            to: None,
        },
        ..Default::default()
    });
    let got = s.list_notifications(failed_since, page(10)).await.unwrap();
    assert_eq!(ids(&got), [seqs[4]]);
    assert_eq!(got.items[0].id, failed.id);
}

fn found(p: &Page<SensorView>) -> Vec<String> {
    p.items.iter().map(|(s, _)| s.id.to_string()).collect()
}

async fn find(s: &dyn Store, text: &str) -> Vec<String> {
    let search = Search::parse(text).unwrap();
    let all = SensorFilter::default();
    found(&s.find_sensors(search, all, None, page(50)).await.unwrap())
}

pub(super) async fn sensors_found_by_id_prefix_and_address_words(s: &Subject) {
    let at = |id: &str, address: &str| Sensor {
        address: address.into(),
        ..sensor(id)
    };
    s.create_sensor(at("Door1", "Moscow, Svobody st. 23 fl 1 room 16"))
        .await
        .unwrap();
    s.create_sensor(at("Door2", "Moscow, Tverskaya st. 7"))
        .await
        .unwrap();
    s.create_sensor(at("Gate9", "Kazan, Baumana 5, back yard"))
        .await
        .unwrap();
    s.create_sensor(at("door3", "Ulица Lenina 4"))
        .await
        .unwrap();
    s.import(vec![at("Door4", "Svobody square 1")], vec![], 1_000)
        .await
        .unwrap();

    assert_eq!(
        find(&**s, "Door").await,
        ["Door1", "Door2", "Door4"],
        "id prefix, case kept"
    );
    assert_eq!(find(&**s, "door").await, ["door3"]);
    assert_eq!(
        find(&**s, "svobody").await,
        ["Door1", "Door4"],
        "a word, any case"
    );
    assert_eq!(
        find(&**s, "svob 23").await,
        ["Door1"],
        "every word, as prefixes"
    );
    assert_eq!(find(&**s, "moscow").await, ["Door1", "Door2"]);
    assert_eq!(find(&**s, "back-yard").await, ["Gate9"]);
    assert_eq!(find(&**s, "ulица").await, ["door3"]);
    assert!(find(&**s, "yard moscow").await.is_empty());
    assert!(
        find(&**s, "oscow").await.is_empty(),
        "words start where they start"
    );

    // Pages by id, and with the connection filter.
    let first = s
        .find_sensors(
            Search::parse("moscow").unwrap(),
            SensorFilter::default(),
            None,
            page(1),
        )
        .await
        .unwrap();
    assert_eq!(found(&first), ["Door1"]);
    let next = s
        .find_sensors(
            Search::parse("moscow").unwrap(),
            SensorFilter::default(),
            None,
            PageRequest {
                limit: 1,
                after: first.next,
            },
        )
        .await
        .unwrap();
    assert_eq!(found(&next), ["Door2"]);
    assert_eq!(next.next, None);
    s.commit(change("Door2", true, None, 5_000), 5_000)
        .await
        .unwrap();
    let online = s
        .find_sensors(
            Search::parse("moscow").unwrap(),
            SensorFilter::connection(Some(Connection::Online)),
            None,
            page(10),
        )
        .await
        .unwrap();
    assert_eq!(found(&online), ["Door2"]);
    // And with the door alarms' filters, which the search keeps as the list does.
    let mut held = change("Door1", true, None, 5_500);
    held.states[0].hold = Some(crate::domain::hold::Hold {
        since: 1_000,
        sent: 1,
    });
    held.states[0].signals.tamper = Some(true);
    s.commit(held, 5_500).await.unwrap();
    let by = |filter: SensorFilter| {
        s.find_sensors(Search::parse("moscow").unwrap(), filter, None, page(10))
    };
    let held = SensorFilter {
        held: Some(true),
        ..SensorFilter::default()
    };
    assert_eq!(found(&by(held).await.unwrap()), ["Door1"]);
    let not_held = SensorFilter {
        held: Some(false),
        ..SensorFilter::default()
    };
    assert_eq!(found(&by(not_held).await.unwrap()), ["Door2"]);
    let tampered = SensorFilter {
        tamper: Some(true),
        ..SensorFilter::default()
    };
    assert_eq!(found(&by(tampered).await.unwrap()), ["Door1"]);
    let flapping = SensorFilter {
        flapping: Some(true),
        ..SensorFilter::default()
    };
    assert!(found(&by(flapping).await.unwrap()).is_empty());
    let low = SensorFilter {
        battery_low: Some(false),
        ..SensorFilter::default()
    };
    assert_eq!(found(&by(low).await.unwrap()), ["Door1", "Door2"]);

    // With a site: that site's sensors only.
    s.create_site(super::silences::site("fs-a", None))
        .await
        .unwrap();
    s.replace_sensor(
        sid("Door2"),
        "Moscow, Tverskaya st. 7".into(),
        None,
        None,
        Some("fs-a".into()),
        Default::default(),
        6_000,
    )
    .await
    .unwrap();
    let in_site = |site: &str| {
        s.find_sensors(
            Search::parse("moscow").unwrap(),
            SensorFilter::default(),
            Some(site.into()),
            page(10),
        )
    };
    assert_eq!(found(&in_site("fs-a").await.unwrap()), ["Door2"]);
    assert!(found(&in_site("fs-b").await.unwrap()).is_empty());

    // A new address is found by its words, the old one no longer; a deleted sensor is gone.
    s.replace_sensor(
        sid("Door1"),
        "Novgorod, Mira 2".into(),
        None,
        None,
        None,
        Default::default(),
        9_000,
    )
    .await
    .unwrap();
    assert_eq!(find(&**s, "svobody").await, ["Door4"]);
    assert_eq!(find(&**s, "novgorod").await, ["Door1"]);
    s.delete_sensor(sid("Door4"), 9_000).await.unwrap();
    assert!(find(&**s, "svobody").await.is_empty());
    assert_eq!(find(&**s, "Door").await, ["Door1", "Door2"]);
}

pub(super) async fn clients_found_by_name(s: &Subject) {
    for (id, name) in [
        ("cf-1", "Acme Doors"),
        ("cf-2", "Globex"),
        ("cf-3", "ÉCOLE acme"),
    ] {
        s.create_client(Client {
            name: name.into(),
            ..client(id, "http://a/")
        })
        .await
        .unwrap();
    }
    let names = |p: Page<Client>| p.items.into_iter().map(|c| c.name).collect::<Vec<_>>();
    let search = Search::parse("ACME").unwrap();
    let got = find_clients(&**s, &search, None, page(10)).await.unwrap();
    assert_eq!(names(got), ["Acme Doors", "ÉCOLE acme"]);
    let got = find_clients(&**s, &Search::parse("école").unwrap(), None, page(10))
        .await
        .unwrap();
    assert_eq!(names(got), ["ÉCOLE acme"], "case aside beyond ASCII");
    let first = find_clients(&**s, &search, None, page(1)).await.unwrap();
    assert!(first.next.is_some());
    let next = find_clients(
        &**s,
        &search,
        None,
        PageRequest {
            limit: 1,
            after: first.next,
        },
    )
    .await
    .unwrap();
    assert_eq!(names(next), ["ÉCOLE acme"]);
}

/// Issue #70: a sensor's notifications include the site events that named it, though they
/// travel in another sensor's lane; with a type, only those of that type.
pub(super) async fn a_sensor_finds_the_site_events_that_named_it(s: &Subject) {
    use super::silences::RULES;
    super::site_edges::fill(s, "sn-a", &["sn1", "sn2", "sn3", "sn4", "sn5"], "snc").await;
    for id in ["sn1", "sn2", "sn3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    let lost = s.decide_sites(RULES, 36_000).await.unwrap().made;
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].sensor_id, sid("sn1"), "in the first one's lane");
    // sn1 comes back: the return names it restored, sn2 and sn3 still lost.
    s.commit(
        liveness("sn1", EventKind::ConnectionRestored, 40_000),
        40_000,
    )
    .await
    .unwrap();
    let back = s.decide_sites(RULES, 41_000).await.unwrap().made;
    assert_eq!(back.len(), 1, "{back:?}");
    let of = |sensor: &str, kind: Option<EventKind>| NotificationFilter {
        sensor_id: Some(sid(sensor)),
        kind,
        ..Default::default()
    };
    let list = |f: NotificationFilter| async move {
        let got = s.list_notifications(f, page(100)).await.unwrap();
        got.items.into_iter().map(|n| n.id).collect::<Vec<_>>()
    };
    let both = vec![lost[0].id.clone(), back[0].id.clone()];
    for sensor in ["sn1", "sn2", "sn3"] {
        assert_eq!(list(of(sensor, None)).await, both, "{sensor}");
    }
    assert_eq!(
        list(of("sn3", Some(EventKind::SiteConnectionLost))).await,
        [lost[0].id.clone()]
    );
    assert_eq!(
        list(of("sn2", Some(EventKind::SiteConnectionRestored))).await,
        [back[0].id.clone()]
    );
    assert!(
        list(of("sn3", Some(EventKind::ConnectionLost)))
            .await
            .is_empty()
    );
    assert!(list(of("sn4", None)).await.is_empty(), "never named");
    // Newest first, paged one by one, as the console asks.
    let mut f = of("sn2", None);
    f.newest_first = true;
    let first = s.list_notifications(f.clone(), page(1)).await.unwrap();
    assert_eq!(first.items[0].id, back[0].id);
    let next = s
        .list_notifications(
            f,
            PageRequest {
                limit: 1,
                after: first.next,
            },
        )
        .await
        .unwrap();
    assert_eq!(next.items[0].id, lost[0].id);
}
