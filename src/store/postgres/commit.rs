//! The group commit: a batch's readings, state, events and notifications in one
//! transaction, one statement per kind of row.

use async_trait::async_trait;

use super::super::rows::{self as row, RUNTIME_COLS, RUNTIME_JOIN};
use super::PgStore;
use super::db::{Bound, Sql, Tx};
use super::doubt::{Doubt, settle};
use super::supersede::Older;
use crate::store::idempotency::positions_text;
use crate::store::rules::{self, commit::Made, commit::Newer};
use crate::store::{Runtime, SensorRuntime};
use std::collections::{HashMap, HashSet};

use tokio_postgres::types::ToSql;

use super::super::{CommitBatch, Error, Fence, Keyed, NotificationRef, Result};
use super::DELETE_LOCK;
use crate::domain::client::{events_from_column, wants};
use crate::domain::{Event, Millis, SensorId, notification::new_notification_id};

/// The partitions of `fence` this node no longer holds at its epoch, sorted. Each one's
/// advisory lock ([`super::cluster::PARTITION_LOCK`]) is held shared until the transaction
/// ends, and `acquire` and `release` take it exclusive before they change an owner or an
/// epoch: neither can change a partition while this commit writes it, nor this commit
/// write one after either did. Shared advisory locks write nothing; the row locks `FOR
/// SHARE` they replace wrote every lease row on every commit (multixacts when commits
/// overlapped), about a quarter of PostgreSQL's delivery throughput.
pub(super) async fn fenced(tx: &Tx<'_>, fence: &[Fence]) -> Result<Vec<u32>> {
    if fence.is_empty() {
        return Ok(Vec::new());
    }
    let mut parts: Vec<i32> = fence.iter().map(|f| f.partition as i32).collect();
    parts.sort_unstable();
    parts.dedup();
    // A statement of its own, so the read below takes its snapshot after the locks are
    // granted: it sees whatever an acquire or release we waited for committed. Taken in
    // partition order, as `release` takes them, so the two never deadlock.
    tx.execute(
        &tx.prepare_cached(&format!(
            "SELECT count(pg_advisory_xact_lock_shared(k.key)) FROM \
             (SELECT {key} AS key FROM UNNEST($1::int4[]) AS u(p) ORDER BY u.p) k",
            key = super::cluster::PARTITION_LOCK
        ))
        .await?,
        &[&parts],
    )
    .await?;
    let held: HashMap<u32, i64> = tx
        .query(
            &tx.prepare_cached(
                "SELECT partition, epoch FROM latch_partitions \
             WHERE partition = ANY($1) AND owner IS NOT NULL",
            )
            .await?,
            &[&parts],
        )
        .await?
        .iter()
        .map(|r| (r.get::<_, i32>(0) as u32, r.get(1)))
        .collect();
    let mut lost: Vec<u32> = fence
        .iter()
        .filter(|f| held.get(&f.partition) != Some(&f.epoch))
        .map(|f| f.partition)
        .collect();
    lost.sort_unstable();
    lost.dedup();
    Ok(lost)
}

/// A client linked to a sensor, with the notification types it wants (`None`: all).
type Subscriber = (String, Option<Vec<String>>);

/// Runs an `UNNEST` insert of `rows` rows, unless there are none.
async fn execute_rows(
    tx: &Tx<'_>,
    st: &tokio_postgres::Statement,
    params: &[&(dyn ToSql + Sync)],
    rows: usize,
) -> Result<u64> {
    if rows == 0 {
        return Ok(0);
    }
    tx.execute(st, params).await
}

