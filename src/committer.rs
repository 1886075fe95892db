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

use tokio::sync::{Semaphore, broadcast, mpsc};
use tracing::Instrument;
use tracing::field::Empty;

use crate::clock::Clock;
use crate::delivery::Dispatcher;
use crate::domain::Event;
use crate::engine::CommitRequest;
use crate::history::shipper::Spooled;
use crate::store::CommitBatch;
use crate::store::Store;
use crate::telemetry::SPANS;

/// Group commits in flight at once on a shared (server) store. One at a time waited for
/// each transaction's round trips with both cores mostly idle: 3.3k state changes/s from
/// four senders on PostgreSQL, one commit of ~500 changes every 150 ms.
const COMMITS_IN_FLIGHT: usize = 4;

/// Longest a commit that waited for a slot waits for the shards just answered: they send
/// their next batch within tens of microseconds when they have one, so this bounds only
/// the wait for a shard that has none.
const GATHER: Duration = Duration::from_millis(1);

/// What every commit needs besides its batch.
#[derive(Clone)]
struct Committing {
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    spooled: Arc<Spooled>,
    clock: Clock,
    fenced: Option<mpsc::UnboundedSender<Vec<u32>>>,
    live: Option<broadcast::Sender<Event>>,
}

/// Runs until every shard has dropped its sender and the commits in flight are done.
pub async fn run(
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    mut rx: mpsc::Receiver<CommitRequest>,
    spooled: Arc<Spooled>,
    clock: Clock,
    fenced: Option<mpsc::UnboundedSender<Vec<u32>>>,
    live: Option<broadcast::Sender<Event>>,
) {
    let parallel = if store.shared() { COMMITS_IN_FLIGHT } else { 1 };
    let permits = Arc::new(Semaphore::new(parallel));
    let committing = Committing {
        store,
        dispatcher,
        spooled,
        clock,
        fenced,
        live,
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
        for r in requests {
            batch.append(r.batch);
            replies.push(r.reply);
        }
        let rows = batch.readings.len();
        let history_rows = rows + batch.events.len();
        // `GET /v1/stream`: events are copied only while someone listens.
        let live_events = self.live.as_ref().filter(|tx| tx.receiver_count() > 0);
        let events = live_events.map(|_| batch.events.clone());
        // Traces (when on): one group commit; see `telemetry`.
        let span = tracing::info_span!(target: SPANS, "commit", readings = rows,
            events = batch.events.len(), notifications = Empty, otel.status_code = Empty);
        let started = Instant::now();
        let result = self
            .store
            .commit(batch, self.clock.now())
            .instrument(span.clone())
            .await;
        metrics::histogram!("latch_commit_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("latch_commit_readings").record(rows as f64);
        match &result {
            Ok(created) => span.record("notifications", created.len()),
            Err(_) => span.record("otel.status_code", "ERROR"),
        };
        drop(span);
        match result {
            Ok(created) => {
                self.spooled.add(history_rows);
                self.dispatcher.deliver(created);
                if let (Some(tx), Some(events)) = (live_events, events) {
                    for e in events {
                        // Only fails when the last listener just left.
                        let _ = tx.send(e);
                    }
                }
                for r in replies {
                    let _ = r.send(Ok(()));
                }
            }
            Err(e) => {
                metrics::counter!("latch_commit_failures_total").increment(1);
                // Cluster mode: partitions another node took over; stop serving them now
                // rather than at the next lease round.
                if let (crate::store::Error::Fenced(parts), Some(tx)) = (&e, &self.fenced) {
                    metrics::counter!("latch_cluster_fenced_commits_total").increment(1);
                    let _ = tx.send(parts.clone());
                }
                let msg = e.to_string();
                for r in replies {
                    let _ = r.send(Err(msg.clone()));
                }
            }
        }
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
