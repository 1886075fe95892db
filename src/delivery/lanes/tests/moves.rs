//! The lanes around partition moves and other nodes' leases, a superseded head's timer,
//! and the fold of a disabled client's backlog.

use super::*;

/// A notification another node's sweep would bring: `seq` of lane (client0, sensor 0).
fn swept(seq: i64, kind: EventKind, now: Millis) -> NotificationRef {
    NotificationRef {
        kind,
        ..back(&ulid::Ulid::new().to_string(), 0, seq, now)
    }
}

#[test]
fn a_head_another_node_holds_is_never_superseded_here() {
    // A partition moved here while its old owner sends the lane's head: the sweep brings
    // that head, and a newer state arrives before any claim of ours answered.
    let mut h = Harness::new(true, Duration::from_secs(1));
    h.seq = 10;
    let older = swept(3, EventKind::StateChanged, h.now);
    h.core.sweep(vec![older.clone()], h.now);
    let newer = h.notify(0, 0, EventKind::StateChanged);
    assert!(
        h.outcomes.is_empty(),
        "not superseded over the other node's attempt"
    );
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&older.id]);
    // The store says the other node holds it for half a minute more.
    h.finish(out[0].clone(), Finished::Held(h.now + 30_000));
    let newest = h.notify(0, 0, EventKind::StateChanged);
    assert_eq!(
        h.verdicts(&newer),
        [Verdict::Superseded],
        "the waiting one is superseded"
    );
    assert!(h.verdicts(&older.id).is_empty(), "the held one is not");
    // Nothing of the lane goes while it is held; it is asked about again within a second.
    assert!(h.admit().is_empty());
    h.now += policy::RECHECK_MS;
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&older.id]);
    // The other node recorded its attempt as delivered: the lane goes on at once.
    h.finish(out[0].clone(), Finished::Gone(Status::Delivered));
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&newest]);
}

#[test]
fn a_superseded_heads_lane_is_scheduled_for_its_new_head() {
    // A state fails and waits an hour for its retry; a lost queues behind it; then a newer
    // state supersedes the waiting retry. The lost is due now, not in an hour.
    let mut h = Harness::new(false, HOUR);
    let first = h.notify(0, 0, EventKind::StateChanged);
    assert_eq!(h.answer_all(500), 1);
    assert!(matches!(h.verdicts(&first)[..], [Verdict::Retry { .. }]));
    h.now += 1_000;
    let lost = h.notify(0, 0, EventKind::ConnectionLost);
    h.notify(0, 0, EventKind::StateChanged);
    assert_eq!(
        h.verdicts(&first),
        [
            Verdict::Retry {
                next_at: h.now - 1_000 + HOUR.as_millis() as Millis
            },
            Verdict::Superseded
        ]
    );
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&lost]);
}

#[test]
fn a_disabled_clients_lane_folds_its_outages() {
    // The client is disabled; the sensor goes and comes back a hundred times.
    let mut h = Harness::new(false, HOUR);
    h.notify(0, 0, EventKind::ConnectionLost);
    let out = h.admit();
    h.finish(out[0].clone(), Finished::Parked);
    let mut last = Vec::new();
    for i in 0..100 {
        let restored = h.notify(0, 0, EventKind::ConnectionRestored);
        let lost = h.notify(0, 0, EventKind::ConnectionLost);
        if i == 99 {
            last = vec![restored, lost];
        }
    }
    // The newest outage that ended, and that the sensor is lost now: the rest folded.
    let (pending, lanes) = (h.core.pending(), h.core.sizes().lanes);
    assert_eq!((pending, lanes), (3, 1));
    let superseded = h
        .outcomes
        .iter()
        .filter(|o| o.verdict == Verdict::Superseded && o.attempt.is_none())
        .count();
    assert_eq!(superseded, 198, "each older pair superseded");
    // Enabled again: what is left goes in order.
    let mut sent = Vec::new();
    assert!(h.core.resume("client0", Vec::new(), h.now).is_empty());
    loop {
        let out = h.admit();
        let Some(head) = out.into_iter().next() else {
            break;
        };
        sent.push(head.1.clone());
        h.finish(head, answer(200, h.now));
    }
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[1..], last[..]);
}

