//! Retention on PostgreSQL: whole monthly history partitions dropped, the outbox pruned in
//! batches, one node of a cluster at a time.
//!
//! `readings` and `events` are range-partitioned by month (`ensure_partitions`), so a
//! month whose end is older than the cut-off goes at once with `DROP TABLE`: no row
//! deletes, no dead tuples for vacuum to chase, and the space goes back to the disk. The
//! price is granularity: rows are kept until their whole month is past retention, up to a
//! month longer than asked. Rows the default partition caught (times outside the monthly
//! partitions) are deleted in batches. Dropping a partition locks its parent for a moment;
//! the drop waits at most [`LOCK_WAIT`] for commits in flight and is tried again at the
//! next round rather than hold ingest up.

use tokio_postgres::Client;

use super::super::retention::{KEPT_FOR_AN_OLDER_FAILED, OUTBOX_STEP, Scanned, outbox_step};
use super::super::{Pruned, Result, Retention};
use super::db::{Db, Sql};
use super::describe;
use crate::domain::Millis;

/// Longest a partition drop waits for its lock before giving up until the next round.
const LOCK_WAIT: &str = "500ms";

/// Rows of a default partition one delete takes.
const DEFAULT_STEP: i64 = 5_000;

/// Deletes what `keep` says is too old. The caller holds the upkeep lock.
pub(super) async fn prune(db: &Db, lock: &Client, keep: Retention) -> Result<Pruned> {
    let mut pruned = Pruned::default();
    if let Some(before) = keep.history_before {
        for (table, time) in [("readings", "ts"), ("events", "at")] {
            pruned.partitions += drop_partitions(lock, table, before).await?;
            let n = prune_default(db, table, time, before).await?;
            match table {
                "readings" => pruned.readings += n,
                _ => pruned.events += n,
            }
        }
    }
    if let Some(before) = keep.notifications_before {
        let mut after = i64::MIN;
        loop {
            let rows = scan_outbox(db, after).await?;
            let (doomed, next, done) = outbox_step(&rows, before, OUTBOX_STEP);
            if !doomed.is_empty() {
                pruned.add(delete_notifications(db, &doomed, before).await?);
            }
            if done {
                break;
            }
            after = next;
        }
        loop {
            let c = db.get("prune_audit").await?;
            let n = super::audit::prune_step(&c, before, keep.audit_unshipped_kept).await?;
            pruned.audit += n;
            if n < crate::store::audit::PRUNE_STEP as u64 {
                break;
            }
        }
    }
    Ok(pruned)
}

/// The first millisecond after the month a partition named `{table}_YYYY_MM` holds.
fn month_end(name: &str, table: &str) -> Option<Millis> {
    use chrono::TimeZone;
    let rest = name.strip_prefix(table)?.strip_prefix('_')?;
    let (y, m) = rest.split_once('_')?;
    let (y, m): (i32, u32) = (y.parse().ok()?, m.parse().ok()?);
    let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    chrono::Utc
        .with_ymd_and_hms(y, m, 1, 0, 0, 0)
        .single()
        .map(|t| t.timestamp_millis())
}

/// Drops the monthly partitions of `table` that end at or before `before`; returns how
/// many. A drop that cannot get its lock within [`LOCK_WAIT`] waits for the next round.
async fn drop_partitions(c: &Client, table: &str, before: Millis) -> Result<u64> {
    let parts = c
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = $1::text::regclass",
            &[&table],
        )
        .await?;
    let mut dropped = 0;
    for row in parts {
        let name: String = row.get(0);
        if month_end(&name, table).is_none_or(|end| end > before) {
            continue;
        }
        let sql = format!(
            "BEGIN; SET LOCAL lock_timeout = '{LOCK_WAIT}'; DROP TABLE IF EXISTS {name}; COMMIT;"
        );
        match c.batch_execute(&sql).await {
            Ok(()) => {
                dropped += 1;
                tracing::info!(partition = %name, "Dropped a history partition past retention.");
            }
            Err(e) => {
                let _ = c.batch_execute("ROLLBACK").await;
                tracing::warn!(partition = %name, error = %describe(&e),
                    "Could not drop a history partition past retention; trying again later.");
            }
        }
    }
    Ok(dropped)
}

/// Deletes the rows of `table`'s default partition older than `before`, in batches.
async fn prune_default(db: &Db, table: &str, time: &str, before: Millis) -> Result<u64> {
    let sql = format!(
        "DELETE FROM {table}_default WHERE ctid = ANY(ARRAY(\
           SELECT ctid FROM {table}_default WHERE {time} < $1 LIMIT $2))"
    );
    let mut deleted = 0;
    loop {
        let c = db.get("retention").await?;
        let n = c.execute(&sql, &[&before, &DEFAULT_STEP]).await?;
        deleted += n;
        if (n as i64) < DEFAULT_STEP {
            return Ok(deleted);
        }
    }
}

