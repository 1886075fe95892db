//! Checks of what a client receives under its control (issue #36): a client's `events`
//! filter what the commit makes, and the sensor state behind debounce, reminders and broker
//! links survives a reload, with the figures events and notifications carry.

use super::*;
use crate::domain::sensor::Debounce;
use crate::domain::{Detail, Source};

fn subscribed(id: &str, url: &str, events: Option<&[&str]>) -> Client {
    Client {
        events: events.map(|e| e.iter().map(|t| t.to_string()).collect()),
        ..client(id, url)
    }
}

async fn runtime_of(s: &dyn Store, id: &str) -> crate::domain::sensor::SensorState {
    let rt = s.load_runtime().await.unwrap();
    rt.into_iter().find(|r| r.0 == sid(id)).unwrap().1
}

/// A type a client does not want makes no notification for it: no row at all.
pub(super) async fn subscriptions_make_only_wanted_notifications(s: &Subject) {
    s.create_sensor(sensor("sb1")).await.unwrap();
    let clients = [
        subscribed("sb-all", "http://a/", None),
        subscribed("sb-lost", "http://b/", Some(&["sensor.connection_lost"])),
        subscribed("sb-none", "http://c/", Some(&[])),
    ];
    for c in clients {
        s.create_client(c).await.unwrap();
    }
    for c in ["sb-all", "sb-lost", "sb-none"] {
        s.link(c.into(), sid("sb1"), 1).await.unwrap();
    }
    let events_of = async |id: &str| s.get_client(id.into()).await.unwrap().unwrap().events;
    assert_eq!(events_of("sb-all").await, None);
    assert_eq!(
        events_of("sb-lost").await,
        Some(vec!["sensor.connection_lost".to_string()])
    );
    assert_eq!(events_of("sb-none").await, Some(vec![]));

    let mut batch = change("sb1", true, None, 1_000);
    let lost = Event {
        kind: EventKind::ConnectionLost,
        at: 2_000,
        ..batch.events[0].clone()
    };
    batch.events.push(lost);
    let created = s.commit(batch, 2_000).await.unwrap();
    let got: Vec<(&str, EventKind)> = created
        .iter()
        .map(|n| (n.client_id.as_str(), n.kind))
        .collect();
    assert_eq!(
        got,
        [
            ("sb-all", EventKind::StateChanged),
            ("sb-all", EventKind::ConnectionLost),
            ("sb-lost", EventKind::ConnectionLost),
        ]
    );
    let listed = async |id: &str| {
        let filter = NotificationFilter {
            client_id: Some(id.into()),
            ..Default::default()
        };
        s.list_notifications(filter, page(10)).await.unwrap().items
    };
    assert!(listed("sb-none").await.is_empty(), "nothing made for it");
    assert_eq!(listed("sb-lost").await.len(), 1);

    // A changed subscription counts from the next commit.
    let mut c = s.get_client("sb-none".into()).await.unwrap().unwrap();
    c.events = None;
    assert!(s.replace_client(c).await.unwrap());
    let created = s
        .commit(change("sb1", false, Some(true), 3_000), 3_000)
        .await
        .unwrap();
    let to: Vec<&str> = created.iter().map(|n| n.client_id.as_str()).collect();
    assert_eq!(to, ["sb-all", "sb-none"]);
}

