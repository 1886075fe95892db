//! One shard's loop: take what has queued up, apply it to a scratch copy of the touched
//! sensors, declare the silent ones lost, and hand the effects to the committer. Only a
//! durable commit moves the scratch state into memory and answers the callers, so a failed
//! commit leaves memory exactly as the store is.
//!
//! A shard holds the partitions `p` with `p % shards == its index` that this node serves,
//! each with its own [`Fleet`]: a partition arrives whole (taken over, with its deadlines
//! counted from the takeover) and leaves whole (flushed first when handed over).

use crate::hashing::FastMap as HashMap;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::due::DueQueue;
use super::fleet::{self, Fleet, Links, Policy};
use super::part::Part;
use super::rules::{self, Change};
use super::{Clock, CommitFailure, CommitRequest, EXPIRE_BATCH, Error, Sequence, Verdicts};
use crate::domain::reading::RejectCode;
use crate::domain::sensor::SensorState;
use crate::domain::{Connection, Millis, Reading, Rejection, SensorId, Source};
use crate::store::{CommitBatch, Fence, Keyed, ReadingRecord, SensorRuntime, StateUpdate};

/// What a shard is asked to do, in the order it was asked.
pub(super) enum ShardMsg {
    Readings {
        readings: Vec<Reading>,
        /// The partition of each reading.
        parts: Vec<u32>,
        received_at: Millis,
        /// The broker session they belong to, if any: see [`Sequence`].
        sequence: Option<Sequence>,
        /// How they came in.
        source: Source,
        /// Of a request sent with an `Idempotency-Key`: the readings' positions in it.
        keyed: Option<Keyed>,
        reply: oneshot::Sender<Result<Verdicts, Error>>,
    },
    Upsert {
        id: SensorId,
        settings: super::Settings,
        /// State to start from when the sensor is new here (else: never reported); boxed,
        /// as registry changes are rare and a state is large beside a batch of readings.
        initial: Option<Box<SensorState>>,
    },

    Remove {
        id: SensorId,
    },
    /// Starts serving a partition with these sensors; deadlines count from `since`.
    Acquire {
        partition: u32,
        epoch: Option<i64>,
        sensors: Vec<SensorRuntime>,
        since: Millis,
        unsure_until: Millis,
        reply: oneshot::Sender<()>,
    },
    /// Stops serving a partition: after committing what is pending (`flush`), or at once
    /// when its lease is already lost.
    Release {
        partition: u32,
        flush: bool,
        reply: oneshot::Sender<()>,
    },
}

/// One shard task: owns its sensors' state and applies their readings in arrival order.
pub(super) struct Shard {
    /// Its place among the shards, named in its commit requests.
    pub(super) index: usize,
    /// Indexed by partition; `Some` for the partitions served here.
    pub(super) parts: Vec<Option<Part>>,
    pub(super) partitions: crate::domain::partition::Partitioning,
    pub(super) policy: Policy,
    /// The broker links as the engine handle last set them ([`super::Engine::set_link`]):
    /// read when they change and before each round's expiry.
    pub(super) links_rx: watch::Receiver<Links>,
    /// The links as this shard's fleets have them.
    pub(super) links: Links,
    pub(super) rx: mpsc::Receiver<ShardMsg>,
    pub(super) commits: mpsc::Sender<CommitRequest>,
    pub(super) batch_max: usize,
    pub(super) clock: Clock,
    /// Sensors found due and not yet declared lost, in id order: see [`Shard::expire`].
    pub(super) due: DueQueue,
}

/// A caller waiting for its readings' verdicts, and the sequence to cut if they fail.
type Reply = (
    oneshot::Sender<Result<Verdicts, Error>>,
    Verdicts,
    Option<Sequence>,
);

/// Readings applied but not yet durable, with the callers waiting on them.
#[derive(Default)]
struct Pending {
    /// Touched sensors: partition and new state.
    scratch: HashMap<SensorId, (u32, SensorState)>,
    batch: CommitBatch,
    replies: Vec<Reply>,
    readings: usize,
    /// When the last readings applied in this batch were received.
    last_received_at: Option<Millis>,
    /// Sensors declared lost in this batch.
    lost: usize,
    /// Sensors whose timer fired in this batch ([`Shard::fire_timers`]).
    timed: usize,
}