#[test]
fn lanes_that_leave_keep_no_timer_and_their_head_in_flight_is_recorded() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    // Sensor 0's head is out; sensor 1's failed and waits for its retry; sensor 2 stays.
    let a = h.notify(0, 0, EventKind::StateChanged);
    h.notify(0, 0, EventKind::ConnectionLost);
    let b = h.notify(0, 1, EventKind::StateChanged);
    h.notify(0, 2, EventKind::StateChanged);
    let out = h.admit();
    assert_eq!(out.len(), 3);
    let (mut a_out, mut rest) = (None, Vec::new());
    for o in out {
        if o.1 == a {
            a_out = Some(o);
        } else {
            rest.push(o);
        }
    }
    for o in rest {
        let status = if o.1 == b { 500 } else { 200 };
        h.finish(o, answer(status, h.now));
    }
    assert!(matches!(h.verdicts(&b)[..], [Verdict::Retry { .. }]));
    // Sensors 0 and 1 move to another node.
    let leaving = h.core.leave(|s| s == sensor(0) || s == sensor(1), 0).0;
    assert_eq!(leaving.len(), 1, "sensor 0's head is out");
    assert_eq!(h.core.pending(), 1, "only the head in flight is left");
    // The attempt in flight ends: recorded as it happened, no retry kept here.
    h.finish(a_out.unwrap(), answer(503, h.now));
    assert!(matches!(h.verdicts(&a)[..], [Verdict::Retry { .. }]));
    h.now += 10_000;
    assert!(h.admit().is_empty(), "no timer left for a lane that moved");
    assert_eq!(
        h.core.sizes(),
        Sizes {
            finished: 1,
            ..Sizes::default()
        },
        "only sensor 2's delivery is remembered (for the sweeps)"
    );
}

#[test]
fn a_head_claimed_but_not_sent_when_its_lane_leaves_gives_its_lease_back() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    assert_eq!(h.core.leave(|_| true, 0).0.len(), 1);
    h.finish(out[0].clone(), Finished::Released { attempts: 3 });
    let o = h.outcomes.last().unwrap();
    assert_eq!(
        (
            o.notification_id.as_str(),
            o.attempt.is_none(),
            o.attempts,
            o.verdict
        ),
        (id.as_str(), true, 3, Verdict::Retry { next_at: h.now })
    );
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn a_client_enabled_through_another_node_resumes_at_the_next_sweep() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit().remove(0);
    h.finish(out, Finished::Parked);
    h.now += 1_000;
    let disabled: Vec<Arc<str>> = vec![Arc::from("client0")];
    h.core.still_disabled(&disabled, h.now);
    assert!(h.admit().is_empty(), "still disabled: parked");
    h.core.still_disabled(&[], h.now);
    assert_eq!(
        h.admit().iter().map(|o| &o.1).collect::<Vec<_>>(),
        [&id],
        "enabled elsewhere: goes at once, not at its next look a minute on"
    );
}

#[test]
fn a_head_whose_claim_failed_gives_back_the_lease_it_may_hold_when_its_lane_leaves() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    let other = h.notify(0, 1, EventKind::StateChanged);
    let out = h.admit();
    assert_eq!(out.len(), 2);
    // The claim's answer was lost: the store may have leased both heads to this node.
    for o in out {
        h.finish(o, Finished::Held(h.now + 1_000));
    }
    let (leaving, given_back) = h.core.leave(|s| s == sensor(0), h.now);
    assert!(leaving.is_empty(), "nothing of sensor 0 is out");
    assert_eq!(given_back.len(), 1, "only the lane that left gives back");
    assert_eq!(given_back[0].notification_id, id);
    assert_eq!(given_back[0].verdict, Verdict::Retry { next_at: h.now });
    assert!(given_back[0].attempt.is_none(), "no attempt was made");
    assert_ne!(given_back[0].notification_id, other);
    // A claim that then succeeds clears the doubt: nothing is given back for it.
    h.now += 1_000;
    let out = h.admit();
    assert_eq!(out.len(), 1);
    h.finish(out[0].clone(), Finished::Later(h.now + 5_000));
    assert!(h.core.leave(|_| true, h.now).1.is_empty());
}

