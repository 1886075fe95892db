//! Reliable, ordered webhook delivery from the durable outbox.
//!
//! The dispatcher keeps an in-memory index of pending notifications, rebuilt from the store
//! at start. Notifications queue in *lanes*, one per (client, sensor); only a lane's head is
//! ever in flight, which is what guarantees a client never sees an older state of a sensor
//! after a newer one. A timer heap holds each idle lane's next due time. Due heads wait in
//! `ready` until the global and per-client limits admit them, and are then claimed from
//! the store in batches: the claim leases them, reads URL and secret from the registry
//! *now*, and cancels those whose client is gone or no longer owns the sensor. Heads are
//! admitted up to [`CLAIM_AHEAD`] times the concurrency limits, so the next claimed head
//! is ready the moment a request ends; semaphores hold the requests themselves to the
//! limits.
//! Results go to a recorder task that writes attempts and verdicts in batches.
//!
//! Memory follows the work *pending*, never the work done: a lane is dropped when its queue
//! empties, a client's counters when nothing of it is out, stale timers are dropped once
//! they outnumber the lanes, and finished ids are remembered only where sweeps need them
//! (a shared store), for [`FINISHED_MEMORY_MS`]. A week of deliveries leaves the
//! dispatcher as small as it started (`latch bench soak` measures it).

pub mod retry;
pub mod sender;
pub mod signing;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::domain::policy::{self, Attempted, Queued};
use crate::domain::{
    Attempt, Claim, EventKind, Millis, NotificationRef, Outcome, SensorId, Status, Verdict,
    time::now_ms,
};
use crate::store::Store;
use retry::RetryPolicy;
use sender::AttemptResult;

/// Errors of the delivery layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// Settings of the dispatcher.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: RetryPolicy,
    pub timeout: Duration,
    pub concurrency: usize,
    pub client_concurrency: u32,
    /// This process's name on leases.
    pub node: String,
}

impl Settings {
    pub fn from_config(c: &crate::config::Config) -> Self {
        Self {
            policy: RetryPolicy::from_config(c),
            timeout: c.delivery_timeout,
            concurrency: c.delivery_concurrency as usize,
            client_concurrency: c.delivery_client_concurrency,
            node: format!("latch-{}", ulid::Ulid::new()),
        }
    }

    /// How long a claim holds a notification: a claimed-ahead head waits for at most one
    /// attempt before its own, so three attempts' timeouts and a margin for recording the
    /// result; a lease only runs out when its holder is gone.
    fn lease(&self) -> Millis {
        3 * self.timeout.as_millis() as Millis + 5_000
    }
}

/// Handle to the dispatcher; cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    tx: mpsc::UnboundedSender<Cmd>,
}

impl Dispatcher {
    /// Schedules notifications just made durable (or put back by a manual retry).
    pub fn enqueue(&self, refs: Vec<NotificationRef>) {
        if !refs.is_empty() {
            let _ = self.tx.send(Cmd::Enqueue(refs));
        }
    }

    /// Starts the dispatcher with the store's pending notifications. It stops when `stop`
    /// is cancelled, letting in-flight attempts finish within `grace`.
    pub async fn start(
        store: Arc<dyn Store>,
        settings: Settings,
        stop: CancellationToken,
        grace: Duration,
        tracker: &TaskTracker,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            // A redirect is never followed: a 303 would turn the POST into a GET, and any
            // redirect would carry the signed headers to a host the client never gave us.
            // A 3xx is a failed attempt with its status recorded, like any other non-2xx.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(settings.client_concurrency as usize)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .build()
            .map_err(Error::Http)?;
        let pending = store.load_pending(i64::MIN).await?;
        let core_store = store.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        let (rec_tx, rec_rx) = mpsc::unbounded_channel();
        tracker.spawn(recorder(store.clone(), rec_rx));
        let settings = Arc::new(settings);
        let (claims, claims_rx) = mpsc::unbounded_channel();
        let sends = Arc::new(Semaphore::new(settings.concurrency));
        tracker.spawn(claimer(
            store.clone(),
            Sending {
                http,
                settings: settings.clone(),
                sends,
                tx: tx.clone(),
                tracker: tracker.clone(),
            },
            claims_rx,
        ));
        let mut core = Core::new(settings, rec_tx, claims, core_store.shared());
        tracing::info!(
            pending = pending.len(),
            "Dispatcher loaded pending notifications."
        );
        core.enqueue(pending, now_ms());
        // Right away, not at the first event: a restart with a backlog shows it at once.
        metrics::gauge!("latch_notifications_pending").set(core.pending as f64);
        if core_store.shared() {
            tracker.spawn(sweeper(core_store, tx.clone(), stop.clone()));
        }
        tracker.spawn(core.run(rx, stop, grace));
        Ok(Self { tx })
    }
}

