//! The group commit: a batch's readings, state, events and notifications in one
//! transaction on the writer.

use std::collections::HashMap;

use rusqlite::{Connection, Transaction, params};

use super::super::{CommitBatch, Error, NotificationRef, Result};
use crate::domain::{Event, EventKind, Millis, SensorId, notification::new_notification_id};

/// Commits `batch` in one transaction, returning the notifications it created.
pub(super) fn commit(
    c: &mut Connection,
    batch: &CommitBatch,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    // SQLite stays one node: no leases to check a fence against.
    if !batch.fence.is_empty() {
        return Err(Error::Backend("cluster fencing needs PostgreSQL".into()));
    }
    let tx = c.transaction()?;
    let created = commit_batch(&tx, batch, now)?;
    tx.commit()?;
    Ok(created)
}

/// The body of a group commit. Rows of a sensor deleted meanwhile are skipped, so a delete
/// racing a batch never resurrects state: whether a sensor is still registered is looked
/// up once per sensor (its state update, most often), not once per row.
fn commit_batch(
    tx: &Transaction,
    batch: &CommitBatch,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let mut created = Vec::new();
    let events: Vec<&Event> = {
        let mut known: HashMap<SensorId, bool> = HashMap::with_capacity(batch.states.len());
        // A state row exists only for a registered sensor (a delete takes it along), so
        // updating it is the registration check; only a sensor's first state is inserted,
        // guarded by a look at `sensors`.
        let mut update_state = tx.prepare_cached(
            "UPDATE sensor_state SET data = ?2, changed_at = COALESCE(?3, changed_at), \
             last_ts = ?4, last_seen_at = ?5, connection = ?6 WHERE sensor_id = ?1",
        )?;
        let mut insert_state = tx.prepare_cached(
            "INSERT INTO sensor_state (sensor_id, data, changed_at, last_ts, last_seen_at, connection) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM sensors WHERE id = ?1)",
        )?;
        for s in &batch.states {
            let values = params![
                s.sensor_id.to_string(),
                s.data.map(i64::from),
                s.changed_at,
                s.last_ts,
                s.last_seen_at,
                s.connection.as_str()
            ];
            let n = match update_state.execute(values)? {
                0 => insert_state.execute(values)?,
                n => n,
            };
            known.insert(s.sensor_id, n > 0);
        }
        let mut exists =
            tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM sensors WHERE id = ?1)")?;
        let mut registered = |id: SensorId| -> Result<bool> {
            if let Some(&k) = known.get(&id) {
                return Ok(k);
            }
            let k = exists.query_row([id.to_string()], |r| r.get::<_, bool>(0))?;
            known.insert(id, k);
            Ok(k)
        };
        let mut ins_reading = tx.prepare_cached(
            "INSERT INTO readings (sensor_id, ts, received_at, data, late) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for r in &batch.readings {
            if !registered(r.sensor_id)? {
                continue;
            }
            ins_reading.execute(params![
                r.sensor_id.to_string(),
                r.ts,
                r.received_at,
                r.data as i64,
                r.late as i64
            ])?;
        }
        let mut kept = Vec::with_capacity(batch.events.len());
        for e in &batch.events {
            if registered(e.sensor_id)? {
                kept.push(e);
            }
        }
        kept
    };
    if events.is_empty() {
        return Ok(created);
    }
    insert_events(tx, &events)?;
    // One notification per event and linked client, in event order, clients in id order.
    let mut rows = Vec::new();
    {
        let mut linked = tx.prepare_cached("SELECT client_id FROM links WHERE sensor_id = ?1")?;
        for (k, e) in events.iter().enumerate() {
            let clients = linked.query_map([e.sensor_id.to_string()], |r| r.get::<_, String>(0))?;
            for client_id in clients {
                rows.push((k, new_notification_id(), client_id?));
            }
        }
    }
    let seqs = insert_notifications(tx, &events, &rows, now)?;
    let mut supersede = tx.prepare_cached(
        "UPDATE notifications SET status = 'superseded', updated_at = ?3 \
         WHERE sensor_id = ?1 AND status = 'pending' AND kind = 'sensor.state_changed' \
         AND seq < ?2 AND (lease_until IS NULL OR lease_until < ?3)",
    )?;
    let mut first_of_event = usize::MAX;
    for (k, id, client_id) in rows {
        let e = events[k];
        let seq = *seqs
            .get(&id)
            .ok_or_else(|| Error::Backend("a new notification's seq was not returned".into()))?;
        // The first notification of a state change supersedes the sensor's older pending,
        // unleased state notifications (as it did when each was inserted on its own).
        if k != first_of_event {
            first_of_event = k;
            if e.kind == EventKind::StateChanged {
                supersede.execute(params![e.sensor_id.to_string(), seq, now])?;
            }
        }
        created.push(NotificationRef {
            id,
            seq,
            client_id,
            sensor_id: e.sensor_id,
            kind: e.kind,
            due_at: now,
            attempts: 0,
        });
    }
    Ok(created)
}

