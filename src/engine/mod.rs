//! The engine: change detection on in-memory shards, group-committed.
//!
//! Readings are routed by hash of sensor id to a shard task ([`shard`]) that owns those
//! sensors' current state, so change detection is a map look-up, never a database round
//! trip. A shard takes whatever readings have queued up, applies them to a scratch copy of
//! the touched sensors, and hands the effects ([`CommitBatch`]) to the committer; only
//! when the commit is durable does it keep the new state and answer the callers. A failed
//! commit therefore leaves memory exactly as the store is, and nothing is acknowledged.
//!
//! Each shard commits on its own, so a request spread over several shards can come out
//! partly durable: one shard's batch in a commit that succeeded, another's in one that
//! failed. [`Ticket::wait`] says exactly that: the failed shard's readings are rejected
//! with `store_unavailable` (send again), the others keep their verdicts; only when no
//! shard committed is the whole request an error. [`Engine::enqueue`] splits a request
//! over the shards and [`Ticket::wait`] puts the answers back together: the one split and
//! merge between a source and the store.
//!
//! A broker session enqueues its batches as one [`Sequence`] ([`Engine::enqueue_in`]):
//! cut at its first reading that does not commit, so that nothing of it commits behind
//! that point and the broker's redelivery can skip what did.
//!
//! Deadlines are read from a [`Clock`]: the wall clock in service, one moved by hand in
//! tests.
//!
//! Sensors belong to partitions ([`crate::domain::partition`]); partition `p` lives on
//! shard `p % shards`. On one node the engine serves every partition from the start
//! ([`Engine::launch`]). In a cluster ([`Engine::launch_leased`]) it serves the partitions
//! whose leases this node holds ([`Engine::acquire`], [`Engine::release`]), stamps each
//! commit with their epochs (the fence), and hands readings of other partitions to their
//! owners through a [`Forwarder`] by the [`Routing`] table the cluster layer keeps.

mod due;
mod extra;
pub mod fleet;
pub mod follow;
mod part;
pub mod rules;
mod sequence;
mod settings;
pub use settings::Settings;
mod shard;
mod ticket;

use crate::hashing::FastMap as HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use crate::clock::Clock;
use crate::domain::partition::Partitioning;
use crate::domain::reading::RejectCode;
use crate::domain::sensor::SensorState;
use crate::domain::{Millis, Reading, Rejection, SensorId, Source};
use crate::store::{CommitBatch, Keyed, SensorRuntime};
use crate::telemetry::families;
use fleet::Fleet;
use part::Part;
pub use sequence::Sequence;
use shard::{Shard, ShardMsg};
pub use ticket::{Report, Ticket, VerdictsRx};

/// How long after taking a partition over, while serving, a sensor unknown here may still
/// be one registered through another node while the partition's sensors were loading: its
/// registration reaches this node within the registry follower's lookback.
pub const TAKEOVER_GRACE_MS: Millis = 5_000;

/// Most sensors a shard declares lost in one round: a fleet-wide outage is worked off in
/// batches of this size, interleaved with ingest, instead of one giant transaction. Readings
/// arriving meanwhile wait about two such commits (`latch bench fleet` measures it): 5,000
/// halved that wait against 10,000 for about the same time to work off 1M sensors.
pub const EXPIRE_BATCH: usize = 5_000;