/// A group commit's tables on PostgreSQL ([`rules::commit`]), in three round trips besides
/// a site's: which of the batch's sensors are registered and their links; then readings,
/// state, events, applied keys and notifications together (pipelined on the connection);
/// then the supersede and the silences, which need the new notifications' seqs. So an
/// operation may hold its writes (`rows`, `newer`) for the next one to send with its own;
/// every write is sent by the time `silence_new`, the sequence's last, answers.
///
/// Rows of a sensor deleted meanwhile are skipped: the delete lock held shared since the
/// transaction began keeps a delete from committing until we do, and one committed before
/// is seen by the registration read, so a delete racing a batch never resurrects state.
/// Reading registration once per sensor replaced an `EXISTS` probe per row in four
/// statements, and the pipelining a round trip per statement.
struct CommitTables<'t> {
    tx: &'t Tx<'t>,
    /// The clients linked to the batch's sensors with events, read with registration.
    linked: HashMap<SensorId, Vec<Subscriber>>,
    /// The batch's rows, not sent yet.
    rows: Option<Rows>,
    /// The supersede, not sent yet.
    older: Older,
}

/// A batch's rows of registered sensors, as the columns of their inserts.
struct Rows {
    readings: ReadingCols,
    states: StateCols,
    events: EventCols,
    keyed: Vec<Keyed>,
    now: Millis,
}

impl Rows {
    /// Sends them, pipelined (the server runs them in this order).
    async fn write(&self, tx: &Tx<'_>) -> Result<()> {
        futures::try_join!(
            self.readings.insert(tx),
            self.states.upsert(tx),
            self.events.insert(tx),
            insert_keyed(tx, &self.keyed, self.now),
        )?;
        Ok(())
    }
}

/// Sends `rows`, when some are held.
async fn write(tx: &Tx<'_>, rows: Option<Rows>) -> Result<()> {
    match rows {
        Some(rows) => rows.write(tx).await,
        None => Ok(()),
    }
}

super::alarms::alarm_tables!(CommitTables<'_>);

impl rules::armed::ArmedTables for CommitTables<'_> {
    async fn armed(&mut self, sensors: &[SensorId]) -> Result<Vec<rules::armed::ArmedRow>> {
        super::armed::armed(self.tx, sensors).await
    }

    async fn describe(&mut self, bodies: &[(i64, String)]) -> Result<()> {
        super::armed::describe(self.tx, bodies).await
    }
}

impl rules::commit::CommitTables for CommitTables<'_> {
    async fn fenced(&mut self, fence: &[Fence]) -> Result<Vec<u32>> {
        fenced(self.tx, fence).await
    }

    /// Reads registration and the links now; holds the rows for [`Self::fan_out`].
    async fn write_rows(&mut self, batch: &CommitBatch, now: Millis) -> Result<Vec<usize>> {
        let (registered, linked) = registration(self.tx, batch).await?;
        let known = |id: &SensorId| registered.contains(id);
        let written = (0..batch.events.len())
            .filter(|&k| known(&batch.events[k].sensor_id))
            .collect();
        self.linked = linked;
        self.rows = Some(Rows {
            readings: ReadingCols::of(batch, known),
            states: StateCols::of(batch, known),
            events: EventCols::of(batch, known),
            keyed: batch.keyed.clone(),
            now,
        });
        Ok(written)
    }

    async fn hold_for_sites(&mut self, events: &[&Event], now: Millis) -> Result<HashSet<usize>> {
        super::site_rounds::hold_for_sites(self.tx, events, now).await
    }

    /// Sends the rows held and the notifications, listed as pending in the same
    /// statement (migration 0011).
    async fn fan_out(
        &mut self,
        events: &[&Event],
        held: &HashSet<usize>,
        alarm_ids: &[Option<String>],
        now: Millis,
    ) -> Result<Vec<Made>> {
        let notes = NotificationCols::of(events, &self.linked, held, alarm_ids);
        let (_, rows) =
            futures::try_join!(write(self.tx, self.rows.take()), notes.insert(self.tx, now))?;
        Ok(notes.made(&rows))
    }

    /// Held for [`Self::silence_new`]: they touch different rows.
    async fn supersede(&mut self, newer: &[Newer<'_>], _now: Millis) -> Result<()> {
        self.older.add(newer);
        Ok(())
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        let older = std::mem::take(&mut self.older);
        let (_, _, silenced) = futures::try_join!(
            write(self.tx, self.rows.take()),
            older.send(self.tx, now),
            super::silences::silence_new(self.tx, seqs, now),
        )?;
        Ok(silenced)
    }
}

