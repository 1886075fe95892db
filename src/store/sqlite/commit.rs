//! The group commit: a batch's readings, state, events and notifications in one
//! transaction on the writer.

use async_trait::async_trait;

use super::SqliteStore;
use super::seen::{Deferred, Seen, Times};
use crate::store::idempotency::positions_text;
use crate::store::rules::{self, commit::Made, commit::Newer};
use crate::store::{Fence, Runtime, SensorRuntime};
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, Transaction, params};

use super::super::rows::{self as row, RUNTIME_COLS, RUNTIME_JOIN};
use super::super::{CommitBatch, Error, NotificationRef, ReadingRecord, Result};
use crate::domain::{Event, Millis, SensorId, notification::new_notification_id};

/// A group commit's tables on the writer ([`rules::commit`]): the transaction, and the
/// times of sensors only seen, which it defers (`seen.rs`).
struct CommitTables<'a> {
    tx: &'a Transaction<'a>,
    seen: &'a Seen,
    deferred: &'a mut Deferred,
}

super::alarms::alarm_tables!(CommitTables<'_>);

impl rules::armed::ArmedTables for CommitTables<'_> {
    async fn armed(&mut self, sensors: &[SensorId]) -> Result<Vec<rules::armed::ArmedRow>> {
        super::armed::armed(self.tx, sensors)
    }

    async fn describe(&mut self, bodies: &[(i64, String)]) -> Result<()> {
        super::armed::describe(self.tx, bodies)
    }
}

impl rules::commit::CommitTables for CommitTables<'_> {
    /// SQLite stays one node: no leases to check a fence against.
    async fn fenced(&mut self, fence: &[Fence]) -> Result<Vec<u32>> {
        match fence.is_empty() {
            true => Ok(Vec::new()),
            false => Err(Error::Backend("cluster fencing needs PostgreSQL".into())),
        }
    }

    async fn write_rows(&mut self, batch: &CommitBatch, now: Millis) -> Result<Vec<usize>> {
        write_rows(self.tx, batch, now, self.seen, self.deferred)
    }

    async fn hold_for_sites(&mut self, events: &[&Event], now: Millis) -> Result<HashSet<usize>> {
        super::site_rounds::hold_for_sites(self.tx, events, now)
    }

    /// From the staged events ([`STAGING`]), the held ones taken out first.
    async fn fan_out(
        &mut self,
        events: &[&Event],
        held: &HashSet<usize>,
        alarm_ids: &[Option<String>],
        now: Millis,
    ) -> Result<Vec<Made>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        if alarm_ids.iter().any(Option::is_some) {
            let mut tag = self
                .tx
                .prepare_cached("UPDATE temp.stage_events SET alarm_id = ?2 WHERE k = ?1")?;
            for (k, id) in alarm_ids.iter().enumerate() {
                if let Some(id) = id {
                    tag.execute(params![k as i64, id])?;
                }
            }
        }
        if !held.is_empty() {
            let mut unstage = self
                .tx
                .prepare_cached("DELETE FROM temp.stage_events WHERE k = ?1")?;
            for k in held {
                unstage.execute([*k as i64])?;
            }
        }
        let made = insert_notifications(self.tx, now)?;
        self.tx
            .prepare_cached("DELETE FROM temp.stage_events")?
            .execute([])?;
        Ok(made)
    }

    async fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> Result<()> {
        super::supersede::older(self.tx, newer, now)
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        super::silences::silence_new(self.tx, seqs, now)
    }
}