/// Sensors declared lost since this process started (every engine in it), as
/// `latch_sensors_lost_total` counts them: `latch bench fleet` watches its in-process
/// latch with one atomic load, where a `/metrics` scrape every few milliseconds renders
/// every family in the process it measures.
static LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// See [`LOST`].
pub fn lost_total() -> u64 {
    LOST.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts sensors a commit declared lost, in the metrics and in [`LOST`].
fn count_lost(n: usize) {
    families::SENSORS_LOST_TOTAL.counter().increment(n as u64);
    LOST.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Most due sensors a shard queues at once to declare lost in id order (16 bytes each);
/// a larger outage is taken a range of ids at a time ([`due`]).
pub const DUE_MAX: usize = 1_000_000;

/// Errors of the engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("the engine is shutting down")]
    Closed,
    #[error("could not make the readings durable: {0}")]
    Commit(String),
    /// The store's disk is full: nothing was made durable. Transient, like `Commit`.
    #[error("could not make the readings durable, the store's disk is full: {0}")]
    StorageFull(String),
    /// The store could not say whether the commit landed (PostgreSQL unreachable while its
    /// outcome was asked for): the readings may be durable. Memory follows what the store
    /// was read back to hold, so sending them again changes no state a second time.
    #[error("could not learn whether the readings were made durable: {0}")]
    Unknown(String),
}

/// How the engine's shards run.
#[derive(Clone, Debug)]
pub struct Tuning {
    pub shards: usize,
    /// Most readings a shard applies in one round (one commit).
    pub batch_max: usize,
    /// The heartbeat timeout of sensors without their own.
    pub default_timeout: std::time::Duration,
    /// The debounce window of sensors without their own (zero: none).
    pub default_debounce: std::time::Duration,
    /// The interval of `sensor.still_lost` reminders; `None`: none.
    pub lost_reminder: Option<std::time::Duration>,
    pub clock: Clock,
    /// Partitions of the fleet (the cluster's; MD5 over any fixed count on one node).
    pub partitions: Partitioning,
    /// Watches the shards: a shard that panicked would leave its sensors unserved.
    pub supervisor: crate::tasks::Supervisor,
}

impl Tuning {
    /// The rules' settings, in the engine's units.
    fn policy(&self) -> fleet::Policy {
        fleet::Policy {
            default_timeout_ms: self.default_timeout.as_millis() as Millis,
            default_debounce_ms: self.default_debounce.as_millis() as Millis,
            reminder_ms: self.lost_reminder.map(|r| (r.as_millis() as Millis).max(1)),
        }
    }
}

/// A batch of effects waiting to be made durable; `reply` says whether it was.
pub struct CommitRequest {
    /// The shard that sent it (each has at most one out at a time).
    pub shard: usize,
    pub batch: CommitBatch,
    pub reply: oneshot::Sender<Result<(), CommitFailure>>,
    /// When the shard sent it: the wait until its commit starts is measured from here.
    pub sent_at: std::time::Instant,
}

/// Why a group commit did not succeed.
#[derive(Debug, Clone)]
pub enum CommitFailure {
    /// Nothing of the batch was written.
    Refused(String),
    /// Nothing of the batch was written: the store's disk is full.
    Full(String),
    /// The batch may have been written (its answer was lost). `landed`: the committed state
    /// of its sensors, read back since (`None`: the store never answered), so memory
    /// follows what the store holds rather than a guess.
    Unknown {
        message: String,
        landed: Option<Vec<SensorRuntime>>,
    },
}

impl std::fmt::Display for CommitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommitFailure::Refused(m) | CommitFailure::Full(m) => f.write_str(m),
            CommitFailure::Unknown { message, .. } => write!(f, "{message} (outcome unknown)"),
        }
    }
}

/// One shard's results: `None` accepted, `Some(reason)` rejected, in its input order.
pub type Verdicts = Vec<Option<Rejection>>;

/// Where the readings of a partition go.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    Here,
    /// The owner's address.
    Node(Arc<str>),
    /// Nobody serves it right now (its lease is moving).
    Nobody,
}

/// Hands readings to the node that serves their partition and answers with its verdicts
/// once that node made them durable (the cluster layer implements it over HTTP). The owner
/// stamps them with its own clock: no node's stamp is taken on another's word. Readings of
/// a [`Sequence`] are not sent once it is cut, and cut it when they do not commit.
pub trait Forwarder: Send + Sync + 'static {
    fn forward(
        &self,
        to: Arc<str>,
        readings: Vec<Reading>,
        sequence: Option<Sequence>,
        source: Source,
        keyed: Option<Keyed>,
    ) -> VerdictsRx;
}

/// The route of every partition, replaced whole by the cluster layer as leases move.
pub struct Routing {
    routes: std::sync::RwLock<Arc<Vec<Route>>>,
    forwarder: Arc<dyn Forwarder>,
}

impl Routing {
    /// Nobody serves anything until the first [`Routing::set`].
    pub fn new(partitions: u32, forwarder: Arc<dyn Forwarder>) -> Self {
        Self {
            routes: std::sync::RwLock::new(Arc::new(vec![Route::Nobody; partitions as usize])),
            forwarder,
        }
    }

    pub fn set(&self, routes: Vec<Route>) {
        *self.routes.write().expect("routing lock") = Arc::new(routes);
    }

    pub fn get(&self) -> Arc<Vec<Route>> {
        self.routes.read().expect("routing lock").clone()
    }
}

/// Handle to the engine's shards; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    shards: Vec<mpsc::Sender<ShardMsg>>,
    partitions: Partitioning,
    clock: Clock,
    /// Cluster mode: where other partitions' readings go.
    routing: Option<Arc<Routing>>,
    /// The broker links, which every shard follows ([`Engine::set_link`]): a channel per
    /// shard, told in shard order, so the shards wake in the same order every time (one
    /// channel's receivers wake in an order Tokio draws at random).
    links: Arc<Vec<tokio::sync::watch::Sender<fleet::Links>>>,
}