type LaneKey = (Arc<str>, SensorId);

/// Most heads claimed in one store call.
const CLAIM_BATCH_MAX: usize = 1024;
/// How long a finished notification is not taken up again from a sweep: well beyond the
/// time its result takes to be recorded.
const FINISHED_MEMORY_MS: Millis = 30_000;
/// Claims running at once on a shared (server) store.
const CLAIMS_IN_FLIGHT: usize = 4;
/// Heads admitted (claimed or sending) per request the limits allow.
const CLAIM_AHEAD: u32 = 2;
/// Stale timer entries tolerated beyond two per lane before the heap is compacted.
const TIMER_SLACK: usize = 1024;

/// A head admitted by the limits, on its way to be claimed and sent.
struct Admitted {
    lane: LaneKey,
    id: String,
    /// Requests in flight to its client.
    client_sends: Arc<Semaphore>,
}

enum Cmd {
    Enqueue(Vec<NotificationRef>),
    /// What a sweep of a shared store found pending.
    Sweep(Vec<NotificationRef>),
    Done(Box<Done>),
}

/// What came of a claimed head.
struct Done {
    lane: LaneKey,
    id: String,
    result: Finished,
}

enum Finished {
    Attempted(AttemptResult),
    /// Not pending any more (superseded, cancelled, …).
    Gone(Status),
    /// Someone else holds it until then; or the store could not be reached.
    Later(Millis),
}

struct Entry {
    id: String,
    seq: i64,
    kind: EventKind,
    due: Millis,
    attempts: u32,
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
}

/// Ids of notifications that left their lane lately, with when. Only a shared store's
/// sweeps need them: a sweep may read a notification as pending just before our result
/// for it is recorded. Forgotten after [`FINISHED_MEMORY_MS`], so this holds half a
/// minute's worth of deliveries, not all of them.
#[derive(Default)]
struct RecentlyFinished {
    at: HashMap<String, Millis>,
    /// The same ids in the order they finished (an id finished twice is here twice).
    order: VecDeque<(Millis, String)>,
}

impl RecentlyFinished {
    fn insert(&mut self, id: String, now: Millis) {
        self.forget(now);
        self.at.insert(id.clone(), now);
        self.order.push_back((now, id));
    }

    fn contains(&self, id: &str) -> bool {
        self.at.contains_key(id)
    }