/// What the batch applies of requests sent with an `Idempotency-Key`, in its transaction.
async fn insert_keyed(tx: &Tx<'_>, keyed: &[Keyed], now: Millis) -> Result<u64> {
    if keyed.is_empty() {
        return Ok(0);
    }
    let keys: Vec<&str> = keyed.iter().map(|k| &*k.key).collect();
    let positions: Vec<String> = keyed.iter().map(|k| positions_text(&k.positions)).collect();
    tx.execute(
        "INSERT INTO idempotency_applied (key, positions, applied_at) \
         SELECT k, p, $3 FROM UNNEST($1::text[], $2::text[]) AS t(k, p)",
        &[&keys, &positions, &now],
    )
    .await
}

/// Which of the batch's sensors are registered, and the clients linked to those with
/// events, with the types each wants: read together, in one round trip.
async fn registration(
    tx: &Tx<'_>,
    batch: &CommitBatch,
) -> Result<(HashSet<SensorId>, HashMap<SensorId, Vec<Subscriber>>)> {
    let mut touched: Vec<String> = batch
        .readings
        .iter()
        .map(|r| r.sensor_id)
        .chain(batch.states.iter().map(|s| s.sensor_id))
        .chain(batch.events.iter().map(|e| e.sensor_id))
        .map(|id| id.to_string())
        .collect();
    touched.sort_unstable();
    touched.dedup();
    let mut with_events: Vec<String> = batch
        .events
        .iter()
        .map(|e| e.sensor_id.to_string())
        .collect();
    with_events.sort_unstable();
    with_events.dedup();
    let registered_sql = tx
        .prepare_cached("SELECT id FROM sensors WHERE id = ANY($1)")
        .await?;
    // With each client's `events`: a type it does not want makes no notification at all.
    let links_sql = tx
        .prepare_cached(
            "SELECT l.sensor_id, l.client_id, c.events FROM links l \
             LEFT JOIN clients c ON c.id = l.client_id WHERE l.sensor_id = ANY($1) \
             ORDER BY l.sensor_id, l.client_id",
        )
        .await?;
    let (registered, links) = futures::try_join!(
        async { tx.query(&registered_sql, &[&touched]).await },
        async {
            if with_events.is_empty() {
                Ok(Vec::new())
            } else {
                tx.query(&links_sql, &[&with_events]).await
            }
        }
    )?;
    // As ids, so the per-row checks allocate nothing.
    let registered: HashSet<SensorId> = registered
        .iter()
        .filter_map(|r| SensorId::parse(r.get(0)).ok())
        .collect();
    let mut linked: HashMap<SensorId, Vec<Subscriber>> = HashMap::new();
    for r in links {
        let Ok(sensor) = SensorId::parse(r.get(0)) else {
            continue;
        };
        linked
            .entry(sensor)
            .or_default()
            .push((r.get(1), events_from_column(r.get(2))));
    }
    Ok((registered, linked))
}

/// The readings of registered sensors, in order, as the columns of one `UNNEST`.
struct ReadingCols {
    ids: Vec<String>,
    ts: Vec<i64>,
    received_at: Vec<i64>,
    data: Vec<bool>,
    late: Vec<bool>,
    battery: Vec<Option<i32>>,
    tamper: Vec<Option<bool>>,
    fault: Vec<Option<String>>,
}

