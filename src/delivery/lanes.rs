//! Lanes, timers and the ready queue: the dispatcher's ordering as a state machine. It is
//! told what arrived, what time it is and what came of each claimed head, and answers with
//! what to do: the heads to claim now, the outcomes to record. No tokio, no store, no
//! clock of its own, so it is tested by moving `now` by hand.
//!
//! Notifications queue in *lanes*, one per (client, sensor), in outbox order; only a
//! lane's head is ever out (claimed or sending), which is what guarantees a client never
//! sees an older state of a sensor after a newer one. A timer heap holds each idle lane's
//! next due time. Due heads wait in `ready` until the global and per-client limits admit
//! them, up to [`CLAIM_AHEAD`] times those limits ([`CLAIM_AHEAD_SHARED`] on a server
//! database, whose claims take longer), so the next claimed head is ready the
//! moment a request ends. A client with a `rate_limit` is admitted one head per token
//! (evenly spaced requests); a disabled client's heads park in their lanes until
//! [`Lanes::resume`].
//!
//! On a store shared with other nodes, a notification another node may be sending (a
//! sweep brought it, or a claim said so) is *held*: nothing of its lane passes it, no rule
//! drops it here, and it is claimed again within [`policy::RECHECK_MS`] until its outcome
//! is known. The lanes of a partition that moved to another node go at once
//! ([`Lanes::leave`]).
//!
//! Memory follows the work *pending*, never the work done: a lane is dropped when its queue
//! empties, a client's counters when nothing of it is out, stale timers are dropped once
//! they outnumber the lanes, and finished ids are remembered only where sweeps need them
//! (a shared store), for [`FINISHED_MEMORY_MS`]. A week of deliveries leaves the
//! dispatcher as small as it started (`latch bench soak` measures it).

mod admission;
mod answer;
mod batches;
mod finished;
mod moves;
mod queue;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use super::attempt::AttemptResult;
use super::rates::{Rates, Token};
use super::retry::RetryPolicy;
use super::{FastMap, FastSet};
use crate::domain::policy::Queued;
use crate::domain::{EventKind, Millis, Outcome, SensorId, Status, Verdict};
use crate::telemetry::families;
pub(super) use batches::BatchOut;
use batches::Batching;
use finished::{RecentlyFinished, shrink};

/// A notification whose outcomes are on their way to the recorder ([`Lanes::unwritten`]).
struct Unwritten {
    lane: LaneKey,
    /// Its lane's head waits for them.
    waits: bool,
    /// Outcomes of it not written yet: a failed attempt's may still be on its way when
    /// a newer state supersedes it.
    outcomes: u32,
    /// One of them ends it (delivered, failed, superseded); the others leave it pending.
    ends: bool,
}

/// A lane's name: its client and sensor.
pub(super) type LaneKey = (Arc<str>, SensorId);

/// How long a finished notification is not taken up again from a sweep: well beyond the
/// time its result takes to be recorded.
pub(super) const FINISHED_MEMORY_MS: Millis = 30_000;
/// Heads admitted (claimed or sending) per request the limits allow. The embedded
/// store's one writer also commits the incoming changes, so a claim may wait behind a
/// commit: at 2 a client's request slots stood empty meanwhile (one client: 0.38–0.53 of
/// the receiver at the same concurrency; 0.56–0.68 at 6).
pub(super) const CLAIM_AHEAD: u32 = 6;
/// The same on a shared (server) store, whose claims take a network transaction: each
/// admitted head waits a claim round trip or two, so more are claimed ahead to keep the
/// request slots busy. At 2 the claim's latency bound PostgreSQL delivery to one client
/// to about `2 × client concurrency / claim time` (2.5k/s).
pub(super) const CLAIM_AHEAD_SHARED: u32 = 8;

/// Heads admitted per request the limits allow, on a shared store or not.
pub(super) fn claim_ahead(shared: bool) -> u32 {
    if shared {
        CLAIM_AHEAD_SHARED
    } else {
        CLAIM_AHEAD
    }
}
/// Stale timer entries tolerated beyond two per lane before the heap is compacted.
const TIMER_SLACK: usize = 1024;

/// What came of a claimed head.
pub(super) struct Done {
    pub lane: LaneKey,
    pub id: String,
    pub result: Finished,
}

pub(super) enum Finished {
    Attempted(AttemptResult),
    /// Not pending any more (superseded, cancelled, …).
    Gone(Status),
    /// Another node holds it until then (its attempt may be in flight), or the store
    /// could not be reached: nothing in this lane may pass it, and it is asked about again
    /// soon ([`policy::look_again`]).
    Held(Millis),
    /// Free, but not to be sent before then.
    Later(Millis),
    /// Its client is disabled: the lane waits for [`Lanes::resume`], looking again only
    /// every [`PARK_RECHECK_MS`] (another node may have enabled the client).
    Parked,
    /// Claimed but not sent: its lane left this node meanwhile ([`Lanes::leave`]). Its
    /// lease is given back, with its `attempts` as they were.
    Released {
        attempts: u32,
    },
}

