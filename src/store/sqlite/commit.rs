//! The group commit: a batch's readings, state, events and notifications in one
//! transaction on the writer.

use std::collections::HashMap;

use rusqlite::{Connection, Transaction, params};

use super::super::{CommitBatch, Error, NotificationRef, Result};
use crate::domain::{EventKind, Millis, SensorId, notification::new_notification_id};

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
    {
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
        let mut ins_event = tx.prepare_cached(
            "INSERT INTO events (sensor_id, kind, at, data, previous, last_seen_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        let mut linked = tx.prepare_cached("SELECT client_id FROM links WHERE sensor_id = ?1")?;
        let mut supersede = tx.prepare_cached(
            "UPDATE notifications SET status = 'superseded', updated_at = ?3 \
             WHERE sensor_id = ?1 AND status = 'pending' AND kind = 'sensor.state_changed' \
             AND seq < ?2 AND (lease_until IS NULL OR lease_until < ?3)",
        )?;
        let mut ins_notif = tx.prepare_cached(
            "INSERT INTO notifications (id, client_id, sensor_id, kind, data, previous, occurred_at, \
             last_seen_at, status, attempts, next_attempt_at, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', 0, ?9, ?9, ?9)",
        )?;
        for e in &batch.events {
            if !registered(e.sensor_id)? {
                continue;
            }
            let sid = e.sensor_id.to_string();
            ins_event.execute(params![
                sid,
                e.kind.as_str(),
                e.at,
                e.data.map(i64::from),
                e.previous.map(i64::from),
                e.last_seen_at
            ])?;
            let clients = linked
                .query_map([&sid], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut first_seq = None;
            for client_id in clients {
                let id = new_notification_id();
                ins_notif.execute(params![
                    id,
                    client_id,
                    sid,
                    e.kind.as_str(),
                    e.data.map(i64::from),
                    e.previous.map(i64::from),
                    e.at,
                    e.last_seen_at,
                    now
                ])?;
                let seq = tx.last_insert_rowid();
                first_seq.get_or_insert(seq);
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
            if e.kind == EventKind::StateChanged
                && let Some(seq) = first_seq
            {
                supersede.execute(params![sid, seq, now])?;
            }
        }
    }
    Ok(created)
}
