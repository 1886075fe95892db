//! The lanes driven by hand: notifications in, attempts answered, time moved by the test.
//! What matters here is the order heads go out in, what the limits let through, and what
//! the lanes keep in memory once the work is done.

use std::time::Duration;

use super::*;
use crate::delivery::attempt::Failure;
use crate::delivery::rates::Lease;
use crate::delivery::retry::Kind;
use crate::domain::{NotificationRef, policy};

/// How much the core holds, map by map.
#[derive(Debug, Default, PartialEq)]
struct Sizes {
    lanes: usize,
    timers: usize,
    ready: usize,
    client_inflight: usize,
    client_waiting: usize,
    finished: usize,
    inflight: usize,
    pending: usize,
    unwritten: usize,
}

impl Lanes {
    fn sizes(&self) -> Sizes {
        Sizes {
            lanes: self.lanes.len(),
            timers: self.timers.len(),
            ready: self.ready.len(),
            client_inflight: self.client_inflight.len(),
            client_waiting: self.client_waiting.len(),
            finished: self.finished.as_ref().map_or(0, RecentlyFinished::len),
            inflight: self.inflight,
            pending: self.pending,
            unwritten: self.unwritten.len(),
        }
    }
}

struct Harness {
    core: Lanes,
    /// Outcomes the lanes asked to record, in order.
    outcomes: Vec<Outcome>,
    seq: i64,
    now: Millis,
}

const HOUR: Duration = Duration::from_secs(3600);
/// A jitter draw that leaves a delay as it is.
const NO_JITTER: f64 = 0.5;

fn sensor(n: usize) -> SensorId {
    SensorId::parse(&format!("s{n:07}")).unwrap()
}

/// A pending state change `id` (`seq`) of lane (client 0, sensor `sensor_n`), due at
/// `due`, as the store hands one over: a sweep bringing it back once its partition is
/// served here again, a replay, a resume. Other clients and kinds by struct update.
fn back(id: &str, sensor_n: usize, seq: i64, due: Millis) -> NotificationRef {
    NotificationRef {
        id: id.to_string(),
        seq,
        client_id: "client0".into(),
        sensor_id: sensor(sensor_n),
        kind: EventKind::StateChanged,
        due_at: due,
        attempts: 0,
        batch_id: None,
    }
}

fn answer(status: u16, now: Millis) -> Finished {
    Finished::Attempted(AttemptResult::answered(now, status, Duration::ZERO, None))
}

impl Harness {
    /// Lanes on a shared store or not; retries wait `retry` (capped there), up to 100; 8
    /// requests in all, 2 per client.
    fn new(shared: bool, retry: Duration) -> Self {
        let policy = RetryPolicy {
            kind: Kind::Exponential { base: retry },
            max_delay: retry,
            max_attempts: 100,
        };
        Self {
            core: Lanes::new(
                Arc::from("n1"),
                policy,
                8,
                2,
                shared,
                crate::clock::Clock::wall(),
            ),
            outcomes: Vec::new(),
            seq: 0,
            now: 1_800_000_000_000,
        }
    }

    /// One notification of `kind` about `sensor` for `client`, due now; returns its id.
    fn notify(&mut self, client: usize, sensor_n: usize, kind: EventKind) -> String {
        self.seq += 1;
        let id = ulid::Ulid::new().to_string();
        let r = NotificationRef {
            client_id: format!("client{client}"),
            kind,
            ..back(&id, sensor_n, self.seq, self.now)
        };
        let outcomes = self.core.add(vec![r], self.now);
        self.written(outcomes);
        id
    }

    /// One state change of `sensor` for `client`, due now.
    fn change(&mut self, client: usize, sensor: usize) {
        self.notify(client, sensor, EventKind::StateChanged);
    }

    /// The heads due now that the limits admit.
    fn admit(&mut self) -> Vec<(LaneKey, String)> {
        self.core.fire_timers(self.now);
        self.core.admit(self.now)
    }