/// How often a lane of a disabled client asks the store again whether it was enabled
/// elsewhere; enabling it through this node resumes it at once.
pub(super) const PARK_RECHECK_MS: Millis = 60_000;

struct Entry {
    id: String,
    seq: i64,
    kind: EventKind,
    due: Millis,
    attempts: u32,
    /// Another node may hold its lease (read from a shared store by a sweep, or a claim
    /// said so): no rule drops it here until a claim of ours settles it.
    held: bool,
    /// A claim of it failed, and may have landed: the store may hold it leased to this
    /// node, which is given back if its lane leaves ([`Lanes::leave`]).
    claim_unsure: bool,
    /// A claim told it to wait on the store's lane (an older notification pending there,
    /// or another node's attempt) and look again within [`policy::RECHECK_MS`]: once the
    /// head before it here ends, it is claimed at once rather than at that look.
    told_to_wait: bool,
    /// The batch it goes out in again: its last attempt was sent in that batch, and failed.
    batch: Option<Arc<str>>,
}

impl Entry {
    fn queued(&self) -> Queued {
        Queued {
            seq: self.seq,
            kind: self.kind,
        }
    }
}

#[derive(Default)]
struct Lane {
    queue: VecDeque<Entry>,
    /// Its head is ready or in flight: timers leave it alone.
    busy: bool,
    /// When its one live timer fires. Other entries of the heap for this lane are stale.
    timer: Option<Millis>,
    /// Its client is disabled: its head waits for [`Lanes::resume`].
    parked: bool,
    /// Its head is out: admitted, claimed or sending.
    out: bool,
    /// Its head gathers for its client's next batch ([`batches`]): listed there once, and
    /// only a lane still gathering may be taken into a batch.
    gathered: bool,
    /// Its sensor's partition left this node while its head was out: once that head is
    /// answered, the lane is dropped ([`Lanes::leave`]).
    leaving: bool,
    /// On a shared store, older notifications that left the lane here (superseded,
    /// delivered, failed for good) whose outcome is not written yet ([`Lanes::gate`]): the
    /// head is not claimed until they are. The store holds them pending until then: the
    /// claim would wait a second for them ([`policy::claim_step`]), and were this node to
    /// die first, the node serving the lane next would send them after the head.
    ended_unwritten: u32,
    /// Its head was ready while `ended_unwritten` held it back: it is readied again once
    /// they are written.
    held_back: bool,
}

/// Every pending notification the dispatcher knows, by lane, with what is due and what is
/// out.
pub(super) struct Lanes {
    policy: RetryPolicy,
    /// Heads out (claimed or sending) at most, in all and per client.
    admit: usize,
    admit_client: u32,
    lanes: FastMap<LaneKey, Lane>,
    timers: BinaryHeap<Reverse<(Millis, LaneKey)>>,
    ready: VecDeque<LaneKey>,
    inflight: usize,
    client_inflight: FastMap<Arc<str>, u32>,
    client_waiting: FastMap<Arc<str>, VecDeque<LaneKey>>,
    pending: usize,
    /// Ids that left their lane lately; `None` unless the store is shared (nothing but a
    /// sweep asks, and only a shared store is swept).
    finished: Option<RecentlyFinished>,
    /// Clients with a `rate_limit`: when each may be sent its next request ([`Rates`]).
    rates: Rates,
    /// Per client, ready heads waiting for its rate: for a lease of its cluster-wide slots,
    /// or for its next slot.
    rate_waiting: FastMap<Arc<str>, VecDeque<LaneKey>>,
    /// When a client's next rate slot comes, one wake-up a client, not a timer a lane: at
    /// each slot one waiting head goes, so a backlog behind a rate limit costs the loop
    /// O(1) a slot, where every lane's timer firing at every slot cost O(backlog).
    rate_wakes: BinaryHeap<Reverse<(Millis, Arc<str>)>>,
    /// The live wake-up of each client in `rate_wakes` (other entries are stale).
    rate_woken: FastMap<Arc<str>, Millis>,
    /// This node, on every outcome ([`Outcome::node`]).
    node: Arc<str>,
    /// Batched clients: their heads gathering, their batches out, the batches to send
    /// again ([`batches`]).
    batching: Batching,
    /// Where batch ids are drawn from (it reads no time here: `now` is always given).
    ids: crate::clock::Clock,
    /// Notifications whose outcome the recorder has not written yet, with their lane and
    /// whether that lane waits for it. Until it is written the store still holds them as
    /// it did before: one still in its lane (a failed attempt, a lease given back) is not
    /// claimed again — the record releases the lease it was sent under, and written after
    /// a newer claim it would release that one too — and one that left its lane (delivered,
    /// failed, superseded) is not queued again from the store's word (a client enabled, a
    /// sweep) to be sent, or superseded, a second time.
    unwritten: FastMap<String, Unwritten>,
    /// Of those, the ones that hold up the next head of their lane on a shared store
    /// ([`Lane::ended_unwritten`]).
    gating: FastMap<String, LaneKey>,
    /// Clients with lanes parked because they were disabled: a sweep of a shared store
    /// resumes those another node enabled ([`Lanes::still_disabled`]).
    parked_clients: FastSet<Arc<str>>,
    /// Clients whose last attempt got no answer (it timed out or could not connect): each
    /// is admitted one head at a time until an attempt is answered, so an endpoint that
    /// hangs holds one request slot, not its client's share of the dispatcher's.
    unanswered: FastSet<Arc<str>>,
    /// On a store of its own, lanes whose head is out (admitted, not yet known to be sent)
    /// while a newer state waits behind it: the dispatcher withdraws those heads, and one
    /// not sent yet comes back to be superseded ([`Lanes::withdrawals`]).
    withdrawals: Vec<LaneKey>,
    /// The metrics every answer counts.
    meters: Meters,
}