impl ReadingCols {
    fn of(batch: &CommitBatch, known: impl Fn(&SensorId) -> bool) -> Self {
        let r: Vec<_> = batch
            .readings
            .iter()
            .filter(|r| known(&r.sensor_id))
            .collect();
        Self {
            ids: r.iter().map(|r| r.sensor_id.to_string()).collect(),
            ts: r.iter().map(|r| r.ts).collect(),
            received_at: r.iter().map(|r| r.received_at).collect(),
            data: r.iter().map(|r| r.data).collect(),
            late: r.iter().map(|r| r.late).collect(),
            battery: r.iter().map(|r| r.signals.battery.map(i32::from)).collect(),
            tamper: r.iter().map(|r| r.signals.tamper).collect(),
            fault: r.iter().map(|r| r.signals.fault_column()).collect(),
        }
    }

    async fn insert(&self, tx: &Tx<'_>) -> Result<u64> {
        let sql = tx
            .prepare_cached(
                "INSERT INTO readings (sensor_id, ts, received_at, data, late, battery, tamper, \
                 fault) \
                 SELECT u.sensor_id, u.ts, u.received_at, u.data, u.late, u.battery, u.tamper, \
                 u.fault \
                 FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::bool[], $5::bool[], \
                 $6::int4[], $7::bool[], $8::text[]) \
                 WITH ORDINALITY AS u(sensor_id, ts, received_at, data, late, battery, tamper, \
                 fault, o) ORDER BY u.o",
            )
            .await?;
        let p: [&(dyn ToSql + Sync); 8] = [
            &self.ids,
            &self.ts,
            &self.received_at,
            &self.data,
            &self.late,
            &self.battery,
            &self.tamper,
            &self.fault,
        ];
        execute_rows(tx, &sql, &p, self.ids.len()).await
    }
}

/// The new state of each registered sensor (its last in the batch: an upsert may not
/// touch a row twice), as columns.
struct StateCols {
    ids: Vec<String>,
    data: Vec<Option<bool>>,
    changed: Vec<Option<i64>>,
    last_ts: Vec<Option<i64>>,
    seen: Vec<Option<i64>>,
    conn: Vec<&'static str>,
    source: Vec<Option<&'static str>>,
    d_from: Vec<Option<bool>>,
    d_at: Vec<Option<i64>>,
    d_since: Vec<Option<i64>>,
    d_flips: Vec<Option<i32>>,
    lost: Vec<Option<i64>>,
    reminders: Vec<Option<i32>>,
    battery: Vec<Option<i32>>,
    battery_low: Vec<bool>,
    tamper: Vec<Option<bool>>,
    fault: Vec<Option<String>>,
    held_since: Vec<Option<i64>>,
    held_sent: Vec<Option<i32>>,
    flap_start: Vec<Option<i64>>,
    flap_count: Vec<Option<i32>>,
    flap_last: Vec<Option<i64>>,
    flapping: Vec<bool>,
    flap_told: Vec<Option<bool>>,
}