impl Engine {
    /// Starts `tuning.shards` shard tasks serving every partition with `sensors` (one
    /// node), committing through `commits`. The shards stop when `stop` is cancelled,
    /// after finishing what is queued.
    pub fn launch(
        tuning: Tuning,
        sensors: impl IntoIterator<Item = (SensorId, SensorState)>,
        commits: mpsc::Sender<CommitRequest>,
        stop: CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
    ) -> Self {
        let resumed_at = tuning.clock.now();
        let policy = tuning.policy();
        let sensors = sensors.into_iter();
        let expected = sensors.size_hint().0 / tuning.partitions.count.max(1) as usize;
        let mut parts: Vec<Option<Part>> = (0..tuning.partitions.count)
            .map(|_| {
                let mut fleet = Fleet::new(policy, resumed_at);
                // A little over the even share: hashing spreads sensors only about evenly.
                fleet.reserve(expected + expected / 32 + 16);
                Some(Part {
                    fleet,
                    epoch: None,
                    unsure_until: resumed_at,
                })
            })
            .collect();
        for (id, state) in sensors {
            let p = tuning.partitions.of(id) as usize;
            if let Some(part) = parts[p].as_mut() {
                part.fleet.insert(id, state);
            }
        }
        Self::start(tuning, parts, commits, stop, tracker, None)
    }

    /// Starts the shards serving no partition yet (cluster mode): partitions come with
    /// [`Engine::acquire`], readings of the others go where `routing` says.
    pub fn launch_leased(
        tuning: Tuning,
        commits: mpsc::Sender<CommitRequest>,
        stop: CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
        routing: Arc<Routing>,
    ) -> Self {
        let parts = (0..tuning.partitions.count).map(|_| None).collect();
        Self::start(tuning, parts, commits, stop, tracker, Some(routing))
    }

    fn start(
        tuning: Tuning,
        mut parts: Vec<Option<Part>>,
        commits: mpsc::Sender<CommitRequest>,
        stop: CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
        routing: Option<Arc<Routing>>,
    ) -> Self {
        let policy = tuning.policy();
        let Tuning {
            shards,
            batch_max,
            clock,
            partitions,
            supervisor,
            ..
        } = tuning;
        let shards = shards.max(1);
        let mut senders = Vec::with_capacity(shards);
        let mut links = Vec::with_capacity(shards);
        for s in 0..shards {
            // This shard's partitions (`p % shards == s`); the others stay `None` here.
            let mine: Vec<Option<Part>> = (0..partitions.count as usize)
                .map(|p| {
                    if p % shards == s {
                        parts[p].take()
                    } else {
                        None
                    }
                })
                .collect();
            let (tx, rx) = mpsc::channel(1024);
            senders.push(tx);
            let (link_tx, links_rx) = tokio::sync::watch::channel(fleet::Links::default());
            links.push(link_tx);
            let shard = Shard {
                index: s,
                parts: mine,
                partitions,
                policy,
                links_rx,
                links: fleet::Links::default(),
                rx,
                commits: commits.clone(),
                batch_max,
                clock: clock.clone(),
                due: due::DueQueue::new(DUE_MAX),
            };
            tracker.spawn(supervisor.watch("engine shard", shard.run(stop.clone())));
        }
        Self {
            shards: senders,
            partitions,
            clock,
            routing,
            links: Arc::new(links),
        }
    }