    /// Tells the lanes what came of an admitted head.
    fn finish(&mut self, head: (LaneKey, String), result: Finished) {
        let outcome = self.finish_unwritten(head, result);
        self.written(outcome.into_iter().collect());
    }

    /// As [`Harness::finish`], but the outcome is handed back, not written yet (the store
    /// has not taken it).
    fn finish_unwritten(
        &mut self,
        (lane, id): (LaneKey, String),
        result: Finished,
    ) -> Option<Outcome> {
        self.core
            .finish(Done { lane, id, result }, self.now, NO_JITTER)
    }

    /// Outcomes the lanes asked to record, written at once (as the recorder does when the
    /// store answers).
    fn written(&mut self, outcomes: Vec<Outcome>) {
        let ids: Vec<String> = outcomes.iter().map(|o| o.notification_id.clone()).collect();
        self.outcomes.extend(outcomes);
        self.core.recorded(&ids);
    }

    /// Sends what the limits admit and answers every attempt with `status`, until nothing
    /// more is ready now. Returns the attempts made.
    fn answer_all(&mut self, status: u16) -> usize {
        let mut attempts = 0;
        for _ in 0..1_000_000 {
            let admitted = self.admit();
            if admitted.is_empty() {
                return attempts;
            }
            for head in admitted {
                attempts += 1;
                self.finish(head, answer(status, self.now));
            }
        }
        panic!("the lanes never ran out of ready heads");
    }

    /// The verdicts recorded for `id`, oldest first.
    fn verdicts(&self, id: &str) -> Vec<Verdict> {
        self.outcomes
            .iter()
            .filter(|o| o.notification_id == id)
            .map(|o| o.verdict)
            .collect()
    }
}

#[test]
fn delivered_notifications_leave_nothing_behind_on_an_embedded_store() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let mut delivered = 0;
    for _ in 0..50 {
        for client in 0..4 {
            for sensor in 0..50 {
                h.change(client, sensor);
            }
        }
        delivered += h.answer_all(200);
        h.now += 10;
    }
    assert_eq!(delivered, 10_000);
    // Nothing grows with the work done: all of it is over, so all of it is forgotten.
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn on_a_shared_store_finished_ids_are_forgotten_after_a_while() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    for sensor in 0..100 {
        h.change(0, sensor);
    }
    assert_eq!(h.answer_all(200), 100);
    // Kept, for the sweeps that may still read them as pending.
    assert_eq!(h.core.sizes().finished, 100);
    h.now += FINISHED_MEMORY_MS + 1;
    for sensor in 0..10 {
        h.change(0, sensor);
    }
    assert_eq!(h.answer_all(200), 10);
    assert_eq!(
        h.core.sizes(),
        Sizes {
            finished: 10,
            ..Sizes::default()
        },
        "only the ones of the last {FINISHED_MEMORY_MS} ms are remembered"
    );
}

#[test]
fn superseded_retries_leave_no_pile_of_stale_timers() {
    // A dead client, a flapping sensor: every change fails once, waits an hour for its
    // retry, and the next change supersedes it. Each leaves a timer an hour out.
    let mut h = Harness::new(false, HOUR);
    for _ in 0..5_000 {
        h.change(0, 0);
        assert_eq!(h.answer_all(500), 1);
        h.now += 1;
    }
    let sizes = h.core.sizes();
    assert_eq!((sizes.lanes, sizes.pending), (1, 1));
    assert!(
        sizes.timers <= 2 * sizes.lanes + TIMER_SLACK,
        "stale timers are dropped: {sizes:?}"
    );
    // The last one's retry still comes, and then nothing is left.
    h.now += 2 * HOUR.as_millis() as Millis;
    assert_eq!(h.answer_all(200), 1);
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn a_due_head_behind_a_stale_timer_is_still_sent() {
    // The head's retry timer goes stale when a newer state replaces it; the replacement
    // is sent at once and, failing too, gets a timer of its own that does fire.
    let mut h = Harness::new(false, Duration::from_millis(50));
    h.change(0, 0);
    assert_eq!(h.answer_all(500), 1);
    h.change(0, 0);
    assert_eq!(h.answer_all(500), 1);
    h.now += 1_000;
    assert_eq!(h.answer_all(200), 1);
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn only_a_lanes_head_is_out_and_the_lane_keeps_outbox_order() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let lost = h.notify(0, 0, EventKind::ConnectionLost);
    let restored = h.notify(0, 0, EventKind::ConnectionRestored);
    let out = h.admit();
    assert_eq!(out.len(), 1, "one head per lane");
    assert_eq!(out[0].1, lost);
    assert!(h.admit().is_empty(), "nothing more while the head is out");
    h.finish(out[0].clone(), answer(200, h.now));
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&restored]);
    h.finish(out[0].clone(), answer(200, h.now));
    assert_eq!(h.verdicts(&lost), [Verdict::Delivered]);
    assert_eq!(h.verdicts(&restored), [Verdict::Delivered]);
    assert_eq!(h.core.sizes(), Sizes::default());
}