impl StateCols {
    fn of(batch: &CommitBatch, known: impl Fn(&SensorId) -> bool) -> Self {
        let mut last: HashMap<SensorId, usize> = HashMap::new();
        for (i, s) in batch.states.iter().enumerate() {
            if known(&s.sensor_id) {
                last.insert(s.sensor_id, i);
            }
        }
        let mut idx: Vec<usize> = last.into_values().collect();
        idx.sort_unstable();
        let st: Vec<_> = idx.iter().map(|&i| &batch.states[i]).collect();
        Self {
            ids: st.iter().map(|s| s.sensor_id.to_string()).collect(),
            data: st.iter().map(|s| s.data).collect(),
            changed: st.iter().map(|s| s.changed_at).collect(),
            last_ts: st.iter().map(|s| s.last_ts).collect(),
            seen: st.iter().map(|s| s.last_seen_at).collect(),
            conn: st.iter().map(|s| s.connection.as_str()).collect(),
            source: st
                .iter()
                .map(|s| s.last_source.map(|x| x.as_str()))
                .collect(),
            d_from: st.iter().map(|s| s.debounce.and_then(|d| d.from)).collect(),
            d_at: st.iter().map(|s| s.debounce.map(|d| d.at)).collect(),
            d_since: st.iter().map(|s| s.debounce.map(|d| d.since)).collect(),
            d_flips: st
                .iter()
                .map(|s| s.debounce.map(|d| d.flips as i32))
                .collect(),
            lost: st.iter().map(|s| s.lost_since).collect(),
            reminders: st.iter().map(|s| s.reminders.map(|r| r as i32)).collect(),
            battery: st
                .iter()
                .map(|s| s.signals.battery.map(i32::from))
                .collect(),
            battery_low: st.iter().map(|s| s.signals.battery_low).collect(),
            tamper: st.iter().map(|s| s.signals.tamper).collect(),
            fault: st
                .iter()
                .map(|s| s.signals.fault.map(|f| f.to_string()))
                .collect(),
            held_since: st.iter().map(|s| s.hold.map(|h| h.since)).collect(),
            held_sent: st
                .iter()
                .map(|s| s.hold.map(|h| h.sent.min(i32::MAX as u32) as i32))
                .collect(),
            flap_start: st.iter().map(|s| s.flapping.map(|f| f.start)).collect(),
            flap_count: st
                .iter()
                .map(|s| s.flapping.map(|f| f.count.min(i32::MAX as u32) as i32))
                .collect(),
            flap_last: st.iter().map(|s| s.flapping.map(|f| f.last)).collect(),
            flapping: st
                .iter()
                .map(|s| s.flapping.is_some_and(|f| f.flapping()))
                .collect(),
            flap_told: st
                .iter()
                .map(|s| s.flapping.and_then(|f| f.told.flatten()))
                .collect(),
        }
    }

    async fn upsert(&self, tx: &Tx<'_>) -> Result<u64> {
        // `lost_since` and `reminders` mean something only while lost: kept from the store
        // when memory does not hold them, cleared once the sensor is not lost.
        let sql = tx
            .prepare_cached(
                "INSERT INTO sensor_state AS st (sensor_id, data, changed_at, last_ts, \
                 last_seen_at, connection, last_source, debounce_from, debounce_at, \
                 debounce_since, debounce_flips, lost_since, reminders, battery, battery_low, \
                 tamper, fault, held_since, held_sent, flap_start, flap_count, flap_last, \
                 flapping, flap_told) \
                 SELECT u.sensor_id, u.data, u.changed_at, u.last_ts, u.last_seen_at, \
                 u.connection, u.last_source, u.debounce_from, u.debounce_at, \
                 u.debounce_since, u.debounce_flips, \
                 CASE WHEN u.connection = 'lost' THEN u.lost_since END, \
                 CASE WHEN u.connection = 'lost' THEN u.reminders END, \
                 u.battery, u.battery_low, u.tamper, u.fault, u.held_since, u.held_sent, \
                 u.flap_start, u.flap_count, u.flap_last, u.flapping, u.flap_told \
                 FROM UNNEST($1::text[], $2::bool[], $3::int8[], $4::int8[], $5::int8[], \
                 $6::text[], $7::text[], $8::bool[], $9::int8[], $10::int8[], $11::int4[], \
                 $12::int8[], $13::int4[], $14::int4[], $15::bool[], $16::bool[], $17::text[], \
                 $18::int8[], $19::int4[], $20::int8[], $21::int4[], $22::int8[], $23::bool[], \
                 $24::bool[]) \
                 AS u(sensor_id, data, changed_at, last_ts, last_seen_at, connection, \
                 last_source, debounce_from, debounce_at, debounce_since, debounce_flips, \
                 lost_since, reminders, battery, battery_low, tamper, fault, held_since, \
                 held_sent, flap_start, flap_count, flap_last, flapping, flap_told) \
                 ON CONFLICT (sensor_id) DO UPDATE SET data = excluded.data, \
                 changed_at = COALESCE(excluded.changed_at, st.changed_at), \
                 last_ts = excluded.last_ts, last_seen_at = excluded.last_seen_at, \
                 connection = excluded.connection, \
                 last_source = COALESCE(excluded.last_source, st.last_source), \
                 debounce_from = excluded.debounce_from, debounce_at = excluded.debounce_at, \
                 debounce_since = excluded.debounce_since, \
                 debounce_flips = excluded.debounce_flips, \
                 lost_since = CASE WHEN excluded.connection = 'lost' \
                   THEN COALESCE(excluded.lost_since, st.lost_since) END, \
                 reminders = CASE WHEN excluded.connection = 'lost' \
                   THEN COALESCE(excluded.reminders, st.reminders) END, \
                 battery = excluded.battery, battery_low = excluded.battery_low, \
                 tamper = excluded.tamper, fault = excluded.fault, \
                 held_since = excluded.held_since, held_sent = excluded.held_sent, \
                 flap_start = excluded.flap_start, flap_count = excluded.flap_count, \
                 flap_last = excluded.flap_last, flapping = excluded.flapping, \
                 flap_told = excluded.flap_told",
            )
            .await?;
        let p: [&(dyn ToSql + Sync); 24] = [
            &self.ids,
            &self.data,
            &self.changed,
            &self.last_ts,
            &self.seen,
            &self.conn,
            &self.source,
            &self.d_from,
            &self.d_at,
            &self.d_since,
            &self.d_flips,
            &self.lost,
            &self.reminders,
            &self.battery,
            &self.battery_low,
            &self.tamper,
            &self.fault,
            &self.held_since,
            &self.held_sent,
            &self.flap_start,
            &self.flap_count,
            &self.flap_last,
            &self.flapping,
            &self.flap_told,
        ];
        execute_rows(tx, &sql, &p, self.ids.len()).await
    }
}