    fn forget(&mut self, now: Millis) {
        while let Some((at, _)) = self.order.front() {
            if now - *at < FINISHED_MEMORY_MS {
                break;
            }
            let Some((at, id)) = self.order.pop_front() else {
                break;
            };
            // Only if it did not finish again since.
            if self.at.get(&id) == Some(&at) {
                self.at.remove(&id);
            }
        }
        shrink(&mut self.at);
        if self.order.capacity() > 64 && self.order.len() < self.order.capacity() / 4 {
            self.order.shrink_to(self.order.len() * 2);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.at.len()
    }
}

/// Gives a map's room back after a burst: a map keeps the capacity of its largest size,
/// and the dispatcher's maps peak with a backlog (a restart with a million pending).
fn shrink<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

struct Core {
    settings: Arc<Settings>,
    recorder: mpsc::UnboundedSender<Outcome>,
    lanes: HashMap<LaneKey, Lane>,
    timers: BinaryHeap<Reverse<(Millis, LaneKey)>>,
    ready: VecDeque<LaneKey>,
    inflight: usize,
    client_inflight: HashMap<Arc<str>, u32>,
    client_waiting: HashMap<Arc<str>, VecDeque<LaneKey>>,
    pending: usize,
    /// Ids that left their lane lately; `None` unless the store is shared (nothing but a
    /// sweep asks, and only a shared store is swept).
    finished: Option<RecentlyFinished>,
    /// Per client, the requests it may have in flight (`client_concurrency` permits).
    client_sends: HashMap<Arc<str>, Arc<Semaphore>>,
    /// Heads admitted by the limits, on their way to the [`claimer`].
    claims: mpsc::UnboundedSender<Admitted>,
}

impl Core {
    fn new(
        settings: Arc<Settings>,
        recorder: mpsc::UnboundedSender<Outcome>,
        claims: mpsc::UnboundedSender<Admitted>,
        shared: bool,
    ) -> Self {
        Self {
            settings,
            recorder,
            lanes: HashMap::new(),
            timers: BinaryHeap::new(),
            ready: VecDeque::new(),
            inflight: 0,
            client_inflight: HashMap::new(),
            client_waiting: HashMap::new(),
            pending: 0,
            finished: shared.then(RecentlyFinished::default),
            client_sends: HashMap::new(),
            claims,
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Cmd>,
        stop: CancellationToken,
        grace: Duration,
    ) {
        loop {
            let next = self.timers.peek().map(|Reverse((due, _))| *due);
            let sleep = async {
                match next {
                    Some(due) => {
                        let wait = (due - now_ms()).max(0) as u64;
                        tokio::time::sleep(Duration::from_millis(wait)).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd),
                    None => break,
                },
                _ = sleep => {}
                _ = stop.cancelled() => break,
            }
            // Take whatever else is queued before dispatching, so claims batch up.
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
            self.fire_timers(now_ms());
            self.pump();
            metrics::gauge!("latch_notifications_pending").set(self.pending as f64);
        }
        // Shutdown: dispatch nothing new; let in-flight attempts finish and be recorded.
        let deadline = tokio::time::Instant::now() + grace;
        while self.inflight > 0 {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Cmd::Done(d))) => self.finish(*d, now_ms()),
                Ok(Some(Cmd::Enqueue(_) | Cmd::Sweep(_))) => {} // durable; picked up at next start
                Ok(None) | Err(_) => break,
            }
        }
        if self.inflight > 0 {
            tracing::warn!(
                inflight = self.inflight,
                "Shutdown grace ran out with attempts in flight; their leases expire and they are sent again."
            );
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Enqueue(refs) => self.enqueue(refs, now_ms()),
            Cmd::Sweep(refs) => {
                // A sweep may read a notification as pending just before our own result
                // for it is recorded: ones we finished lately are not taken up again.
                let now = now_ms();
                let refs = match &mut self.finished {
                    Some(finished) => {
                        finished.forget(now);
                        refs.into_iter()
                            .filter(|r| !finished.contains(&r.id))
                            .collect()
                    }
                    None => refs,
                };
                self.enqueue(refs, now);
            }
            Cmd::Done(d) => self.finish(*d, now_ms()),
        }
    }

    fn enqueue(&mut self, refs: Vec<NotificationRef>, now: Millis) {
        for r in refs {
            let key: LaneKey = (Arc::from(r.client_id.as_str()), r.sensor_id);
            let lane = self.lanes.entry(key.clone()).or_default();
            if lane.queue.iter().any(|e| e.id == r.id) {
                continue;
            }
            // Older waiting state notifications are superseded. The commit did it in the
            // store for unleased ones; record it for all, so a head whose lease was not yet
            // released agrees too. A head in flight stays: it finishes first and the new
            // one follows.
            let newer = Queued {
                seq: r.seq,
                kind: r.kind,
            };
            let busy = lane.busy;
            let superseded =
                |i: usize, e: &Entry| policy::supersedes(newer, e.queued(), busy && i == 0);
            if lane.queue.iter().enumerate().any(|(i, e)| superseded(i, e)) {
                let queue = std::mem::take(&mut lane.queue);
                for (i, e) in queue.into_iter().enumerate() {
                    if superseded(i, &e) {
                        self.pending -= 1;
                        metrics::counter!("latch_notifications_total", "status" => "superseded")
                            .increment(1);
                        let _ = self.recorder.send(Outcome {
                            notification_id: e.id,
                            attempt: None,
                            attempts: e.attempts,
                            verdict: Verdict::Superseded,
                        });
                    } else {
                        lane.queue.push_back(e);
                    }
                }
            }
            let pos = lane
                .queue
                .partition_point(|e| e.seq < r.seq)
                .max(usize::from(lane.busy));
            lane.queue.insert(
                pos,
                Entry {
                    id: r.id,
                    seq: r.seq,
                    kind: r.kind,
                    due: r.due_at,
                    attempts: r.attempts,
                },
            );
            self.pending += 1;
            if !lane.busy && pos == 0 {
                let due = r.due_at;
                self.schedule(key, due, now);
            }
        }
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

    fn fire_timers(&mut self, now: Millis) {
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

    fn pump(&mut self) {
        let mut batch: Vec<Admitted> = Vec::new();
        let admit = self.settings.concurrency * CLAIM_AHEAD as usize;
        let admit_client = self.settings.client_concurrency * CLAIM_AHEAD;
        while self.inflight < admit {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(head) = self.lanes.get(&key).and_then(|l| l.queue.front()) else {
                continue;
            };
            let id = head.id.clone();
            let count = self.client_inflight.entry(key.0.clone()).or_default();
            if *count >= admit_client {
                self.client_waiting
                    .entry(key.0.clone())
                    .or_default()
                    .push_back(key);
                continue;
            }
            *count += 1;
            self.inflight += 1;
            let limit = self.settings.client_concurrency as usize;
            let client_sends = self
                .client_sends
                .entry(key.0.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(limit)))
                .clone();
            batch.push(Admitted {
                lane: key,
                id,
                client_sends,
            });
        }
        if batch.is_empty() {
            return;
        }
        for item in batch {
            let _ = self.claims.send(item);
        }
    }

    fn finish(&mut self, d: Done, now: Millis) {
        self.inflight -= 1;
        if let Some(c) = self.client_inflight.get_mut(&d.lane.0) {
            *c -= 1;
            if *c == 0 {
                // Nothing of this client is claimed or sending: no permit is held.
                self.client_inflight.remove(&d.lane.0);
                self.client_sends.remove(&d.lane.0);
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
        let Some(lane) = self.lanes.get_mut(&d.lane) else {
            return;
        };
        lane.busy = false;
        // A state notification waits behind the head: an attempt that failed is then
        // superseded rather than retried (the policy decides).
        let state_behind = lane
            .queue
            .iter()
            .skip(1)
            .any(|e| e.kind == EventKind::StateChanged);
        let Some(head) = lane.queue.front_mut() else {
            self.lanes.remove(&d.lane);
            return;
        };
        if head.id != d.id {
            // The head changed while this one was out (a manual retry of an older one).
            let due = head.due;
            self.schedule(d.lane, due, now);
            return;
        }
        let pop = match d.result {
            Finished::Gone(status) => {
                metrics::counter!("latch_notifications_total", "status" => status.as_str())
                    .increment(1);
                true
            }
            Finished::Later(until) => {
                head.due = until;
                false
            }
            Finished::Attempted(result) => {
                let attempts = head.attempts + 1;
                let policy = &self.settings.policy;
                let verdict = policy::verdict(
                    Attempted {
                        delivered: result.delivered(),
                        gone: result.gone(),
                        attempts,
                        max_attempts: policy.max_attempts,
                        kind: head.kind,
                        state_behind,
                    },
                    || {
                        let delay = match result.retry_after {
                            Some(asked) => policy.retry_after(asked),
                            None => policy.jittered(attempts, rand::thread_rng().r#gen()),
                        };
                        now + delay.as_millis() as Millis
                    },
                );
                metrics::counter!("latch_delivery_attempts_total", "outcome" => result.label())
                    .increment(1);
                metrics::histogram!("latch_delivery_attempt_seconds")
                    .record(result.duration.as_secs_f64());
                let status = policy::status_after(verdict);
                if status != Status::Pending {
                    metrics::counter!("latch_notifications_total", "status" => status.as_str())
                        .increment(1);
                }
                if verdict == Verdict::Delivered {
                    let seq_ms = ulid::Ulid::from_string(&head.id)
                        .map(|u| u.timestamp_ms() as Millis)
                        .unwrap_or(now);
                    metrics::histogram!("latch_delivery_latency_seconds")
                        .record((now - seq_ms).max(0) as f64 / 1000.0);
                }
                let _ = self.recorder.send(Outcome {
                    notification_id: head.id.clone(),
                    attempt: Some(Attempt {
                        notification_id: head.id.clone(),
                        at: result.at,
                        status_code: result.status_code,
                        error: result.error.clone(),
                        duration_ms: result.duration.as_millis().min(u32::MAX as u128) as u32,
                    }),
                    attempts,
                    verdict,
                });
                match verdict {
                    Verdict::Retry { next_at } => {
                        head.attempts = attempts;
                        head.due = next_at;
                        false
                    }
                    _ => true,
                }
            }
        };
        if pop {
            if let Some(done) = lane.queue.pop_front()
                && let Some(finished) = &mut self.finished
            {
                finished.insert(done.id, now);
            }
            self.pending -= 1;
        }
        match lane.queue.front().map(|h| h.due) {
            Some(due) => self.schedule(d.lane, due, now),
            None => {
                self.lanes.remove(&d.lane);
                shrink(&mut self.lanes);
            }
        }
    }
}

/// Writes attempts and verdicts in batches. A failed write is tried again (the outcomes
/// stay in memory); if latch dies first, the leases run out and the attempts are repeated,
/// which at-least-once delivery allows.
async fn recorder(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Outcome>) {
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < 2048 {
            match rx.try_recv() {
                Ok(o) => batch.push(o),
                Err(_) => break,
            }
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            match store.record(batch.clone(), now_ms()).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, outcomes = batch.len(), "Recording delivery outcomes failed; retrying.");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    if rx.is_closed() && backoff >= Duration::from_secs(5) {
                        tracing::error!(
                            outcomes = batch.len(),
                            "Giving up on recording outcomes at shutdown; they will be attempted again."
                        );
                        break;
                    }
                }
            }
        }
        batch.clear();
    }
}

