//! Batched clients: what gathers into a request, when it goes, one in flight, and a failed
//! batch going again as itself.

use super::*;
use crate::delivery::lanes::batches::BATCHES_OUT;
use crate::domain::client::Batch;

impl Harness {
    /// Client 0 batches up to `max_events`, waiting `max_wait_ms`.
    fn batching(&mut self, max_events: u32, max_wait_ms: u32) {
        self.core.set_batch(
            "client0",
            Some(Batch {
                max_events,
                max_wait_ms,
            }),
        );
    }

    /// The batches that go now (single heads must not: client 0 batches).
    fn batches(&mut self) -> Vec<BatchOut> {
        let singles = self.admit();
        assert!(singles.is_empty(), "a batched head went alone: {singles:?}");
        self.core.admit_batches(self.now)
    }

    /// Answers every head of `b` with `status`, as one request.
    fn answer_batch(&mut self, b: BatchOut, status: u16) {
        let dones = b
            .members
            .into_iter()
            .map(|(lane, id)| Done {
                lane,
                id,
                result: answer(status, self.now),
            })
            .collect();
        let outcomes = self
            .core
            .finish_batch(&b.client, &b.id, dones, self.now, NO_JITTER);
        self.written(outcomes);
    }
}

fn ids(b: &BatchOut) -> Vec<String> {
    let mut v: Vec<String> = b.members.iter().map(|(_, id)| id.clone()).collect();
    v.sort();
    v
}

#[test]
fn a_full_batch_goes_at_once_and_a_partial_one_after_its_wait() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(3, 1_000);
    for sensor in 0..5 {
        h.change(0, sensor);
    }
    let out = h.batches();
    assert_eq!(out.len(), 1, "three make a batch; two wait for more");
    assert_eq!(out[0].members.len(), 3);
    h.now += 999;
    assert!(
        h.batches().is_empty(),
        "not before the first has waited 1 s"
    );
    assert_eq!(
        h.core.next_timer(),
        Some(h.now + 1),
        "the loop wakes for it"
    );
    h.now += 1;
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].members.len(), 2);
}

#[test]
fn one_batch_sends_while_one_more_waits_claimed_ahead() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(2, 0);
    for sensor in 0..10 {
        h.change(0, sensor);
    }
    let out = h.batches();
    assert_eq!(out.len(), BATCHES_OUT as usize);
    assert!(h.batches().is_empty(), "no third while two are out");
    let mut out = out.into_iter();
    h.answer_batch(out.next().unwrap(), 200);
    assert_eq!(h.batches().len(), 1, "the next goes once one is answered");
}

#[test]
fn a_batch_holds_one_head_a_lane_and_the_next_follows_its_answer() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(100, 0);
    h.change(0, 0);
    let first = h.notify(0, 0, EventKind::ConnectionLost);
    h.change(0, 1);
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].members.len(), 2, "one head of each lane");
    assert!(!ids(&out[0]).contains(&first));
    h.answer_batch(out.into_iter().next().unwrap(), 200);
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert_eq!(ids(&out[0]), vec![first], "the lane's next, after");
}

#[test]
fn a_failed_batch_goes_again_as_itself_less_what_ended_meanwhile() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(10, 0);
    for sensor in 0..3 {
        h.change(0, sensor);
    }
    let out = h.batches().remove(0);
    let (id, members) = (out.id.clone(), ids(&out));
    h.answer_batch(out, 500);
    // Every head waits for the batch's one retry time, marked with its batch.
    assert!(
        h.outcomes
            .iter()
            .all(|o| o.batch_id.as_deref() == Some(&*id))
    );
    let next_ats: Vec<_> = h.outcomes.iter().map(|o| o.verdict.next_at()).collect();
    assert!(next_ats.iter().all(|t| t.is_some() && *t == next_ats[0]));
    // A new state of sensor 1 supersedes its head; sensor 5 changes for the first time.
    h.change(0, 1);
    h.change(0, 5);
    h.now += 2_000;
    let out = h.batches();
    assert_eq!(out.len(), 2);
    let again = out
        .iter()
        .find(|b| b.id == id)
        .expect("the batch went again");
    assert_eq!(again.members.len(), 2, "its heads but the superseded one");
    assert!(ids(again).iter().all(|m| members.contains(m)));
    assert!(again.left_out.is_empty());
    let fresh = out.iter().find(|b| b.id != id).unwrap();
    assert_eq!(
        fresh.members.len(),
        2,
        "the newer ones in a batch of their own"
    );
}

