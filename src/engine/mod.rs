//! The engine: change detection on in-memory shards, group-committed.
//!
//! Readings are routed by hash of sensor id to a shard task that owns those sensors'
//! current state, so change detection is a map look-up, never a database round trip.
//! A shard takes whatever readings have queued up, applies them to a scratch copy of the
//! touched sensors, and hands the effects ([`effects::CommitBatch`]) to the committer; only
//! when the commit is durable does it keep the new state and answer the callers. A failed
//! commit therefore leaves memory exactly as the store is, and nothing is acknowledged.

pub mod effects;
pub mod fleet;
pub mod follow;
pub mod rules;

use std::collections::HashMap;
use std::hash::BuildHasher;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::domain::{
    Connection, Event, EventKind, Millis, Reading, Rejection, SensorId, time::now_ms,
};
use effects::{CommitBatch, ReadingRecord, StateUpdate};
use fleet::Fleet;
use rules::{Change, SensorState};

/// Most sensors declared lost in one group commit: a fleet-wide outage is worked off in
/// batches of this size, interleaved with ingest, instead of one giant transaction.
pub const EXPIRE_BATCH: usize = 10_000;

/// Errors of the engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("the engine is shutting down")]
    Closed,
    #[error("could not make the readings durable: {0}")]
    Commit(String),
}

/// A batch of effects waiting to be made durable; `reply` says whether it was.
pub struct CommitRequest {
    pub batch: CommitBatch,
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// Per-reading results: `None` accepted, `Some(reason)` rejected.
pub type Verdicts = Vec<Option<Rejection>>;

enum ShardMsg {
    Readings {
        readings: Vec<Reading>,
        received_at: Millis,
        reply: oneshot::Sender<Result<Verdicts, Error>>,
    },
    Upsert {
        id: SensorId,
        heartbeat_timeout_s: Option<u32>,
        /// State to start from when the sensor is new here (else: never reported).
        initial: Option<SensorState>,
    },
    Remove {
        id: SensorId,
    },
}

/// Handle to the engine's shards; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    shards: Vec<mpsc::Sender<ShardMsg>>,
    hasher: std::hash::RandomState,
}

type VerdictsRx = oneshot::Receiver<Result<Verdicts, Error>>;

/// Readings handed to the shards; [`Submitted::wait`] resolves once they are durable.
pub struct Submitted {
    total: usize,
    /// Per shard: input positions of its readings and its verdicts to come.
    waits: Vec<(Vec<usize>, VerdictsRx)>,
}