#[test]
fn a_head_claimed_again_after_a_failed_claim_is_not_given_back_while_it_is_out() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    h.finish(out[0].clone(), Finished::Held(h.now + 1_000));
    h.now += 1_000;
    let out = h.admit();
    assert_eq!(out.len(), 1, "claimed again");
    // It is being sent when its lane leaves: its attempt's outcome settles the lease.
    let (leaving, given_back) = h.core.leave(|_| true, h.now);
    assert_eq!(leaving.len(), 1);
    assert!(given_back.is_empty(), "a lease in use is not given back");
}

#[test]
fn an_older_state_queued_behind_a_head_in_flight_does_not_supersede_it() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    h.seq = 10;
    let head = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    assert_eq!(out.len(), 1);
    // An older failed state of the lane is replayed while the head is out.
    let older = back("older", 0, 1, h.now);
    let outcomes = h.core.add(vec![older], h.now);
    h.written(outcomes);
    h.finish(out[0].clone(), answer(500, h.now));
    assert!(
        matches!(h.verdicts(&head)[..], [Verdict::Retry { .. }]),
        "the newest state is tried again, not superseded by an older one: {:?}",
        h.verdicts(&head)
    );
}

#[test]
fn on_a_shared_store_a_head_waits_for_what_it_superseded_to_be_written() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    let older = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    h.finish(out[0].clone(), answer(500, h.now));
    // A newer state supersedes the waiting retry; its outcome is not written yet.
    h.seq += 1;
    let newer = back("newer", 0, h.seq, h.now);
    let unwritten = h.core.add(vec![newer], h.now);
    assert_eq!(unwritten.len(), 1);
    assert_eq!(unwritten[0].notification_id, older);
    assert!(
        h.admit().is_empty(),
        "a claim now would find the older one pending in the store"
    );
    h.written(unwritten);
    let out = h.admit();
    assert_eq!(
        out.len(),
        1,
        "it goes once the older one's outcome is written"
    );
    assert_eq!(out[0].1, "newer");
}

#[test]
fn a_lane_taken_up_again_keeps_a_head_whose_retry_is_not_written_first() {
    // A reminder's failed attempt was on its way to a refusing store when its partition
    // left this node and came back. The store lists both reminders pending: the older
    // one, its outcome not written, still goes first (simulation seed 289: taken up
    // without it, the lane sent the newer one first and the older one after).
    let mut h = Harness::new(true, Duration::from_secs(1));
    let older = h.notify(0, 0, EventKind::StillLost);
    let out = h.admit().remove(0);
    let newer = h.notify(0, 0, EventKind::StillLost);
    let retry = h
        .finish_unwritten(out, answer(500, h.now))
        .expect("the attempt is recorded");
    let (_, given_back) = h.core.leave(|_| true, h.now);
    assert!(given_back.is_empty(), "nothing was out");
    let listed = |id: &str, seq| NotificationRef {
        kind: EventKind::StillLost,
        ..back(id, 0, seq, h.now)
    };
    let refs = vec![listed(&older, 1), listed(&newer, 2)];
    h.core.sweep(refs, h.now);
    assert!(
        h.admit().is_empty(),
        "nothing before the older one's outcome is written"
    );
    h.core.recorded(&[retry.notification_id]);
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&older]);
}