#[test]
fn a_head_its_claim_did_not_send_is_not_in_the_batchs_retry() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(10, 500);
    h.change(0, 0);
    h.change(0, 1);
    assert!(h.batches().is_empty());
    h.now += 500;
    let out = h.batches().remove(0);
    let id = out.id.clone();
    // Sensor 1's head was not sent with the other (its claim said later).
    let mut members = out.members.into_iter();
    let sent = members.next().unwrap();
    let later = members.next().unwrap();
    let dones = vec![
        Done {
            lane: sent.0,
            id: sent.1.clone(),
            result: answer(500, h.now),
        },
        Done {
            lane: later.0,
            id: later.1.clone(),
            result: Finished::Later(h.now + 60_000),
        },
    ];
    let outcomes = h
        .core
        .finish_batch(&out.client, &id, dones, h.now, NO_JITTER);
    assert_eq!(outcomes.len(), 1, "only the attempt is recorded");
    h.written(outcomes);
    // The batch goes again at its retry time with what it sent, and needs nothing else.
    h.now += 1_000;
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].id, id);
    assert_eq!(ids(&out[0]), vec![sent.1.clone()]);
    h.answer_batch(out.into_iter().next().unwrap(), 200);
    // The other goes when due, in a batch of its own.
    h.now += 59_000;
    assert!(h.batches().is_empty());
    h.now += 500;
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert_ne!(out[0].id, id);
    assert_eq!(ids(&out[0]), vec![later.1]);
}

#[test]
fn a_batch_whose_heads_are_not_all_due_sends_what_is_there_and_unmarks_the_rest() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(10, 300);
    h.change(0, 0);
    h.change(0, 1);
    h.now += 300;
    let out = h.batches().remove(0);
    let id = out.id.clone();
    h.answer_batch(out, 500);
    // Sensor 1's head is held back by hand: it is not due with the batch.
    let lane1: LaneKey = (Arc::from("client0"), sensor(1));
    let lane = h.core.lanes.get_mut(&lane1).unwrap();
    lane.queue[0].due = h.now + 3_600_000;
    lane.timer = None;
    h.now += 1_000;
    assert!(
        h.batches().is_empty(),
        "the batch waits for all its heads first"
    );
    h.now += 300;
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].id, id);
    assert_eq!(out[0].members.len(), 1);
    assert_eq!(
        out[0].left_out.len(),
        1,
        "the other never goes under this id again"
    );
    assert_eq!(h.core.lanes[&lane1].queue[0].batch, None);
}

#[test]
fn ending_batching_sends_what_gathered_one_by_one() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(10, 10_000);
    h.change(0, 0);
    h.change(0, 1);
    assert!(h.batches().is_empty());
    h.core.set_batch("client0", None);
    assert_eq!(h.admit().len(), 2);
    assert!(h.core.admit_batches(h.now).is_empty());
}

#[test]
fn delivered_batches_leave_nothing_behind() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(7, 0);
    for round in 0..20 {
        for sensor in 0..30 {
            h.change(0, sensor + round % 3);
        }
        loop {
            let out = h.batches();
            if out.is_empty() {
                break;
            }
            for b in out {
                h.answer_batch(b, 200);
            }
        }
        h.now += 10;
    }
    assert_eq!(h.core.pending(), 0);
    assert_eq!(h.core.sizes(), Sizes::default());
    assert!(h.core.batching.is_idle());
}

#[test]
fn a_lane_that_leaves_while_it_gathers_and_comes_back_goes_once_in_its_batch() {
    // A rolling restart: sensor 0's partition leaves while its head gathers for a batch,
    // and comes back before the batch goes.
    let mut h = Harness::new(true, Duration::from_secs(1));
    h.batching(100, 1_000);
    let a = h.notify(0, 0, EventKind::StateChanged);
    h.change(0, 1);
    assert!(h.batches().is_empty(), "both gather for a second");
    assert!(
        h.core.leave(|s| s == sensor(0), 0).0.is_empty(),
        "nothing is out"
    );
    h.core.sweep(vec![back(&a, 0, 1, h.now)], h.now);
    assert!(h.batches().is_empty());
    h.now += 1_000;
    let out = h.batches();
    assert_eq!(out.len(), 1);
    let mut members = ids(&out[0]);
    members.dedup();
    assert_eq!(
        members.len(),
        out[0].members.len(),
        "a notification twice in one request: {:?}",
        out[0].members
    );
    assert_eq!(out[0].members.len(), 2);
    // Answered once, it is recorded once.
    h.answer_batch(out.into_iter().next().unwrap(), 200);
    assert_eq!(h.verdicts(&a), [Verdict::Delivered]);
    assert_eq!(h.core.pending(), 0);
}

