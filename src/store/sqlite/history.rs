//! History: readings and events listed, the spool shipped to a sink, the journal moved
//! into the archive.

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::super::rows::{self as row, Cols, EVENT_COLS, READING_COLS};
use super::super::{
    Error, HistoryBatch, HistorySink, Page, PageRequest, ReadingRecord, Result, Stored, TimeRange,
    limit_plus_one, split_cursor,
};
use super::SqliteStore;
use crate::domain::{Event, SensorId};
use crate::store::HistoryStore;

pub(super) fn list_readings(
    c: &Connection,
    sensor_id: SensorId,
    range: TimeRange,
    page: PageRequest,
) -> Result<Page<Stored<ReadingRecord>>> {
    let sql = format!(
        // The archive by its key, the (small) journal by a scan; a move between them is
        // one transaction, so this one statement sees each row once.
        "SELECT * FROM (SELECT {READING_COLS} FROM readings_archive \
           WHERE sensor_id = ?1 AND ts >= ?2 AND ts < ?3 AND (ts, id) > (?4, ?5) \
           ORDER BY ts, id LIMIT ?6) \
         UNION ALL \
         SELECT * FROM (SELECT {READING_COLS} FROM readings \
           WHERE sensor_id = ?1 AND ts >= ?2 AND ts < ?3 AND (ts, id) > (?4, ?5) \
           ORDER BY ts, id LIMIT ?6) \
         ORDER BY ts, id LIMIT ?6"
    );
    page_by_time(
        c,
        &sql,
        sensor_id,
        range,
        page,
        |r, s| row::reading(r, s),
        |r| r.ts,
    )
}

pub(super) fn list_events(
    c: &Connection,
    sensor_id: SensorId,
    range: TimeRange,
    page: PageRequest,
) -> Result<Page<Stored<Event>>> {
    let sql = format!(
        "SELECT {EVENT_COLS} FROM events \
         WHERE sensor_id = ?1 AND at >= ?2 AND at < ?3 AND (at, id) > (?4, ?5) \
         ORDER BY at, id LIMIT ?6"
    );
    page_by_time(
        c,
        &sql,
        sensor_id,
        range,
        page,
        |r, s| row::event(r, s),
        |e| e.at,
    )
}

/// One page of a sensor's history rows in time order. `sql` takes the sensor (`?1`), the
/// range (`?2`, `?3`), the cursor's time and id (`?4`, `?5`) and the limit (`?6`); the
/// next cursor is the last row's `time` and id.
fn page_by_time<T>(
    c: &Connection,
    sql: &str,
    sensor_id: SensorId,
    range: TimeRange,
    page: PageRequest,
    map: impl Fn(&rusqlite::Row<'_>, SensorId) -> rusqlite::Result<Stored<T>>,
    time: impl Fn(&T) -> i64,
) -> Result<Page<Stored<T>>> {
    let (after_time, after_id) = match &page.after {
        Some(cur) => split_cursor(cur)?,
        None => (i64::MIN, i64::MIN),
    };
    let rows = c
        .prepare_cached(sql)?
        .query_map(
            params![
                sensor_id.to_string(),
                range.from.unwrap_or(i64::MIN),
                range.to.unwrap_or(i64::MAX),
                after_time,
                after_id,
                limit_plus_one(&page)
            ],
            |r| map(r, sensor_id),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Page::from_rows(rows, page.limit, |r| {
        format!("{}:{}", time(&r.row), r.id)
    }))
}

/// Reads a batch from the spool, hands it to `sink`, and lets go of it once the sink has it.
pub(super) async fn ship(
    store: &SqliteStore,
    limit: usize,
    sink: &dyn HistorySink,
) -> Result<usize> {
    let batch = store.read(move |c| spooled(c, limit as i64)).await?;
    if batch.is_empty() {
        return Ok(0);
    }
    sink.insert(&batch).await.map_err(Error::Sink)?;
    // One writer hands out ids in commit order, so every row at or below the highest id
    // read was in the batch: a range delete lets go of exactly what shipped.
    let last_reading = batch.readings.iter().map(|r| r.id).max().unwrap_or(0);
    let last_event = batch.events.iter().map(|e| e.id).max().unwrap_or(0);
    let last_attempt = batch.attempts.iter().map(|a| a.id).max();
    let shipped = batch.len();
    store
        .write(move |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM readings WHERE id <= ?1", [last_reading])?;
            tx.execute("DELETE FROM events WHERE id <= ?1", [last_event])?;
            // Attempts stay (the API shows them with their notification): the mark moves.
            if let Some(last) = last_attempt {
                tx.execute(
                    "UPDATE ship_marks SET last_id = ?1 WHERE what = 'attempts' AND last_id < ?1",
                    [last],
                )?;
            }
            tx.commit()?;
            Ok(shipped)
        })
        .await
}