/// The handles of the metrics the lanes count, taken from the recorder once
/// ([`families::CountersBy`]) rather than at every attempt.
struct Meters {
    /// `latch_delivery_attempts_total` by outcome.
    attempts: families::CountersBy,
    /// `latch_notifications_total` by status.
    notifications: families::CountersBy,
    attempt_seconds: metrics::Histogram,
    latency: metrics::Histogram,
}

impl Meters {
    /// A notification reached its final `status`: counted by status, and in this
    /// process's progress (what `latch bench` waits on without scraping).
    fn ended(&mut self, status: &'static str) {
        self.notifications.get(status).increment(1);
        crate::delivery::progress::ended(1);
    }

    fn new() -> Self {
        Self {
            attempts: families::DELIVERY_ATTEMPTS.counters_by("outcome"),
            notifications: families::NOTIFICATIONS.counters_by("status"),
            attempt_seconds: families::DELIVERY_ATTEMPT_SECONDS.histogram(),
            latency: families::DELIVERY_LATENCY.histogram(),
        }
    }
}

impl Lanes {
    /// Lanes of `node` for `concurrency` requests in all and `client_concurrency` per
    /// client, on a store `shared` with other nodes or not; batch ids are drawn from `ids`.
    pub(super) fn new(
        node: Arc<str>,
        policy: RetryPolicy,
        concurrency: usize,
        client_concurrency: u32,
        shared: bool,
        ids: crate::clock::Clock,
    ) -> Self {
        let ahead = claim_ahead(shared);
        Self {
            policy,
            admit: concurrency * ahead as usize,
            admit_client: client_concurrency * ahead,
            lanes: FastMap::default(),
            timers: BinaryHeap::new(),
            ready: VecDeque::new(),
            inflight: 0,
            client_inflight: FastMap::default(),
            client_waiting: FastMap::default(),
            pending: 0,
            finished: shared.then(RecentlyFinished::default),
            rates: Rates::new(false),
            rate_waiting: FastMap::default(),
            rate_wakes: BinaryHeap::new(),
            rate_woken: FastMap::default(),
            node,
            batching: Batching::default(),
            ids,
            unwritten: FastMap::default(),
            gating: FastMap::default(),
            parked_clients: FastSet::default(),
            unanswered: Default::default(),
            withdrawals: Vec::new(),
            meters: Meters::new(),
        }
    }

    /// The lanes whose head out here a newer state has made pointless since the last call
    /// (a store of its own only): withdrawn before it is sent, the head comes back unsent
    /// and is superseded. The store's commit passes such a head by when it holds it leased
    /// (a lease of its earlier attempt not yet released, or this claim's), so only this
    /// node can tell it is not on its way (simulation seed 420, without the supersede
    /// check's allowance for it).
    pub(super) fn withdrawals(&mut self) -> Vec<LaneKey> {
        std::mem::take(&mut self.withdrawals)
    }

    /// `client`'s last attempt here got no answer.
    pub(super) fn unanswered(&self, client: &str) -> bool {
        self.unanswered.contains(client)
    }

    /// Notes whether `client`'s endpoint answered an attempt ([`Lanes::unanswered`]).
    pub(super) fn answered(&mut self, client: &Arc<str>, result: &AttemptResult) {
        if result.unanswered() {
            if !self.unanswered.contains(client) {
                self.unanswered.insert(client.clone());
            }
        } else if !self.unanswered.is_empty() {
            self.unanswered.remove(client);
        }
    }