/// What sending a claimed head needs.
#[derive(Clone)]
struct Sending {
    http: reqwest::Client,
    settings: Arc<Settings>,
    /// Requests in flight in all (`concurrency` permits).
    sends: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Cmd>,
    tracker: TaskTracker,
}

/// Claims due heads in batches: whatever piled up while the previous claim ran is claimed
/// in one store call, so claims cost one transaction per batch under load, and spawns each
/// attempt.
async fn claimer(
    store: Arc<dyn Store>,
    sending: Sending,
    mut rx: mpsc::UnboundedReceiver<Admitted>,
) {
    // A server database takes several claims at once (each its own transaction and
    // connection); the embedded one has a single writer, so one at a time is as fast.
    let parallel = if store.shared() { CLAIMS_IN_FLIGHT } else { 1 };
    let permits = Arc::new(Semaphore::new(parallel));
    while let Some(first) = rx.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < CLAIM_BATCH_MAX {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (store, sending) = (store.clone(), sending.clone());
        sending.tracker.clone().spawn(async move {
            claim_and_send(store, sending, batch).await;
            drop(permit);
        });
    }
}

/// Claims one batch of heads and starts an attempt for each one leased to us; an attempt
/// waits for a request slot of its client and of the whole dispatcher.
async fn claim_and_send(store: Arc<dyn Store>, sending: Sending, batch: Vec<Admitted>) {
    let now = now_ms();
    let ids: Vec<String> = batch.iter().map(|a| a.id.clone()).collect();
    let claims = store
        .claim(
            ids,
            sending.settings.node.clone(),
            now,
            now + sending.settings.lease(),
        )
        .await;
    let tx = &sending.tx;
    let claims = match claims {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "Claiming notifications failed; trying again shortly.");
            for Admitted { lane, id, .. } in batch {
                let result = Finished::Later(now + 1000);
                let _ = tx.send(Cmd::Done(Box::new(Done { lane, id, result })));
            }
            return;
        }
    };
    for (admitted, claim) in batch.into_iter().zip(claims) {
        let Admitted {
            lane,
            id,
            client_sends,
        } = admitted;
        let result = match claim {
            Claim::Send(s) => {
                let sending = sending.clone();
                sending.tracker.clone().spawn(async move {
                    let result = {
                        // The client's slot first: a global one is held only while sending.
                        let Ok(_client) = client_sends.acquire().await else {
                            return;
                        };
                        let Ok(_all) = sending.sends.acquire().await else {
                            return;
                        };
                        sender::send(&sending.http, &s, sending.settings.timeout).await
                    };
                    let result = Finished::Attempted(result);
                    let _ = sending
                        .tx
                        .send(Cmd::Done(Box::new(Done { lane, id, result })));
                });
                continue;
            }
            Claim::Done { status, .. } => Finished::Gone(status),
            Claim::Leased { until, .. } => Finished::Later(until),
        };
        let _ = tx.send(Cmd::Done(Box::new(Done { lane, id, result })));
    }
}

