//! History: every reading, event and webhook attempt, kept for queries.
//!
//! Without ClickHouse, history lives in the store and is read from there. With
//! `clickhouse_url` set, the store's history tables become a durable spool: rows are still
//! committed there with the readings that made them (so nothing is acknowledged that is not
//! durable), the [`shipper`] moves them to ClickHouse in batches, and reads merge both, so a
//! reading is visible the moment it is accepted.

pub mod archiver;
pub mod clickhouse;
pub mod retention;
pub mod shipper;

use std::sync::Arc;

use crate::domain::{Event, SensorId};
use crate::store::{
    self, HistoryStore, Page, PageRequest, ReadingRecord, Registry, Store, Stored, TimeRange,
};
use clickhouse::ClickHouse;

/// Errors of the history layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("ClickHouse: {0}")]
    ClickHouse(String),
}

impl From<::clickhouse::error::Error> for Error {
    fn from(e: ::clickhouse::error::Error) -> Self {
        Error::ClickHouse(e.to_string())
    }
}

/// Reads history from wherever it is.
#[derive(Clone)]
pub struct History {
    /// Where the store's history (or its spool) is read.
    reads: Arc<dyn HistoryStore>,
    /// Where a sensor is deleted with its spooled history.
    registry: Arc<dyn Registry>,
    clickhouse: Option<ClickHouse>,
    /// Held by the shipper through each shipment and by sensor deletion, so a deletion
    /// never falls between a shipment's read of the spool and its insert into ClickHouse
    /// (which would bring the deleted rows back). Across nodes, PostgreSQL's row locks do
    /// the same.
    shipping: Arc<tokio::sync::Mutex<()>>,
    /// The oldest reading kept, as retention's last look-up found it (`None`: none, or
    /// not looked up yet). A `std` mutex: held for a copy, never across an `.await`.
    from: Arc<std::sync::Mutex<Option<crate::domain::Millis>>>,
}

impl History {
    pub fn new(store: Arc<dyn Store>, clickhouse: Option<ClickHouse>) -> Self {
        Self {
            reads: store.clone(),
            registry: store,
            clickhouse,
            shipping: Arc::default(),
            from: Arc::default(),
        }
    }

    /// How far back history goes: the time of the oldest reading kept, refreshed by
    /// [`retention`] every few minutes.
    pub fn history_from(&self) -> Option<crate::domain::Millis> {
        *self.from.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_from(&self, from: Option<crate::domain::Millis>) {
        *self.from.lock().unwrap_or_else(|p| p.into_inner()) = from;
    }

    /// The lock the shipper holds through each shipment.
    pub fn shipping(&self) -> Arc<tokio::sync::Mutex<()>> {
        self.shipping.clone()
    }

    /// A sensor's readings by `(ts, id)`.
    pub async fn readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>, Error> {
        // The spool is read before ClickHouse: a row leaves the spool only after ClickHouse
        // has it, so whichever way a shipment races this read, the row is seen (possibly
        // twice, which the merge folds).
        let spooled = self
            .reads
            .list_readings(sensor_id, range, page.clone())
            .await?;
        let Some(ch) = &self.clickhouse else {
            return Ok(spooled);
        };
        let after = cursor(&page)?;
        let shipped = ch
            .readings(sensor_id, range, after, page.limit as u64 + 1)
            .await?;
        Ok(merge(spooled, shipped, page.limit, |r| r.row.ts))
    }

    /// A sensor's events by `(at, id)`.
    pub async fn events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>, Error> {
        let spooled = self
            .reads
            .list_events(sensor_id, range, page.clone())
            .await?;
        let Some(ch) = &self.clickhouse else {
            return Ok(spooled);
        };
        let after = cursor(&page)?;
        let shipped = ch
            .events(sensor_id, range, after, page.limit as u64 + 1)
            .await?;
        Ok(merge(spooled, shipped, page.limit, |e| e.row.at))
    }

    /// Deletes a sensor from the store (with its spooled history) and its shipped history
    /// from ClickHouse, which deletes in the background; a ClickHouse failure is only
    /// logged. `false` if there was no such sensor.
    pub async fn delete_sensor(&self, sensor_id: SensorId, now: i64) -> Result<bool, Error> {
        let _no_shipment = self.shipping.lock().await;
        if !self.registry.delete_sensor(sensor_id, now).await? {
            return Ok(false);
        }
        if let Some(ch) = &self.clickhouse
            && let Err(e) = ch.delete_sensor(sensor_id).await
        {
            tracing::warn!(sensor = %sensor_id, error = %e,
                "Could not delete the sensor's history in ClickHouse.");
        }
        Ok(true)
    }
}

fn cursor(page: &PageRequest) -> Result<(i64, i64), Error> {
    Ok(match &page.after {
        Some(c) => store::split_cursor(c)?,
        None => (i64::MIN, i64::MIN),
    })
}

/// One page out of a spool page (at most `limit` rows, `next` if it had more) and up to
/// `limit + 1` shipped rows after the same cursor. The first `limit` rows of the union are
/// among these, so the merge is exact; a row in both (mid-shipment, or shipped twice) is
/// kept once, by id.
fn merge<T>(
    spooled: Page<Stored<T>>,
    shipped: Vec<Stored<T>>,
    limit: u32,
    time: impl Fn(&Stored<T>) -> i64,
) -> Page<Stored<T>> {
    let spool_has_more = spooled.next.is_some();
    let mut rows = spooled.items;
    rows.extend(shipped);
    rows.sort_by_key(|r| (time(r), r.id));
    rows.dedup_by_key(|r| r.id);
    let more = rows.len() > limit as usize || spool_has_more;
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|r| format!("{}:{}", time(r), r.id))
    } else {
        None
    };
    Page { items: rows, next }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(keys: &[(i64, i64)]) -> Vec<Stored<()>> {
        keys.iter().map(|&(_, id)| Stored { id, row: () }).collect()
    }

    #[test]
    fn merge_interleaves_folds_duplicates_and_pages() {
        // time = id * 10 for these rows.
        let t = |r: &Stored<()>| r.id * 10;
        let spool = Page {
            items: rows(&[(0, 3), (0, 5)]),
            next: None,
        };
        let shipped = rows(&[(0, 1), (0, 3), (0, 4)]);
        let page = merge(spool, shipped, 3, t);
        let ids: Vec<i64> = page.items.iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![1, 3, 4]);
        assert_eq!(page.next.as_deref(), Some("40:4"));

        let spool = Page {
            items: rows(&[(0, 5)]),
            next: None,
        };
        let last = merge(spool, vec![], 3, t);
        assert_eq!(last.items.len(), 1);
        assert_eq!(last.next, None);

        // A full spool page says there is more even when ClickHouse has nothing after it.
        let spool = Page {
            items: rows(&[(0, 6), (0, 7)]),
            next: Some("70:7".into()),
        };
        let page = merge(spool, vec![], 2, t);
        assert_eq!(page.next.as_deref(), Some("70:7"));
    }
}