/// The events of registered sensors, in order (only those notify), as columns.
struct EventCols {
    ids: Vec<String>,
    kinds: Vec<&'static str>,
    at: Vec<i64>,
    data: Vec<Option<bool>>,
    previous: Vec<Option<bool>>,
    seen: Vec<Option<i64>>,
    lost: Vec<Option<i64>>,
    reminder: Vec<Option<i32>>,
    flips: Vec<Option<i32>>,
}

impl EventCols {
    fn of(batch: &CommitBatch, known: impl Fn(&SensorId) -> bool) -> Self {
        let ev: Vec<&Event> = batch
            .events
            .iter()
            .filter(|e| known(&e.sensor_id))
            .collect();
        Self {
            ids: ev.iter().map(|e| e.sensor_id.to_string()).collect(),
            kinds: ev.iter().map(|e| e.kind.as_str()).collect(),
            at: ev.iter().map(|e| e.at).collect(),
            data: ev.iter().map(|e| e.data).collect(),
            previous: ev.iter().map(|e| e.previous).collect(),
            seen: ev.iter().map(|e| e.last_seen_at).collect(),
            lost: ev.iter().map(|e| e.detail.lost_since).collect(),
            reminder: ev
                .iter()
                .map(|e| e.detail.reminder.map(|r| r as i32))
                .collect(),
            flips: ev
                .iter()
                .map(|e| e.detail.flips_suppressed.map(|f| f as i32))
                .collect(),
        }
    }

    async fn insert(&self, tx: &Tx<'_>) -> Result<u64> {
        let sql = tx
            .prepare_cached(
                "INSERT INTO events (sensor_id, kind, at, data, previous, last_seen_at, \
                 lost_since, reminder, flips_suppressed) \
                 SELECT u.sensor_id, u.kind, u.at, u.data, u.previous, u.last_seen_at, \
                 u.lost_since, u.reminder, u.flips \
                 FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::bool[], $5::bool[], \
                 $6::int8[], $7::int8[], $8::int4[], $9::int4[]) \
                 WITH ORDINALITY AS u(sensor_id, kind, at, data, previous, last_seen_at, \
                 lost_since, reminder, flips, o) ORDER BY u.o",
            )
            .await?;
        let p: [&(dyn ToSql + Sync); 9] = [
            &self.ids,
            &self.kinds,
            &self.at,
            &self.data,
            &self.previous,
            &self.seen,
            &self.lost,
            &self.reminder,
            &self.flips,
        ];
        execute_rows(tx, &sql, &p, self.ids.len()).await
    }
}