/// Writes the rows of sensors still registered, and stages the events written for the
/// fan-out: whether a sensor is registered is looked up once per sensor (its state
/// update, most often), not once per row.
fn write_rows(
    tx: &Transaction,
    batch: &CommitBatch,
    now: Millis,
    seen: &Seen,
    deferred: &mut Deferred,
) -> Result<Vec<usize>> {
    let mut known = write_states(tx, batch, seen, deferred)?;
    let mut exists = tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM sensors WHERE id = ?1)")?;
    let mut registered = |id: SensorId| -> Result<bool> {
        if let Some(&k) = known.get(&id) {
            return Ok(k);
        }
        let k = exists.query_row([id.to_string()], |r| r.get::<_, bool>(0))?;
        known.insert(id, k);
        Ok(k)
    };
    let mut kept = Vec::with_capacity(batch.readings.len());
    for r in &batch.readings {
        if registered(r.sensor_id)? {
            kept.push(r);
        }
    }
    if insert_readings(tx, &kept)? {
        deferred.last_reading = Some(tx.last_insert_rowid());
    }
    if !batch.keyed.is_empty() {
        let mut st = tx.prepare_cached(
            "INSERT INTO idempotency_applied (key, positions, applied_at) VALUES (?1, ?2, ?3)",
        )?;
        for k in &batch.keyed {
            st.execute(rusqlite::params![
                &*k.key,
                positions_text(&k.positions),
                now
            ])?;
        }
    }
    let mut written = Vec::with_capacity(batch.events.len());
    for (k, e) in batch.events.iter().enumerate() {
        if registered(e.sensor_id)? {
            written.push(k);
        }
    }
    if !written.is_empty() {
        let events: Vec<&Event> = written.iter().map(|&k| &batch.events[k]).collect();
        stage_events(tx, &events)?;
        tx.prepare_cached(
            "INSERT INTO events_journal (sensor_id, kind, at, data, previous, last_seen_at, \
             lost_since, reminder, flips_suppressed) \
             SELECT sensor_id, kind, at, data, previous, last_seen_at, lost_since, reminder, \
             flips_suppressed FROM temp.stage_events ORDER BY k",
        )?
        .execute([])?;
    }
    Ok(written)
}

/// Readings one `INSERT` of [`insert_readings`] writes. A statement a reading paid its
/// step, its reset and `AUTOINCREMENT`'s read and write of `sqlite_sequence` for each one.
const READINGS_PER_INSERT: usize = 64;

/// The journal's `INSERT` of one reading.
const INSERT_READING: &str = "INSERT INTO readings (sensor_id, ts, received_at, data, late, \
     battery, tamper, fault) VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
/// The parameters of one reading in [`INSERT_READING`].
const READING_PARAMS: usize = 8;

/// The journal's `INSERT` of [`READINGS_PER_INSERT`] readings, written once.
static INSERT_READINGS: LazyLock<String> = LazyLock::new(|| {
    let more = ", (?, ?, ?, ?, ?, ?, ?, ?)".repeat(READINGS_PER_INSERT - 1);
    format!("{INSERT_READING}{more}")
});

/// Appends `readings` to the journal in their order (their ids ascend in it), up to
/// [`READINGS_PER_INSERT`] a statement. Answers whether it wrote any.
fn insert_readings(tx: &Transaction, readings: &[&ReadingRecord]) -> Result<bool> {
    let mut chunks = readings.chunks_exact(READINGS_PER_INSERT);
    if chunks.len() > 0 {
        let mut st = tx.prepare_cached(&INSERT_READINGS)?;
        for chunk in chunks.by_ref() {
            for (k, r) in chunk.iter().enumerate() {
                bind_reading(&mut st, k * READING_PARAMS, r)?;
            }
            st.raw_execute()?;
        }
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut st = tx.prepare_cached(INSERT_READING)?;
        for r in rest {
            bind_reading(&mut st, 0, r)?;
            st.raw_execute()?;
        }
    }
    Ok(!readings.is_empty())
}