/// On a store of its own, a state whose claim went unanswered (the store may have leased
/// it, so the commit of a newer one passed it by) was not sent: a newer state supersedes
/// it, whether it comes before the claim's answer or after (simulation seed 0). On a
/// shared store another node may hold it, and it stays.
#[test]
fn a_state_whose_claim_went_unanswered_is_superseded_on_a_store_of_its_own() {
    for shared in [false, true] {
        for newer_first in [false, true] {
            let mut h = Harness::new(shared, Duration::from_secs(1));
            let first = h.notify(0, 0, EventKind::StateChanged);
            let out = h.admit();
            assert_eq!(out[0].1, first);
            let newer = if newer_first {
                Some(h.notify(0, 0, EventKind::StateChanged))
            } else {
                None
            };
            h.finish(out[0].clone(), Finished::Held(h.now + 1_000));
            let newer = newer.unwrap_or_else(|| h.notify(0, 0, EventKind::StateChanged));
            let want: &[Verdict] = if shared { &[] } else { &[Verdict::Superseded] };
            assert_eq!(
                h.verdicts(&first),
                want,
                "shared {shared}, newer first {newer_first}"
            );
            assert!(h.verdicts(&newer).is_empty());
        }
    }
}

/// On a store of its own, a state out here when a newer one comes is withdrawn: the
/// store's commit passed it by if it held it leased, so only this node can tell it was not
/// sent. Come back unsent (withdrawn before its claim, or given back after it), it is
/// superseded and the newer one goes (simulation seed 420). On a shared store nothing is
/// withdrawn: another node may hold the lease.
#[test]
fn a_state_out_but_not_sent_is_withdrawn_and_superseded_on_a_store_of_its_own() {
    for shared in [false, true] {
        for result in [Finished::Later(0), Finished::Released { attempts: 1 }] {
            let mut h = Harness::new(shared, Duration::from_secs(1));
            let first = h.notify(0, 0, EventKind::StateChanged);
            let out = h.admit();
            assert_eq!(out[0].1, first);
            let newer = h.notify(0, 0, EventKind::StateChanged);
            let withdrawn = h.core.withdrawals();
            if shared {
                assert!(withdrawn.is_empty(), "shared: nothing withdrawn");
                continue;
            }
            assert_eq!(withdrawn, vec![out[0].0.clone()]);
            assert!(h.core.withdrawals().is_empty(), "told once");
            let result = match result {
                Finished::Later(_) => Finished::Later(h.now),
                other => other,
            };
            h.finish(out[0].clone(), result);
            assert_eq!(h.verdicts(&first), [Verdict::Superseded]);
            let out = h.admit();
            assert_eq!(out[0].1, newer);
            h.finish(out[0].clone(), answer(200, h.now));
            assert_eq!(h.core.sizes(), Sizes::default());
        }
    }
}

