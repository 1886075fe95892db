//! What comes into the lanes: notifications just made durable, what a sweep of a shared
//! store found pending, what an enabled client resumes with; and the older waiting ones
//! each makes pointless, superseded on the way in.

use std::sync::Arc;

use super::{Entry, Lane, LaneKey, Lanes};
use crate::delivery::FastSet;
use crate::domain::policy::{self, Queued, Waiting};
use crate::domain::{EventKind, Millis, NotificationRef, Outcome, Verdict};

impl Lanes {
    /// The clients disabled now, as a sweep of a shared store read them: those with
    /// parked lanes that are not any more were enabled through another node, and resume
    /// here too (rather than at their lanes' next look, a minute on).
    pub(in crate::delivery) fn still_disabled(&mut self, disabled: &[Arc<str>], now: Millis) {
        let enabled: Vec<Arc<str>> = self
            .parked_clients
            .iter()
            .filter(|c| !disabled.contains(c))
            .cloned()
            .collect();
        for client in enabled {
            self.resume(&client, Vec::new(), now);
        }
    }

    /// A client was enabled: its parked lanes go again at once, and `refs` (its pending
    /// notifications, as the store has them) are queued where they are missing.
    pub(in crate::delivery) fn resume(
        &mut self,
        client: &str,
        refs: Vec<NotificationRef>,
        now: Millis,
    ) -> Vec<Outcome> {
        self.parked_clients.remove(client);
        let shared = self.finished.is_some();
        let outcomes = self.queue(refs, now, shared);
        let parked: Vec<LaneKey> = self
            .lanes
            .iter()
            .filter(|(k, l)| &*k.0 == client && l.parked)
            .map(|(k, _)| k.clone())
            .collect();
        for key in parked {
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            lane.parked = false;
            if lane.busy {
                continue;
            }
            if let Some(head) = lane.queue.front_mut() {
                head.due = now;
                self.schedule(key, now, now);
            }
        }
        outcomes
    }

    /// What a sweep of a shared store found pending. A sweep may read a notification as
    /// pending just before our own result for it is recorded: ones we finished lately are
    /// not taken up again. Another node may hold what it brings (its attempt in flight
    /// around a partition move), so nothing of it is dropped here before a claim of ours.
    pub(in crate::delivery) fn sweep(
        &mut self,
        refs: Vec<NotificationRef>,
        now: Millis,
    ) -> Vec<Outcome> {
        let (refs, shared) = match &mut self.finished {
            Some(finished) => {
                finished.forget(now);
                let refs = refs
                    .into_iter()
                    .filter(|r| !finished.contains(&r.id))
                    .collect();
                (refs, true)
            }
            None => (refs, false),
        };
        // Only another node can be sending what a sweep finds and this node does not have:
        // on a store of one node (its leases all released when it opened) nothing is held,
        // and a newer state supersedes an older one a restart found pending beside it.
        self.queue(refs, now, shared)
    }

    /// Queues notifications just made durable in their lanes (ones already queued are
    /// skipped), and returns the outcomes to record for the older ones they make pointless.
    pub(in crate::delivery) fn add(
        &mut self,
        refs: Vec<NotificationRef>,
        now: Millis,
    ) -> Vec<Outcome> {
        self.queue(refs, now, false)
    }

