//! Without ClickHouse, the embedded store commits readings to an append-only journal and
//! the archiver moves them into its indexed archive every second (or as soon as
//! [`super::shipper::BATCH`] rows were committed), in bulk and sorted: far cheaper than
//! indexing each group commit's readings as they come (see the SQLite migration 0003).
//! Stores that index readings on insert (PostgreSQL) have nothing to move.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::shipper::Spooled;
use crate::store::Journal;

/// How often the journal is moved into the archive.
pub const EVERY: Duration = Duration::from_secs(1);
/// Most readings one move takes: each move holds the store's one writer, so ingest waits
/// for it; smaller moves keep that wait short, larger ones write fewer pages per reading.
pub const BATCH: usize = 100_000;

/// Runs until `stop`.
pub async fn run(store: Arc<dyn Journal>, spooled: Arc<Spooled>, stop: CancellationToken) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = spooled.full.notified() => {}
            _ = tokio::time::sleep(EVERY) => {}
        }
        loop {
            spooled.reset();
            match store.archive_history(BATCH).await {
                Ok(moved) if moved >= BATCH => continue,
                Ok(_) => break,
                Err(e) => {
                    // The readings stay in the journal, where reads find them too.
                    tracing::warn!(error = %e, "Moving readings into the archive failed.");
                    break;
                }
            }
        }
    }
}