/// Binds `r` to the [`READING_PARAMS`] parameters after `at`.
fn bind_reading(st: &mut rusqlite::Statement<'_>, at: usize, r: &ReadingRecord) -> Result<()> {
    st.raw_bind_parameter(at + 1, r.sensor_id.to_string())?;
    st.raw_bind_parameter(at + 2, r.ts)?;
    st.raw_bind_parameter(at + 3, r.received_at)?;
    st.raw_bind_parameter(at + 4, r.data as i64)?;
    st.raw_bind_parameter(at + 5, r.late as i64)?;
    st.raw_bind_parameter(at + 6, r.signals.battery)?;
    st.raw_bind_parameter(at + 7, r.signals.tamper)?;
    st.raw_bind_parameter(at + 8, r.signals.fault_column())?;
    Ok(())
}

/// Writes each sensor's new state; answers, for each sensor it names, whether it is
/// registered. A state row exists only for a registered sensor (a delete takes it along),
/// so updating it is the registration check; only a sensor's first state is inserted,
/// guarded by a look at `sensors`. An update of nothing but the sensor's times
/// ([`crate::store::StateUpdate::seen_only`]) is not written but kept in `deferred`
/// (`seen.rs`), once its row is found.
fn write_states(
    tx: &Transaction,
    batch: &CommitBatch,
    seen: &Seen,
    deferred: &mut Deferred,
) -> Result<HashMap<SensorId, bool>> {
    let mut known: HashMap<SensorId, bool> = HashMap::with_capacity(batch.states.len());
    let mut has_row =
        tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM sensor_state WHERE sensor_id = ?1)")?;
    // `lost_since` and `reminders` mean something only while lost: kept from the store
    // when memory does not hold them, cleared once the sensor is not lost.
    let mut update_state = tx.prepare_cached(
        "UPDATE sensor_state SET data = ?2, changed_at = COALESCE(?3, changed_at),          last_ts = ?4, last_seen_at = ?5, connection = ?6,          last_source = COALESCE(?7, last_source), debounce_from = ?8, debounce_at = ?9,          debounce_since = ?10, debounce_flips = ?11,          lost_since = CASE WHEN ?6 = 'lost' THEN COALESCE(?12, lost_since) END,          reminders = CASE WHEN ?6 = 'lost' THEN COALESCE(?13, reminders) END, \
         battery = ?14, battery_low = ?15, tamper = ?16, fault = ?17, held_since = ?18, \
         held_sent = ?19, flap_start = ?20, flap_count = ?21, flap_last = ?22, flapping = ?23, \
         flap_told = ?24 WHERE sensor_id = ?1",
    )?;
    let mut insert_state = tx.prepare_cached(
        "INSERT INTO sensor_state (sensor_id, data, changed_at, last_ts, last_seen_at,          connection, last_source, debounce_from, debounce_at, debounce_since, debounce_flips,          lost_since, reminders, battery, battery_low, tamper, fault, held_since, held_sent, \
          flap_start, flap_count, flap_last, flapping, flap_told) \
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, \
         CASE WHEN ?6 = 'lost' THEN ?12 END, CASE WHEN ?6 = 'lost' THEN ?13 END, \
         ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24 WHERE EXISTS (SELECT 1 FROM sensors WHERE id = ?1)",
    )?;
    let rows = seen.rows();
    for s in &batch.states {
        if s.seen_only {
            let found = rows.contains(&s.sensor_id) || {
                let found =
                    has_row.query_row([s.sensor_id.to_string()], |r| r.get::<_, bool>(0))?;
                if found {
                    deferred.found.push(s.sensor_id);
                }
                found
            };
            if found {
                let times = Times {
                    last_ts: s.last_ts,
                    last_seen_at: s.last_seen_at,
                };
                deferred.kept.push((s.sensor_id, times));
                known.insert(s.sensor_id, true);
                continue;
            }
        }
        let d = s.debounce.as_ref();
        let f = s.flapping;
        let values = params![
            s.sensor_id.to_string(),
            s.data.map(i64::from),
            s.changed_at,
            s.last_ts,
            s.last_seen_at,
            s.connection.as_str(),
            s.last_source.map(|x| x.as_str()),
            d.and_then(|d| d.from).map(i64::from),
            d.map(|d| d.at),
            d.map(|d| d.since),
            d.map(|d| d.flips),
            s.lost_since,
            s.reminders,
            s.signals.battery,
            s.signals.battery_low,
            s.signals.tamper,
            s.signals.fault.map(|f| f.to_string()),
            s.hold.map(|h| h.since),
            s.hold.map(|h| h.sent),
            f.map(|f| f.start),
            f.map(|f| f.count),
            f.map(|f| f.last),
            f.is_some_and(|f| f.flapping()),
            f.and_then(|f| f.told.flatten())
        ];
        let n = match update_state.execute(values)? {
            0 => insert_state.execute(values)?,
            n => n,
        };
        if n > 0 {
            deferred.written.push(s.sensor_id);
        }
        known.insert(s.sensor_id, n > 0);
    }
    Ok(known)
}