/// One notification per event and linked client that wants its type, in event order, as
/// columns; `event` is each one's event (its place in [`EventCols`]).
struct NotificationCols<'e> {
    id: Vec<String>,
    client: Vec<&'e str>,
    sensor: Vec<String>,
    kind: Vec<&'static str>,
    data: Vec<Option<bool>>,
    previous: Vec<Option<bool>>,
    at: Vec<i64>,
    seen: Vec<Option<i64>>,
    lost: Vec<Option<i64>>,
    reminder: Vec<Option<i32>>,
    flips: Vec<Option<i32>>,
    battery: Vec<Option<i32>>,
    threshold: Vec<Option<i32>>,
    fault: Vec<Option<String>>,
    window_s: Vec<Option<i32>>,
    alarm: Vec<Option<String>>,
    event: Vec<usize>,
}

impl<'e> NotificationCols<'e> {
    /// `held`: the places of events a site's decision holds, which make none now;
    /// `alarm_ids`: each event's alarm, by place (empty: none).
    fn of(
        events: &[&Event],
        linked: &'e HashMap<SensorId, Vec<Subscriber>>,
        held: &HashSet<usize>,
        alarm_ids: &[Option<String>],
    ) -> Self {
        let mut n = Self {
            id: vec![],
            client: vec![],
            sensor: vec![],
            kind: vec![],
            data: vec![],
            previous: vec![],
            at: vec![],
            seen: vec![],
            lost: vec![],
            reminder: vec![],
            flips: vec![],
            battery: vec![],
            threshold: vec![],
            fault: vec![],
            window_s: vec![],
            alarm: vec![],
            event: vec![],
        };
        for (k, e) in events.iter().enumerate() {
            if held.contains(&k) {
                continue;
            }
            for (client, wanted) in linked.get(&e.sensor_id).into_iter().flatten() {
                if !wants(wanted, e.kind) {
                    continue;
                }
                n.id.push(new_notification_id());
                n.client.push(client.as_str());
                n.sensor.push(e.sensor_id.to_string());
                n.kind.push(e.kind.as_str());
                n.data.push(e.data);
                n.previous.push(e.previous);
                n.at.push(e.at);
                n.seen.push(e.last_seen_at);
                n.lost.push(e.detail.lost_since);
                n.reminder.push(e.detail.reminder.map(|r| r as i32));
                n.flips.push(e.detail.flips_suppressed.map(|f| f as i32));
                n.battery.push(e.detail.battery.map(i32::from));
                n.threshold.push(e.detail.threshold.map(i32::from));
                n.fault.push(e.detail.fault.map(|f| f.to_string()));
                n.window_s
                    .push(e.detail.window_s.map(|w| w.min(i32::MAX as u32) as i32));
                n.alarm.push(alarm_ids.get(k).cloned().flatten());
                n.event.push(k);
            }
        }
        n
    }