#[test]
fn a_lane_that_comes_back_waiting_for_its_retry_is_not_sent_early_by_a_batch() {
    // Sensor 0's head gathers; its partition leaves and comes back with that head due in a
    // minute (another node tried it meanwhile). Sensor 1's batch goes now without it, and
    // the head goes once, at its time.
    let mut h = Harness::new(true, Duration::from_secs(1));
    h.batching(100, 1_000);
    let a = h.notify(0, 0, EventKind::StateChanged);
    h.change(0, 1);
    assert!(h.batches().is_empty());
    h.core.leave(|s| s == sensor(0), 0);
    h.core.sweep(vec![back(&a, 0, 1, h.now + 60_000)], h.now);
    h.now += 1_000;
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert!(
        !ids(&out[0]).contains(&a),
        "a head waiting for its retry went early"
    );
    h.answer_batch(out.into_iter().next().unwrap(), 200);
    h.now += 59_000;
    assert!(
        h.batches().is_empty(),
        "due now, it gathers for its wait first"
    );
    h.now += 1_000;
    let out = h.batches();
    assert_eq!(out.len(), 1);
    assert_eq!(ids(&out[0]), vec![a.clone()]);
    assert!(h.batches().is_empty(), "one request of the lane at a time");
}

#[test]
fn heads_waiting_for_a_rate_slot_gather_once_their_client_batches() {
    // A client limited to one request a second: its heads wait for their slots, one at a
    // time. It is then told to batch: the heads still waiting gather for its batches,
    // whose requests the limit paces instead.
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.core.set_rate("client0", Some(1));
    for sensor in 0..3 {
        h.change(0, sensor);
    }
    let first = h.admit();
    assert_eq!(first.len(), 1, "one request a second");
    h.batching(10, 0);
    h.finish(first.into_iter().next().unwrap(), answer(200, h.now));
    let mut gathered = 0;
    for _ in 0..10 {
        h.now += 1_000;
        for b in h.batches() {
            gathered += b.members.len();
            h.answer_batch(b, 200);
        }
    }
    assert_eq!(
        gathered, 2,
        "the heads that waited for a rate slot went in batches"
    );
    assert_eq!(h.core.pending(), 0);
}

#[test]
fn a_head_an_older_replay_went_before_leaves_its_batch_for_good() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    h.batching(10, 0);
    let a = h.notify(0, 0, EventKind::ConnectionLost);
    let b = h.notify(0, 1, EventKind::ConnectionLost);
    let out = h.batches().remove(0);
    let first = out.id.clone();
    h.answer_batch(out, 500);
    // A failed notification of sensor 0, older than `a`, is replayed: it goes first.
    let outcomes = h.core.add(vec![back("old", 0, 0, h.now)], h.now);
    h.written(outcomes);
    h.now += 2_000;
    let mut out = h.batches();
    let at = out
        .iter()
        .position(|b| b.id == first)
        .expect("the batch went again");
    let again = out.remove(at);
    assert_eq!(
        ids(&again),
        std::slice::from_ref(&b),
        "without the head the replay went before"
    );
    assert_eq!(again.left_out, std::slice::from_ref(&a));
    // The batch fails again; the replayed one is delivered.
    h.answer_batch(again, 500);
    for o in out {
        h.answer_batch(o, 200);
    }
    // `a` follows the replayed one, never under the id of requests it was left out of.
    h.now += 2_000;
    let out = h.batches();
    let with_a = out
        .iter()
        .find(|o| ids(o).contains(&a))
        .expect("a goes out");
    assert_ne!(
        with_a.id, first,
        "a batch's retry holds only what it held before"
    );
}
