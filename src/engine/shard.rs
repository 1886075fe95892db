//! One shard's loop: take what has queued up, apply it to a scratch copy of the touched
//! sensors, declare the silent ones lost, and hand the effects to the committer. Only a
//! durable commit moves the scratch state into memory and answers the callers, so a failed
//! commit leaves memory exactly as the store is.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::fleet::{self, Fleet};
use super::rules::{self, Change};
use super::{Clock, CommitRequest, EXPIRE_BATCH, Error, Verdicts};
use crate::domain::sensor::SensorState;
use crate::domain::{Connection, Event, EventKind, Millis, Reading, Rejection, SensorId};
use crate::store::{CommitBatch, ReadingRecord, StateUpdate};

/// What a shard is asked to do, in the order it was asked.
pub(super) enum ShardMsg {
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

/// One shard task: owns its sensors' state and applies their readings in arrival order.
pub(super) struct Shard {
    pub(super) map: Fleet,
    pub(super) rx: mpsc::Receiver<ShardMsg>,
    pub(super) commits: mpsc::Sender<CommitRequest>,
    pub(super) batch_max: usize,
    pub(super) clock: Clock,
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
    /// Runs until `stop`, then finishes what callers already queued.
    pub(super) async fn run(mut self, stop: CancellationToken) {
        let mut stopping = false;
        loop {
            let deadline = self.map.next_deadline();
            let sleep = async {
                match deadline {
                    Some(d) => self.clock.sleep_until(d).await,
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