/// On a store of its own, a state ready but not admitted (its client at its limit, or its
/// last outcome not written yet) is not on its way: a newer state supersedes it and goes
/// in its place (simulation seed 189). On a shared store it stays until its claim says.
#[test]
fn a_ready_state_not_admitted_is_superseded_on_a_store_of_its_own() {
    for shared in [false, true] {
        let mut h = Harness::new(shared, Duration::from_secs(1));
        // Client 0 has as many heads out as its limit admits: the next one waits.
        let limit = 2 * claim_ahead(shared) as usize;
        for sensor in 0..limit {
            h.change(0, sensor);
        }
        let busy = h.admit();
        assert_eq!(busy.len(), limit);
        let older = h.notify(0, limit, EventKind::StateChanged);
        assert!(h.admit().is_empty(), "the client is at its limit");
        let newer = h.notify(0, limit, EventKind::StateChanged);
        let want: &[Verdict] = if shared { &[] } else { &[Verdict::Superseded] };
        assert_eq!(h.verdicts(&older), want, "shared {shared}");
        h.finish(busy[0].clone(), answer(200, h.now));
        let out = h.admit();
        let first = if shared { &older } else { &newer };
        assert_eq!(&out[0].1, first, "shared {shared}");
        for head in busy.into_iter().skip(1).chain(out) {
            h.finish(head, answer(200, h.now));
        }
        h.answer_all(200);
        // A shared store remembers finished ids a while; nothing else is left.
        let finished = h.core.sizes().finished;
        let left = Sizes {
            finished,
            ..Sizes::default()
        };
        assert_eq!(h.core.sizes(), left, "shared {shared}");
    }
}

/// A state that comes late (a replay, or one a look for pending brings after a commit's
/// answer was lost) and supersedes a ready head still goes in order: before a connection
/// event made after it, though that event waited behind the head it replaced.
#[test]
fn a_late_state_that_supersedes_a_ready_head_keeps_its_place_in_order() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let limit = 2 * claim_ahead(false) as usize;
    for sensor in 0..limit {
        h.change(0, sensor);
    }
    let busy = h.admit();
    let older = h.notify(0, limit, EventKind::StateChanged);
    assert!(h.admit().is_empty(), "the client is at its limit");
    let (late_seq, lost_seq) = (h.seq + 1, h.seq + 2);
    h.seq += 2;
    let lost = NotificationRef {
        kind: EventKind::ConnectionLost,
        ..back("lost", limit, lost_seq, h.now)
    };
    let outcomes = h.core.add(vec![lost], h.now);
    h.written(outcomes);
    let outcomes = h
        .core
        .add(vec![back("late", limit, late_seq, h.now)], h.now);
    h.written(outcomes);
    assert_eq!(h.verdicts(&older), [Verdict::Superseded]);
    let mut sent = Vec::new();
    for head in busy {
        h.finish(head, answer(200, h.now));
        for head in h.admit() {
            sent.push(head.1.clone());
            h.finish(head, answer(200, h.now));
        }
    }
    assert_eq!(sent, ["late", "lost"]);
}

/// A failed state whose failure is not written yet waits for it, ready; on a store of its
/// own a newer state supersedes it there, and goes once both outcomes are written.
#[test]
fn a_failed_state_waiting_for_its_record_is_superseded_on_a_store_of_its_own() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let older = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    let failure = h
        .finish_unwritten(out[0].clone(), answer(500, h.now))
        .expect("a failed attempt's outcome");
    h.now += 1_000;
    assert!(h.admit().is_empty(), "waits for its failure to be written");
    let newer = h.notify(0, 0, EventKind::StateChanged);
    assert_eq!(h.verdicts(&older), [Verdict::Superseded]);
    assert!(h.admit().is_empty(), "the failure is still not written");
    h.written(vec![failure]);
    let out = h.admit();
    assert_eq!(out[0].1, newer);
    h.finish(out[0].clone(), answer(200, h.now));
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn a_newer_state_supersedes_waiting_ones_but_not_the_one_in_flight() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let first = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    assert_eq!(out[0].1, first);
    let second = h.notify(0, 0, EventKind::StateChanged);
    let lost = h.notify(0, 0, EventKind::ConnectionLost);
    let third = h.notify(0, 0, EventKind::StateChanged);
    assert_eq!(h.verdicts(&second), [Verdict::Superseded]);
    assert!(
        h.verdicts(&first).is_empty(),
        "in flight: it finishes first"
    );
    assert_eq!(h.core.pending(), 3);
    // The head fails with a newer state behind it: superseded, not retried.
    h.finish(out[0].clone(), answer(500, h.now));
    assert_eq!(h.verdicts(&first), [Verdict::Superseded]);
    let out = h.admit();
    assert_eq!(out[0].1, lost, "lost/restored are never superseded");
    h.finish(out[0].clone(), answer(200, h.now));
    let out = h.admit();
    assert_eq!(out[0].1, third);
    h.finish(out[0].clone(), answer(200, h.now));
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn a_failed_head_waits_for_its_retry_time() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    h.finish(out[0].clone(), answer(500, h.now));
    let retry_at = h.now + 1_000;
    assert_eq!(h.verdicts(&id), [Verdict::Retry { next_at: retry_at }]);
    assert_eq!(h.core.next_timer(), Some(retry_at));
    h.now = retry_at - 1;
    assert!(h.admit().is_empty());
    h.now = retry_at;
    let out = h.admit();
    assert_eq!(out[0].1, id);
    h.finish(out[0].clone(), answer(200, h.now));
    assert_eq!(
        h.outcomes.last().map(|o| (o.attempts, o.verdict)),
        Some((2, Verdict::Delivered))
    );
}

