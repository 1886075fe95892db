//! What an answer does to a lane: the head leaves it, waits for a retry, or waits for a
//! lease to run out, and the lane's next head is scheduled.

use std::sync::Arc;

use super::Meters;
use super::batches::Batching;
use super::{Done, Entry, Finished, LaneKey, Lanes, PARK_RECHECK_MS, shrink};
use crate::delivery::attempt::AttemptResult;
use crate::delivery::retry::{RetryAt, RetryPolicy};
use crate::domain::policy::{self, Attempted};
use crate::domain::{Attempt, EventKind, Millis, Outcome, Status, Verdict};

impl Lanes {
    /// Takes what came of an admitted head: the head leaves its lane, waits for a retry,
    /// or waits for a lease to run out, and the lane's next head is scheduled. Returns the
    /// outcome to record, if an attempt was made (or a lease is given back); `jitter` (in
    /// `[0, 1)`) spreads a retry. A lane that left this node meanwhile is dropped: no
    /// retry waits here for it, the node serving it now takes it from the store.
    pub(in crate::delivery) fn finish(
        &mut self,
        d: Done,
        now: Millis,
        jitter: f64,
    ) -> Option<Outcome> {
        self.inflight -= 1;
        if let Some(c) = self.client_inflight.get_mut(&d.lane.0) {
            *c -= 1;
            if *c == 0 {
                self.client_inflight.remove(&d.lane.0);
            }
        }
        if let Some(waiting) = self.client_waiting.get_mut(&d.lane.0) {
            if let Some(k) = waiting.pop_front() {
                self.ready.push_back(k);
            }
            if waiting.is_empty() {
                self.client_waiting.remove(&d.lane.0);
            }
        }
        if let Finished::Attempted(result) = &d.result {
            self.answered(&d.lane.0, result);
        }
        self.settle(d, now, RetryAt::Jittered(jitter), None)
    }

    /// [`Lanes::finish`] for one head, once the counters of what is out have been
    /// released: `retry_at` says when a failed attempt is tried again; `batch` is the batch
    /// the head was sent in, which a retry goes out in again. The outcome it returns is on
    /// its way to the recorder from then on ([`Lanes::recorded`]).
    pub(super) fn settle(
        &mut self,
        d: Done,
        now: Millis,
        retry_at: RetryAt,
        batch: Option<&Arc<str>>,
    ) -> Option<Outcome> {
        let lane = d.lane.clone();
        let outcome = self.settle_head(d, now, retry_at, batch);
        if let Some(o) = &outcome {
            self.unwritten(o, &lane);
            // A head that ended here (delivered, failed for good) holds up the next one as
            // a superseded one does (simulation seed 508198).
            let next = self.lanes.get(&lane).and_then(|l| l.queue.front());
            if matches!(o.verdict, Verdict::Delivered | Verdict::Failed)
                && next.is_some_and(|h| h.id != o.notification_id)
            {
                self.gate(&lane, &o.notification_id);
            }
        }
        outcome
    }

