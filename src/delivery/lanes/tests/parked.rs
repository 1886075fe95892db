//! A disabled client's lanes: parked until it is enabled, then going in order at once,
//! and asked about again after a while.

use super::*;

#[test]
fn a_disabled_clients_lanes_park_until_it_is_resumed() {
    let mut h = Harness::new(false, HOUR);
    let a = h.notify(1, 0, EventKind::ConnectionLost);
    let b = h.notify(1, 0, EventKind::ConnectionRestored);
    let out = h.admit();
    assert_eq!(out.len(), 1);
    h.finish(out.into_iter().next().unwrap(), Finished::Parked);
    h.now += 1000;
    assert!(h.admit().is_empty(), "parked: no claim again soon");
    let pending: Vec<NotificationRef> = [(&a, 1), (&b, 2)]
        .into_iter()
        .map(|(id, seq)| NotificationRef {
            client_id: "client1".into(),
            kind: EventKind::ConnectionLost,
            ..back(id, 0, seq, h.now)
        })
        .collect();
    assert!(h.core.resume("client1", pending, h.now).is_empty());
    assert_eq!(h.core.pending(), 2, "nothing queued twice");
    let out = h.admit();
    assert_eq!(out.iter().map(|(_, id)| id).collect::<Vec<_>>(), vec![&a]);
    h.finish(out.into_iter().next().unwrap(), answer(200, h.now));
    let out = h.admit();
    assert_eq!(out.iter().map(|(_, id)| id).collect::<Vec<_>>(), vec![&b]);
}

#[test]
fn a_parked_head_an_older_one_was_replayed_before_follows_it_once_resumed() {
    // A disabled client's lane parks its head; a failed older one of the lane is replayed
    // in front of it; the client is enabled: both go, in order, without the minute the
    // parked head was to wait before its client was looked at again.
    let mut h = Harness::new(false, HOUR);
    h.seq = 10;
    let parked = h.notify(1, 0, EventKind::ConnectionLost);
    let out = h.admit();
    h.finish(out.into_iter().next().unwrap(), Finished::Parked);
    h.now += 1000;
    let older = NotificationRef {
        client_id: "client1".into(),
        ..back(&ulid::Ulid::new().to_string(), 0, 3, h.now)
    };
    assert!(h.core.add(vec![older.clone()], h.now).is_empty());
    assert!(h.admit().is_empty(), "still parked");
    assert!(h.core.resume("client1", Vec::new(), h.now).is_empty());
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&older.id]);
    h.finish(out.into_iter().next().unwrap(), answer(200, h.now));
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&parked]);
}

#[test]
fn a_parked_lane_asks_again_after_a_while() {
    let mut h = Harness::new(false, HOUR);
    h.change(1, 0);
    let out = h.admit();
    h.finish(out.into_iter().next().unwrap(), Finished::Parked);
    h.now += PARK_RECHECK_MS - 1;
    assert!(h.admit().is_empty());
    h.now += 1;
    assert_eq!(h.admit().len(), 1);
}
