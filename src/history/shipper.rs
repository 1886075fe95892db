//! The shipper: moves the spool to ClickHouse in batches, every `clickhouse_flush` or as
//! soon as [`BATCH`] rows wait, and keeps at it through ClickHouse outages.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::clickhouse::ClickHouse;
use crate::store::{self, HistoryBatch, HistorySink, HistoryStore};
use crate::telemetry::events::{ClickHouseUp, Emit, ShipFailed, Shipped, SpoolDepth};

/// Most rows of each kind in one shipment; this many waiting ships at once.
pub const BATCH: usize = 100_000;
/// Longest wait between attempts while ClickHouse is failing.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often the spool is counted for the gauge.
const DEPTH_EVERY: Duration = Duration::from_secs(5);
/// How long a stop waits for a last shipment.
const LAST_SHIPMENT: Duration = Duration::from_secs(5);

/// Rows committed since the last shipment: the committer counts, the shipper listens.
#[derive(Default)]
pub struct Spooled {
    rows: AtomicU64,
    pub(super) full: Notify,
}

impl Spooled {
    /// Called after a commit with the history rows it wrote.
    pub fn add(&self, rows: usize) {
        let before = self.rows.fetch_add(rows as u64, Ordering::Relaxed);
        if before < BATCH as u64 && before + rows as u64 >= BATCH as u64 {
            self.full.notify_one();
        }
    }

    pub(super) fn reset(&self) {
        self.rows.store(0, Ordering::Relaxed);
    }
}

#[async_trait]
impl HistorySink for ClickHouse {
    async fn insert(&self, batch: &HistoryBatch) -> Result<(), String> {
        ClickHouse::insert(self, batch)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Runs until `stop`, then tries one last shipment.
pub async fn run(
    store: Arc<dyn HistoryStore>,
    clickhouse: ClickHouse,
    flush: Duration,
    spooled: Arc<Spooled>,
    shipping: Arc<tokio::sync::Mutex<()>>,
    stop: CancellationToken,
) {
    let mut schema_ready = false;
    let mut failing_since: Option<Instant> = None;
    let mut backoff = flush;
    let mut last_depth = Instant::now() - DEPTH_EVERY;
    loop {
        let ok = if schema_ready {
            ship_all(&*store, &clickhouse, &spooled, &shipping).await
        } else {
            match clickhouse.ensure_schema().await {
                Ok(()) => {
                    schema_ready = true;
                    ship_all(&*store, &clickhouse, &spooled, &shipping).await
                }
                Err(e) => Err(store::Error::Sink(e.to_string())),
            }
        };
        match ok {
            Ok(()) => {
                ClickHouseUp {
                    failed_for: failing_since.take().map(|since| since.elapsed()),
                }
                .emit();
                backoff = flush;
            }
            Err(e) if !matches!(e, store::Error::Sink(_)) => {
                // The store, not ClickHouse: the rows wait where they are; next flush.
                tracing::warn!(error = %e, "Reading the history spool failed.");
            }
            Err(e) => {
                let first = failing_since.is_none();
                failing_since.get_or_insert_with(Instant::now);
                ShipFailed { error: &e, first }.emit();
                backoff = (backoff * 2).min(MAX_BACKOFF.max(flush));
            }
        }
        if last_depth.elapsed() >= DEPTH_EVERY {
            last_depth = Instant::now();
            if let Ok(depth) = store.spool_depth().await {
                SpoolDepth(depth).emit();
            }
        }
        let wait = if failing_since.is_some() {
            backoff
        } else {
            flush
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = spooled.full.notified(), if failing_since.is_none() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
    if schema_ready && failing_since.is_none() {
        let last = tokio::time::timeout(
            LAST_SHIPMENT,
            ship_all(&*store, &clickhouse, &spooled, &shipping),
        );
        if !matches!(last.await, Ok(Ok(()))) {
            tracing::info!("History left in the spool ships at the next start.");
        }
    }
}

/// Ships batches until the spool is (nearly) empty.
async fn ship_all(
    store: &dyn HistoryStore,
    ch: &ClickHouse,
    spooled: &Spooled,
    shipping: &tokio::sync::Mutex<()>,
) -> store::Result<()> {
    loop {
        spooled.reset();
        let started = Instant::now();
        let shipped = {
            let _shipment = shipping.lock().await;
            store.ship_history(BATCH, ch).await?
        };
        Shipped {
            rows: shipped,
            took: started.elapsed(),
        }
        .emit();
        if shipped < BATCH {
            return Ok(());
        }
    }
}