/// How the last reading came in, a debounce window, and while lost since when and how many
/// reminders went out, are kept; `lost_since` and `reminders` are kept when a write does
/// not hold them and cleared once the sensor is not lost.
pub(super) async fn state_keeps_source_window_and_reminders(s: &Subject) {
    let own = Sensor {
        debounce_s: Some(30),
        ..sensor("sx1")
    };
    s.create_sensor(own).await.unwrap();
    s.create_client(client("sx-a", "http://a/")).await.unwrap();
    s.link("sx-a".into(), sid("sx1"), 1).await.unwrap();
    assert_eq!(
        s.get_sensor(sid("sx1"))
            .await
            .unwrap()
            .unwrap()
            .0
            .debounce_s,
        Some(30)
    );

    for from in [Some(false), None] {
        let window = Debounce {
            from,
            at: 900,
            since: 1_000,
            flips: 3,
        };
        let mut batch = change("sx1", true, None, 1_000);
        batch.events.clear();
        batch.states[0].last_source = Some(Source::Mqtt);
        batch.states[0].debounce = Some(window);
        s.commit(batch, 1_000).await.unwrap();
        let rt = runtime_of(&**s, "sx1").await;
        assert_eq!(
            (rt.last_source, rt.debounce, rt.debounce_s),
            (Some(Source::Mqtt), Some(window), Some(30))
        );
    }
    let (_, status) = s.get_sensor(sid("sx1")).await.unwrap().unwrap();
    assert_eq!(status.last_source, Some(Source::Mqtt));

    let state = |connection, lost_since, reminders| StateUpdate {
        sensor_id: sid("sx1"),
        data: Some(true),
        changed_at: None,
        last_ts: Some(1_000),
        last_seen_at: Some(1_000),
        connection,
        last_source: None,
        debounce: None,
        lost_since,
        reminders,
        signals: Default::default(),
        hold: None,
        flapping: None,
        seen_only: false,
    };
    let reminder = Event {
        sensor_id: sid("sx1"),
        kind: EventKind::StillLost,
        at: 65_000,
        data: Some(true),
        previous: None,
        last_seen_at: Some(1_000),
        detail: Detail {
            lost_since: Some(5_000),
            reminder: Some(2),
            flips_suppressed: None,
            ..Detail::default()
        },
    };
    let batch = CommitBatch {
        states: vec![state(Connection::Lost, Some(5_000), Some(2))],
        events: vec![reminder.clone()],
        ..Default::default()
    };
    let created = s.commit(batch, 65_000).await.unwrap();
    let rt = runtime_of(&**s, "sx1").await;
    assert_eq!((rt.lost_since, rt.reminders), (Some(5_000), Some(2)));
    assert_eq!(rt.last_source, Some(Source::Mqtt), "kept when not written");
    assert_eq!(rt.debounce, None, "a window is written as it is");
    let (n, _) = s
        .get_notification(created[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.detail, reminder.detail);
    let events = s
        .list_events(sid("sx1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert_eq!(events.items.last().unwrap().row, reminder);

    // Memory without reminders holds neither: the store keeps them while lost...
    let batch = CommitBatch {
        states: vec![state(Connection::Lost, None, None)],
        ..Default::default()
    };
    s.commit(batch, 66_000).await.unwrap();
    let rt = runtime_of(&**s, "sx1").await;
    assert_eq!((rt.lost_since, rt.reminders), (Some(5_000), Some(2)));
    // ... and drops them once the sensor is back.
    let mut back = change("sx1", false, Some(true), 70_000);
    back.events[0].detail.flips_suppressed = Some(4);
    s.commit(back.clone(), 70_000).await.unwrap();
    let rt = runtime_of(&**s, "sx1").await;
    assert_eq!((rt.lost_since, rt.reminders), (None, None));
    let events = s
        .list_events(sid("sx1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert_eq!(events.items.last().unwrap().row, back.events[0]);
}

/// A sensor's battery threshold and labels, its battery, tamper flag and fault as a commit
/// wrote them, and what a battery or fault notification carries, are kept; a claim reads
/// the labels from the registry, as it reads the address.
pub(super) async fn door_signals_round_trip(s: &Subject) {
    use crate::domain::sensor::{Labels, SensorAlarms};
    use crate::domain::signals::{Fault, SignalState};
    let labels = Labels {
        zero: Some("closed".into()),
        one: Some("open".into()),
    };
    let own = Sensor {
        battery_low_pct: 30,
        labels: labels.clone(),
        ..sensor("ds1")
    };
    s.create_sensor(own).await.unwrap();
    s.create_client(client("ds-a", "http://a/")).await.unwrap();
    s.link("ds-a".into(), sid("ds1"), 1).await.unwrap();
    let (read, _) = s.get_sensor(sid("ds1")).await.unwrap().unwrap();
    assert_eq!((read.battery_low_pct, &read.labels), (30, &labels));

    let jam = Fault::parse("lock_jam").unwrap();
    let signals = SignalState {
        battery: Some(25),
        battery_low: true,
        tamper: Some(true),
        fault: Some(jam),
    };
    let mut batch = change("ds1", true, None, 1_000);
    batch.states[0].signals = signals;
    let alarm = |kind, detail| Event {
        sensor_id: sid("ds1"),
        kind,
        at: 1_000,
        data: None,
        previous: None,
        last_seen_at: None,
        detail,
    };
    let low = Detail {
        battery: Some(25),
        threshold: Some(30),
        ..Detail::default()
    };
    let fault = Detail {
        fault: Some(jam),
        ..Detail::default()
    };
    batch.events.push(alarm(EventKind::BatteryLow, low));
    batch.events.push(alarm(EventKind::Fault, fault));
    let created = s.commit(batch, 1_000).await.unwrap();
    assert_eq!(created.len(), 3);
    let (_, status) = s.get_sensor(sid("ds1")).await.unwrap().unwrap();
    assert_eq!(status.signals, signals);
    let rt = runtime_of(&**s, "ds1").await;
    assert_eq!((rt.battery_low_pct, rt.signals), (30, signals));
    let listed = |battery_below, tamper| async move {
        let filter = SensorFilter {
            battery_below,
            tamper,
            ..SensorFilter::default()
        };
        s.list_sensors(filter, page(10)).await.unwrap().items.len()
    };
    assert_eq!(listed(Some(26), Some(true)).await, 1);
    assert_eq!(listed(Some(25), None).await, 0, "strictly below");
    assert_eq!(listed(None, Some(false)).await, 0);
    for (made, detail) in created[1..].iter().zip([low, fault]) {
        let (n, _) = s.get_notification(made.id.clone()).await.unwrap().unwrap();
        assert_eq!((n.detail, n.data), (detail, None));
    }
    let claims = s
        .claim(
            vec![created[0].id.clone()],
            "n1".into(),
            2_000,
            62_000,
            None,
        )
        .await
        .unwrap();
    match &claims[0] {
        Claim::Send(x) => assert_eq!(x.labels, labels),
        other => panic!("expected a send: {other:?}"),
    }

    // A replace writes both; a later commit writes the signals as they are.
    let alarms = SensorAlarms {
        battery_low_pct: 0,
        ..SensorAlarms::default()
    };
    let (view, _) = s
        .replace_sensor(sid("ds1"), "x".into(), None, None, None, alarms, 3_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (view.0.battery_low_pct, view.0.labels),
        (0, Labels::default())
    );
    let mut batch = change("ds1", false, Some(true), 4_000);
    batch.states[0].signals = SignalState {
        tamper: Some(false),
        ..signals
    };
    s.commit(batch, 4_000).await.unwrap();
    let rt = runtime_of(&**s, "ds1").await;
    assert_eq!((rt.battery_low_pct, rt.signals.tamper), (0, Some(false)));
    assert_eq!(rt.signals.fault, Some(jam));
}

/// A sensor's hold alarms (registry) and how far its state held (state) are kept: a
/// create and a replace write the alarms, a commit writes the hold as it is (and `None`
/// clears it), and both come back in the sensor's view and in what the engine loads.
pub(super) async fn hold_alarms_round_trip(s: &Subject) {
    use crate::domain::hold::{Hold, HoldAlarm, HoldAlarms};
    use crate::domain::sensor::SensorAlarms;
    let open = HoldAlarms::from_list(&[HoldAlarm {
        data: 1,
        after_s: 60,
        remind_every_s: Some(300),
    }])
    .unwrap();
    let own = Sensor {
        hold_alarms: open,
        ..sensor("ha1")
    };
    s.create_sensor(own).await.unwrap();
    let (read, status) = s.get_sensor(sid("ha1")).await.unwrap().unwrap();
    assert_eq!((read.hold_alarms, status.hold), (open, None));

    let held = Hold {
        since: 1_000,
        sent: 3,
    };
    let mut batch = change("ha1", true, None, 1_000);
    batch.states[0].hold = Some(held);
    s.commit(batch, 1_000).await.unwrap();
    let (_, status) = s.get_sensor(sid("ha1")).await.unwrap().unwrap();
    assert_eq!(status.hold, Some(held));
    let rt = runtime_of(&**s, "ha1").await;
    assert_eq!((rt.hold_alarms, rt.hold), (open, Some(held)));

    let closed = HoldAlarms::from_list(&[HoldAlarm {
        data: 0,
        after_s: 5,
        remind_every_s: None,
    }])
    .unwrap();
    let alarms = SensorAlarms {
        hold_alarms: closed,
        ..SensorAlarms::default()
    };
    let (view, _) = s
        .replace_sensor(sid("ha1"), "x".into(), None, None, None, alarms, 2_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.0.hold_alarms, closed);
    let mut batch = change("ha1", false, Some(true), 3_000);
    batch.states[0].hold = None;
    s.commit(batch, 3_000).await.unwrap();
    let rt = runtime_of(&**s, "ha1").await;
    assert_eq!((rt.hold_alarms, rt.hold), (closed, None));
}

/// A sensor's flap (registry) and its count of changes (state) are kept, and a
/// `sensor.flapping` notification keeps its threshold and window.
pub(super) async fn flap_round_trip(s: &Subject) {
    use crate::domain::flap::{Flap, FlapState};
    use crate::domain::sensor::SensorAlarms;
    let flap = Flap {
        changes: 6,
        window_s: 60,
    };
    let own = Sensor {
        flap: Some(flap),
        ..sensor("fl1")
    };
    s.create_sensor(own).await.unwrap();
    s.create_client(client("fl-a", "http://a/")).await.unwrap();
    s.link("fl-a".into(), sid("fl1"), 1).await.unwrap();
    let (read, status) = s.get_sensor(sid("fl1")).await.unwrap().unwrap();
    assert_eq!((read.flap, status.flapping), (Some(flap), false));

    let flapping = FlapState {
        start: 1_000,
        count: 6,
        last: 1_900,
        told: Some(Some(true)),
    };
    let mut batch = change("fl1", true, Some(false), 1_900);
    batch.states[0].flapping = Some(flapping);
    batch.events[0].kind = EventKind::Flapping;
    batch.events[0].previous = None;
    batch.events[0].detail = Detail {
        threshold: Some(6),
        window_s: Some(60),
        ..Detail::default()
    };
    let created = s.commit(batch, 1_900).await.unwrap();
    let (n, _) = s
        .get_notification(created[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (n.kind, n.detail.threshold, n.detail.window_s),
        (EventKind::Flapping, Some(6), Some(60))
    );
    let (_, status) = s.get_sensor(sid("fl1")).await.unwrap().unwrap();
    assert!(status.flapping);
    let rt = runtime_of(&**s, "fl1").await;
    assert_eq!((rt.flap, rt.flapping), (Some(flap), Some(flapping)));

    // Counting, not flapping; then a replace that takes the flap away.
    let counting = FlapState {
        told: None,
        count: 2,
        ..flapping
    };
    let mut batch = change("fl1", false, Some(true), 3_000);
    batch.states[0].flapping = Some(counting);
    s.commit(batch, 3_000).await.unwrap();
    let rt = runtime_of(&**s, "fl1").await;
    assert_eq!(rt.flapping, Some(counting));
    let (view, _) = s
        .replace_sensor(
            sid("fl1"),
            "x".into(),
            None,
            None,
            None,
            SensorAlarms::default(),
            4_000,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((view.0.flap, view.1.flapping), (None, false));
}

/// A reading's battery, tamper flag and fault are kept in history as it reported them (a
/// cleared fault apart from one it said nothing of), in the journal and once archived.
pub(super) async fn door_signals_in_history(s: &Subject) {
    use crate::domain::signals::{Fault, Signals};
    s.create_sensor(sensor("dh1")).await.unwrap();
    let said = [
        Signals {
            battery: Some(87),
            tamper: Some(true),
            fault: Some(Some(Fault::parse("lock_jam").unwrap())),
        },
        Signals {
            fault: Some(None),
            ..Signals::default()
        },
        Signals::default(),
    ];
    let mut batch = CommitBatch::default();
    for (i, signals) in said.iter().enumerate() {
        let mut one = change("dh1", i % 2 == 0, None, 1_000 + i as Millis);
        one.readings[0].signals = *signals;
        batch.readings.extend(one.readings);
    }
    s.commit(batch, 2_000).await.unwrap();
    let read = || async {
        s.list_readings(sid("dh1"), TimeRange::default(), page(10))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|r| r.row.signals)
            .collect::<Vec<_>>()
    };
    assert_eq!(read().await, said);
    if let Some(journal) = &s.journal {
        journal.archive_history(1_000_000).await.unwrap();
        assert_eq!(read().await, said, "archived as they were");
    }
}