#[test]
fn gone_answers_leave_the_lane_without_an_outcome() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    h.finish(out[0].clone(), Finished::Gone(Status::Cancelled));
    assert!(h.outcomes.is_empty(), "the store already knows");
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn a_head_leased_elsewhere_is_asked_about_again_within_a_second() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit();
    let until = h.now + 5_000;
    h.finish(out[0].clone(), Finished::Held(until));
    assert!(h.admit().is_empty());
    // Not at the end of the lease: the other node records its outcome when its attempt
    // ends, and the lane goes on then.
    h.now += policy::RECHECK_MS;
    assert_eq!(h.admit().iter().map(|o| &o.1).collect::<Vec<_>>(), [&id]);
}

#[test]
fn on_a_shared_store_a_sweep_skips_what_finished_lately() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    assert_eq!(h.answer_all(200), 1);
    // The sweep read it as pending just before its result was recorded.
    let stale = back(&id, 0, 1, h.now);
    h.core.sweep(vec![stale.clone()], h.now);
    assert_eq!(h.core.pending(), 0);
    // Long after, it would be taken up again (a sweep then reads the store's truth).
    h.now += FINISHED_MEMORY_MS;
    h.core.sweep(vec![stale], h.now);
    assert_eq!(h.core.pending(), 1);
}

#[test]
fn a_head_told_to_wait_lets_an_older_one_swept_meanwhile_go_first() {
    // Around a takeover: the new owner's lane has only the newer notification when a sweep
    // brings the older one, still pending in the store, while the newer is out.
    let mut h = Harness::new(true, Duration::from_secs(1));
    h.seq = 10;
    let newer = h.notify(0, 0, EventKind::ConnectionRestored);
    let out = h.admit();
    assert_eq!(out[0].1, newer);
    let older = NotificationRef {
        kind: EventKind::ConnectionLost,
        ..back(&ulid::Ulid::new().to_string(), 0, 3, h.now)
    };
    h.core.sweep(vec![older.clone()], h.now);
    // The store answers the newer: wait, an older one of its lane is pending.
    h.finish(out[0].clone(), Finished::Later(h.now + 1_000));
    let out = h.admit();
    assert_eq!(
        out.iter().map(|o| o.1.as_str()).collect::<Vec<_>>(),
        [older.id.as_str()],
        "the older one goes first"
    );
    h.finish(out[0].clone(), answer(200, h.now));
    // The newer one goes as soon as the older one is done here, not at the look again a
    // second on that its answer named (its claim no longer counts the older one: this
    // node leased it).
    let out = h.admit();
    assert_eq!(out.iter().map(|o| &o.1).collect::<Vec<_>>(), [&newer]);
}

mod batches;
mod limits;
mod moves;
mod parked;

