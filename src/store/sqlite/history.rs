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

/// The oldest `limit` unshipped rows of each kind.
fn spooled(c: &Connection, limit: i64, through: i64) -> Result<HistoryBatch> {
    let readings = c
        .prepare_cached(&format!(
            "SELECT {READING_COLS}, sensor_id FROM readings WHERE id <= ?2 ORDER BY id LIMIT ?1"
        ))?
        .query_map([limit, through], |r| {
            row::reading(r, r.sensor_id(row::READING_N)?)
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let events = c
        .prepare_cached(&format!(
            "SELECT * FROM (SELECT {EVENT_COLS}, sensor_id FROM events ORDER BY id LIMIT ?1) \
             UNION ALL SELECT * FROM (SELECT {EVENT_COLS}, sensor_id FROM events_journal \
             ORDER BY id LIMIT ?1) ORDER BY id LIMIT ?1"
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
    let audit = super::audit::spooled(c, limit)?;
    Ok(HistoryBatch {
        audit,
        readings,
        events,
        attempts,
    })
}

/// Readings one step of a move copies into the archive (or deletes from the journal) in
/// one transaction: the writer, and every group commit waiting for it, is free between
/// steps. A move of 100,000 readings in one transaction held it for 0.3–0.6 s.
const STEP: usize = 5_000;

/// Moves the events' journal into `events` ([`move_events`]), then up to `limit` readings
/// into the archive ([`move_readings`]); answers how many readings it moved. Either move
/// goes ahead when the other fails.
pub(super) async fn archive(store: &SqliteStore, limit: usize) -> Result<usize> {
    let events = move_events(store).await;
    let readings = move_readings(store, limit).await?;
    events?;
    Ok(readings)
}

/// Moves up to `limit` readings, the oldest, from the journal into the archive, in steps of
/// [`STEP`]: they are read and sorted by the archive's key on a reader, copied in that
/// order a slice of the key at a time (so each archive page is still written about once
/// per move), then deleted from the journal. Between steps a reading may be in both
/// tables: reads of the journal skip what the archive holds, a copy skips what the archive
/// already has (a move cut short by a crash is taken up again), and a reading no longer
/// in the journal (its sensor deleted meanwhile) is not copied. The copies are on the disk
/// before the first delete is issued (the archive's writer syncs each step; see
/// `SqliteStore::open`); the deletes commit without waiting for it, and a power cut loses
/// only the last of them (the log keeps their order), which leaves readings in both tables,
/// as above. The power-cut test (crates/sim, `power`) holds this to a simulated disk.
async fn move_readings(store: &SqliteStore, limit: usize) -> Result<usize> {
    let limit = limit.clamp(1, 1 << 40) as i64;
    // Only readings whose times `sensor_state` holds leave the journal (`seen.rs`).
    let through = store.flush_seen(false).await?;
    let keyed = store.read(move |c| waiting(c, limit, through)).await?;
    if keyed.is_empty() {
        return Ok(0);
    }
    let moved = keyed.len();
    let mut ids = keyed.clone();
    ids.sort_unstable();
    let keyed = std::sync::Arc::new(keyed);
    for from in (0..moved).step_by(STEP) {
        let keyed = keyed.clone();
        store
            .write_archive(move |c| timed(|| copy(c, &keyed[from..(from + STEP).min(keyed.len())])))
            .await?;
    }
    for chunk in ids.chunks(STEP) {
        let upto = chunk[chunk.len() - 1];
        store
            .write_relaxed(move |c| {
                timed(|| Ok(c.execute("DELETE FROM readings WHERE id <= ?1", [upto])?))
            })
            .await?;
    }
    Ok(moved)
}

/// Events one step of [`move_events`] takes: one transaction of the writer each.
const EVENTS_STEP: usize = 20_000;

/// Moves the journal's events into `events`, in the key order of its index (sensor, time),
/// so that a second's events reach the index's pages together (migration 0020). Each step
/// copies and deletes in one transaction: an event is in one table or the other, never
/// both and never neither, and a step a power cut loses leaves its events in the journal.
async fn move_events(store: &SqliteStore) -> Result<usize> {
    let mut moved = 0;
    loop {
        let n = store
            .write_relaxed(move |c| {
                timed(|| {
                    let tx = c.transaction()?;
                    let upto: Option<i64> = tx.query_row(
                        "SELECT max(id) FROM (SELECT id FROM events_journal ORDER BY id LIMIT ?1)",
                        [EVENTS_STEP as i64],
                        |r| r.get(0),
                    )?;
                    let Some(upto) = upto else {
                        return Ok(0);
                    };
                    tx.prepare_cached(&format!(
                        "INSERT INTO events ({EVENT_COLS}, sensor_id) \
                         SELECT {EVENT_COLS}, sensor_id FROM events_journal WHERE id <= ?1 \
                         ORDER BY sensor_id, at, id"
                    ))?
                    .execute([upto])?;
                    let n = tx
                        .prepare_cached("DELETE FROM events_journal WHERE id <= ?1")?
                        .execute([upto])?;
                    tx.commit()?;
                    Ok(n)
                })
            })
            .await?;
        moved += n;
        if n < EVENTS_STEP {
            return Ok(moved);
        }
    }
}

/// Runs one step of a move, recording how long it held the writer.
fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = std::time::Instant::now();
    let out = f()?;
    crate::telemetry::families::HISTORY_ARCHIVE_SECONDS
        .histogram()
        .record(started.elapsed().as_secs_f64());
    Ok(out)
}

/// The ids of the `limit` oldest readings of the journal up to `through`, in the archive's
/// key order.
fn waiting(c: &Connection, limit: i64, through: i64) -> Result<Vec<i64>> {
    Ok(c.prepare_cached(
        "SELECT id FROM readings \
         WHERE id <= (SELECT MAX(id) FROM (SELECT id FROM readings WHERE id <= ?2 \
           ORDER BY id LIMIT ?1)) \
         ORDER BY sensor_id, ts, id",
    )?
    .query_map([limit, through], |r| r.get(0))?
    .collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Copies the readings `ids` (in the archive's key order) into the archive, those still in
/// the journal and not in the archive yet, in one transaction and one statement (rather
/// than a statement a reading with its values bound, read on a reader into a string a
/// reading: 2–3 % more readings a second, BENCHMARKS.md, eleventh pass).
fn copy(c: &mut Connection, ids: &[i64]) -> Result<()> {
    let last = ids.iter().copied().max().unwrap_or(0);
    let ids = serde_json::to_string(ids).map_err(|e| Error::Backend(e.to_string()))?;
    let tx = c.transaction()?;
    tx.prepare_cached(
        "INSERT OR IGNORE INTO readings_archive (sensor_id, ts, id, received_at, data, late, \
         battery, tamper, fault) \
         SELECT j.sensor_id, j.ts, j.id, j.received_at, j.data, j.late, j.battery, j.tamper, \
         j.fault \
         FROM json_each(?1) AS k JOIN readings j ON j.id = k.value ORDER BY k.key",
    )?
    .execute([ids])?;
    // Ids the archive holds are never handed out again (`archive.rs`).
    super::archive::moved_up_to(&tx, last)?;
    tx.commit()?;
    Ok(())
}

#[async_trait]
impl HistoryStore for SqliteStore {
    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        self.read(move |c| {
            let sql = format!(
                // The archive by its key, the (small) journal by a scan. A move between them
                // copies, then deletes, in several transactions: of the journal, what the archive
                // holds already is skipped, so this one statement sees each row once.
                "SELECT * FROM (SELECT {READING_COLS} FROM readings_archive \
                   WHERE sensor_id = ?1 AND ts >= ?2 AND ts < ?3 AND (ts, id) > (?4, ?5) \
                   ORDER BY ts, id LIMIT ?6) \
                 UNION ALL \
                 SELECT * FROM (SELECT {READING_COLS} FROM readings j \
                   WHERE sensor_id = ?1 AND ts >= ?2 AND ts < ?3 AND (ts, id) > (?4, ?5) \
                   AND NOT EXISTS (SELECT 1 FROM readings_archive a \
                     WHERE a.sensor_id = j.sensor_id AND a.ts = j.ts AND a.id = j.id) \
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
        })
        .await
    }

    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        self.read(move |c| {
            let sql = format!(
                // The moved events by their index, the (small) journal by a scan; a move
                // is one transaction, so each event is in one of them.
                "SELECT * FROM (SELECT {EVENT_COLS} FROM events \
                   WHERE sensor_id = ?1 AND at >= ?2 AND at < ?3 AND (at, id) > (?4, ?5) \
                   ORDER BY at, id LIMIT ?6) \
                 UNION ALL \
                 SELECT * FROM (SELECT {EVENT_COLS} FROM events_journal \
                   WHERE sensor_id = ?1 AND at >= ?2 AND at < ?3 AND (at, id) > (?4, ?5) \
                   ORDER BY at, id LIMIT ?6) \
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
        })
        .await
    }

    /// Reads a batch from the spool, hands it to `sink`, and lets go of it once the sink has it.
    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        // Only readings whose times `sensor_state` holds leave the journal (`seen.rs`).
        let through = self.flush_seen(false).await?;
        let mut batch = self
            .read(move |c| spooled(c, limit as i64, through))
            .await?;
        if batch.len() < limit {
            // Caught up with the bound: what is left waits only for its sensors' kept
            // times, so they are written now, once a shipment round (a stop's last
            // shipment then takes everything accepted).
            let through_now = self.flush_seen(true).await?;
            if through_now > through {
                batch = self
                    .read(move |c| spooled(c, limit as i64, through_now))
                    .await?;
            }
        }
        if batch.is_empty() {
            return Ok(0);
        }
        sink.insert(&batch).await.map_err(Error::Sink)?;
        // One writer hands out ids in commit order, so every row at or below the highest id
        // read was in the batch: a range delete lets go of exactly what shipped.
        let last_reading = batch.readings.iter().map(|r| r.id).max().unwrap_or(0);
        let last_event = batch.events.iter().map(|e| e.id).max().unwrap_or(0);
        let last_attempt = batch.attempts.iter().map(|a| a.id).max();
        let last_record = batch.audit.iter().map(|e| e.id).max();
        let shipped = batch.len();
        self.write(move |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM readings WHERE id <= ?1", [last_reading])?;
            tx.execute("DELETE FROM events WHERE id <= ?1", [last_event])?;
            tx.execute("DELETE FROM events_journal WHERE id <= ?1", [last_event])?;
            // Attempts stay (the API shows them with their notification): the mark moves.
            if let Some(last) = last_attempt {
                tx.execute(
                    "UPDATE ship_marks SET last_id = ?1 WHERE what = 'attempts' AND last_id < ?1",
                    [last],
                )?;
            }
            if let Some(last) = last_record {
                super::audit::shipped(&tx, last)?;
            }
            tx.commit()?;
            Ok(shipped)
        })
        .await
    }

    async fn spool_depth(&self) -> Result<u64> {
        self.read(move |c| {
            Ok(c.query_row(
                &format!(
                    "SELECT (SELECT COUNT(*) FROM readings) + (SELECT COUNT(*) FROM events) \
                 + (SELECT COUNT(*) FROM events_journal) \
                 + (SELECT COUNT(*) FROM attempts \
                    WHERE id > (SELECT last_id FROM ship_marks WHERE what = 'attempts')) \
                 + {}",
                    super::audit::UNSHIPPED
                ),
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    /// The oldest reading kept: the first of each sensor's archive range, and the journal's
    /// (moved into the archive every second, or the ClickHouse spool).
    async fn history_from(&self) -> Result<Option<crate::domain::Millis>> {
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT MIN(m) FROM (\
                   SELECT (SELECT MIN(a.ts) FROM readings_archive a WHERE a.sensor_id = s.id) AS m \
                   FROM sensors s \
                   UNION ALL SELECT MIN(ts) FROM readings)",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }
}

#[async_trait]
impl crate::store::Journal for SqliteStore {
    async fn archive_history(&self, limit: usize) -> Result<usize> {
        archive(self, limit).await
    }
}