    /// The engine's time: what readings are stamped with when they arrive.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// The engine's clock, for a task that keeps its time.
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.clock
    }

    /// The partition of a sensor.
    pub fn partition(&self, id: SensorId) -> u32 {
        self.partitions.of(id)
    }

    pub fn partitions(&self) -> u32 {
        self.partitions.count
    }

    /// How sensors map to partitions.
    pub fn partitioning(&self) -> Partitioning {
        self.partitions
    }

    fn shard(&self, id: SensorId) -> usize {
        self.partition(id) as usize % self.shards.len()
    }

    fn shard_of_partition(&self, p: u32) -> usize {
        p as usize % self.shards.len()
    }

    /// Hands items received at `received_at` through `source` to their shards and returns
    /// without waiting for the commit; `Err` items are rejections the caller already
    /// found, kept in place. Items enqueued by one caller are applied in the order of its
    /// calls, so a broker source can pipeline batches and still keep each sensor's readings
    /// in order.
    pub async fn enqueue(
        &self,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        source: Source,
    ) -> Result<Ticket, Error> {
        let routes = self.routing.as_ref().map(|r| r.get());
        self.split(items, received_at, source, routes.as_deref(), None, None)
            .await
    }

    /// As [`Engine::enqueue`], for a request sent with an `Idempotency-Key`: each commit
    /// that applies some of its readings keeps their positions in the request under `key`,
    /// in its transaction ([`Keyed`]). `positions` are the items' positions in the request.
    pub async fn enqueue_keyed(
        &self,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        source: Source,
        keyed: Keyed,
    ) -> Result<Ticket, Error> {
        let routes = self.routing.as_ref().map(|r| r.get());
        self.split(
            items,
            received_at,
            source,
            routes.as_deref(),
            None,
            Some(&keyed),
        )
        .await
    }

    /// As [`Engine::enqueue`], as the next batch of `sequence`: none of it is applied once
    /// the sequence is cut, and it cuts the sequence where it does not commit.
    pub async fn enqueue_in(
        &self,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        source: Source,
        sequence: &Sequence,
    ) -> Result<Ticket, Error> {
        let routes = self.routing.as_ref().map(|r| r.get());
        self.split(
            items,
            received_at,
            source,
            routes.as_deref(),
            Some(sequence),
            None,
        )
        .await
    }

    /// As [`Engine::enqueue`] for readings another node forwarded here (of `sequence` when
    /// the sender's were; of a keyed request when `keyed` says so): applied here or
    /// refused (`store_unavailable`), never forwarded again.
    pub async fn enqueue_here(
        &self,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        source: Source,
        sequence: Option<&Sequence>,
        keyed: Option<&Keyed>,
    ) -> Result<Ticket, Error> {
        self.split(items, received_at, source, None, sequence, keyed)
            .await
    }

    async fn split(
        &self,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
        source: Source,
        routes: Option<&Vec<Route>>,
        sequence: Option<&Sequence>,
        keyed: Option<&Keyed>,
    ) -> Result<Ticket, Error> {
        /// Per shard: the items' indexes, the readings, their partitions and their
        /// positions in a keyed request.
        type Part = (Vec<usize>, Vec<Reading>, Vec<u32>, Vec<u32>);
        let mut rejected = Vec::new();
        let mut parts: Vec<Part> = vec![(vec![], vec![], vec![], vec![]); self.shards.len()];
        /// Per other node: the items' indexes, the readings and their positions.
        type Away = (Vec<usize>, Vec<Reading>, Vec<u32>);
        let mut away: HashMap<Arc<str>, Away> = HashMap::default();
        let position = |i: usize| keyed.map_or(0, |k| k.positions[i]);
        for (i, item) in items.into_iter().enumerate() {
            match item {
                Ok(r) => {
                    let p = self.partition(r.sensor_id);
                    let route = routes.map(|t| &t[p as usize]);
                    if let Some(seq) = sequence {
                        let admitted = match route {
                            None => !seq.is_cut(),
                            Some(Route::Nobody) => {
                                seq.cut();
                                true // Refused just below, for the move.
                            }
                            Some(route) => seq.admits(p, route),
                        };
                        if !admitted {
                            rejected.push((i, Sequence::refusal()));
                            continue;
                        }
                    }
                    match route {
                        None | Some(Route::Here) => {
                            let s = &mut parts[self.shard_of_partition(p)];
                            s.0.push(i);
                            s.1.push(r);
                            s.2.push(p);
                            s.3.push(position(i));
                        }
                        Some(Route::Node(to)) => {
                            let e = away.entry(to.clone()).or_default();
                            e.0.push(i);
                            e.1.push(r);
                            e.2.push(position(i));
                        }
                        Some(Route::Nobody) => rejected.push((
                            i,
                            Rejection::new(
                                RejectCode::StoreUnavailable,
                                format!("partition {p} is moving between nodes; send it again"),
                            ),
                        )),
                    }
                }
                Err(rej) => rejected.push((i, rej)),
            }
        }
        let mut waits = Vec::new();
        let mut sent = false;
        let keyed_part = |positions: Vec<u32>| {
            keyed.map(|k| Keyed {
                key: k.key.clone(),
                positions,
            })
        };
        for (s, (idx, rs, ps, positions)) in parts.into_iter().enumerate() {
            if rs.is_empty() {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            let msg = ShardMsg::Readings {
                readings: rs,
                parts: ps,
                received_at,
                sequence: sequence.cloned(),
                source,
                keyed: keyed_part(positions),
                reply: tx,
            };
            match self.shards[s].send(msg).await {
                Ok(()) => sent = true,
                // Shutting down. Once another shard has the request's other readings, this
                // part's failure is a verdict on its readings, not on the whole request.
                Err(mpsc::error::SendError(msg)) => {
                    if let ShardMsg::Readings { reply, .. } = msg {
                        let _ = reply.send(Err(Error::Closed));
                    }
                    if let Some(seq) = sequence {
                        seq.cut();
                    }
                }
            }
            waits.push((idx, rx));
        }
        if let Some(routing) = &self.routing {
            for (to, (idx, rs, positions)) in away {
                families::CLUSTER_FORWARDED
                    .counter_with(&[("source", source.as_str())])
                    .increment(rs.len() as u64);
                let forward = routing.forwarder.forward(
                    to,
                    rs,
                    sequence.cloned(),
                    source,
                    keyed_part(positions),
                );
                waits.push((idx, forward));
                sent = true;
            }
        }
        if !sent && !waits.is_empty() {
            return Err(Error::Closed);
        }
        Ok(Ticket { rejected, waits })
    }

    /// Starts serving `partition` with its `sensors` as the store has them, under lease
    /// `epoch`; their deadlines count from `since` at the earliest: the takeover after a
    /// crash, so a sensor is not declared lost for the time nobody served it, or the floor
    /// a live owner that handed the partition over had, so a move postpones no deadline.
    /// Until `unsure_until` a sensor unknown here is "send again" rather than unknown
    /// ([`TAKEOVER_GRACE_MS`]).
    pub async fn acquire(
        &self,
        partition: u32,
        epoch: Option<i64>,
        sensors: Vec<SensorRuntime>,
        since: Millis,
        unsure_until: Millis,
    ) -> Result<(), Error> {
        let (reply, done) = oneshot::channel();
        self.shards[self.shard_of_partition(partition)]
            .send(ShardMsg::Acquire {
                partition,
                epoch,
                sensors,
                since,
                unsure_until,
                reply,
            })
            .await
            .map_err(|_| Error::Closed)?;
        done.await.map_err(|_| Error::Closed)
    }

    /// Stops serving `partition`: with `flush`, after committing what is pending for it
    /// (a handover); without, at once (its lease is lost, nothing of it can commit).
    pub async fn release(&self, partition: u32, flush: bool) -> Result<(), Error> {
        let (reply, done) = oneshot::channel();
        self.shards[self.shard_of_partition(partition)]
            .send(ShardMsg::Release {
                partition,
                flush,
                reply,
            })
            .await
            .map_err(|_| Error::Closed)?;
        done.await.map_err(|_| Error::Closed)
    }

    /// Starts tracking a new sensor, or changes a tracked one's settings.
    pub async fn upsert_sensor(&self, id: SensorId, settings: Settings) -> Result<(), Error> {
        self.shards[self.shard(id)]
            .send(ShardMsg::Upsert {
                id,
                settings,
                initial: None,
            })
            .await
            .map_err(|_| Error::Closed)
    }

    /// Follows a registry change made elsewhere (another node's API): a sensor new here
    /// starts from its stored `state`; a tracked one keeps its own, fresher state and only
    /// takes the settings.
    pub async fn track(&self, id: SensorId, state: SensorState) -> Result<(), Error> {
        self.shards[self.shard(id)]
            .send(ShardMsg::Upsert {
                id,
                settings: Settings::of(&state),
                initial: Some(Box::new(state)),
            })
            .await
            .map_err(|_| Error::Closed)
    }

    /// latch's connection to a broker went down, or came back (`up`), at `at`: sensors last
    /// heard through it are not declared lost meanwhile, and their deadlines count from
    /// `at` at the earliest once it is back. Takes effect at once, not in a queue: a shard
    /// reads the links before it declares anyone lost, so nothing is declared lost for a
    /// silence after this returns that a link down explains.
    pub fn set_link(&self, source: Source, up: bool, at: Millis) {
        for shard in self.links.iter() {
            shard.send_modify(|links| fleet::change_link(links, source, up, at));
        }
    }

    /// latch stops taking readings: a stop began. Silence from now on is latch's own
    /// downtime, not the sensors' ([`fleet::deafen`]): no sensor is declared lost while the
    /// stop finishes, as none is while latch is down.
    pub fn stop_hearing(&self) {
        for shard in self.links.iter() {
            shard.send_modify(fleet::deafen);
        }
    }

    /// Stops tracking a deleted sensor; its later readings are rejected as unknown.
    pub async fn remove_sensor(&self, id: SensorId) -> Result<(), Error> {
        self.shards[self.shard(id)]
            .send(ShardMsg::Remove { id })
            .await
            .map_err(|_| Error::Closed)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod timer_tests;
