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

mod answer;
mod batches;
mod finished;
mod moves;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use super::attempt::AttemptResult;
use super::rates::{Lease, Rates, Token, Wanted};
use super::retry::RetryPolicy;
use super::{FastMap, FastSet};
use crate::domain::policy::{self, Queued, Waiting};
use crate::domain::{EventKind, Millis, NotificationRef, Outcome, SensorId, Status, Verdict};
use crate::telemetry::families;
pub(super) use batches::BatchOut;
use batches::Batching;
use finished::{RecentlyFinished, shrink};

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
    /// On a shared store, older notifications of the lane superseded here whose outcome
    /// is not written yet: the head is not claimed until they are, or the claim would find
    /// them pending in the store and wait a second for them ([`policy::claim_step`]).
    superseded_unwritten: u32,
    /// Its head was ready while `superseded_unwritten` held it back: it is readied again
    /// once they are written.
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
    unwritten: FastMap<String, (LaneKey, bool)>,
    /// Of those, the ones superseded in their lane on a shared store
    /// ([`Lane::superseded_unwritten`]).
    gating: FastMap<String, LaneKey>,
    /// Clients with lanes parked because they were disabled: a sweep of a shared store
    /// resumes those another node enabled ([`Lanes::still_disabled`]).
    parked_clients: FastSet<Arc<str>>,
    /// Clients whose last attempt got no answer (it timed out or could not connect): each
    /// is admitted one head at a time until an attempt is answered, so an endpoint that
    /// hangs holds one request slot, not its client's share of the dispatcher's.
    unanswered: FastSet<Arc<str>>,
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
        }
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
            if let Some((key, true)) = self.unwritten.remove(id) {
                self.ready.push_back(key);
            }
            if let Some(key) = self.gating.remove(id)
                && let Some(lane) = self.lanes.get_mut(&key)
            {
                lane.superseded_unwritten = lane.superseded_unwritten.saturating_sub(1);
                if lane.superseded_unwritten == 0 && lane.held_back {
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
        self.unwritten
            .insert(outcome.notification_id.clone(), (lane.clone(), false));
    }

    /// How many heads of `client` may be out at once.
    fn client_limit(&self, client: &str) -> u32 {
        limit_of(&self.unanswered, self.admit_client, client)
    }

    /// Heads that waited for their client's slots go to admission again while the client
    /// has fewer out than it may. A finished head hands its slot to the next waiting one
    /// ([`Lanes::finish`]), but a head that then does not take it (it gathers for a batch,
    /// its lane left this node) would leave the others waiting with no slot out to free
    /// one, and a client's limit can grow (its endpoint answers again): so a client
    /// below its limit never keeps heads waiting.
    fn refill(&mut self) {
        if self.client_waiting.is_empty() {
            return;
        }
        let mut go = Vec::new();
        for (client, waiting) in &mut self.client_waiting {
            let out = self.client_inflight.get(client).copied().unwrap_or(0);
            // A batched client's heads take no slot of their own: they gather.
            let limit = match self.batching.batched(client) {
                true => u32::MAX,
                false => limit_of(&self.unanswered, self.admit_client, client),
            };
            for _ in out..limit {
                match waiting.pop_front() {
                    Some(k) => go.push(k),
                    None => break,
                }
            }
        }
        self.client_waiting.retain(|_, q| !q.is_empty());
        self.ready.extend(go);
    }

    /// Clients' rates are the cluster's: their slots come leased from the store
    /// ([`Lanes::rates_wanted`], [`Lanes::rate_granted`]).
    pub(super) fn share_rates(&mut self) {
        self.rates = Rates::new(true);
    }

    /// Sets (or with `None` lifts) a client's limit of requests per second.
    pub(super) fn set_rate(&mut self, client: &str, per_second: Option<u32>) {
        self.rates.set(client, per_second);
        if per_second.is_none() {
            self.rate_granted(client, None);
        }
    }

    /// The `rate_limit` admission applies to `client` now.
    pub(super) fn rate_limit(&self, client: &str) -> Option<u32> {
        self.rates.limit(client)
    }

    /// The leases of rate slots to ask the store for.
    pub(super) fn rates_wanted(&mut self) -> Vec<Wanted> {
        self.rates.wanted()
    }

    /// A lease of `client`'s rate slots came (`None`: asking failed): the heads that waited
    /// for it are ready again.
    pub(super) fn rate_granted(&mut self, client: &str, lease: Option<Lease>) {
        self.rates.granted(client, lease);
        if let Some(waiting) = self.rate_waiting.remove(client) {
            for key in waiting {
                Self::make_ready(&mut self.lanes, &mut self.ready, key);
            }
        }
        self.rate_woken.remove(client);
        self.batch_rate_granted(client);
    }

    /// The clients disabled now, as a sweep of a shared store read them: those with
    /// parked lanes that are not any more were enabled through another node, and resume
    /// here too (rather than at their lanes' next look, a minute on).
    pub(super) fn still_disabled(&mut self, disabled: &[Arc<str>], now: Millis) {
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
    pub(super) fn resume(
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

    /// What a sweep of a shared store found pending. A sweep may read a notification as
    /// pending just before our own result for it is recorded: ones we finished lately are
    /// not taken up again. Another node may hold what it brings (its attempt in flight
    /// around a partition move), so nothing of it is dropped here before a claim of ours.
    pub(super) fn sweep(&mut self, refs: Vec<NotificationRef>, now: Millis) -> Vec<Outcome> {
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
    pub(super) fn add(&mut self, refs: Vec<NotificationRef>, now: Millis) -> Vec<Outcome> {
        self.queue(refs, now, false)
    }

    /// [`Lanes::add`], of notifications another node may hold (`held`) or not.
    fn queue(&mut self, refs: Vec<NotificationRef>, now: Millis, held: bool) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        // Each lane touched, with its head before: lanes are scheduled once all of `refs`
        // are in, so that a newer state supersedes an older one that came in the same call
        // (a restart loads both; readied first, the older would count as out, and go to a
        // client that had the newer one before the restart).
        let mut touched: Vec<(LaneKey, Option<i64>)> = Vec::new();
        let mut seen: FastSet<LaneKey> = FastSet::default();
        for r in refs {
            let key: LaneKey = (Arc::from(r.client_id.as_str()), r.sensor_id);
            // Its outcome is on its way to the store, which does not know it yet.
            if self.unwritten.contains_key(&r.id) {
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
            let pointless = take_pointless(lane, r.seq, r.kind);
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
                .max(usize::from(lane.busy));
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
    fn superseded(&mut self, key: &LaneKey, entries: Vec<Entry>) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(entries.len());
        for e in entries {
            self.pending -= 1;
            if let Some(b) = &e.batch {
                self.batching.leave(b, key);
            }
            families::NOTIFICATIONS
                .counter_with(&[("status", "superseded")])
                .increment(1);
            let outcome = Outcome {
                notification_id: e.id,
                client_id: key.0.to_string(),
                attempt: None,
                attempts: e.attempts,
                verdict: Verdict::Superseded,
                node: self.node.clone(),
                batch_id: None,
            };
            self.unwritten
                .insert(outcome.notification_id.clone(), (key.clone(), false));
            if self.finished.is_some()
                && let Some(lane) = self.lanes.get_mut(key)
            {
                lane.superseded_unwritten += 1;
                self.gating
                    .insert(outcome.notification_id.clone(), key.clone());
            }
            outcomes.push(outcome);
        }
        outcomes
    }

    fn schedule(&mut self, key: LaneKey, due: Millis, now: Millis) {
        let Some(lane) = self.lanes.get_mut(&key) else {
            return;
        };
        if due <= now {
            lane.busy = true;
            lane.timer = None;
            self.ready.push_back(key);
        } else if lane.timer != Some(due) {
            lane.timer = Some(due);
            self.timers.push(Reverse((due, key)));
            self.compact_timers();
        }
    }

    /// Drops stale timers once they outnumber the lanes. A stale one is skipped when it
    /// comes due, but that can be an hour out (a retry's delay, then a newer state
    /// superseded the retry): a sensor flapping for a dead client would leave one per
    /// change. Each lane has at most one live timer, so a compaction leaves at most one
    /// per lane, and the next one is at least as many pushes away: O(1) a push.
    fn compact_timers(&mut self) {
        if self.timers.len() <= 2 * self.lanes.len() + TIMER_SLACK {
            return;
        }
        let lanes = &self.lanes;
        self.timers
            .retain(|Reverse((due, key))| lanes.get(key).is_some_and(|l| l.timer == Some(*due)));
        self.timers.shrink_to(2 * self.timers.len() + TIMER_SLACK);
    }

    /// Moves the heads due by `now` to the ready queue, and the first head waiting for a
    /// client's rate slot once that slot has come.
    pub(super) fn fire_timers(&mut self, now: Millis) {
        while let Some(Reverse((due, _))) = self.rate_wakes.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((due, client))) = self.rate_wakes.pop() else {
                break;
            };
            if self.rate_woken.get(&client) != Some(&due) {
                continue;
            }
            self.rate_woken.remove(&client);
            self.next_rate_waiting(&client);
        }
        while let Some(Reverse((due, _))) = self.timers.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((due, key))) = self.timers.pop() else {
                break;
            };
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            // Stale timers (the lane moved on since) are skipped.
            if lane.timer != Some(due) {
                continue;
            }
            lane.timer = None;
            if lane.busy {
                continue;
            }
            match lane.queue.front().map(|h| h.due) {
                None => {}
                Some(head_due) if head_due > now => {
                    lane.timer = Some(head_due);
                    self.timers.push(Reverse((head_due, key)));
                }
                Some(_) => {
                    lane.busy = true;
                    self.ready.push_back(key);
                }
            }
        }
    }

    /// Moves the first head waiting for `client`'s rate (if any) to the ready queue.
    fn next_rate_waiting(&mut self, client: &Arc<str>) {
        let Some(waiting) = self.rate_waiting.get_mut(client) else {
            return;
        };
        while let Some(key) = waiting.pop_front() {
            if Self::make_ready(&mut self.lanes, &mut self.ready, key) {
                break;
            }
        }
        if waiting.is_empty() {
            self.rate_waiting.remove(client);
        }
    }

    /// Readies a lane that waited for its client's rate, unless the wait went stale: the
    /// lane is gone, empty, or ready or out by another way meanwhile (a newer notification
    /// scheduled it), which must not send its head twice.
    fn make_ready(
        lanes: &mut FastMap<LaneKey, Lane>,
        ready: &mut VecDeque<LaneKey>,
        key: LaneKey,
    ) -> bool {
        let Some(lane) = lanes.get_mut(&key) else {
            return false;
        };
        if lane.busy || lane.queue.is_empty() {
            return false;
        }
        lane.busy = true;
        lane.timer = None;
        ready.push_back(key);
        true
    }

    /// The ready heads the limits admit at `now`, each with its lane: to be claimed and
    /// sent. A head whose client is at its concurrency limit waits for one of that
    /// client's to finish; one whose client's rate limit has no token yet waits on a timer
    /// for the next token.
    pub(super) fn admit(&mut self, now: Millis) -> Vec<(LaneKey, String)> {
        self.refill();
        let mut batch = Vec::new();
        while self.inflight < self.admit {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            if lane.superseded_unwritten > 0 {
                // Older ones it superseded are not written yet: it goes once they are.
                lane.held_back = true;
                continue;
            }
            let Some(head) = lane.queue.front() else {
                continue;
            };
            if let Some((_, waits)) = self.unwritten.get_mut(&head.id) {
                // Its last outcome is not written yet: it goes once it is.
                *waits = true;
                continue;
            }
            if self.batching.batched(&key.0) {
                // Gathers for the client's next request ([`Lanes::admit_batches`]).
                self.gather(key, now);
                continue;
            }
            let id = head.id.clone();
            let count = self.client_inflight.get(&key.0).copied().unwrap_or(0);
            if count >= self.client_limit(&key.0) {
                self.client_waiting
                    .entry(key.0.clone())
                    .or_default()
                    .push_back(key);
                continue;
            }
            match self.rates.take(&key.0, now) {
                Token::Go => {}
                // No slot yet: the head queues for one; the client wakes when the next
                // comes.
                Token::At(due) => {
                    // Not ready while it waits: a newer state may still supersede it.
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.busy = false;
                    }
                    let client = key.0.clone();
                    self.rate_waiting
                        .entry(client.clone())
                        .or_default()
                        .push_back(key);
                    if self.rate_woken.get(&client) != Some(&due) {
                        self.rate_woken.insert(client.clone(), due);
                        self.rate_wakes.push(Reverse((due, client)));
                    }
                    continue;
                }
                // Ready again once the client's next slots are leased.
                Token::Lease => {
                    if let Some(lane) = self.lanes.get_mut(&key) {
                        lane.busy = false;
                    }
                    self.rate_waiting
                        .entry(key.0.clone())
                        .or_default()
                        .push_back(key);
                    continue;
                }
            }
            // Its client's slot (if it has a rate) is taken: the next head waiting for one
            // tries for the next.
            self.next_rate_waiting(&key.0);
            *self.client_inflight.entry(key.0.clone()).or_default() += 1;
            self.inflight += 1;
            if let Some(lane) = self.lanes.get_mut(&key) {
                lane.out = true;
            }
            batch.push((key, id));
        }
        batch
    }
}

/// How many heads of `client` may be out at once: its share, or one while its endpoint
/// does not answer.
fn limit_of(unanswered: &FastSet<Arc<str>>, share: u32, client: &str) -> u32 {
    if unanswered.contains(client) {
        1
    } else {
        share
    }
}

#[cfg(test)]
mod tests;

/// Takes out of `lane` what a newer notification (`seq`, `kind`) makes pointless
/// ([`policy::made_pointless`]): never its head in flight, nor one another node may hold.
fn take_pointless(lane: &mut Lane, seq: i64, kind: EventKind) -> Vec<Entry> {
    let busy = lane.busy;
    let waiting: Vec<Waiting> = lane
        .queue
        .iter()
        .enumerate()
        .map(|(i, e)| Waiting {
            queued: e.queued(),
            out: e.held || (busy && i == 0),
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
