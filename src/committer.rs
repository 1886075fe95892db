//! The committer: merges the effect batches of all engine shards that are waiting into one
//! store transaction (group commit), then hands the notifications it created to the
//! dispatcher and answers the shards.
//!
//! One transaction for several shards' batches means one fsync for all of them, which is
//! what makes durable acknowledgement cheap on a single SQLite writer. A server database
//! (PostgreSQL) takes several transactions at once: there, a commit starts while others
//! are in flight, up to [`COMMITS_IN_FLIGHT`]. Each shard waits for its batch's answer
//! before it sends the next, so commits in flight never hold the same sensor and a
//! sensor's rows are still written in order.
//!
//! Under load, shards can take turns: while one shard's batch commits, the other's
//! queues up and goes alone in the next commit, and the first one's next batch, sent a
//! moment after its answer, waits for the commit after that. A commit then holds one
//! shard's readings, and on SQLite's one slot that is an fsync and a set of page writes
//! for half the batch it could carry. So a commit that had to wait for a slot also waits,
//! at most [`GATHER`], for the shards the last commit answered that have not sent yet, and
//! takes them along. A lone busy shard waits for nobody, and an idle store for no one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};
use tracing::Instrument;
use tracing::field::Empty;

use crate::clock::Clock;
use crate::domain::{Event, EventKind, Millis, NotificationRef, SensorId};
use crate::engine::{CommitFailure, CommitRequest};
use crate::store::{CommitBatch, Runtime, SensorRuntime};
use crate::telemetry::events::{CommitFailed, Emit};
use crate::telemetry::{SPANS, families};

/// Group commits in flight at once on a shared (server) store. One at a time waited for
/// each transaction's round trips with both cores mostly idle: 3.3k state changes/s from
/// four senders on PostgreSQL, one commit of ~500 changes every 150 ms.
const COMMITS_IN_FLIGHT: usize = 4;

/// Longest a commit that waited for a slot waits for the shards just answered: they send
/// their next batch within tens of microseconds when they have one, so this bounds only
/// the wait for a shard that has none.
const GATHER: Duration = Duration::from_millis(1);

/// How many times a commit whose outcome is unknown reads its sensors back before giving
/// up, and the longest wait between two tries.
const READ_BACK_TRIES: u32 = 20;
const READ_BACK_MAX_WAIT: Duration = Duration::from_secs(3);

/// What one group commit made durable, for whoever the wiring connects.
pub struct Committed {
    /// The notifications it created, in outbox order.
    pub notifications: Vec<NotificationRef>,
    /// Readings and events it added to history.
    pub history_rows: usize,
    /// Its events, when [`Listener::wants_events`] said so before the commit: copying
    /// them costs, and only a live stream's listeners need them.
    pub events: Option<Vec<Event>>,
    /// Readings it made durable.
    pub readings: usize,
    /// Its events counted by kind, in [`EventKind::ALL`]'s order (the recent rates).
    pub kinds: [usize; EventKind::ALL.len()],
    /// When it was committed (the committer's clock).
    pub at: Millis,
}

/// Who hears of commits: the wiring connects the dispatcher, the history shipper and the
/// live stream here, so the committer imports none of them.
pub trait Listener: Send + Sync + 'static {
    /// Whether the next commit's events should be copied into [`Committed::events`].
    fn wants_events(&self) -> bool;
    /// A commit succeeded.
    fn committed(&self, committed: Committed);
    /// Cluster mode: a commit was refused because these partitions moved to another node.
    fn fenced(&self, partitions: Vec<u32>);
    /// A commit whose outcome is unknown may have landed: the notifications it would have
    /// made are pending in the store with an outbox `seq` above `after_seq`, the highest
    /// seq of a commit before it, and nobody was told of them.
    fn maybe_landed(&self, after_seq: i64);
}

/// What every commit needs besides its batch.
#[derive(Clone)]
struct Committing {
    store: Arc<dyn Runtime>,
    clock: Clock,
    listener: Arc<dyn Listener>,
    /// The highest outbox seq a commit made so far.
    last_seq: Arc<std::sync::atomic::AtomicI64>,
}