    /// What [`Lanes::settle`] does to the lane.
    fn settle_head(
        &mut self,
        d: Done,
        now: Millis,
        retry_at: RetryAt,
        batch: Option<&Arc<str>>,
    ) -> Option<Outcome> {
        // Given back whatever became of the lane: the lease is ours, and must not hold up
        // the node that serves the lane now.
        let mut outcome = match d.result {
            Finished::Released { attempts } => {
                Some(self.given_back(d.id.clone(), &d.lane, attempts, now))
            }
            _ => None,
        };
        let Some(lane) = self.lanes.get_mut(&d.lane) else {
            return outcome;
        };
        lane.busy = false;
        lane.parked = false;
        lane.out = false;
        // A newer state notification waits behind the head: an attempt that failed is then
        // superseded rather than retried (the policy decides). An older one behind it (a
        // replay or a sweep queued it behind the head in flight) supersedes nothing: the
        // lane is put back in order and the head is tried again after it.
        let head_seq = lane.queue.front().map(|h| h.seq);
        let state_behind = lane
            .queue
            .iter()
            .skip(1)
            .any(|e| e.kind == EventKind::StateChanged && Some(e.seq) > head_seq);
        let Some(head) = lane.queue.front_mut() else {
            self.lanes.remove(&d.lane);
            return outcome;
        };
        if head.id != d.id {
            // The head changed while this one was out (a manual retry of an older one).
            let due = head.due;
            self.reschedule(d.lane, due, now);
            return outcome;
        }
        // Only a retry of an attempt sent in a batch goes in that batch again: a head
        // that was not sent with the others is never sent under its id after them.
        if let Some(b) = head.batch.take() {
            self.batching.leave(&b, &d.lane);
        }
        // Told to wait: perhaps behind an older notification of the lane that a sweep
        // has queued behind this head meanwhile; the lane is put back in order.
        let later = matches!(d.result, Finished::Later(_) | Finished::Held(_));
        let unsent = later || matches!(d.result, Finished::Released { .. });
        if unsent && self.finished.is_none() && head.kind == EventKind::StateChanged && state_behind
        {
            return self.supersede_unsent(d.lane, now);
        }
        head.claim_unsure = matches!(d.result, Finished::Held(_));
        head.told_to_wait = later;
        let pop = match d.result {
            Finished::Gone(status) => {
                // A claim ends a notification only by cancelling or superseding it. One it
                // found delivered or failed was counted when that outcome was recorded,
                // here or on another node: a lane told of it twice (a client enabled while
                // its parked heads were looked at again) must not count it twice.
                if !matches!(status, Status::Delivered | Status::Failed) {
                    self.meters.ended(status.as_str());
                }
                true
            }
            Finished::Held(until) => {
                head.held = true;
                head.due = policy::look_again(until, now);
                false
            }
            Finished::Later(at) => {
                head.held = false;
                head.due = at;
                false
            }
            Finished::Released { .. } => {
                head.held = false;
                head.due = now;
                false
            }
            Finished::Parked => {
                head.held = false;
                head.due = now + PARK_RECHECK_MS;
                lane.parked = true;
                if !self.parked_clients.contains(&d.lane.0) {
                    self.parked_clients.insert(d.lane.0.clone());
                }
                false
            }
            Finished::Attempted(result) => {
                let (done, o) = attempted(
                    head,
                    result,
                    Context {
                        policy: &self.policy,
                        node: &self.node,
                        batching: &mut self.batching,
                        meters: &mut self.meters,
                        lane: &d.lane,
                        batch,
                        retry_at,
                        state_behind,
                        now,
                    },
                );
                outcome = Some(o);
                done
            }
        };
        self.go_on(d.lane, pop, later, now);
        outcome
    }

    /// On a store of its own (no other node may hold it), a state head that was not sent
    /// (told to wait, withdrawn, given back, or its claim went unanswered, which may have
    /// leased it, so that the commit of a newer one passed it by) is superseded once a
    /// newer state waits behind it, as that commit would have done: the client is not sent
    /// a state it would at once be told is over (simulation seeds 0 and 420, without the
    /// supersede check's allowance for them). Its superseding ends the lease a give-back
    /// would have.
    fn supersede_unsent(&mut self, key: LaneKey, now: Millis) -> Option<Outcome> {
        let head = self.lanes.get_mut(&key)?.queue.pop_front()?;
        let outcome = self.supersede_entry(&key, head);
        self.go_on(key, false, true, now);
        Some(outcome)
    }

