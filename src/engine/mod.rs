//! The engine: change detection on in-memory shards, group-committed.
//!
//! Readings are routed by hash of sensor id to a shard task that owns those sensors'
//! current state, so change detection is a map look-up, never a database round trip.
//! A shard takes whatever readings have queued up, applies them to a scratch copy of the
//! touched sensors, and hands the effects ([`CommitBatch`]) to the committer; only
//! when the commit is durable does it keep the new state and answer the callers. A failed
//! commit therefore leaves memory exactly as the store is, and nothing is acknowledged.
//!
//! Each shard commits on its own, so a request spread over several shards can come out
//! partly durable: one shard's batch in a commit that succeeded, another's in one that
//! failed. [`Submitted::wait`] says exactly that: the failed shard's readings are rejected
//! with `store_unavailable` (send again), the others keep their verdicts; only when no
//! shard committed is the whole request an error.
//!
//! Deadlines are read from a [`Clock`]: the wall clock in service, one moved by hand in
//! tests.

pub mod fleet;
pub mod follow;
pub mod rules;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::domain::sensor::SensorState;
use crate::domain::{
    Connection, Event, EventKind, Millis, Reading, Rejection, SensorId, reading::RejectCode,
    time::now_ms,
};
use crate::store::{CommitBatch, ReadingRecord, StateUpdate};
use fleet::Fleet;
use rules::Change;

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

/// Where the engine reads the time. Cheap to clone; clones share one time.
#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<AtomicI64>>);

impl Clock {
    /// The wall clock.
    pub fn wall() -> Self {
        Self(None)
    }

    /// A clock that shows `at` until [`Clock::set`] moves it.
    pub fn manual(at: Millis) -> Self {
        Self(Some(Arc::new(AtomicI64::new(at))))
    }

    pub fn now(&self) -> Millis {
        match &self.0 {
            None => now_ms(),
            Some(t) => t.load(Ordering::SeqCst),
        }
    }