/// Runs until every shard has dropped its sender and the commits in flight are done.
/// `parallel`: how many commits may be in flight at once (1 for a single-writer store).
pub async fn run(
    store: Arc<dyn Runtime>,
    shared: bool,
    mut rx: mpsc::Receiver<CommitRequest>,
    clock: Clock,
    listener: Arc<dyn Listener>,
) {
    let parallel = if shared { COMMITS_IN_FLIGHT } else { 1 };
    let permits = Arc::new(Semaphore::new(parallel));
    let committing = Committing {
        store,
        clock,
        listener,
        last_seq: Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN)),
    };
    let tracker = tokio_util::task::TaskTracker::new();
    // Shards the last finished commit answered. A `std` mutex: held for a copy, never
    // across an `.await`.
    let answered = Arc::new(Mutex::new(Vec::new()));
    while let Some(first) = rx.recv().await {
        let busy = permits.available_permits() == 0;
        // Whatever queued while waiting for a slot joins this commit.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let awaited = if busy {
            answered.lock().expect("answered lock").clone()
        } else {
            Vec::new()
        };
        let requests = gather(&mut rx, first, awaited).await;
        let (committing, answered) = (committing.clone(), answered.clone());
        tracker.spawn(async move {
            let shards = requests.iter().map(|r| r.shard).collect();
            committing.commit(requests).await;
            // Before the slot is free: the next commit looks at it once it has the slot.
            *answered.lock().expect("answered lock") = shards;
            drop(permit);
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// The requests of the next commit: `first`, whatever queued meanwhile, and, of the shards
/// in `awaited` (those the last commit answered, when this one had to wait for a slot),
/// each that has not sent yet, if it sends within [`GATHER`].
async fn gather(
    rx: &mut mpsc::Receiver<CommitRequest>,
    first: CommitRequest,
    mut awaited: Vec<usize>,
) -> Vec<CommitRequest> {
    let mut requests = vec![first];
    while let Ok(r) = rx.try_recv() {
        requests.push(r);
    }
    awaited.retain(|s| !requests.iter().any(|r| r.shard == *s));
    let until = tokio::time::Instant::now() + GATHER;
    while !awaited.is_empty() {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(r)) => {
                awaited.retain(|s| *s != r.shard);
                requests.push(r);
            }
            _ => break,
        }
    }
    requests
}

impl Committing {
    /// One group commit of `requests`, answered each.
    async fn commit(&self, requests: Vec<CommitRequest>) {
        let mut batch = CommitBatch::default();
        let mut replies = Vec::with_capacity(requests.len());
        // The sensors a commit writes state for, should its outcome have to be read back.
        let mut touched: Vec<SensorId> = Vec::new();
        let sent: Vec<Instant> = requests.iter().map(|r| r.sent_at).collect();
        for r in requests {
            touched.extend(r.batch.states.iter().map(|s| s.sensor_id));
            batch.append(r.batch);
            replies.push(r.reply);
        }
        let rows = batch.readings.len();
        let history_rows = rows + batch.events.len();
        let events = self.listener.wants_events().then(|| batch.events.clone());
        let mut kinds = [0; EventKind::ALL.len()];
        for e in &batch.events {
            if let Some(i) = EventKind::ALL.iter().position(|k| *k == e.kind) {
                kinds[i] += 1;
            }
        }
        let at = self.clock.now();
        // One group commit: a span for the log (its failures say which commit) and, when
        // traces are on, for OTLP; see `telemetry`.
        let span = tracing::info_span!(target: SPANS, "commit", readings = rows,
            events = batch.events.len(), notifications = Empty, otel.status_code = Empty);
        let started = Instant::now();
        let queue = families::COMMIT_QUEUE_SECONDS.histogram();
        for t in sent {
            queue.record(started.saturating_duration_since(t).as_secs_f64());
        }
        let result = self.store.commit(batch, at).instrument(span.clone()).await;
        families::COMMIT_SECONDS
            .histogram()
            .record(started.elapsed().as_secs_f64());
        families::COMMIT_READINGS.histogram().record(rows as f64);
        match &result {
            Ok(created) => span.record("notifications", created.len()),
            Err(_) => span.record("otel.status_code", "ERROR"),
        };
        drop(span);
        match result {
            Ok(notifications) => {
                if let Some(seq) = notifications.iter().map(|n| n.seq).max() {
                    self.last_seq
                        .fetch_max(seq, std::sync::atomic::Ordering::Relaxed);
                }
                self.listener.committed(Committed {
                    notifications,
                    history_rows,
                    events,
                    readings: rows,
                    kinds,
                    at,
                });
                for r in replies {
                    let _ = r.send(Ok(()));
                }
            }
            Err(e) => {
                CommitFailed {
                    fenced: matches!(e, crate::store::Error::Fenced(_)),
                }
                .emit();
                // Cluster mode: partitions another node took over; stop serving them now
                // rather than at the next lease round.
                if let crate::store::Error::Fenced(parts) = &e {
                    self.listener.fenced(parts.clone());
                }
                let failure = if e.maybe_written() {
                    // The store waited for the transaction to end and still could not
                    // learn its outcome (PostgreSQL unreachable all along): what the shards
                    // hold must follow the store, not the guess that nothing landed, so
                    // read the batch's sensors back — a state found is a commit that landed.
                    let landed = self.read_back(touched).await;
                    // And what it may have made goes out (on one node, where no sweep of
                    // the outbox would ever find it).
                    if landed.is_some() {
                        self.listener
                            .maybe_landed(self.last_seq.load(std::sync::atomic::Ordering::Relaxed));
                    }
                    CommitFailure::Unknown {
                        message: e.to_string(),
                        landed,
                    }
                } else if e.is_full() {
                    CommitFailure::Full(e.to_string())
                } else {
                    CommitFailure::Refused(e.to_string())
                };
                for r in replies {
                    let _ = r.send(Err(failure.clone()));
                }
            }
        }
    }