/// How often a node sharing its store with others looks for pending notifications it was
/// not told about: written by another node, or left by one that died.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// How many sweeps back the watermark of a sweep lies: a notification committed by a
/// transaction that began before that sweep may carry a lower seq than the newest one seen.
const SWEEP_LOOKBACK: usize = 3;
/// How often a sweep reads every pending notification, for transactions slower than the
/// lookback.
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// On a shared store, feeds pending notifications to the dispatcher now and then; the
/// dispatcher skips the ones it knows, and claims (with leases) settle who sends what. Most
/// sweeps read only what came after the newest seq seen a few sweeps ago, so a large
/// outbox is not read in full every 2 s.
async fn sweeper(store: Arc<dyn Store>, tx: mpsc::UnboundedSender<Cmd>, stop: CancellationToken) {
    let mut marks: VecDeque<i64> = VecDeque::new();
    let mut last_full = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        let full = last_full.elapsed() >= FULL_SWEEP_EVERY;
        let after = match marks.front() {
            Some(&mark) if !full => mark,
            _ => i64::MIN,
        };
        match store.load_pending(after).await {
            Ok(refs) => {
                if full {
                    last_full = Instant::now();
                }
                let newest = refs.iter().map(|r| r.seq).max();
                let mark = newest.max(marks.back().copied()).unwrap_or(i64::MIN);
                marks.push_back(mark);
                if marks.len() > SWEEP_LOOKBACK {
                    marks.pop_front();
                }
                if tx.send(Cmd::Sweep(refs)).is_err() {
                    return;
                }
            }
            Err(e) => tracing::warn!(error = %e, "Looking for pending notifications failed."),
        }
    }
}

#[cfg(test)]
mod tests;
