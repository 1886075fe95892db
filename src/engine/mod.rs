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
//! Deadlines are read from a [`Clock`]: the wall clock in service, one moved by hand in
//! tests.

pub mod fleet;
pub mod follow;
pub mod rules;
mod shard;
mod ticket;

use std::hash::BuildHasher;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use crate::clock::Clock;
use crate::domain::sensor::SensorState;
use crate::domain::{Millis, Reading, Rejection, SensorId};
use crate::store::CommitBatch;
use fleet::Fleet;
use shard::{Shard, ShardMsg};
pub use ticket::{Report, Ticket};

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

/// How the engine's shards run.
#[derive(Clone, Debug)]
pub struct Tuning {
    pub shards: usize,
    /// Most readings a shard applies in one round (one commit).
    pub batch_max: usize,
    /// The heartbeat timeout of sensors without their own.
    pub default_timeout: std::time::Duration,
    pub clock: Clock,
}

/// A batch of effects waiting to be made durable; `reply` says whether it was.
pub struct CommitRequest {
    pub batch: CommitBatch,
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// One shard's results: `None` accepted, `Some(reason)` rejected, in its input order.
type Verdicts = Vec<Option<Rejection>>;

/// Handle to the engine's shards; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    shards: Vec<mpsc::Sender<ShardMsg>>,
    hasher: std::hash::RandomState,
    clock: Clock,
}

impl Engine {
    /// Starts `tuning.shards` shard tasks holding `sensors` and committing through
    /// `commits`. The shards stop when `stop` is cancelled, after finishing what is queued.
    pub fn launch(
        tuning: Tuning,
        sensors: impl IntoIterator<Item = (SensorId, SensorState)>,
        commits: mpsc::Sender<CommitRequest>,
        stop: CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
    ) -> Self {
        let Tuning {
            shards,
            batch_max,
            default_timeout,
            clock,
        } = tuning;
        let hasher = std::hash::RandomState::new();
        let resumed_at = clock.now();
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
                clock: clock.clone(),
            };
            tracker.spawn(shard.run(stop.clone()));
        }
        Self {
            shards: senders,
            hasher,
            clock,
        }
    }

    /// The engine's time: what readings are stamped with when they arrive.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    fn shard(&self, id: SensorId) -> usize {
        shard_of(&self.hasher, id, self.shards.len())
    }

    /// Hands items received at `received_at` to their shards and returns without waiting
    /// for the commit; `Err` items are rejections the caller already found, kept in place.
    /// Items enqueued by one caller are applied in the order of its calls, so a broker
    /// source can pipeline batches and still keep each sensor's readings in order.
    pub async fn enqueue(
        &self,
        items: Vec<Result<Reading, Rejection>>,
        received_at: Millis,
    ) -> Result<Ticket, Error> {
        let mut rejected = Vec::new();
        let mut parts: Vec<(Vec<usize>, Vec<Reading>)> = vec![(vec![], vec![]); self.shards.len()];
        for (i, item) in items.into_iter().enumerate() {
            match item {
                Ok(r) => {
                    let s = self.shard(r.sensor_id);
                    parts[s].0.push(i);
                    parts[s].1.push(r);
                }
                Err(rej) => rejected.push((i, rej)),
            }
        }
        let mut waits = Vec::new();
        let mut sent = false;
        for (s, (idx, rs)) in parts.into_iter().enumerate() {
            if rs.is_empty() {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            let msg = ShardMsg::Readings {
                readings: rs,
                received_at,
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
                }
            }
            waits.push((idx, rx));
        }
        if !sent && !waits.is_empty() {
            return Err(Error::Closed);
        }
        Ok(Ticket { rejected, waits })
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

#[cfg(test)]
mod tests;