impl Submitted {
    /// Waits for the commit; one verdict per reading, in input order.
    pub async fn wait(self) -> Result<Verdicts, Error> {
        let mut out = vec![None; self.total];
        for (idx, rx) in self.waits {
            let verdicts = rx.await.map_err(|_| Error::Closed)??;
            for (i, v) in idx.into_iter().zip(verdicts) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

impl Engine {
    /// Starts `shards` shard tasks holding `sensors` and committing through `commits`.
    /// The shards stop when `stop` is cancelled, after finishing what is queued.
    /// `default_timeout` is the heartbeat timeout of sensors without their own.
    pub fn start(
        shards: usize,
        batch_max: usize,
        default_timeout: std::time::Duration,
        sensors: impl IntoIterator<Item = (SensorId, SensorState)>,
        commits: mpsc::Sender<CommitRequest>,
        stop: CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
    ) -> Self {
        let hasher = std::hash::RandomState::new();
        let resumed_at = now_ms();
        let timeout_ms = default_timeout.as_millis() as Millis;
        let mut maps: Vec<Fleet> = (0..shards)
            .map(|_| Fleet::new(timeout_ms, resumed_at))
            .collect();
        let sensors = sensors.into_iter();
        let expected = sensors.size_hint().0 / shards.max(1);
        for m in &mut maps {
            // A little over the even share: hashing spreads sensors only about evenly.
            m.reserve(expected + expected / 64 + 16);
        }
        for (id, state) in sensors {
            maps[shard_of(&hasher, id, shards)].insert(id, state);
        }
        let mut senders = Vec::with_capacity(shards);
        for map in maps {
            let (tx, rx) = mpsc::channel(1024);
            senders.push(tx);
            let shard = Shard {
                map,
                rx,
                commits: commits.clone(),
                batch_max,
            };
            tracker.spawn(shard.run(stop.clone()));
        }
        Self {
            shards: senders,
            hasher,
        }
    }

    fn shard(&self, id: SensorId) -> usize {
        shard_of(&self.hasher, id, self.shards.len())
    }

    /// Applies readings received at `received_at`; answers once their effects are durable,
    /// with a verdict per reading in input order.
    pub async fn submit(
        &self,
        readings: Vec<Reading>,
        received_at: Millis,
    ) -> Result<Verdicts, Error> {
        self.enqueue(readings, received_at).await?.wait().await
    }

    /// Hands readings to their shards and returns without waiting for the commit. Readings
    /// enqueued by one caller are applied in the order of its calls, so a broker source can
    /// pipeline batches and still keep each sensor's readings in order.
    pub async fn enqueue(
        &self,
        readings: Vec<Reading>,
        received_at: Millis,
    ) -> Result<Submitted, Error> {
        let n = self.shards.len();
        let mut parts: Vec<(Vec<usize>, Vec<Reading>)> = vec![(vec![], vec![]); n];
        for (i, r) in readings.into_iter().enumerate() {
            let s = self.shard(r.sensor_id);
            parts[s].0.push(i);
            parts[s].1.push(r);
        }
        let total: usize = parts.iter().map(|p| p.0.len()).sum();
        let mut waits = Vec::new();
        for (s, (idx, rs)) in parts.into_iter().enumerate() {
            if rs.is_empty() {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            self.shards[s]
                .send(ShardMsg::Readings {
                    readings: rs,
                    received_at,
                    reply: tx,
                })
                .await
                .map_err(|_| Error::Closed)?;
            waits.push((idx, rx));
        }
        Ok(Submitted { total, waits })
    }

    /// Starts tracking a new sensor, or changes a tracked one's timeout.
    pub async fn upsert_sensor(
        &self,
        id: SensorId,
        heartbeat_timeout_s: Option<u32>,
    ) -> Result<(), Error> {
        self.shards[self.shard(id)]
            .send(ShardMsg::Upsert {
                id,
                heartbeat_timeout_s,
                initial: None,
            })
            .await
            .map_err(|_| Error::Closed)
    }

    /// Follows a registry change made elsewhere (another node's API): a sensor new here
    /// starts from its stored `state`; a tracked one keeps its own, fresher state and only
    /// takes the timeout.
    pub async fn track(&self, id: SensorId, state: SensorState) -> Result<(), Error> {
        self.shards[self.shard(id)]
            .send(ShardMsg::Upsert {
                id,
                heartbeat_timeout_s: state.heartbeat_timeout_s,
                initial: Some(state),
            })
            .await
            .map_err(|_| Error::Closed)
    }

    /// Stops tracking a deleted sensor; its later readings are rejected as unknown.
    pub async fn remove_sensor(&self, id: SensorId) -> Result<(), Error> {
        self.shards[self.shard(id)]
            .send(ShardMsg::Remove { id })
            .await
            .map_err(|_| Error::Closed)
    }
}

fn shard_of(hasher: &std::hash::RandomState, id: SensorId, n: usize) -> usize {
    (hasher.hash_one(id) % n as u64) as usize
}

struct Shard {
    map: Fleet,
    rx: mpsc::Receiver<ShardMsg>,
    commits: mpsc::Sender<CommitRequest>,
    batch_max: usize,
}

/// Readings applied but not yet durable, with the callers waiting on them.
#[derive(Default)]
struct Pending {
    scratch: HashMap<SensorId, SensorState>,
    batch: CommitBatch,
    replies: Vec<(oneshot::Sender<Result<Verdicts, Error>>, Verdicts)>,
    readings: usize,
    /// Sensors declared lost in this batch.
    lost: usize,
}

impl Shard {
    async fn run(mut self, stop: CancellationToken) {
        let mut stopping = false;
        loop {
            let deadline = self.map.next_deadline();
            let sleep = async {
                match deadline {
                    Some(d) => {
                        let wait = (d - now_ms()).max(0) as u64;
                        tokio::time::sleep(std::time::Duration::from_millis(wait)).await
                    }
                    None => std::future::pending().await,
                }
            };
            let first = tokio::select! {
                m = self.rx.recv() => match m {
                    Some(m) => Some(m),
                    None => break,
                },
                _ = sleep, if !stopping => None,
                _ = stop.cancelled(), if !stopping => {
                    // Finish what callers already queued, then leave.
                    stopping = true;
                    self.rx.close();
                    continue;
                }
            };
            let mut pending = Pending::default();
            if let Some(first) = first {
                self.handle(first, &mut pending).await;
            }
            while pending.readings < self.batch_max {
                match self.rx.try_recv() {
                    Ok(m) => self.handle(m, &mut pending).await,
                    Err(_) => break,
                }
            }
            if !stopping {
                self.expire(now_ms(), &mut pending);
            }
            if !self.flush(pending).await {
                // The store is failing: do not spin on due sensors meanwhile.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }

    /// Declares silent sensors lost, a bounded batch at a time. Sensors that readings in
    /// this same batch just touched are not silent and are skipped.
    fn expire(&self, now: Millis, p: &mut Pending) {
        let expired = self.map.expired(now, EXPIRE_BATCH);
        if expired.is_empty() {
            return;
        }
        for (id, deadline) in expired {
            if p.scratch.contains_key(&id) {
                continue;
            }
            let Some(current) = self.map.get(id) else {
                continue;
            };
            let state = p.scratch.entry(id).or_insert(current);
            state.connection = Connection::Lost;
            p.batch.events.push(Event {
                sensor_id: id,
                kind: EventKind::ConnectionLost,
                at: deadline,
                data: state.data,
                previous: None,
                last_seen_at: state.last_seen_at,
            });
            p.lost += 1;
        }
    }

    async fn handle(&mut self, msg: ShardMsg, pending: &mut Pending) {
        match msg {
            ShardMsg::Readings {
                readings,
                received_at,
                reply,
            } => {
                let verdicts = readings
                    .iter()
                    .map(|r| self.apply(r, received_at, pending))
                    .collect();
                pending.readings += readings.len();
                pending.replies.push((reply, verdicts));
            }
            // Registry changes are rare: commit what came before them, so that readings
            // queued before a delete or a timeout change see the registry they were sent to.
            ShardMsg::Upsert {
                id,
                heartbeat_timeout_s,
                initial,
            } => {
                let _ = self.flush(std::mem::take(pending)).await;
                if self.map.get(id).is_some() {
                    self.map.set_timeout(id, heartbeat_timeout_s);
                } else {
                    let state = initial.unwrap_or_else(|| SensorState::new(heartbeat_timeout_s));
                    self.map.insert(id, state);
                }
            }
            ShardMsg::Remove { id } => {
                let _ = self.flush(std::mem::take(pending)).await;
                if self
                    .map
                    .remove(id)
                    .is_some_and(|s| s.connection == Connection::Lost)
                {
                    fleet::lost_gauge(-1.0);
                }
            }
        }
    }

    fn apply(&self, r: &Reading, received_at: Millis, p: &mut Pending) -> Option<Rejection> {
        let state = match p.scratch.get_mut(&r.sensor_id) {
            Some(s) => s,
            None => {
                let Some(current) = self.map.get(r.sensor_id) else {
                    return Some(Rejection::unknown_sensor(r.sensor_id));
                };
                p.scratch.entry(r.sensor_id).or_insert(current)
            }
        };
        let ts = r.ts.unwrap_or(received_at);
        let change = rules::apply(
            r.sensor_id,
            state,
            r.data,
            ts,
            received_at,
            &mut p.batch.events,
        );
        p.batch.readings.push(ReadingRecord {
            sensor_id: r.sensor_id,
            data: r.data,
            ts,
            received_at,
            late: change == Change::Late,
        });
        None
    }

    /// Commits a pending batch; `false` when the commit failed.
    async fn flush(&mut self, mut p: Pending) -> bool {
        if p.replies.is_empty() && p.lost == 0 {
            return true;
        }
        p.batch.states = p
            .scratch
            .iter()
            .map(|(id, s)| StateUpdate {
                sensor_id: *id,
                data: s.data,
                changed_at: s.changed_at,
                last_ts: s.last_ts,
                last_seen_at: s.last_seen_at,
                connection: s.connection,
            })
            .collect();
        let result = if p.batch.is_empty() {
            Ok(())
        } else {
            let (tx, rx) = oneshot::channel();
            let sent = self
                .commits
                .send(CommitRequest {
                    batch: p.batch,
                    reply: tx,
                })
                .await;
            match sent {
                Ok(()) => rx
                    .await
                    .unwrap_or_else(|_| Err("the committer stopped".into()))
                    .map_err(Error::Commit),
                Err(_) => Err(Error::Closed),
            }
        };
        match result {
            Ok(()) => {
                for (id, s) in p.scratch {
                    let was_lost = self
                        .map
                        .update(id, s)
                        .is_some_and(|old| old.connection == Connection::Lost);
                    match (was_lost, s.connection == Connection::Lost) {
                        (false, true) => fleet::lost_gauge(1.0),
                        (true, false) => fleet::lost_gauge(-1.0),
                        _ => {}
                    }
                }
                if p.lost > 0 {
                    metrics::counter!("latch_sensors_lost_total").increment(p.lost as u64);
                    tracing::info!(sensors = p.lost, "Sensors went silent: connection lost.");
                }
                for (reply, verdicts) in p.replies {
                    let _ = reply.send(Ok(verdicts));
                }
                true
            }
            Err(e) => {
                // Memory keeps the committed state: readings are refused (their senders
                // try again) and silent sensors stay due, so the next round retries them.
                tracing::error!(error = %e, "Group commit failed; readings not acknowledged.");
                for (reply, _) in p.replies {
                    let _ = reply.send(Err(e.clone()));
                }
                false
            }
        }
    }
}