    /// Moves a manual clock; the wall clock cannot be moved and ignores this.
    pub fn set(&self, at: Millis) {
        if let Some(t) = &self.0 {
            t.store(at, Ordering::SeqCst);
        }
    }
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
    /// Waits for the commits; one verdict per reading, in input order. The readings of a
    /// shard whose commit failed are rejected with `store_unavailable` while the other
    /// shards' stand; `Err` only when no shard committed, so nothing was accepted.
    pub async fn wait(self) -> Result<Verdicts, Error> {
        let mut out = vec![None; self.total];
        let mut failed = None;
        let mut committed = false;
        for (idx, rx) in self.waits {
            match rx.await.unwrap_or(Err(Error::Closed)) {
                Ok(verdicts) => {
                    committed = true;
                    for (i, v) in idx.into_iter().zip(verdicts) {
                        out[i] = v;
                    }
                }
                Err(e) => {
                    let rejection = Rejection::new(
                        RejectCode::StoreUnavailable,
                        format!("not stored ({e}); send it again"),
                    );
                    for i in idx {
                        out[i] = Some(rejection.clone());
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if !committed => Err(e),
            _ => Ok(out),
        }
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
        let tuning = Tuning {
            shards,
            batch_max,
            default_timeout,
            clock: Clock::wall(),
        };
        Self::launch(tuning, sensors, commits, stop, tracker)
    }

    /// [`Engine::start`] with every setting, the clock among them.
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
    clock: Clock,
}

/// Readings applied but not yet durable, with the callers waiting on them.
#[derive(Default)]
struct Pending {
    scratch: HashMap<SensorId, SensorState>,
    batch: CommitBatch,
    replies: Vec<(oneshot::Sender<Result<Verdicts, Error>>, Verdicts)>,
    readings: usize,
    /// When the last readings applied in this batch were received.
    last_received_at: Option<Millis>,
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
                        let wait = (d - self.clock.now()).max(0) as u64;
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
            let mut drained = false;
            while pending.readings < self.batch_max {
                match self.rx.try_recv() {
                    Ok(m) => self.handle(m, &mut pending).await,
                    Err(_) => {
                        drained = true;
                        break;
                    }
                }
            }
            if !stopping {
                // A round cut short by `batch_max` leaves readings queued, and one of them
                // may be a reading that arrived before a deadline that has passed since.
                // The queue is in arrival order, so what waits in it arrived after the last
                // reading applied: only deadlines before that one are surely silence.
                let now = self.clock.now();
                let upto = if drained {
                    Some(now)
                } else {
                    pending.last_received_at.map(|r| r.min(now))
                };
                if let Some(upto) = upto {
                    self.expire(upto, &mut pending);
                }
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
                pending.last_received_at = Some(received_at);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::task::TaskTracker;

    use super::*;

    fn sid(s: &str) -> SensorId {
        SensorId::parse(s).unwrap()
    }

    fn online(seen: Millis) -> SensorState {
        SensorState {
            data: Some(true),
            changed_at: Some(seen),
            last_ts: Some(seen),
            last_seen_at: Some(seen),
            connection: Connection::Online,
            heartbeat_timeout_s: None,
        }
    }

    fn reading(id: SensorId) -> Reading {
        Reading {
            sensor_id: id,
            data: true,
            ts: None,
        }
    }

    /// An engine with a 10 s default timeout whose commits the test answers.
    fn engine(
        shards: usize,
        batch_max: usize,
        clock: Clock,
        sensors: Vec<(SensorId, SensorState)>,
    ) -> (Engine, mpsc::Receiver<CommitRequest>, CancellationToken) {
        let (tx, rx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let tuning = Tuning {
            shards,
            batch_max,
            default_timeout: Duration::from_secs(10),
            clock,
        };
        let engine = Engine::launch(tuning, sensors, tx, stop.clone(), &TaskTracker::new());
        (engine, rx, stop)
    }

    /// Answers every commit as `answer` says, keeping the batches it was given.
    fn committer(
        mut rx: mpsc::Receiver<CommitRequest>,
        answer: impl Fn(&CommitBatch) -> Result<(), String> + Send + 'static,
    ) -> Arc<std::sync::Mutex<Vec<CommitBatch>>> {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = log.clone();
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                let _ = r.reply.send(answer(&r.batch));
                kept.lock().unwrap().push(r.batch);
            }
        });
        log
    }

    #[tokio::test]
    async fn a_failed_shard_rejects_its_own_readings_and_the_others_stand() {
        let ids: Vec<SensorId> = (0..32).map(|i| sid(&format!("p{i}"))).collect();
        let sensors = ids.iter().map(|&i| (i, SensorState::new(None))).collect();
        let (engine, rx, stop) = engine(2, 100, Clock::manual(0), sensors);
        let ok = ids[0];
        let bad = *ids[1..]
            .iter()
            .find(|&&i| engine.shard(i) != engine.shard(ok))
            .expect("32 sensors over 2 shards");
        // The shard of `bad` commits in a round of its own that fails; `ok`'s succeeds.
        committer(rx, move |b| {
            if b.readings.iter().any(|r| r.sensor_id == bad) {
                Err("disk full".into())
            } else {
                Ok(())
            }
        });

        let verdicts = engine
            .submit(vec![reading(ok), reading(bad), reading(ok)], 1000)
            .await
            .expect("one shard committed: the request is answered reading by reading");
        assert_eq!(verdicts[0], None);
        assert_eq!(verdicts[2], None);
        let rejected = verdicts[1].as_ref().expect("not stored");
        assert_eq!(rejected.code, RejectCode::StoreUnavailable);
        assert!(rejected.message.contains("disk full"), "{rejected}");

        // Nothing committed at all: the whole request failed, as before.
        let all_failed = engine.submit(vec![reading(bad)], 2000).await;
        assert!(
            matches!(all_failed, Err(Error::Commit(_))),
            "{all_failed:?}"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn readings_queued_behind_a_full_round_come_before_silence() {
        let clock = Clock::manual(0);
        let (s, o) = (sid("silent"), sid("other"));
        // `s` is due at 10 s; `o` at 18 s.
        let sensors = vec![(s, online(0)), (o, online(8_000))];
        let (engine, mut rx, stop) = engine(1, 1, clock.clone(), sensors);

        // The shard waits on a slow commit while readings queue up behind it: one of `o`
        // that fills the next round, then `s`'s, which arrived before its deadline.
        let slow = engine.enqueue(vec![reading(o)], 9_000).await.unwrap();
        let held = rx.recv().await.unwrap();
        let fills = engine.enqueue(vec![reading(o)], 9_100).await.unwrap();
        let in_time = engine.enqueue(vec![reading(s)], 9_200).await.unwrap();
        clock.set(15_000);
        held.reply.send(Ok(())).unwrap();
        let log = committer(rx, |_| Ok(()));
        for sub in [slow, fills, in_time] {
            assert!(sub.wait().await.unwrap().iter().all(Option::is_none));
        }

        let events: Vec<(SensorId, EventKind)> = log
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| b.events.iter().map(|e| (e.sensor_id, e.kind)))
            .collect();
        assert!(
            !events.iter().any(|(id, _)| *id == s),
            "its reading came in time, so it was never lost: {events:?}"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_full_round_still_declares_sensors_silent_before_its_readings() {
        let clock = Clock::manual(0);
        let (s, o) = (sid("silent"), sid("other"));
        let sensors = vec![(s, online(0)), (o, online(8_000))];
        let (engine, mut rx, stop) = engine(1, 1, clock.clone(), sensors);

        // As above, but the readings waiting came after `s`'s deadline: it is lost in the
        // round they fill, however busy the shard stays.
        let slow = engine.enqueue(vec![reading(o)], 9_000).await.unwrap();
        let held = rx.recv().await.unwrap();
        let fills = engine.enqueue(vec![reading(o)], 12_000).await.unwrap();
        let more = engine.enqueue(vec![reading(o)], 12_100).await.unwrap();
        clock.set(15_000);
        held.reply.send(Ok(())).unwrap();
        let log = committer(rx, |_| Ok(()));
        for sub in [slow, fills, more] {
            sub.wait().await.unwrap();
        }
        let batches = log.lock().unwrap();
        let lost = &batches[0].events;
        assert_eq!(lost.len(), 1, "{batches:?}");
        assert_eq!(
            (lost[0].sensor_id, lost[0].kind),
            (s, EventKind::ConnectionLost)
        );
        assert_eq!(lost[0].at, 10_000);
        assert_eq!(batches[0].readings[0].received_at, 12_000);
        stop.cancel();
    }
}