/// The writer's staging tables (`TEMP`, in memory, without indexes): a batch's events are
/// staged row by row there, then inserted, joined with `links` into the batch's
/// notifications and those inserted, one `INSERT … SELECT` each. That keeps the big
/// tables' cursors open across the batch where a statement per row opened and positioned
/// one per index for every row, and reads a batch's links in one pass.
const STAGING: &str = "PRAGMA temp_store = MEMORY; \
    CREATE TEMP TABLE IF NOT EXISTS stage_events (k INTEGER PRIMARY KEY, sensor_id TEXT, \
      kind TEXT, at INTEGER, data INTEGER, previous INTEGER, last_seen_at INTEGER, \
      lost_since INTEGER, reminder INTEGER, flips_suppressed INTEGER, battery INTEGER, \
      threshold INTEGER, fault TEXT, window_s INTEGER, alarm_id TEXT); \
    CREATE TEMP TABLE IF NOT EXISTS stage_notifications (n INTEGER PRIMARY KEY, \
      event INTEGER, id TEXT, client_id TEXT);";

/// Readies the writer connection for [`commit`]: the staging tables, and
/// `latch_notification_id()` for the notifications SQL creates.
pub(super) fn prepare(c: &Connection) -> rusqlite::Result<()> {
    c.execute_batch(STAGING)?;
    c.create_scalar_function(
        "latch_notification_id",
        0,
        FunctionFlags::SQLITE_UTF8,
        |_| Ok(new_notification_id()),
    )
}

/// Stages `events`, each with its index in the batch, through [`STAGING`].
fn stage_events(tx: &Transaction, events: &[&Event]) -> Result<()> {
    let mut stage = tx.prepare_cached(
        "INSERT INTO temp.stage_events \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, NULL)",
    )?;
    for (k, e) in events.iter().enumerate() {
        stage.execute(params![
            k as i64,
            e.sensor_id.to_string(),
            e.kind.as_str(),
            e.at,
            e.data.map(i64::from),
            e.previous.map(i64::from),
            e.last_seen_at,
            e.detail.lost_since,
            e.detail.reminder,
            e.detail.flips_suppressed,
            e.detail.battery,
            e.detail.threshold,
            e.detail.fault.map(|f| f.to_string()),
            e.detail.window_s
        ])?;
    }
    Ok(())
}