    /// The recorder wrote the outcomes of these notifications: heads that waited for it go
    /// on.
    pub(super) fn recorded(&mut self, ids: &[String]) {
        if self.unwritten.is_empty() {
            return;
        }
        for id in ids {
            // One outcome of it written: the store holds it as it should only once the
            // last one is (a failed attempt's, then its superseding: simulation seed
            // 513201, where the first one written let a resume queue it again).
            let Some(u) = self.unwritten.get_mut(id) else {
                continue;
            };
            u.outcomes -= 1;
            if u.outcomes > 0 {
                continue;
            }
            if let Some(u) = self.unwritten.remove(id)
                && u.waits
            {
                self.ready.push_back(u.lane);
            }
            if let Some(key) = self.gating.remove(id)
                && let Some(lane) = self.lanes.get_mut(&key)
            {
                lane.ended_unwritten = lane.ended_unwritten.saturating_sub(1);
                if lane.ended_unwritten == 0 && lane.held_back {
                    lane.held_back = false;
                    self.ready.push_back(key);
                }
            }
        }
    }

    /// The outcome that gives back this node's lease on notification `id` of `lane`
    /// without an attempt: pending again, due `now`.
    fn given_back(&self, id: String, lane: &LaneKey, attempts: u32, now: Millis) -> Outcome {
        Outcome {
            notification_id: id,
            client_id: lane.0.to_string(),
            attempt: None,
            attempts,
            verdict: Verdict::Retry { next_at: now },
            node: self.node.clone(),
            batch_id: None,
        }
    }

    /// `outcome`, of a notification of `lane`, goes to the recorder.
    fn unwritten(&mut self, outcome: &Outcome, lane: &LaneKey) {
        let ends = !matches!(outcome.verdict, Verdict::Retry { .. });
        self.unwritten
            .entry(outcome.notification_id.clone())
            .and_modify(|u| {
                u.outcomes += 1;
                u.ends |= ends;
            })
            .or_insert_with(|| Unwritten {
                lane: lane.clone(),
                waits: false,
                outcomes: 1,
                ends,
            });
    }

    /// On a shared store, lane `key`'s head is not claimed until the outcome of `id`, which
    /// left the lane ahead of it, is written ([`Lane::ended_unwritten`]).
    fn gate(&mut self, key: &LaneKey, id: &str) {
        if self.finished.is_some()
            && let Some(lane) = self.lanes.get_mut(key)
        {
            lane.ended_unwritten += 1;
            self.gating.insert(id.to_string(), key.clone());
        }
    }

    /// `client`'s lanes and counters, in words ([`super::Dispatcher::describe`]).
    pub(super) fn describe(&self, client: &str) -> String {
        let mut out = format!(
            "inflight {} (client {:?}), waiting {:?}, unanswered {}, batched {} (busy {}), rate {:?} waiting {:?} woken {:?}",
            self.inflight,
            self.client_inflight.get(client),
            self.client_waiting.get(client).map(|q| q.len()),
            self.unanswered.contains(client),
            self.batching.batched(client),
            self.batching.busy(client),
            self.rates.limit(client),
            self.rate_waiting.get(client).map(|q| q.len()),
            self.rate_woken.get(client),
        );
        let mut lanes: Vec<_> = self.lanes.iter().filter(|(k, _)| &*k.0 == client).collect();
        lanes.sort_by_key(|(k, _)| k.1);
        for (k, l) in lanes {
            out.push_str(&format!(
                "\n  {}: busy {} out {} parked {} leaving {} gathered {} timer {:?} in ready {} heads {:?}",
                k.1,
                l.busy,
                l.out,
                l.parked,
                l.leaving,
                l.gathered,
                l.timer,
                self.ready.contains(k),
                l.queue
                    .iter()
                    .map(|e| (e.seq, e.due, e.held, e.attempts))
                    .collect::<Vec<_>>()
            ));
        }
        out
    }

    /// Notifications pending, in lanes or out.
    pub(super) fn pending(&self) -> usize {
        self.pending
    }

    /// Heads claimed or sending.
    pub(super) fn inflight(&self) -> usize {
        self.inflight
    }

    /// When the earliest timer fires (it may be stale: firing it then does nothing), or a
    /// gathering batch is due to go.
    pub(super) fn next_timer(&self) -> Option<Millis> {
        let lane = self.timers.peek().map(|Reverse((due, _))| *due);
        let rate = self.rate_wakes.peek().map(|Reverse((due, _))| *due);
        let timer = match (lane, rate) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (timer, self.batching.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether anything of the client is claimed or sending.
    pub(super) fn client_busy(&self, client: &str) -> bool {
        self.client_inflight.contains_key(client) || self.batching.busy(client)
    }
}

#[cfg(test)]
mod tests;
