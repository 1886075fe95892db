//! The committer: merges the effect batches of all engine shards that are waiting into one
//! store transaction (group commit), then hands the notifications it created to the
//! dispatcher and answers the shards.
//!
//! One transaction for several shards' batches means one fsync for all of them, which is
//! what makes durable acknowledgement cheap on a single SQLite writer.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{broadcast, mpsc};

use crate::clock::Clock;
use crate::delivery::Dispatcher;
use crate::domain::Event;
use crate::engine::CommitRequest;
use crate::history::shipper::Spooled;
use crate::store::CommitBatch;
use crate::store::Store;

/// Runs until every shard has dropped its sender.
pub async fn run(
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    mut rx: mpsc::Receiver<CommitRequest>,
    spooled: Arc<Spooled>,
    clock: Clock,
    fenced: Option<mpsc::UnboundedSender<Vec<u32>>>,
    live: Option<broadcast::Sender<Event>>,
) {
    while let Some(first) = rx.recv().await {
        let mut requests = vec![first];
        while let Ok(r) = rx.try_recv() {
            requests.push(r);
        }
        let mut batch = CommitBatch::default();
        let mut replies = Vec::with_capacity(requests.len());
        for r in requests {
            batch.append(r.batch);
            replies.push(r.reply);
        }
        let rows = batch.readings.len();
        let history_rows = rows + batch.events.len();
        // `GET /v1/stream`: events are copied only while someone listens.
        let live_events = live.as_ref().filter(|tx| tx.receiver_count() > 0);
        let events = live_events.map(|_| batch.events.clone());
        let started = Instant::now();
        let result = store.commit(batch, clock.now()).await;
        metrics::histogram!("latch_commit_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("latch_commit_readings").record(rows as f64);
        match result {
            Ok(created) => {
                spooled.add(history_rows);
                dispatcher.deliver(created);
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
                if let (crate::store::Error::Fenced(parts), Some(tx)) = (&e, &fenced) {
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