    /// [`Lanes::add`], of notifications another node may hold (`held`) or not.
    pub(super) fn queue(
        &mut self,
        refs: Vec<NotificationRef>,
        now: Millis,
        held: bool,
    ) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        // Each lane touched, with its head before: lanes are scheduled once all of `refs`
        // are in, so that a newer state supersedes an older one that came in the same call
        // (a restart loads both; readied first, the older would count as out, and go to a
        // client that had the newer one before the restart).
        let mut touched: Vec<(LaneKey, Option<i64>)> = Vec::new();
        let mut seen: FastSet<LaneKey> = FastSet::default();
        let shared = self.finished.is_some();
        for r in refs {
            let key: LaneKey = (Arc::from(r.client_id.as_str()), r.sensor_id);
            // It ended here, and the store does not know it yet. One whose outcome leaves it
            // pending (a retry, a lease given back) is queued: it is still its lane's, and
            // its head waits for that outcome to be written before it is claimed. Left
            // out, a lane taken up again from the store after its partition came back sent
            // the newer notification first (simulation seed 289).
            if self.unwritten.get(&r.id).is_some_and(|u| u.ends) {
                continue;
            }
            let lane = self.lanes.entry(key.clone()).or_default();
            // Its partition is served here again.
            lane.leaving = false;
            if lane.queue.iter().any(|e| e.id == r.id) {
                continue;
            }
            if seen.insert(key.clone()) {
                touched.push((key.clone(), lane.queue.front().map(|e| e.seq)));
            }
            // Older waiting notifications it makes pointless are superseded
            // ([`policy::made_pointless`]). The commit did it in the store for unleased
            // states; record it for all, so a head whose lease was not yet released agrees
            // too. A head in flight stays, and so does one another node may hold: it
            // finishes first and the new one follows.
            let pointless = take_pointless(lane, r.seq, r.kind, shared);
            // A head out here that the supersede rule would drop were it waiting.
            let newer = Queued {
                seq: r.seq,
                kind: r.kind,
            };
            let withdraw = !shared
                && lane.out
                && lane
                    .queue
                    .front()
                    .is_some_and(|h| policy::supersedes(newer, h.queued(), false));
            if withdraw {
                self.withdrawals.push(key.clone());
            }
            outcomes.extend(self.superseded(&key, pointless));
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            // In order, but never before the head in flight here. One another node may be
            // sending (a failed one replayed while a newer one is out there) is kept from
            // going by its claim ([`policy::claim_step`]), not here: a head a sweep brought
            // is held only in case, and must not overtake an older one for it.
            let pos = lane
                .queue
                .partition_point(|e| e.seq < r.seq)
                .max(usize::from(head_out(lane, shared)));
            // Before the head of a parked lane (a replay while its client is disabled): that
            // head was due, and its time said only when to look at its client again, which
            // the lane's timer keeps. Once the client is resumed it follows the new head at
            // once, not a minute on.
            if pos == 0
                && lane.parked
                && let Some(head) = lane.queue.front_mut()
            {
                head.due = head.due.min(now);
            }
            // A batch to send again, as the store keeps it. On a shared store another node
            // may have sent that batch meanwhile (a partition moved), so one read from it
            // goes in a batch of its own.
            let batch = r
                .batch_id
                .filter(|_| self.finished.is_none())
                .map(Arc::<str>::from);
            if let Some(b) = &batch {
                self.batching.join(b.clone(), key.clone(), r.id.clone());
            }
            lane.queue.insert(
                pos,
                Entry {
                    id: r.id,
                    seq: r.seq,
                    kind: r.kind,
                    due: r.due_at,
                    attempts: r.attempts,
                    held,
                    claim_unsure: false,
                    told_to_wait: false,
                    batch,
                },
            );
            self.pending += 1;
        }
        // A new head (a new one, or the one after a superseded head) is due at its own
        // time, not at the time of the head it replaced. A parked lane waits for its
        // client to be enabled.
        for (key, head_before) in touched {
            let Some(lane) = self.lanes.get(&key) else {
                continue;
            };
            let head = lane.queue.front().map(|e| (e.seq, e.due));
            if !lane.busy
                && !lane.parked
                && let Some((seq, due)) = head
                && head_before != Some(seq)
            {
                self.schedule(key, due, now);
            }
        }
        outcomes
    }

    /// Records `entries` of lane `key` superseded while waiting: no longer pending here,
    /// out of any batch, their outcomes on the way to the recorder.
    pub(super) fn superseded(&mut self, key: &LaneKey, entries: Vec<Entry>) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(entries.len());
        for e in entries {
            let outcome = self.supersede_entry(key, e);
            self.unwritten(&outcome, key);
            self.gate(key, &outcome.notification_id);
            outcomes.push(outcome);
        }
        outcomes
    }

    /// `e`, out of lane `key` now, superseded: no longer pending here, out of any batch;
    /// its outcome to record.
    pub(super) fn supersede_entry(&mut self, key: &LaneKey, e: Entry) -> Outcome {
        self.pending -= 1;
        if let Some(b) = &e.batch {
            self.batching.leave(b, key);
        }
        self.meters.ended("superseded");
        Outcome {
            notification_id: e.id,
            client_id: key.0.to_string(),
            attempt: None,
            attempts: e.attempts,
            verdict: Verdict::Superseded,
            node: self.node.clone(),
            batch_id: None,
        }
    }
}

/// Takes out of `lane` what a newer notification (`seq`, `kind`) makes pointless
/// ([`policy::made_pointless`]): never its head out, nor, on a `shared` store, one another
/// node may hold. On a store of its own, a head held only because its claim went
/// unanswered is this node's: it was not sent (simulation seed 0, without the supersede
/// check's allowance for it).
fn take_pointless(lane: &mut Lane, seq: i64, kind: EventKind, shared: bool) -> Vec<Entry> {
    let head_out = head_out(lane, shared);
    let waiting: Vec<Waiting> = lane
        .queue
        .iter()
        .enumerate()
        .map(|(i, e)| Waiting {
            queued: e.queued(),
            out: (e.held && shared) || (head_out && i == 0),
        })
        .collect();
    let pointless = policy::made_pointless(&waiting, Queued { seq, kind });
    if pointless.is_empty() {
        return Vec::new();
    }
    let mut taken = Vec::with_capacity(pointless.len());
    for (i, e) in std::mem::take(&mut lane.queue).into_iter().enumerate() {
        if pointless.binary_search(&i).is_ok() {
            taken.push(e);
        } else {
            lane.queue.push_back(e);
        }
    }
    taken
}

/// Whether `lane`'s head is out of reach of the rules here: nothing passes it, nothing
/// drops it. On a shared store that is any head ready or out. On a store of its own only
/// one out (admitted, claimed or sending) may be on its way, or one gathered for a batch
/// it goes out in again (that batch keeps its members); one ready but not admitted
/// (waiting for a request slot, or for its last outcome to be written) is not
/// (simulation seed 189, without the supersede check's allowance for it). Its lane stays
/// ready: the head after it goes in its place.
fn head_out(lane: &Lane, shared: bool) -> bool {
    if shared {
        return lane.busy;
    }
    lane.out || (lane.gathered && lane.queue.front().is_some_and(|h| h.batch.is_some()))
}