/// A state notification `n` outranks an older state of its lane still pending: the claim
/// of that one supersedes it while `n` is stored, and would send it after `n` once `n`
/// was gone. Such an `n` stays until the older one is settled.
const KEPT_FOR_ITS_LANE: &str = "(n.kind = 'sensor.state_changed' AND EXISTS (\
    SELECT 1 FROM notifications_pending p JOIN notifications o ON o.seq = p.seq \
    WHERE p.sensor_id = n.sensor_id AND p.client_id = n.client_id AND p.seq < n.seq \
    AND o.kind = 'sensor.state_changed'))";

/// A notification of a (client, sensor) a silence kept something from stays until the
/// silence's end reconciles the pair, and so does every site event of that client (it may
/// name the sensor, from another sensor's lane): what the client was told is read from them
/// then, and a silence longer than retention would otherwise find less than was told (#68).
const KEPT_FOR_A_SILENCE: &str = "EXISTS (SELECT 1 FROM silenced_pairs sp \
    WHERE sp.client_id = n.client_id AND (sp.sensor_id = n.sensor_id \
    OR n.kind IN ('site.connection_lost', 'site.connection_restored')))";

/// A notification of an alarm not resolved stays: an acknowledgement tells the clients it
/// told, read from them, however long the alarm stays open.
const KEPT_FOR_ITS_ALARM: &str = "EXISTS (SELECT 1 FROM alarms a \
    WHERE a.id = n.alarm_id AND a.state <> 'resolved')";

async fn scan_outbox(db: &Db, after: i64) -> Result<Vec<Scanned>> {
    let c = db.get("retention").await?;
    Ok(c.query(
        "SELECT seq, created_at, status = 'pending', updated_at FROM notifications \
         WHERE seq > $1 ORDER BY seq LIMIT $2",
        &[&after, &OUTBOX_STEP],
    )
    .await?
    .iter()
    .map(|r| Scanned {
        seq: r.get(0),
        created_at: r.get(1),
        pending: r.get(2),
        updated_at: r.get(3),
    })
    .collect())
}

/// Deletes the notifications `seqs` that are still finished and older than `before`, with
/// their attempts and named sensors, in one statement; not a delivered state an older state
/// of its lane still waits behind ([`KEPT_FOR_ITS_LANE`]), nor a delivered notification an
/// older failed one of its lane that it outranks is stored behind
/// ([`KEPT_FOR_AN_OLDER_FAILED`]; the statement reads the lane as it was when it began:
/// where it deletes the older failed one, the newer one goes at the next round).
async fn delete_notifications(db: &Db, seqs: &[i64], before: Millis) -> Result<Pruned> {
    let c = db.get("retention").await?;
    let row = c
        .query_one(
            &format!(
                "WITH gone AS (DELETE FROM notifications n WHERE seq = ANY($1) \
               AND status <> 'pending' AND updated_at < $2 AND NOT {KEPT_FOR_ITS_LANE} \
               AND NOT {kept_for_failed} AND NOT {KEPT_FOR_A_SILENCE} \
               AND NOT {KEPT_FOR_ITS_ALARM} RETURNING id, seq), \
             a AS (DELETE FROM attempts WHERE notification_id IN (SELECT id FROM gone) \
               RETURNING 1), \
             named AS (DELETE FROM notification_sensors WHERE seq IN (SELECT seq FROM gone)) \
             SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM a)",
                kept_for_failed = *KEPT_FOR_AN_OLDER_FAILED
            ),
            &[&seqs, &before],
        )
        .await?;
    Ok(Pruned {
        notifications: row.get::<_, i64>(0) as u64,
        attempts: row.get::<_, i64>(1) as u64,
        ..Pruned::default()
    })
}

/// Forgets nodes that left without saying so (killed, their machine gone): their rows
/// would otherwise stay in `latch_nodes` forever. A node heard from within the hour is
/// kept, whether or not it is live now.
pub(super) async fn expire_nodes(c: &Client) -> Result<u64> {
    Ok(c.execute(
        "DELETE FROM latch_nodes WHERE heartbeat_at < now() - interval '1 hour'",
        &[],
    )
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_name_gives_the_end_of_its_month() {
        assert_eq!(
            month_end("readings_2026_01", "readings"),
            Some(1_769_904_000_000)
        );
        assert_eq!(
            month_end("events_2025_12", "events"),
            Some(1_767_225_600_000)
        );
        assert_eq!(month_end("readings_default", "readings"), None);
        assert_eq!(month_end("events_2026_01", "readings"), None);
    }
}
