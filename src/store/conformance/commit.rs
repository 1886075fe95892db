//! Checks of the group commit: state, history and the notifications a batch creates.

use super::*;

pub(super) async fn commit_creates_state_history_and_outbox(s: &Subject) {
    s.create_sensor(sensor("cm1")).await.unwrap();
    s.create_client(client("cm-a", "http://a/")).await.unwrap();
    s.create_client(client("cm-b", "http://b/")).await.unwrap();
    s.link("cm-a".into(), sid("cm1"), 1).await.unwrap();
    s.link("cm-b".into(), sid("cm1"), 1).await.unwrap();

    let created = s
        .commit(change("cm1", true, None, 10_000), 10_000)
        .await
        .unwrap();
    assert_eq!(created.len(), 2, "one notification per linked client");
    assert!(created[0].seq < created[1].seq);
    let (_, status) = s.get_sensor(sid("cm1")).await.unwrap().unwrap();
    assert_eq!(status.data, Some(true));
    assert_eq!(status.changed_at, Some(10_000));
    assert_eq!(status.connection, Connection::Online);

    // A state write without a change leaves changed_at as stored.
    let mut repeat = change("cm1", true, None, 10_500);
    repeat.events.clear();
    repeat.readings.clear();
    repeat.states[0].changed_at = None;
    s.commit(repeat, 10_500).await.unwrap();
    let (_, status) = s.get_sensor(sid("cm1")).await.unwrap().unwrap();
    assert_eq!(status.changed_at, Some(10_000), "kept when unchanged");
    assert_eq!(status.last_seen_at, Some(10_500));

    // A newer change supersedes the older pending, unleased ones.
    let newer = s
        .commit(change("cm1", false, Some(true), 20_000), 20_000)
        .await
        .unwrap();
    let first = s
        .get_notification(created[0].id.clone())
        .await
        .unwrap()
        .unwrap()
        .0;
    assert_eq!(first.status, Status::Superseded);
    let pending = s.load_pending(i64::MIN).await.unwrap();
    let newest = s.load_pending(newer[0].seq).await.unwrap();
    assert_eq!(
        newest.iter().map(|p| p.seq).collect::<Vec<_>>(),
        vec![newer[1].seq],
        "a sweep after a seq sees only what came later"
    );
    let ids: Vec<&str> = pending.iter().map(|p| p.id.as_str()).collect();
    assert!(ids.contains(&newer[0].id.as_str()) && !ids.contains(&created[0].id.as_str()));

    let rt = s.load_runtime().await.unwrap();
    let cm = &rt.iter().find(|r| r.0 == sid("cm1")).unwrap().1;
    assert_eq!(cm.data, Some(false));
    assert_eq!(cm.last_ts, Some(20_000));

    let readings = s
        .list_readings(sid("cm1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert_eq!(readings.items.len(), 2);
    let ranged = s
        .list_readings(
            sid("cm1"),
            TimeRange {
                from: Some(15_000),
                to: None,
            },
            page(10),
        )
        .await
        .unwrap();
    assert_eq!(ranged.items.len(), 1);
    assert!(!ranged.items[0].row.data);
    let events = s
        .list_events(sid("cm1"), TimeRange::default(), page(1))
        .await
        .unwrap();
    assert_eq!(events.items.len(), 1);
    let rest = s
        .list_events(
            sid("cm1"),
            TimeRange::default(),
            PageRequest {
                limit: 1,
                after: events.next,
            },
        )
        .await
        .unwrap();
    assert_eq!(rest.items[0].row.previous, Some(true));
    assert_eq!(rest.next, None);

    // Filters of the notification list.
    let f = NotificationFilter {
        client_id: Some("cm-a".into()),
        sensor_id: Some(sid("cm1")),
        status: Some(Status::Superseded),
        ..Default::default()
    };
    let listed = s.list_notifications(f, page(10)).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].id, created[0].id);
}

/// A sweep that read some pending notifications a second ago is told only of the others,
/// in outbox order, and never of one that is no longer pending.
pub(super) async fn a_sweep_is_told_only_of_what_it_did_not_read(s: &Subject) {
    s.create_sensor(sensor("kn1")).await.unwrap();
    s.create_sensor(sensor("kn2")).await.unwrap();
    s.create_client(client("kn-a", "http://a/")).await.unwrap();
    s.link("kn-a".into(), sid("kn1"), 1).await.unwrap();
    s.link("kn-a".into(), sid("kn2"), 1).await.unwrap();
    let mut made = Vec::new();
    let changes = [
        ("kn1", true, None),
        ("kn2", true, None),
        ("kn1", false, Some(true)),
    ];
    for (i, (id, data, previous)) in changes.into_iter().enumerate() {
        let at = 10_000 + 1_000 * i as i64;
        made.extend(s.commit(change(id, data, previous, at), at).await.unwrap());
    }
    // The third supersedes the first: kn1's 1 is not pending any more.
    let mine = |refs: Vec<NotificationRef>| -> Vec<i64> {
        refs.iter()
            .filter(|r| made.iter().any(|m| m.seq == r.seq))
            .map(|r| r.seq)
            .collect()
    };
    let all = mine(s.load_pending(i64::MIN).await.unwrap());
    assert_eq!(all, vec![made[1].seq, made[2].seq]);
    let none = Arc::new(std::collections::BTreeSet::new());
    let unknown = s.load_pending_unknown(i64::MIN, none).await.unwrap();
    assert_eq!(mine(unknown), all, "nothing known: every pending one");
    let known = Arc::new([made[0].seq, made[1].seq].into_iter().collect());
    let unknown = s.load_pending_unknown(i64::MIN, known).await.unwrap();
    assert_eq!(mine(unknown), vec![made[2].seq], "the ones not read before");
    let known = Arc::new([made[2].seq].into_iter().collect());
    let unknown = s.load_pending_unknown(made[1].seq, known).await.unwrap();
    assert!(mine(unknown).is_empty(), "past the mark, all known");
}