/// The oldest `limit` unshipped rows of each kind.
fn spooled(c: &Connection, limit: i64) -> Result<HistoryBatch> {
    let readings = c
        .prepare_cached(&format!(
            "SELECT {READING_COLS}, sensor_id FROM readings ORDER BY id LIMIT ?1"
        ))?
        .query_map([limit], |r| row::reading(r, r.sensor_id(5)?))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let events = c
        .prepare_cached(&format!(
            "SELECT {EVENT_COLS}, sensor_id FROM events ORDER BY id LIMIT ?1"
        ))?
        .query_map([limit], |r| row::event(r, r.sensor_id(row::EVENT_N)?))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let attempts = c
        .prepare_cached(
            "SELECT a.id, a.notification_id, a.at, a.status_code, a.error, a.duration_ms, \
             COALESCE(n.client_id, ''), COALESCE(n.sensor_id, ''), COALESCE(n.kind, '') \
             FROM attempts a LEFT JOIN notifications n ON n.id = a.notification_id \
             WHERE a.id > (SELECT last_id FROM ship_marks WHERE what = 'attempts') \
             ORDER BY a.id LIMIT ?1",
        )?
        .query_map([limit], |r| row::attempt_record(r))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(HistoryBatch {
        readings,
        events,
        attempts,
    })
}

pub(super) fn archive(c: &mut Connection, limit: usize) -> Result<usize> {
    let started = std::time::Instant::now();
    let moved = move_to_archive(c, limit)?;
    if moved > 0 {
        crate::telemetry::families::HISTORY_ARCHIVE_SECONDS
            .histogram()
            .record(started.elapsed().as_secs_f64());
    }
    Ok(moved)
}

/// One move of up to `limit` readings, the oldest, from the journal into the archive.
fn move_to_archive(c: &mut Connection, limit: usize) -> Result<usize> {
    let tx = c.transaction()?;
    // The id of the `limit`-th oldest reading, or of the newest when fewer wait.
    let last: Option<i64> = tx.query_row(
        "SELECT MAX(id) FROM (SELECT id FROM readings ORDER BY id LIMIT ?1)",
        [limit.clamp(1, 1 << 40) as i64],
        |r| r.get(0),
    )?;
    let Some(last) = last else {
        return Ok(0);
    };
    // Sorted by the archive's key: each of its pages is written once per move.
    let moved = tx.execute(
        "INSERT INTO readings_archive (sensor_id, ts, id, received_at, data, late) \
         SELECT sensor_id, ts, id, received_at, data, late FROM readings \
         WHERE id <= ?1 ORDER BY sensor_id, ts, id",
        [last],
    )?;
    tx.execute("DELETE FROM readings WHERE id <= ?1", [last])?;
    tx.commit()?;
    Ok(moved)
}

pub(super) fn spool_depth(c: &Connection) -> Result<u64> {
    Ok(c.query_row(
        "SELECT (SELECT COUNT(*) FROM readings) + (SELECT COUNT(*) FROM events) \
         + (SELECT COUNT(*) FROM attempts \
            WHERE id > (SELECT last_id FROM ship_marks WHERE what = 'attempts'))",
        [],
        |r| r.get(0),
    )?)
}

#[async_trait]
impl HistoryStore for SqliteStore {
    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        self.read(move |c| list_readings(c, sensor_id, range, page))
            .await
    }

    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        self.read(move |c| list_events(c, sensor_id, range, page))
            .await
    }

    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        ship(self, limit, sink).await
    }

    async fn spool_depth(&self) -> Result<u64> {
        self.read(spool_depth).await
    }

    async fn archive_history(&self, limit: usize) -> Result<usize> {
        self.write(move |c| archive(c, limit)).await
    }

    async fn history_from(&self) -> Result<Option<crate::domain::Millis>> {
        self.read(super::retention::history_from).await
    }
}
