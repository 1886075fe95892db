//! Checks of the registry: sensors, clients, links, import, deletes and the changes other
//! nodes follow.

use super::*;

pub(super) async fn sensors_crud_and_pagination(s: &Subject) {
    for i in 0..25 {
        s.create_sensor(sensor(&format!("pg{i:02}"))).await.unwrap();
    }
    assert!(matches!(
        s.create_sensor(sensor("pg00")).await,
        Err(Error::Conflict(_))
    ));
    let mut seen = vec![];
    let mut req = page(10);
    loop {
        let p = s
            .list_sensors(crate::store::SensorFilter::default(), req.clone())
            .await
            .unwrap();
        seen.extend(p.items.iter().map(|(x, _)| x.id.to_string()));
        match p.next {
            Some(n) => req.after = Some(n),
            None => break,
        }
    }
    let expected: Vec<String> = (0..25).map(|i| format!("pg{i:02}")).collect();
    assert_eq!(seen, expected, "pages cover every sensor once, in id order");

    let (got, status) = s.get_sensor(sid("pg03")).await.unwrap().unwrap();
    assert_eq!(got.address, "address of pg03");
    assert_eq!(status, SensorStatus::default());
    let replaced = s
        .replace_sensor(
            sid("pg03"),
            "new place".into(),
            Some(60),
            Some(5),
            None,
            Default::default(),
            4,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(replaced.0.0.address, "new place");
    assert_eq!(replaced.0.0.heartbeat_timeout_s, Some(60));
    assert_eq!(replaced.0.0.debounce_s, Some(5));
    assert!(replaced.1.is_empty(), "it left no site: nothing to make");
    assert!(
        s.replace_sensor(
            sid("nope"),
            "x".into(),
            None,
            None,
            None,
            Default::default(),
            4
        )
        .await
        .unwrap()
        .is_none()
    );
    assert!(s.delete_sensor(sid("pg03"), 5).await.unwrap());
    assert!(!s.delete_sensor(sid("pg03"), 5).await.unwrap());
    assert!(s.get_sensor(sid("pg03")).await.unwrap().is_none());
    let unknown = s
        .list_sensors(
            crate::store::SensorFilter::connection(Some(Connection::Unknown)),
            page(1000),
        )
        .await
        .unwrap();
    assert_eq!(unknown.items.len(), 24);
    let online = s
        .list_sensors(
            crate::store::SensorFilter::connection(Some(Connection::Online)),
            page(1000),
        )
        .await
        .unwrap();
    assert!(online.items.is_empty());
    assert!(matches!(
        s.list_readings(
            sid("pg01"),
            TimeRange::default(),
            PageRequest {
                limit: 5,
                after: Some("junk".into())
            }
        )
        .await,
        Err(Error::BadCursor)
    ));
}

pub(super) async fn clients_and_links(s: &Subject) {
    s.create_client(client("cA", "http://a/")).await.unwrap();
    s.create_client(client("cB", "http://b/")).await.unwrap();
    s.create_sensor(sensor("ln1")).await.unwrap();
    assert!(matches!(
        s.link("cX".into(), sid("ln1"), 1).await,
        Err(Error::NotFound("client"))
    ));
    assert!(matches!(
        s.link("cA".into(), sid("zz"), 1).await,
        Err(Error::NotFound("sensor"))
    ));
    s.link("cA".into(), sid("ln1"), 1).await.unwrap();
    s.link("cA".into(), sid("ln1"), 1).await.unwrap(); // idempotent
    s.link("cB".into(), sid("ln1"), 1).await.unwrap();
    let clients = s.list_sensor_clients(sid("ln1"), page(10)).await.unwrap();
    assert_eq!(
        clients
            .items
            .iter()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        ["cA", "cB"]
    );
    let sensors = s.list_client_sensors("cA".into(), page(10)).await.unwrap();
    assert_eq!(sensors.items.len(), 1);
    s.unlink("cB".into(), sid("ln1")).await.unwrap();
    s.unlink("cB".into(), sid("ln1")).await.unwrap(); // idempotent
    assert_eq!(
        s.list_sensor_clients(sid("ln1"), page(10))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let mut c = s.get_client("cB".into()).await.unwrap().unwrap();
    c.url = "http://b2/".into();
    assert!(s.replace_client(c).await.unwrap());
    assert_eq!(
        s.get_client("cB".into()).await.unwrap().unwrap().url,
        "http://b2/"
    );
    assert!(!s.replace_client(client("cZ", "http://z/")).await.unwrap());
    assert!(matches!(
        s.list_client_sensors("cZ".into(), page(10)).await,
        Err(Error::NotFound("client"))
    ));
}

pub(super) async fn import_skips_what_exists(s: &Subject) {
    s.create_client(client("im-a", "http://a/")).await.unwrap();
    s.create_sensor(sensor("im0")).await.unwrap();
    let sensors: Vec<Sensor> = (0..3).map(|i| sensor(&format!("im{i}"))).collect();
    let links = vec![
        ("im-a".to_string(), sid("im1")),
        ("nobody".to_string(), sid("im2")),
        ("im-a".to_string(), sid("imX")),
    ];
    s.import(sensors, links, 1_000).await.unwrap();
    for i in 0..3 {
        assert!(
            s.get_sensor(sid(&format!("im{i}")))
                .await
                .unwrap()
                .is_some()
        );
    }
    let linked = s
        .list_client_sensors("im-a".into(), page(10))
        .await
        .unwrap();
    assert_eq!(linked.items.len(), 1);
    assert_eq!(linked.items[0].0.id, sid("im1"));
}

pub(super) async fn deletes_cancel_pending(s: &Subject) {
    s.create_sensor(sensor("dl1")).await.unwrap();
    s.create_sensor(sensor("dl2")).await.unwrap();
    s.create_client(client("dl-a", "http://a/")).await.unwrap();
    s.create_client(client("dl-b", "http://b/")).await.unwrap();
    s.link("dl-a".into(), sid("dl1"), 1).await.unwrap();
    s.link("dl-b".into(), sid("dl2"), 1).await.unwrap();
    let a = s
        .commit(change("dl1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let b = s
        .commit(change("dl2", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    assert!(s.delete_sensor(sid("dl1"), 2).await.unwrap());
    assert!(s.delete_client("dl-b".into(), 2).await.unwrap());
    for id in [a.id, b.id] {
        assert_eq!(
            s.get_notification(id).await.unwrap().unwrap().0.status,
            Status::Cancelled
        );
    }
    assert!(
        s.list_readings(sid("dl1"), TimeRange::default(), page(10))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // A batch for a sensor deleted meanwhile does not bring its state back.
    s.commit(change("dl1", false, Some(true), 3), 3)
        .await
        .unwrap();
    assert!(s.get_sensor(sid("dl1")).await.unwrap().is_none());
    assert!(
        s.load_runtime()
            .await
            .unwrap()
            .iter()
            .all(|r| r.0 != sid("dl1"))
    );
    // Nor its history, with or without a state row in the batch.
    let mut no_state = change("dl1", true, Some(false), 4);
    no_state.states.clear();
    s.commit(no_state, 4).await.unwrap();
    let readings = s.list_readings(sid("dl1"), TimeRange::default(), page(10));
    assert!(readings.await.unwrap().items.is_empty());
    let events = s.list_events(sid("dl1"), TimeRange::default(), page(10));
    assert!(events.await.unwrap().items.is_empty());
}

pub(super) async fn registry_changes_follow_create_change_delete(s: &Subject) {
    // One process per store has nothing to follow: its engine saw every change itself.
    let Some(cluster) = &s.cluster else {
        return;
    };
    let start = cluster.newest_registry_change().await.unwrap();
    s.create_sensor(sensor("rg1")).await.unwrap();
    s.replace_sensor(
        sid("rg1"),
        "moved".into(),
        Some(90),
        None,
        None,
        Default::default(),
        1,
    )
    .await
    .unwrap();
    s.create_sensor(sensor("rg2")).await.unwrap();
    s.delete_sensor(sid("rg2"), 1).await.unwrap();
    let (newest, changes) = cluster.registry_changes(start).await.unwrap();
    assert!(newest > start);
    let rg1 = changes.iter().find(|(id, _)| *id == sid("rg1")).unwrap();
    assert_eq!(
        rg1.1.unwrap().1.heartbeat_timeout_s,
        Some(90),
        "its state now"
    );
    let rg2 = changes.iter().find(|(id, _)| *id == sid("rg2")).unwrap();
    assert_eq!(rg2.1, None, "deleted");
    assert_eq!(changes.len(), 2, "one entry per sensor");
    let (same, none) = cluster.registry_changes(newest).await.unwrap();
    assert_eq!((same, none.len()), (newest, 0));
    cluster.prune_registry_changes(i64::MAX).await.unwrap();
    assert!(cluster.registry_changes(start).await.unwrap().1.is_empty());
}

pub(super) async fn counts_by_connection(s: &Subject) {
    assert_eq!(
        s.count_sensors().await.unwrap(),
        ConnectionCounts::default()
    );
    for id in ["fc1", "fc2", "fc3", "fc4"] {
        s.create_sensor(sensor(id)).await.unwrap();
    }
    let state = |id: &str, connection| StateUpdate {
        sensor_id: sid(id),
        data: Some(true),
        changed_at: Some(1_000),
        last_ts: Some(1_000),
        last_seen_at: Some(1_000),
        connection,
        last_source: None,
        debounce: None,
        lost_since: None,
        reminders: None,
        signals: Default::default(),
        hold: None,
        flapping: None,
        seen_only: false,
    };
    let batch = CommitBatch {
        states: vec![
            state("fc1", Connection::Online),
            state("fc2", Connection::Online),
            state("fc3", Connection::Lost),
        ],
        ..Default::default()
    };
    s.commit(batch, 1_000).await.unwrap();
    let counts = ConnectionCounts {
        online: 2,
        lost: 1,
        unknown: 1,
        ..ConnectionCounts::default()
    };
    assert_eq!(s.count_sensors().await.unwrap(), counts);
    assert!(s.delete_sensor(sid("fc3"), 2_000).await.unwrap());
    assert_eq!(
        s.count_sensors().await.unwrap(),
        ConnectionCounts { lost: 0, ..counts }
    );
    // Door alarms open: one held open, one low on battery and flapping.
    let held = StateUpdate {
        hold: Some(crate::domain::hold::Hold {
            since: 500,
            sent: 1,
        }),
        ..state("fc1", Connection::Online)
    };
    let mut worn = state("fc2", Connection::Online);
    worn.signals.battery_low = true;
    worn.flapping = Some(crate::domain::flap::FlapState {
        start: 900,
        count: 3,
        last: 1_000,
        told: Some(Some(true)),
    });
    let counting = StateUpdate {
        flapping: Some(crate::domain::flap::FlapState {
            told: None,
            ..worn.flapping.unwrap()
        }),
        hold: Some(crate::domain::hold::Hold::new(900)),
        ..state("fc4", Connection::Online)
    };
    let batch = CommitBatch {
        states: vec![held, worn, counting],
        ..Default::default()
    };
    s.commit(batch, 3_000).await.unwrap();
    let doors = s.count_sensors().await.unwrap();
    assert_eq!(
        (doors.held, doors.battery_low, doors.flapping, doors.online),
        (1, 1, 1, 3),
        "a hold not yet alarmed and a count not yet flapping are not counted"
    );
}