pub(super) async fn lost_state_survives_and_filters(s: &Subject) {
    s.create_sensor(sensor("lv1")).await.unwrap();
    s.create_client(client("lv-a", "http://a/")).await.unwrap();
    s.link("lv-a".into(), sid("lv1"), 1).await.unwrap();
    s.commit(change("lv1", true, None, 1_000), 1_000)
        .await
        .unwrap();
    let lost = CommitBatch {
        readings: vec![],
        states: vec![StateUpdate {
            sensor_id: sid("lv1"),
            data: Some(true),
            changed_at: Some(1_000),
            last_ts: Some(1_000),
            last_seen_at: Some(1_000),
            connection: Connection::Lost,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            signals: Default::default(),
            hold: None,
            flapping: None,
            seen_only: false,
        }],
        events: vec![Event {
            sensor_id: sid("lv1"),
            kind: EventKind::ConnectionLost,
            at: 61_000,
            data: Some(true),
            previous: None,
            last_seen_at: Some(1_000),
            detail: Default::default(),
        }],
        ..Default::default()
    };
    let created = s.commit(lost, 61_000).await.unwrap();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].kind, EventKind::ConnectionLost);
    let (n, _) = s
        .get_notification(created[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((n.data, n.last_seen_at), (Some(true), Some(1_000)));
    let rt = s.load_runtime().await.unwrap();
    assert_eq!(
        rt.iter().find(|r| r.0 == sid("lv1")).unwrap().1.connection,
        Connection::Lost
    );
    let lost = s
        .list_sensors(
            crate::store::SensorFilter::connection(Some(Connection::Lost)),
            page(1000),
        )
        .await
        .unwrap();
    assert!(lost.items.iter().any(|(x, _)| x.id == sid("lv1")));
    let events = s
        .list_events(sid("lv1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert_eq!(
        events.items.last().unwrap().row.kind,
        EventKind::ConnectionLost
    );
    assert_eq!(events.items.last().unwrap().row.last_seen_at, Some(1_000));
}

/// A batch of several events: one notification per event and linked client, in event
/// order and clients in id order, each returned as stored; an unregistered sensor's event
/// notifies nobody; and of one sensor's two changes in a batch, the later supersedes the
/// earlier's notifications.
pub(super) async fn a_batch_notifies_in_event_then_client_order(s: &Subject) {
    for id in ["bo1", "bo2"] {
        s.create_sensor(sensor(id)).await.unwrap();
    }
    for c in ["bo-b", "bo-a", "bo-c"] {
        s.create_client(client(c, "http://x/")).await.unwrap();
    }
    for (c, id) in [("bo-b", "bo1"), ("bo-a", "bo1"), ("bo-c", "bo2")] {
        s.link(c.into(), sid(id), 1).await.unwrap();
    }
    let earlier = s
        .commit(change("bo2", true, None, 1_000), 1_000)
        .await
        .unwrap();
    let mut batch = change("bo1", true, None, 2_000);
    batch.append(change("ghost", true, None, 2_000));
    let mut again = change("bo1", false, Some(true), 2_001);
    batch.readings.append(&mut again.readings);
    batch.events.append(&mut again.events);
    batch.states[0] = again.states.remove(0);
    batch.append(change("bo2", false, Some(true), 2_002));
    let created = s.commit(batch, 2_002).await.unwrap();

    let order: Vec<(&str, String, EventKind)> = created
        .iter()
        .map(|n| (n.client_id.as_str(), n.sensor_id.to_string(), n.kind))
        .collect();
    let changed = EventKind::StateChanged;
    assert_eq!(
        order,
        [
            ("bo-a", "bo1".to_string(), changed),
            ("bo-b", "bo1".to_string(), changed),
            ("bo-a", "bo1".to_string(), changed),
            ("bo-b", "bo1".to_string(), changed),
            ("bo-c", "bo2".to_string(), changed),
        ],
        "event order, then client id order; the unregistered sensor notifies nobody"
    );
    assert!(
        created.windows(2).all(|w| w[0].seq < w[1].seq) && earlier[0].seq < created[0].seq,
        "seqs grow across and within commits"
    );
    let mut statuses = Vec::new();
    for n in &created {
        let (stored, _) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
        assert_eq!(
            (stored.seq, stored.client_id.as_str(), stored.sensor_id),
            (n.seq, n.client_id.as_str(), n.sensor_id),
            "returned as stored"
        );
        statuses.push((stored.status, stored.data));
    }
    use Status::{Pending, Superseded};
    assert_eq!(
        statuses,
        [
            (Superseded, Some(true)),
            (Superseded, Some(true)),
            (Pending, Some(false)),
            (Pending, Some(false)),
            (Pending, Some(false)),
        ],
        "bo1's second change supersedes its first"
    );
    let (first, _) = s
        .get_notification(earlier[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.status, Superseded, "bo2's older change too");
}
