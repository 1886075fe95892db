//! The group commit: a batch's readings, state, events and notifications in one
//! transaction, one statement per kind of row.

use std::collections::HashMap;

use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;

use super::super::{CommitBatch, Error, Fence, NotificationRef, Result};
use super::{DELETE_LOCK, backend};
use crate::domain::{EventKind, Millis, SensorId, notification::new_notification_id};

pub(super) async fn commit(
    pool: &Pool,
    batch: CommitBatch,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let mut c = pool.get().await?;
    let tx = c.transaction().await?;
    tx.execute(
        &tx.prepare_cached("SELECT pg_advisory_xact_lock_shared($1, hashtext(current_schema()))")
            .await?,
        &[&DELETE_LOCK],
    )
    .await?;
    let fenced = fenced(&tx, &batch.fence).await?;
    if !fenced.is_empty() {
        tx.rollback().await?;
        return Err(Error::Fenced(fenced));
    }
    let created = commit_batch(&tx, &batch, now).await?;
    tx.commit().await?;
    Ok(created)
}

/// The partitions of `fence` this node no longer holds at its epoch, sorted. Each one's
/// advisory lock ([`super::cluster::PARTITION_LOCK`]) is held shared until the transaction
/// ends, and `acquire` and `release` take it exclusive before they change an owner or an
/// epoch: neither can change a partition while this commit writes it, nor this commit
/// write one after either did. Shared advisory locks write nothing; the row locks `FOR
/// SHARE` they replace wrote every lease row on every commit (multixacts when commits
/// overlapped), about a quarter of PostgreSQL's delivery throughput.
pub(super) async fn fenced(
    tx: &deadpool_postgres::Transaction<'_>,
    fence: &[Fence],
) -> Result<Vec<u32>> {
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

/// The body of a group commit: one statement per kind of row. Rows of a sensor deleted
/// meanwhile are skipped (the `EXISTS` guards), so a delete racing a batch never
/// resurrects state.
async fn commit_batch(
    tx: &deadpool_postgres::Transaction<'_>,
    batch: &CommitBatch,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    if !batch.readings.is_empty() {
        let r = &batch.readings;
        let ids: Vec<String> = r.iter().map(|r| r.sensor_id.to_string()).collect();
        let ts: Vec<i64> = r.iter().map(|r| r.ts).collect();
        let recv: Vec<i64> = r.iter().map(|r| r.received_at).collect();
        let data: Vec<bool> = r.iter().map(|r| r.data).collect();
        let late: Vec<bool> = r.iter().map(|r| r.late).collect();
        tx.execute(
            &tx.prepare_cached(
                "INSERT INTO readings (sensor_id, ts, received_at, data, late) \
             SELECT u.sensor_id, u.ts, u.received_at, u.data, u.late \
             FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::bool[], $5::bool[]) \
             WITH ORDINALITY AS u(sensor_id, ts, received_at, data, late, o) \
             WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id) ORDER BY u.o",
            )
            .await?,
            &[&ids, &ts, &recv, &data, &late],
        )
        .await
        .map_err(backend)?;
    }
    if !batch.states.is_empty() {
        // One row per sensor (the last): an upsert may not touch a row twice.
        let mut last: HashMap<SensorId, usize> = HashMap::new();
        for (i, s) in batch.states.iter().enumerate() {
            last.insert(s.sensor_id, i);
        }
        let mut idx: Vec<usize> = last.into_values().collect();
        idx.sort_unstable();
        let st: Vec<_> = idx.iter().map(|&i| &batch.states[i]).collect();
        let ids: Vec<String> = st.iter().map(|s| s.sensor_id.to_string()).collect();
        let data: Vec<Option<bool>> = st.iter().map(|s| s.data).collect();
        let changed: Vec<Option<i64>> = st.iter().map(|s| s.changed_at).collect();
        let last_ts: Vec<Option<i64>> = st.iter().map(|s| s.last_ts).collect();
        let seen: Vec<Option<i64>> = st.iter().map(|s| s.last_seen_at).collect();
        let conn: Vec<&str> = st.iter().map(|s| s.connection.as_str()).collect();
        tx.execute(
            &tx.prepare_cached("INSERT INTO sensor_state AS st (sensor_id, data, changed_at, last_ts, last_seen_at, connection) \
             SELECT u.* FROM UNNEST($1::text[], $2::bool[], $3::int8[], $4::int8[], $5::int8[], $6::text[]) \
             AS u(sensor_id, data, changed_at, last_ts, last_seen_at, connection) \
             WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id) \
             ON CONFLICT (sensor_id) DO UPDATE SET data = excluded.data, \
             changed_at = COALESCE(excluded.changed_at, st.changed_at), last_ts = excluded.last_ts, \
             last_seen_at = excluded.last_seen_at, connection = excluded.connection").await?,
            &[&ids, &data, &changed, &last_ts, &seen, &conn],
        )
        .await?;
    }
    if batch.events.is_empty() {
        return Ok(Vec::new());
    }
    let ev = &batch.events;
    let sids: Vec<String> = ev.iter().map(|e| e.sensor_id.to_string()).collect();
    let kinds: Vec<&str> = ev.iter().map(|e| e.kind.as_str()).collect();
    let at: Vec<i64> = ev.iter().map(|e| e.at).collect();
    let data: Vec<Option<bool>> = ev.iter().map(|e| e.data).collect();
    let prev: Vec<Option<bool>> = ev.iter().map(|e| e.previous).collect();
    let seen: Vec<Option<i64>> = ev.iter().map(|e| e.last_seen_at).collect();
    // Events of sensors still registered, in order; only those notify.
    let kept: Vec<i64> = tx
        .query(
            &tx.prepare_cached(
                "WITH u AS (SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::bool[], \
             $5::bool[], $6::int8[]) WITH ORDINALITY AS u(sensor_id, kind, at, data, previous, \
             last_seen_at, o)), ins AS (INSERT INTO events (sensor_id, kind, at, data, previous, \
             last_seen_at) SELECT u.sensor_id, u.kind, u.at, u.data, u.previous, u.last_seen_at \
             FROM u WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id) ORDER BY u.o) \
             SELECT u.o FROM u WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id)",
            )
            .await?,
            &[&sids, &kinds, &at, &data, &prev, &seen],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut wanted: Vec<&str> = kept
        .iter()
        .map(|&o| sids[o as usize - 1].as_str())
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let mut linked: HashMap<String, Vec<String>> = HashMap::new();
    for r in tx
        .query(
            &tx.prepare_cached(
                "SELECT sensor_id, client_id FROM links WHERE sensor_id = ANY($1) \
             ORDER BY sensor_id, client_id",
            )
            .await?,
            &[&wanted],
        )
        .await?
    {
        linked.entry(r.get(0)).or_default().push(r.get(1));
    }
    // One notification per event and linked client, in event order.
    let (mut n_id, mut n_client, mut n_sensor, mut n_kind, mut n_data, mut n_prev) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut n_at, mut n_seen) = (vec![], vec![]);
    for &o in &kept {
        let e = &ev[o as usize - 1];
        let sid = &sids[o as usize - 1];
        for client in linked.get(sid).into_iter().flatten() {
            n_id.push(new_notification_id());
            n_client.push(client.as_str());
            n_sensor.push(sid.as_str());
            n_kind.push(e.kind.as_str());
            n_data.push(e.data);
            n_prev.push(e.previous);
            n_at.push(e.at);
            n_seen.push(e.last_seen_at);
        }
    }
    if n_id.is_empty() {
        return Ok(Vec::new());
    }
    let params: [&(dyn ToSql + Sync); 9] = [
        &n_id, &n_client, &n_sensor, &n_kind, &n_data, &n_prev, &n_at, &n_seen, &now,
    ];
    let rows = tx
        .query(
            &tx.prepare_cached(
                "INSERT INTO notifications (id, client_id, sensor_id, kind, data, previous, \
             occurred_at, last_seen_at, status, attempts, next_attempt_at, created_at, updated_at) \
             SELECT u.id, u.client_id, u.sensor_id, u.kind, u.data, u.previous, u.occurred_at, \
             u.last_seen_at, 'pending', 0, $9, $9, $9 \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bool[], \
             $7::int8[], $8::int8[]) WITH ORDINALITY AS u(id, client_id, sensor_id, kind, data, \
             previous, occurred_at, last_seen_at, o) ORDER BY u.o RETURNING id, seq",
            )
            .await?,
            &params,
        )
        .await?;
    let seqs: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut created = Vec::with_capacity(n_id.len());
    // Per sensor, the first seq of its newest state change: older pending, unleased state
    // notifications of that sensor are superseded by it.
    let mut newest: HashMap<&str, i64> = HashMap::new();
    let mut i = 0;
    for &o in &kept {
        let e = &ev[o as usize - 1];
        let sid = sids[o as usize - 1].as_str();
        let n = linked.get(sid).map_or(0, Vec::len);
        for k in 0..n {
            let id = n_id[i + k].clone();
            let seq = seqs[&id];
            if k == 0 && e.kind == EventKind::StateChanged {
                newest.insert(sid, seq);
            }
            created.push(NotificationRef {
                id,
                seq,
                client_id: n_client[i + k].to_string(),
                sensor_id: e.sensor_id,
                kind: e.kind,
                due_at: now,
                attempts: 0,
            });
        }
        i += n;
    }
    if !newest.is_empty() {
        let (s, q): (Vec<&str>, Vec<i64>) = newest.into_iter().unzip();
        tx.execute(
            &tx.prepare_cached(
                // Per sensor through the partial index of pending ones (`OFFSET 0` keeps the
                // lookups per sensor: a plain join of the arrays with the outbox scans it), the
                // seqs gathered once, then the rows by seq. As a join with the outbox, a
                // planner without statistics yet (a new table) ran the lookups once per pending
                // row: 3 s for one commit of 500 changes.
                "UPDATE notifications n SET status = 'superseded', updated_at = $3 \
             WHERE n.seq = ANY (ARRAY(SELECT p.seq \
             FROM UNNEST($1::text[], $2::int8[]) AS u(sensor_id, seq) \
             CROSS JOIN LATERAL (SELECT q.seq FROM notifications q WHERE q.sensor_id = u.sensor_id \
             AND q.status = 'pending' AND q.seq < u.seq OFFSET 0) p)) \
             AND n.status = 'pending' AND n.kind = 'sensor.state_changed' \
             AND (n.lease_until IS NULL OR n.lease_until < $3)",
            )
            .await?,
            &[&s, &q, &now],
        )
        .await?;
    }
    Ok(created)
}