/// The writer's staging tables (`TEMP`, in memory, without indexes): a batch's events and
/// notifications are staged row by row there and inserted with one `INSERT … SELECT` each,
/// which keeps the big tables' cursors open across the batch where a statement per row
/// opened and positioned one per index for every row.
pub(super) const STAGING: &str = "PRAGMA temp_store = MEMORY; \
    CREATE TEMP TABLE IF NOT EXISTS stage_events (sensor_id TEXT, kind TEXT, at INTEGER, \
      data INTEGER, previous INTEGER, last_seen_at INTEGER); \
    CREATE TEMP TABLE IF NOT EXISTS stage_notifications (id TEXT, client_id TEXT, \
      sensor_id TEXT, kind TEXT, data INTEGER, previous INTEGER, occurred_at INTEGER, \
      last_seen_at INTEGER);";

/// Inserts `events` in order, through [`STAGING`].
fn insert_events(tx: &Transaction, events: &[&Event]) -> Result<()> {
    let mut stage =
        tx.prepare_cached("INSERT INTO temp.stage_events VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?;
    for e in events {
        stage.execute(params![
            e.sensor_id.to_string(),
            e.kind.as_str(),
            e.at,
            e.data.map(i64::from),
            e.previous.map(i64::from),
            e.last_seen_at
        ])?;
    }
    tx.prepare_cached(
        "INSERT INTO events (sensor_id, kind, at, data, previous, last_seen_at) \
         SELECT sensor_id, kind, at, data, previous, last_seen_at FROM temp.stage_events \
         ORDER BY rowid",
    )?
    .execute([])?;
    tx.prepare_cached("DELETE FROM temp.stage_events")?
        .execute([])?;
    Ok(())
}

/// Inserts the notifications `rows` (event index, id, client) in order, through
/// [`STAGING`], returning each one's seq by id.
fn insert_notifications(
    tx: &Transaction,
    events: &[&Event],
    rows: &[(usize, String, String)],
    now: Millis,
) -> Result<HashMap<String, i64>> {
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    let mut stage = tx.prepare_cached(
        "INSERT INTO temp.stage_notifications VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (k, id, client_id) in rows {
        let e = events[*k];
        stage.execute(params![
            id,
            client_id,
            e.sensor_id.to_string(),
            e.kind.as_str(),
            e.data.map(i64::from),
            e.previous.map(i64::from),
            e.at,
            e.last_seen_at
        ])?;
    }
    let mut seqs = HashMap::with_capacity(rows.len());
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO notifications (id, client_id, sensor_id, kind, data, previous, \
             occurred_at, last_seen_at, status, attempts, next_attempt_at, created_at, updated_at) \
             SELECT id, client_id, sensor_id, kind, data, previous, occurred_at, last_seen_at, \
             'pending', 0, ?1, ?1, ?1 FROM temp.stage_notifications ORDER BY rowid \
             RETURNING id, seq",
        )?;
        let mut returned = insert.query([now])?;
        while let Some(r) = returned.next()? {
            seqs.insert(r.get(0)?, r.get(1)?);
        }
    }
    tx.prepare_cached("DELETE FROM temp.stage_notifications")?
        .execute([])?;
    Ok(seqs)
}
