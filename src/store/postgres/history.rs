//! History: readings and events listed, and the spool shipped to a sink.

use async_trait::async_trait;

use super::super::rows::{self as row, Cols, EVENT_COLS, READING_COLS};
use super::super::{
    Error, HistoryBatch, HistorySink, Page, PageRequest, ReadingRecord, Result, Stored, TimeRange,
    limit_plus_one, split_cursor,
};
use super::PgStore;
use super::db::{Bound, Db, Sql};
use crate::domain::{Event, SensorId};
use crate::store::HistoryStore;

/// One page of a sensor's history rows in time order. `sql` takes the sensor (`$1`), the
/// range (`$2`, `$3`), the cursor's time and id (`$4`, `$5`) and the limit (`$6`); the
/// next cursor is the last row's `time` and id.
async fn page_by_time<T>(
    db: &Db,
    sql: &str,
    sensor_id: SensorId,
    range: TimeRange,
    page: PageRequest,
    map: impl Fn(&tokio_postgres::Row, SensorId) -> Result<Stored<T>>,
    time: impl Fn(&T) -> i64,
) -> Result<Page<Stored<T>>> {
    let (after_time, after_id) = match &page.after {
        Some(cur) => split_cursor(cur)?,
        None => (i64::MIN, i64::MIN),
    };
    let c = db.get("page_by_time").await?;
    let rows = c
        .query(
            sql,
            &[
                &sensor_id.to_string(),
                &range.from.unwrap_or(i64::MIN),
                &range.to.unwrap_or(i64::MAX),
                &after_time,
                &after_id,
                &limit_plus_one(&page),
            ],
        )
        .await?;
    let rows = rows
        .iter()
        .map(|r| map(r, sensor_id))
        .collect::<Result<Vec<_>>>()?;
    Ok(Page::from_rows(rows, page.limit, |r| {
        format!("{}:{}", time(&r.row), r.id)
    }))
}

#[async_trait]
impl HistoryStore for PgStore {
    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        let sql = format!(
            "SELECT {READING_COLS} FROM readings \
             WHERE sensor_id = $1 AND ts >= $2 AND ts < $3 AND (ts, id) > ($4, $5) \
             ORDER BY ts, id LIMIT $6"
        );
        page_by_time(&self.db, &sql, sensor_id, range, page, row::reading, |r| {
            r.ts
        })
        .await
    }

    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        let sql = format!(
            "SELECT {EVENT_COLS} FROM events \
             WHERE sensor_id = $1 AND at >= $2 AND at < $3 AND (at, id) > ($4, $5) \
             ORDER BY at, id LIMIT $6"
        );
        page_by_time(&self.db, &sql, sensor_id, range, page, row::event, |e| e.at).await
    }

    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        let limit = limit as i64;
        let mut c = self.db.get_for("ship_history", Bound::Shipment).await?;
        // Rows are deleted (or marked) and locked in a transaction that commits only once
        // the sink has them: a failure rolls back, other nodes skip the locked rows, and
        // readers keep seeing them in the spool until ClickHouse has them too.
        let tx = c.transaction().await?;
        let readings = tx
            .query(
                &format!(
                    "DELETE FROM readings WHERE id = ANY(ARRAY(\
                   SELECT id FROM readings ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                 RETURNING {READING_COLS}, sensor_id"
                ),
                &[&limit],
            )
            .await?
            .iter()
            .map(|r| row::reading(r, r.sensor_id(row::READING_N)?))
            .collect::<Result<Vec<_>>>()?;
        let events = tx
            .query(
                &format!(
                    "DELETE FROM events WHERE id = ANY(ARRAY(\
                   SELECT id FROM events ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                 RETURNING {EVENT_COLS}, sensor_id"
                ),
                &[&limit],
            )
            .await?
            .iter()
            .map(|r| row::event(r, r.sensor_id(row::EVENT_N)?))
            .collect::<Result<Vec<_>>>()?;
        let attempts = tx
            .query(
                "WITH a AS (UPDATE attempts SET shipped = true WHERE id = ANY(ARRAY(\
                   SELECT id FROM attempts WHERE NOT shipped ORDER BY id LIMIT $1 \
                   FOR UPDATE SKIP LOCKED)) \
                 RETURNING id, notification_id, at, status_code, error, duration_ms) \
                 SELECT a.id, a.notification_id, a.at, a.status_code, a.error, a.duration_ms, \
                   COALESCE(n.client_id, ''), COALESCE(n.sensor_id, ''), COALESCE(n.kind, '') \
                 FROM a LEFT JOIN notifications n ON n.id = a.notification_id ORDER BY a.id",
                &[&limit],
            )
            .await?
            .iter()
            .map(row::attempt_record)
            .collect::<Result<Vec<_>>>()?;
        let audit = super::audit::ship(&tx, limit).await?;
        let batch = HistoryBatch {
            audit,
            readings,
            events,
            attempts,
        };
        if batch.is_empty() {
            return Ok(0);
        }
        sink.insert(&batch).await.map_err(Error::Sink)?;
        tx.commit().await?;
        Ok(batch.len())
    }

    async fn spool_depth(&self) -> Result<u64> {
        let c = self.db.get("spool_depth").await?;
        let n: i64 = c
            .query_one(
                &format!(
                    "SELECT (SELECT COUNT(*) FROM readings) + (SELECT COUNT(*) FROM events) \
                     + (SELECT COUNT(*) FROM attempts WHERE NOT shipped) + {}",
                    super::audit::UNSHIPPED
                ),
                &[],
            )
            .await?
            .get(0);
        Ok(n as u64)
    }

    /// The oldest reading kept: the first of each sensor's range in the index by sensor and
    /// time, over every partition. Readings are indexed as they are committed: there is no
    /// journal to move.
    ///
    /// The planner is held to the index's first entry. Planned while a partition was new
    /// and its statistics said it was empty, each probe became a scan of the partition (or
    /// a bitmap of the sensor's entries), per sensor: 8–34 s of the server's CPU for 50,000
    /// sensors in the delivery bench, in the middle of the backlog it measures.
    async fn history_from(&self) -> Result<Option<crate::domain::Millis>> {
        let mut c = self
            .db
            .get_for("history_from", super::db::Bound::Bulk)
            .await?;
        let tx = c.transaction().await?;
        tx.batch_execute(
            "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
             SET LOCAL jit = off",
        )
        .await?;
        let from = tx
            .query_one(
                "SELECT MIN((SELECT r.ts FROM readings r WHERE r.sensor_id = s.id \
                 ORDER BY r.ts LIMIT 1)) FROM sensors s",
                &[],
            )
            .await?
            .get(0);
        tx.commit().await?;
        Ok(from)
    }
}