impl Shard {
    /// Runs until `stop`, then finishes what callers already queued.
    pub(super) async fn run(mut self, stop: CancellationToken) {
        let mut stopping = false;
        // Whether every engine handle is gone (no link changes can come any more).
        let mut unlinked = false;
        loop {
            let deadline = self.next_deadline();
            let sleep = async {
                match deadline {
                    Some(d) => self.clock.sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            // Biased (a simulated run takes the same branch every time): what is queued
            // first, so readings that arrived before a deadline are applied before it.
            let first = tokio::select! {
                biased;
                m = self.rx.recv() => match m {
                    Some(m) => Some(m),
                    None => break,
                },
                // Before the deadlines: while the store refuses commits, the sensors that
                // fell due stay due, and a deadline in the past is always ready.
                _ = stop.cancelled(), if !stopping => {
                    // Finish what callers already queued, then leave.
                    stopping = true;
                    self.rx.close();
                    continue;
                }
                _ = sleep, if !stopping => None,
                // A link back up may bring deadlines nearer than the one slept for.
                changed = self.links_rx.changed(), if !unlinked => {
                    unlinked = changed.is_err();
                    None
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
                    // A link that went down before `upto` holds its sensors in this round.
                    self.follow_links();
                    self.expire(upto, &mut pending);
                    self.fire_timers(upto, &mut pending);
                }
            }
            if !self.flush(pending).await {
                // The store is failing: do not spin on due sensors meanwhile.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }

    /// Takes the broker links as the engine handle set them into every fleet here.
    fn follow_links(&mut self) {
        let links = *self.links_rx.borrow_and_update();
        if links != self.links {
            self.links = links;
            for part in self.parts.iter_mut().flatten() {
                part.fleet.set_links(links);
            }
        }
    }

    fn next_deadline(&self) -> Option<Millis> {
        self.parts
            .iter()
            .flatten()
            .filter_map(|p| p.fleet.next_deadline())
            .min()
    }

    fn part(&self, p: u32) -> Option<&Part> {
        self.parts.get(p as usize).and_then(Option::as_ref)
    }

    fn partition_of(&self, id: SensorId) -> u32 {
        self.partitions.of(id)
    }

    /// Declares silent sensors lost, a bounded batch at a time. Sensors that readings in
    /// this same batch just touched are not silent and are skipped.
    ///
    /// Batches go in sensor-id order, not deadline order (partitions by hash and last-seen
    /// order both scatter ids), taken from the [`DueQueue`]; each is checked again when
    /// taken, since a reading may have moved its deadline meanwhile.
    fn expire(&mut self, upto: Millis, p: &mut Pending) {
        if self.due.is_empty() {
            self.due.refill(&self.parts, upto);
        }
        let mut taken = 0;
        while taken < EXPIRE_BATCH {
            let Some(due) = self.due.pop() else { break };
            let id = due.id();
            let n = due.partition;
            if p.scratch.contains_key(&id) {
                continue;
            }
            let Some(fleet) = self.part(n).map(|part| &part.fleet) else {
                continue;
            };
            // Not listed any more (lost, removed), or seen since: it stays listed and a
            // later gathering finds it when due.
            let (Some(deadline), Some(current)) = (fleet.deadline_of(id), fleet.get(id)) else {
                continue;
            };
            if deadline > upto {
                continue;
            }
            let (_, state) = p.scratch.entry(id).or_insert((n, current));
            rules::lose(id, state, deadline, &mut p.batch.events);
            p.lost += 1;
            taken += 1;
        }
        self.due.shrink(EXPIRE_BATCH);
    }

    /// Ends the debounce windows that have passed and sends the reminders and hold alarms
    /// that are due ([`rules::settle`], [`rules::remind`], [`rules::hold`]), a bounded
    /// batch at a time, on the state this
    /// round left (a reading in it may have moved a window).
    fn fire_timers(&mut self, upto: Millis, p: &mut Pending) {
        let mut due = Vec::new();
        for (n, part) in self.parts.iter().enumerate() {
            let Some(part) = part else { continue };
            part.fleet.each_timer(upto, |id| {
                due.push((id, n as u32));
                due.len() < EXPIRE_BATCH
            });
            if due.len() >= EXPIRE_BATCH {
                break;
            }
        }
        for (id, n) in due {
            let fresh = !p.scratch.contains_key(&id);
            let state = match p.scratch.get_mut(&id) {
                Some((_, s)) => s,
                None => {
                    let Some(current) = self.part(n).and_then(|part| part.fleet.get(id)) else {
                        continue;
                    };
                    &mut p.scratch.entry(id).or_insert((n, current)).1
                }
            };
            let window = self.policy.debounce_ms(state);
            let mut fired = rules::settle(id, state, upto, window, &mut p.batch.events);
            if let Some(every) = self.policy.reminder_ms {
                fired |= rules::remind(id, state, upto, every, &mut p.batch.events);
            }
            fired |= rules::hold(id, state, upto, &mut p.batch.events);
            fired |= rules::unflap(id, state, upto, &mut p.batch.events);
            if fired {
                p.timed += 1;
            } else if fresh {
                p.scratch.remove(&id);
            }
        }
    }

    async fn handle(&mut self, msg: ShardMsg, pending: &mut Pending) {
        match msg {
            ShardMsg::Readings {
                readings,
                parts,
                received_at,
                sequence,
                source,
                keyed,
                reply,
            } => {
                // Cut before its turn came (by this shard's last round or another shard):
                // nothing of it may commit behind what did not.
                if sequence.as_ref().is_some_and(Sequence::is_cut) {
                    let _ = reply.send(Ok(vec![Some(Sequence::refusal()); readings.len()]));
                    return;
                }
                let verdicts: Verdicts = readings
                    .iter()
                    .zip(parts)
                    .map(|(r, p)| self.apply(r, p, received_at, source, pending))
                    .collect();
                if let Some(seq) = &sequence
                    && verdicts.iter().flatten().any(|rej| rej.code.is_transient())
                {
                    seq.cut();
                }
                // What this batch applies of a keyed request commits with it.
                if let Some(k) = keyed {
                    let positions: Vec<u32> = k
                        .positions
                        .iter()
                        .zip(&verdicts)
                        .filter(|(_, v)| v.is_none())
                        .map(|(p, _)| *p)
                        .collect();
                    if !positions.is_empty() {
                        pending.batch.keyed.push(Keyed {
                            key: k.key,
                            positions,
                        });
                    }
                }
                pending.readings += readings.len();
                pending.last_received_at = Some(received_at);
                pending.replies.push((reply, verdicts, sequence));
            }
            // Registry changes are rare: commit what came before them, so that readings
            // queued before a delete or a timeout change see the registry they were sent to.
            ShardMsg::Upsert {
                id,
                settings,
                initial,
            } => {
                let _ = self.flush(std::mem::take(pending)).await;
                let p = self.partition_of(id);
                // A partition another node serves: that node follows the change.
                let Some(part) = self.parts.get_mut(p as usize).and_then(Option::as_mut) else {
                    return;
                };
                if part.fleet.get(id).is_some() {
                    let now = self.clock.now();
                    if let Some(held) = part.fleet.set_settings(id, settings, now) {
                        // Hold alarms set on a state already held: its timer starts now,
                        // committed like a change (a failed commit leaves it unset until
                        // the next change of state).
                        let mut set = Pending::default();
                        set.scratch.insert(id, (p, held));
                        set.timed += 1;
                        self.flush(set).await;
                    }
                } else {
                    let state = initial.map_or_else(|| settings.new_state(), |s| *s);
                    part.fleet.insert(id, state);
                }
            }

            ShardMsg::Remove { id } => {
                let _ = self.flush(std::mem::take(pending)).await;
                let p = self.partition_of(id);
                if let Some(part) = self.parts.get_mut(p as usize).and_then(Option::as_mut)
                    && part
                        .fleet
                        .remove(id)
                        .is_some_and(|s| s.connection == Connection::Lost)
                {
                    fleet::lost_gauge(-1.0);
                }
            }
            ShardMsg::Acquire {
                partition,
                epoch,
                sensors,
                since,
                unsure_until,
                reply,
            } => {
                self.follow_links();
                let mut fleet = Fleet::new(self.policy, since);
                fleet.set_links(self.links);
                fleet.reserve(sensors.len());
                for (id, state) in sensors {
                    fleet.insert(id, state);
                }
                let old = self.parts[partition as usize].replace(Part {
                    fleet,
                    epoch,
                    unsure_until,
                });
                if let Some(old) = old {
                    fleet::lost_gauge(-(old.fleet.count_lost() as f64));
                }
                let _ = reply.send(());
            }
            ShardMsg::Release {
                partition,
                flush,
                reply,
            } => {
                if flush {
                    let _ = self.flush(std::mem::take(pending)).await;
                } else {
                    // Its lease is gone: what is pending for it can no longer commit, and
                    // would fence the rest of the batch with it.
                    self.discard(partition, pending);
                }
                if let Some(old) = self.parts[partition as usize].take() {
                    fleet::lost_gauge(-(old.fleet.count_lost() as f64));
                }
                let _ = reply.send(());
            }
        }
    }

    fn apply(
        &self,
        r: &Reading,
        partition: u32,
        received_at: Millis,
        source: Source,
        p: &mut Pending,
    ) -> Option<Rejection> {
        let state = match p.scratch.get_mut(&r.sensor_id) {
            Some((_, s)) => s,
            None => {
                let Some(part) = self.part(partition) else {
                    return Some(Rejection::new(
                        RejectCode::StoreUnavailable,
                        format!("partition {partition} is moving between nodes; send it again"),
                    ));
                };
                let Some(current) = part.fleet.get(r.sensor_id) else {
                    if received_at < part.unsure_until {
                        return Some(Rejection::new(
                            RejectCode::StoreUnavailable,
                            format!(
                                "sensor \"{}\" is not known to this node yet (its partition \
                                 was just taken over); send it again",
                                r.sensor_id
                            ),
                        ));
                    }
                    return Some(Rejection::unknown_sensor(r.sensor_id));
                };
                &mut p
                    .scratch
                    .entry(r.sensor_id)
                    .or_insert((partition, current))
                    .1
            }
        };
        let ts = r.ts.unwrap_or(received_at);
        let window = self.policy.debounce_ms(state);
        let input = rules::Input {
            data: r.data,
            ts,
            received_at,
            source,
            signals: r.signals,
        };
        let change = rules::apply(r.sensor_id, state, input, window, &mut p.batch.events);
        p.batch.readings.push(ReadingRecord {
            sensor_id: r.sensor_id,
            data: r.data,
            ts,
            received_at,
            late: change == Change::Late,
            signals: r.signals,
        });
        None
    }

    /// Drops what is pending for a partition whose lease is lost: its callers are told to
    /// send again, the rest of the batch stays.
    fn discard(&self, partition: u32, p: &mut Pending) {
        if !p.scratch.values().any(|(n, _)| *n == partition) {
            return;
        }
        // A caller's readings get one answer, so the whole round is refused (its callers
        // send again; sensors due to expire stay due) and starts over empty.
        for (reply, _, sequence) in std::mem::take(&mut p.replies) {
            if let Some(seq) = sequence {
                seq.cut();
            }
            let _ = reply.send(Err(Error::Commit(format!(
                "partition {partition} moved to another node"
            ))));
        }
        *p = Pending::default();
    }

    /// Commits a pending batch; `false` when the commit failed.
    async fn flush(&mut self, mut p: Pending) -> bool {
        if p.replies.is_empty() && p.lost == 0 && p.timed == 0 {
            return true;
        }
        let mut fence: Vec<Fence> = p
            .scratch
            .values()
            .filter_map(|(n, _)| {
                let epoch = self.part(*n)?.epoch?;
                Some(Fence {
                    partition: *n,
                    epoch,
                })
            })
            .collect();
        fence.sort_unstable();
        fence.dedup();
        p.batch.fence = fence;
        p.batch.states = p
            .scratch
            .iter()
            .map(|(id, (n, s))| StateUpdate {
                seen_only: self
                    .part(*n)
                    .and_then(|p| p.fleet.get(*id))
                    .is_some_and(|before| s.only_seen_since(&before)),
                hold: s.hold,
                flapping: s.flapping,
                sensor_id: *id,
                data: s.data,
                changed_at: s.changed_at,
                last_ts: s.last_ts,
                last_seen_at: s.last_seen_at,
                connection: s.connection,
                last_source: s.last_source,
                debounce: s.debounce,
                lost_since: s.lost_since,
                reminders: s.reminders,
                signals: s.signals,
            })
            .collect();
        let result = if p.batch.is_empty() {
            Ok(())
        } else {
            let (tx, rx) = oneshot::channel();
            let sent = self
                .commits
                .send(CommitRequest {
                    shard: self.index,
                    batch: p.batch,
                    reply: tx,
                    sent_at: std::time::Instant::now(),
                })
                .await;
            match sent {
                Ok(()) => rx.await.unwrap_or_else(|_| {
                    Err(CommitFailure::Refused("the committer stopped".into()))
                }),
                Err(_) => Err(CommitFailure::Refused("the engine is shutting down".into())),
            }
        };
        match result {
            Ok(()) => {
                self.adopt(p.scratch);
                if p.lost > 0 {
                    super::count_lost(p.lost);
                    tracing::info!(sensors = p.lost, "Sensors went silent: connection lost.");
                }
                for (reply, verdicts, _) in p.replies {
                    let _ = reply.send(Ok(verdicts));
                }
                true
            }
            Err(failure) => {
                // Memory keeps the committed state: readings are refused (their senders
                // try again) and silent sensors stay due, so the next round retries them.
                // A full disk is told once per episode by the store, not once per commit.
                if matches!(failure, CommitFailure::Full(_)) {
                    tracing::debug!(error = %failure, "Group commit failed: the disk is full.");
                } else {
                    tracing::error!(error = %failure, "Group commit failed; readings not acknowledged.");
                }
                if let CommitFailure::Unknown {
                    landed: Some(landed),
                    ..
                } = &failure
                {
                    // It may have landed: the sensors whose state the store now holds are
                    // taken as committed, so a resent reading is a repeat and a sensor
                    // declared lost is not declared lost again.
                    let landed = landed_states(p.scratch, landed);
                    tracing::info!(
                        sensors = landed.len(),
                        "The commit had landed for these sensors after all."
                    );
                    self.adopt(landed);
                }
                let e = match &failure {
                    CommitFailure::Full(m) => Error::StorageFull(m.clone()),
                    CommitFailure::Unknown { .. } => Error::Unknown(failure.to_string()),
                    CommitFailure::Refused(_) => Error::Commit(failure.to_string()),
                };
                for (reply, _, sequence) in p.replies {
                    // Before the next round: none of the sequence's later readings apply.
                    if let Some(seq) = sequence {
                        seq.cut();
                    }
                    let _ = reply.send(Err(e.clone()));
                }
                false
            }
        }
    }

    /// Takes committed states into memory.
    fn adopt(&mut self, committed: HashMap<SensorId, (u32, SensorState)>) {
        for (id, (n, s)) in committed {
            // A partition released meanwhile (flushed first, so only on shutdown paths) has
            // nothing to update.
            let Some(part) = self.parts[n as usize].as_mut() else {
                continue;
            };
            let was_lost = part
                .fleet
                .update(id, s)
                .is_some_and(|old| old.connection == Connection::Lost);
            match (was_lost, s.connection == Connection::Lost) {
                (false, true) => fleet::lost_gauge(1.0),
                (true, false) => fleet::lost_gauge(-1.0),
                _ => {}
            }
        }
    }
}

/// Of a failed commit's scratch states, those the store holds now (read back after the
/// failure): the commit landed for them.
fn landed_states(
    scratch: HashMap<SensorId, (u32, SensorState)>,
    stored: &[SensorRuntime],
) -> HashMap<SensorId, (u32, SensorState)> {
    let stored: HashMap<SensorId, &SensorState> = stored.iter().map(|(id, s)| (*id, s)).collect();
    scratch
        .into_iter()
        .filter(|(id, (_, s))| stored.get(id).is_some_and(|st| s.same_committed(st)))
        .collect()
}