#[test]
fn a_head_is_not_claimed_again_before_its_last_outcome_is_written() {
    // A failed attempt's outcome releases the lease it was sent under. Written after the
    // head's next claim, it would release that claim's lease too, and another node could
    // send the lane while this one does: the head waits for the recorder first.
    let mut h = Harness::new(false, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit().remove(0);
    let outcome = h
        .finish_unwritten(out, answer(500, h.now))
        .expect("the attempt is recorded");
    h.now += 10_000;
    assert!(
        h.admit().is_empty(),
        "its retry is due, its outcome not written"
    );
    h.core.recorded(&[outcome.notification_id]);
    assert_eq!(h.admit().iter().map(|o| &o.1).collect::<Vec<_>>(), [&id]);
}

#[test]
fn a_notification_whose_outcome_is_not_written_is_not_queued_again_from_the_store() {
    // Delivered, but the store has not been told yet (its writes fail for a while): the
    // client is enabled meanwhile, and the store's list of its pending notifications still
    // holds it. It is not sent again, nor superseded by the newer one behind it.
    let mut h = Harness::new(false, Duration::from_secs(1));
    let id = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit().remove(0);
    let delivered = h
        .finish_unwritten(out.clone(), answer(200, h.now))
        .expect("recorded");
    let stale = back(&id, 0, 1, h.now);
    let outcomes = h.core.resume("client0", vec![stale], h.now);
    assert!(outcomes.is_empty());
    assert!(h.admit().is_empty(), "sent once");
    h.core.recorded(&[delivered.notification_id]);
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn on_a_shared_store_the_next_head_waits_until_the_one_that_ended_is_written() {
    // The store holds a head delivered here pending until its outcome is written: were
    // this node to die first, the node serving the lane next would send it again after
    // the newer one sent meanwhile (simulation seed 508198, a dead letter).
    let mut h = Harness::new(true, Duration::from_secs(1));
    let older = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit().remove(0);
    assert_eq!(out.1, older);
    let newer = h.notify(0, 0, EventKind::StateChanged);
    let outcome = h
        .finish_unwritten(out, answer(200, h.now))
        .expect("the delivery is recorded");
    assert!(
        h.admit().is_empty(),
        "the newer one waits for the older one's outcome"
    );
    h.core.recorded(&[outcome.notification_id]);
    assert_eq!(h.admit().iter().map(|o| &o.1).collect::<Vec<_>>(), [&newer]);
}

#[test]
fn a_notification_is_not_queued_again_while_a_second_outcome_of_it_is_unwritten() {
    // Its failed attempt's outcome, then its superseding by a newer state, are both on
    // their way to the store. Once the first is written the store still holds it pending,
    // and a client enabled meanwhile lists it so: it is not queued and sent again
    // (simulation seed 513201: delivered so, then recorded superseded).
    let mut h = Harness::new(false, Duration::from_secs(1));
    let older = h.notify(0, 0, EventKind::StateChanged);
    let out = h.admit().remove(0);
    let failed = h
        .finish_unwritten(out, answer(500, h.now))
        .expect("the attempt is recorded");
    let newer = ulid::Ulid::new().to_string();
    let superseded = h.core.add(vec![back(&newer, 0, 2, h.now)], h.now);
    assert_eq!(
        superseded
            .iter()
            .map(|o| (&o.notification_id, o.verdict))
            .collect::<Vec<_>>(),
        [(&older, Verdict::Superseded)]
    );
    h.core.recorded(&[failed.notification_id]);
    let outcomes = h
        .core
        .resume("client0", vec![back(&older, 0, 1, h.now)], h.now);
    assert!(outcomes.is_empty());
    let out = h.admit().remove(0);
    assert_eq!(out.1, newer);
    h.finish(out, answer(200, h.now));
    assert!(h.admit().is_empty(), "the older one is not sent after it");
    h.core.recorded(&[older]);
    // Once the older one's retry time has passed, as it would have been.
    h.now += 2_000;
    assert!(h.admit().is_empty());
    assert_eq!(h.core.sizes(), Sizes::default());
}