    /// Inserts them, listed as pending in the same statement (migration 0011); answers
    /// each one's id and seq.
    async fn insert(&self, tx: &Tx<'_>, now: Millis) -> Result<Vec<tokio_postgres::Row>> {
        if self.id.is_empty() {
            return Ok(Vec::new());
        }
        let sql = tx
            .prepare_cached(
                "WITH ins AS (INSERT INTO notifications (id, client_id, sensor_id, kind, data, \
                 previous, occurred_at, last_seen_at, status, attempts, next_attempt_at, \
                 created_at, updated_at, lost_since, reminder, flips_suppressed, battery, \
                 threshold, fault, window_s, alarm_id) \
                 SELECT u.id, u.client_id, u.sensor_id, u.kind, u.data, u.previous, \
                 u.occurred_at, u.last_seen_at, 'pending', 0, $9, $9, $9, u.lost_since, \
                 u.reminder, u.flips, u.battery, u.threshold, u.fault, u.window_s, u.alarm_id \
                 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], \
                 $6::bool[], $7::int8[], $8::int8[], $10::int8[], $11::int4[], $12::int4[], \
                 $13::int4[], $14::int4[], $15::text[], $16::int4[], $17::text[]) \
                 WITH ORDINALITY AS u(id, client_id, sensor_id, kind, data, previous, \
                 occurred_at, last_seen_at, lost_since, reminder, flips, battery, threshold, \
                 fault, window_s, alarm_id, o) ORDER BY u.o \
                 RETURNING id, seq, sensor_id, client_id), \
                 listed AS (INSERT INTO notifications_pending (seq, sensor_id, client_id) \
                 SELECT seq, sensor_id, client_id FROM ins) \
                 SELECT id, seq FROM ins",
            )
            .await?;
        let p: [&(dyn ToSql + Sync); 17] = [
            &self.id,
            &self.client,
            &self.sensor,
            &self.kind,
            &self.data,
            &self.previous,
            &self.at,
            &self.seen,
            &now,
            &self.lost,
            &self.reminder,
            &self.flips,
            &self.battery,
            &self.threshold,
            &self.fault,
            &self.window_s,
            &self.alarm,
        ];
        tx.query(&sql, &p).await
    }

    /// What the insert made, in outbox order, from the `rows` it answered.
    fn made(&self, rows: &[tokio_postgres::Row]) -> Vec<Made> {
        let seqs: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        self.id
            .iter()
            .enumerate()
            .map(|(i, id)| Made {
                event: self.event[i],
                seq: seqs[id],
                id: id.clone(),
                client_id: self.client[i].to_string(),
            })
            .collect()
    }
}

#[async_trait]
impl Runtime for PgStore {
    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>> {
        let c = self.db.get_for("load_runtime", Bound::Bulk).await?;
        let rows = c
            .query(
                &format!("SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN}"),
                &[],
            )
            .await?;
        rows.iter().map(row::runtime).collect()
    }

    /// The committed state of those of `ids` that are registered.
    async fn load_states(&self, ids: Vec<SensorId>) -> Result<Vec<SensorRuntime>> {
        let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        let c = self.db.get("load_states").await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN} WHERE s.id = ANY($1)"
                ),
                &[&ids],
            )
            .await?;
        rows.iter().map(row::runtime).collect()
    }

    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>> {
        let result = async {
            let mut c = self.db.get("commit").await?;
            let tx = c.transaction().await?;
            // The transaction's id and backend, in the statement that takes the delete lock: what
            // to ask about should the answer to `COMMIT` be lost ([`super::doubt`]).
            let first = tx
                .query_one(
                    &tx.prepare_cached(
                        "SELECT pg_advisory_xact_lock_shared($1, hashtext(current_schema()))::text, \
                         txid_current(), pg_backend_pid()",
                    )
                    .await?,
                    &[&DELETE_LOCK],
                )
                .await?;
            let doubt = Doubt {
                xid: first.get(1),
                pid: first.get(2),
            };
            let mut tables = CommitTables {
                tx: &tx,
                linked: HashMap::new(),
                rows: None,
                older: Older::default(),
            };
            let created = match rules::commit::commit(&mut tables, &batch, now).await {
                Err(Error::Fenced(fenced)) => {
                    tx.rollback().await?;
                    return Err(Error::Fenced(fenced));
                }
                r => r?,
            };
            match tx.commit().await {
                Ok(()) => Ok(created),
                Err(Error::Indeterminate(why)) => {
                    c.discard();
                    settle(&self.db, doubt, why).await.map(|()| created)
                }
                Err(e) => Err(e),
            }
        }
        .await;
        self.space.note(&result);
        result
    }
}