/// Creates the notifications of the staged events, one per event and linked client that
/// wants its type (`clients.events`, [`crate::domain::client::wants`]: a type it does not
/// want makes no notification at all), in event order, clients in id order, and returns
/// them in that (seq) order.
///
/// Seqs are given here rather than by `AUTOINCREMENT`, which this one writer can do
/// exactly: after the highest seq ever used, in the order of the staging, so nothing has
/// to be matched back by id.
fn insert_notifications(tx: &Transaction, now: Millis) -> Result<Vec<Made>> {
    // Rows are inserted in the `ORDER BY`'s order, and the staging table is empty here (it
    // is emptied after each use, and a failed commit rolls it back), so `n` counts 1, 2, …
    // in that order. The join yields that order already (events by `k`, each sensor's
    // links by client from `links_by_sensor`): no sort, where `row_number()` cost a
    // co-routine pass over every row, about half this statement's time.
    let staged = tx
        .prepare_cached(
            "INSERT INTO temp.stage_notifications (event, id, client_id) \
             SELECT e.k, latch_notification_id(), l.client_id \
             FROM temp.stage_events e JOIN links l ON l.sensor_id = e.sensor_id \
             LEFT JOIN clients c ON c.id = l.client_id \
             WHERE c.events IS NULL OR instr(',' || c.events || ',', ',' || e.kind || ',') > 0 \
             ORDER BY e.k, l.client_id",
        )?
        .execute([])?;
    if staged == 0 {
        return Ok(Vec::new());
    }
    // `AUTOINCREMENT` never reuses a seq, not even a deleted row's: it goes on from the
    // larger of the last one it gave and the table's highest.
    let base: i64 = tx
        .prepare_cached(
            "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'notifications'), 0), \
             COALESCE((SELECT MAX(seq) FROM notifications), 0))",
        )?
        .query_row([], |r| r.get(0))?;
    tx.prepare_cached(
        "INSERT INTO notifications (seq, id, client_id, sensor_id, kind, data, previous, \
         occurred_at, last_seen_at, status, attempts, next_attempt_at, created_at, updated_at, \
         lost_since, reminder, flips_suppressed, battery, threshold, fault, window_s, alarm_id) \
         SELECT ?1 + s.n, s.id, s.client_id, e.sensor_id, e.kind, e.data, e.previous, e.at, \
         e.last_seen_at, 'pending', 0, ?2, ?2, ?2, e.lost_since, e.reminder, e.flips_suppressed, \
         e.battery, e.threshold, e.fault, e.window_s, e.alarm_id \
         FROM temp.stage_notifications s JOIN temp.stage_events e ON e.k = s.event ORDER BY s.n",
    )?
    .execute(params![base, now])?;
    let rows = tx
        .prepare_cached("SELECT n, event, id, client_id FROM temp.stage_notifications ORDER BY n")?
        .query_map([], |r| {
            Ok(Made {
                seq: base + r.get::<_, i64>(0)?,
                event: r.get::<_, i64>(1)? as usize,
                id: r.get(2)?,
                client_id: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    tx.prepare_cached("DELETE FROM temp.stage_notifications")?
        .execute([])?;
    Ok(rows)
}

#[async_trait]
impl Runtime for SqliteStore {
    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>> {
        self.read_seen(|c, seen| {
            let mut rows = c
                .prepare(&format!(
                    "SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN}"
                ))?
                .query_map([], |r| row::runtime(r))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            seen.patch_runtime(&mut rows);
            Ok(rows)
        })
        .await
    }

    /// One process writes this store: there are no other nodes' changes to follow.
    async fn load_states(&self, ids: Vec<SensorId>) -> Result<Vec<SensorRuntime>> {
        self.read_seen(move |c, seen| {
            let mut st = c.prepare_cached(&format!(
                "SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN} WHERE s.id = ?1"
            ))?;
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                if let Some(r) = st.query_map([id.to_string()], |r| row::runtime(r))?.next() {
                    out.push(r?);
                }
            }
            seen.patch_runtime(&mut out);
            Ok(out)
        })
        .await
    }

    /// Commits `batch` in one transaction, returning the notifications it created.
    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>> {
        let seen = self.inner.seen.clone();
        self.write(move |c| {
            let tx = c.transaction()?;
            let mut deferred = Deferred::default();
            let created = rules::now_or_never(rules::commit::commit(
                &mut CommitTables {
                    tx: &tx,
                    seen: &seen,
                    deferred: &mut deferred,
                },
                &batch,
                now,
            ))?;
            // Under load, the kept times are written here, with a commit's fsync.
            let flushed = match seen.due() {
                true => Some(seen.flush(&tx, &deferred)?),
                false => None,
            };
            tx.commit()?;
            seen.after(deferred, flushed);
            Ok(created)
        })
        .await
    }
}