    /// After its head's answer, the lane goes on: without the head if it ended (`pop`),
    /// back in order if a head was told to wait (`later`), and due at its new head's time
    /// (gone, when nothing waits in it).
    fn go_on(&mut self, key: LaneKey, pop: bool, later: bool, now: Millis) {
        let Some(lane) = self.lanes.get_mut(&key) else {
            return;
        };
        if pop {
            if let Some(done) = lane.queue.pop_front()
                && let Some(finished) = &mut self.finished
            {
                finished.insert(done.id, now);
            }
            self.pending -= 1;
            // The head after it may have been told to wait for this one (pending in the
            // store until now): it is asked about again at once. A claim that still finds
            // a reason to wait (its own retry time, another node's attempt) says so again.
            if let Some(next) = lane.queue.front_mut()
                && next.told_to_wait
            {
                next.told_to_wait = false;
                next.due = next.due.min(now);
            }
        }
        if later {
            lane.queue.make_contiguous().sort_by_key(|e| e.seq);
        }
        match lane.queue.front().map(|h| h.due) {
            Some(due) => self.reschedule(key, due, now),
            None => {
                self.lanes.remove(&key);
                shrink(&mut self.lanes);
            }
        }
    }
}

/// What an attempt's verdict needs beside its head: the lane's settings and where it is.
struct Context<'a> {
    policy: &'a RetryPolicy,
    node: &'a Arc<str>,
    batching: &'a mut Batching,
    meters: &'a mut Meters,
    lane: &'a LaneKey,
    /// The batch the attempt was sent in.
    batch: Option<&'a Arc<str>>,
    retry_at: RetryAt,
    /// A state notification waits behind the head.
    state_behind: bool,
    now: Millis,
}

/// The head's attempt came back with `result`: its verdict (delivered, retry, failed,
/// superseded), counted; a retry waits in the lane (in its batch again, if it was sent in
/// one). Whether the head leaves the lane, and the outcome to record.
fn attempted(head: &mut Entry, result: AttemptResult, cx: Context<'_>) -> (bool, Outcome) {
    head.held = false;
    let attempts = head.attempts + 1;
    let next_at = match cx.retry_at {
        RetryAt::At(at) => at,
        RetryAt::Jittered(j) => cx.policy.retry_time(attempts, &result, j, cx.now),
    };
    let verdict = policy::verdict(
        Attempted {
            delivered: result.delivered(),
            gone: result.gone(),
            not_allowed: result.not_allowed(),
            attempts,
            max_attempts: cx.policy.max_attempts,
            kind: head.kind,
            state_behind: cx.state_behind,
        },
        || next_at,
    );
    attempt_metrics(cx.meters, &result, verdict, &head.id, cx.now);
    let outcome = Outcome {
        notification_id: head.id.clone(),
        client_id: cx.lane.0.to_string(),
        attempt: Some(Attempt {
            notification_id: head.id.clone(),
            at: result.at,
            status_code: result.status_code,
            error: result.error,
            duration_ms: result.duration.as_millis().min(u32::MAX as u128) as u32,
        }),
        attempts,
        verdict,
        node: cx.node.clone(),
        batch_id: cx.batch.map(|b| b.to_string()),
    };
    let done = match verdict {
        Verdict::Retry { next_at } => {
            head.attempts = attempts;
            head.due = next_at;
            if let Some(b) = cx.batch {
                head.batch = Some(b.clone());
                cx.batching
                    .join(b.clone(), cx.lane.clone(), head.id.clone());
            }
            false
        }
        _ => true,
    };
    (done, outcome)
}

/// Counts an attempt, its duration, the status it left its notification in and, once
/// delivered, how long after it was created (the id is a ULID: its time is the creation).
fn attempt_metrics(
    meters: &mut Meters,
    result: &AttemptResult,
    verdict: Verdict,
    id: &str,
    now: Millis,
) {
    meters.attempts.get(result.label()).increment(1);
    meters.attempt_seconds.record(result.duration.as_secs_f64());
    let status = policy::status_after(verdict);
    if status != Status::Pending {
        meters.ended(status.as_str());
    }
    if status == Status::Delivered {
        crate::delivery::progress::delivered(1);
    }
    if verdict == Verdict::Delivered {
        let created = ulid::Ulid::from_string(id)
            .map(|u| u.timestamp_ms() as Millis)
            .unwrap_or(now);
        meters
            .latency
            .record((now - created).max(0) as f64 / 1000.0);
    }
}