    /// The committed state of `ids`, asked until the store answers (a few minutes at most):
    /// `None` if it never did.
    async fn read_back(&self, ids: Vec<SensorId>) -> Option<Vec<SensorRuntime>> {
        let mut wait = Duration::from_millis(50);
        for _ in 0..READ_BACK_TRIES {
            match self.store.load_states(ids.clone()).await {
                Ok(states) => return Some(states),
                Err(e) => {
                    tracing::warn!(error = %e, sensors = ids.len(),
                        "Could not read back the sensors of a commit whose outcome is unknown; trying again.");
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(READ_BACK_MAX_WAIT);
        }
        tracing::error!(
            sensors = ids.len(),
            "Gave up reading back a commit whose outcome is unknown; its sensors keep the state from before it."
        );
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(shard: usize) -> CommitRequest {
        let (reply, _) = tokio::sync::oneshot::channel();
        CommitRequest {
            shard,
            batch: CommitBatch::default(),
            reply,
            sent_at: Instant::now(),
        }
    }

    fn shards(requests: &[CommitRequest]) -> Vec<usize> {
        requests.iter().map(|r| r.shard).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_that_waited_takes_along_the_shard_answered_last() {
        let (tx, mut rx) = mpsc::channel(8);
        // Runs once `gather` waits (one thread: nothing else runs before it yields).
        let later = tokio::spawn(async move {
            tx.send(request(1)).await.ok();
            tx
        });
        let got = gather(&mut rx, request(0), vec![0, 1]).await;
        assert_eq!(shards(&got), [0, 1], "shard 1 sent within the gather");
        drop(later.await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_that_did_not_wait_goes_alone() {
        let (tx, mut rx) = mpsc::channel(8);
        // Runs once `gather` waits (one thread: nothing else runs before it yields).
        let later = tokio::spawn(async move {
            tx.send(request(1)).await.ok();
            tx
        });
        let got = gather(&mut rx, request(0), Vec::new()).await;
        assert_eq!(shards(&got), [0]);
        let _tx = later.await.expect("sender");
        assert_eq!(
            rx.recv().await.map(|r| r.shard),
            Some(1),
            "it goes in the next commit"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_with_nothing_to_send_is_waited_for_at_most_the_gather() {
        let (tx, mut rx) = mpsc::channel(8);
        tx.send(request(2)).await.expect("queued");
        let started = tokio::time::Instant::now();
        let got = gather(&mut rx, request(0), vec![0, 1, 2]).await;
        assert_eq!(
            shards(&got),
            [0, 2],
            "what queued joins; shard 1 never sent"
        );
        assert_eq!(
            started.elapsed(),
            GATHER,
            "gave up on shard 1 at the gather's end"
        );
    }
}
