//! Retention on the embedded store: old readings, events and finished notifications deleted
//! in small steps.
//!
//! SQLite has one writer, and ingest's group commits wait for it. So each step finds what
//! to delete on a reader (which never holds the writer up), deletes at most a few thousand
//! rows in one short write, and the next step waits as long as the last one held the
//! writer: a commit waits behind retention for one step at most, and retention takes at
//! most half the writer's time while it catches up. Freed pages go to SQLite's free list
//! and are reused by the next rows, so once retention is reached the file stops growing;
//! `latch vacuum` gives the free pages back to the disk.
//!
//! Readings are kept in the archive by sensor and time, and events are indexed by sensor
//! and time, so old rows are found per sensor: each sensor's oldest rows are the first of
//! its range.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};

use super::super::retention::{KEPT_FOR_AN_OLDER_FAILED, OUTBOX_STEP, Scanned};
use super::super::{Pruned, Result};
use crate::domain::Millis;

/// Most readings moved from the journal into the archive before a round (the archiver's
/// own batch).
pub(super) const JOURNAL_STEP: usize = 100_000;

/// Waits as long as a step held the writer (at least a millisecond), so commits queued
/// behind it go first.
pub(super) async fn pace(started: Instant) {
    tokio::time::sleep(started.elapsed().max(Duration::from_millis(1))).await;
}

/// The id just before `id` in the order sensors are listed, so a listing after it starts
/// at `id` again. Sensor ids are ASCII letters and digits: the empty string sorts first,
/// and `id` with its last character lowered by one (and `~`-padded) sorts right before it.
pub(super) fn before_id(id: &str) -> String {
    let mut bytes = id.as_bytes().to_vec();
    match bytes.pop() {
        Some(last) => {
            bytes.push(last - 1);
            bytes.push(b'~');
            String::from_utf8(bytes).unwrap_or_default()
        }
        None => String::new(),
    }
}

/// Up to `limit` sensors listed after `after` that have readings or events before
/// `before`, in id order.
pub(super) fn old_history(
    c: &Connection,
    after: &str,
    before: Millis,
    limit: i64,
) -> Result<Vec<String>> {
    Ok(c.prepare_cached(
        "SELECT s.id FROM sensors s WHERE s.id > ?1 AND (\
           EXISTS (SELECT 1 FROM readings_archive a WHERE a.sensor_id = s.id AND a.ts < ?2) \
           OR EXISTS (SELECT 1 FROM events e WHERE e.sensor_id = s.id AND e.at < ?2)) \
         ORDER BY s.id LIMIT ?3",
    )?
    .query_map(params![after, before, limit], |r| r.get(0))?
    .collect::<rusqlite::Result<Vec<String>>>()?)
}

/// Deletes the readings and events of `sensors` before `before`, at most `budget` rows in
/// all, in one transaction. Returns what it deleted and the sensor it stopped in, if the
/// budget ran out before that sensor's old rows did.
pub(super) fn delete_history(
    c: &mut Connection,
    sensors: &[String],
    before: Millis,
    budget: i64,
) -> Result<(Pruned, Option<String>)> {
    // Immediate: it reads the archive before it deletes there, and the archive's own writer
    // may commit in between, which a transaction that began reading could not write after.
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut pruned = Pruned::default();
    let mut left = budget;
    let mut unfinished = None;
    for id in sensors {
        // The archive's key is (sensor_id, ts, id): the `left`-th old row of the sensor
        // bounds a delete of at most `left` rows.
        let bound: Option<(i64, i64)> = tx
            .prepare_cached(
                "SELECT ts, id FROM readings_archive WHERE sensor_id = ?1 AND ts < ?2 \
                 ORDER BY ts, id LIMIT 1 OFFSET ?3",
            )?
            .query_row(params![id, before, left - 1], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let readings = match bound {
            Some((ts, rid)) => tx
                .prepare_cached(
                    "DELETE FROM readings_archive WHERE sensor_id = ?1 AND (ts, id) <= (?2, ?3)",
                )?
                .execute(params![id, ts, rid])?,
            None => tx
                .prepare_cached("DELETE FROM readings_archive WHERE sensor_id = ?1 AND ts < ?2")?
                .execute(params![id, before])?,
        } as i64;
        left -= readings;
        let events = tx
            .prepare_cached(
                "DELETE FROM events WHERE id IN (SELECT id FROM events \
                 WHERE sensor_id = ?1 AND at < ?2 ORDER BY at LIMIT ?3)",
            )?
            .execute(params![id, before, left.max(0)])? as i64;
        left -= events;
        pruned.readings += readings as u64;
        pruned.events += events as u64;
        if left <= 0 {
            unfinished = Some(id.clone());
            break;
        }
    }
    tx.commit()?;
    Ok((pruned, unfinished))
}

/// The next notifications after `after`, in outbox order.
pub(super) fn scan_outbox(c: &Connection, after: i64) -> Result<Vec<Scanned>> {
    Ok(c.prepare_cached(
        "SELECT seq, created_at, status = 'pending', updated_at FROM notifications \
         WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?
    .query_map(params![after, OUTBOX_STEP], |r| {
        Ok(Scanned {
            seq: r.get(0)?,
            created_at: r.get(1)?,
            pending: r.get(2)?,
            updated_at: r.get(3)?,
        })
    })?
    .collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Deletes one notification ([`delete_notifications`]): the rules that keep it are in
/// that function's doc.
static DELETE_ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM notifications AS n WHERE seq = ?1 AND status <> 'pending' \
         AND updated_at < ?2 AND NOT (n.kind = 'sensor.state_changed' AND EXISTS (\
           SELECT 1 FROM notifications o WHERE o.sensor_id = n.sensor_id \
           AND o.seq < n.seq AND o.status = 'pending' AND o.client_id = n.client_id \
           AND o.kind = 'sensor.state_changed')) AND NOT {} AND NOT EXISTS (SELECT 1 \
           FROM silenced_pairs sp WHERE sp.client_id = n.client_id \
           AND (sp.sensor_id = n.sensor_id \
                OR n.kind IN ('site.connection_lost', 'site.connection_restored'))) \
         AND NOT EXISTS (SELECT 1 FROM alarms a WHERE a.id = n.alarm_id \
           AND a.state <> 'resolved') \
         RETURNING id, site_id IS NOT NULL",
        *KEPT_FOR_AN_OLDER_FAILED
    )
});

/// Deletes the notifications `seqs` that are still finished and older than `before` (one
/// may have been replayed since it was read), with their attempts and named sensors. A
/// delivered state that an older state of its lane still waits behind stays: the claim of
/// that one supersedes it while the newer one is stored, and would send it after the newer
/// one without. So does a delivered notification while an older failed one of its lane
/// that it outranks is stored ([`KEPT_FOR_AN_OLDER_FAILED`]): a retry of that one is
/// refused only while the newer one is there (deleted in seq order, an older failed one
/// deleted first lets the newer one go in the same step). So does every notification of a
/// (client, sensor) a silence kept something from until its end reconciles it, and every
/// site event of that client (it may name the sensor, from another sensor's lane): what the
/// client was told is read from them then, and a silence longer than retention would
/// otherwise find nothing, or less than was told (issue #68). A notification of an alarm not resolved stays too: an acknowledgement
/// tells the clients it told, read from them, however long the alarm stays open.
pub(super) fn delete_notifications(
    c: &mut Connection,
    seqs: &[i64],
    before: Millis,
) -> Result<Pruned> {
    let tx = c.transaction()?;
    let mut pruned = Pruned::default();
    {
        let mut gone = tx.prepare_cached(&DELETE_ONE)?;
        let mut attempts = tx.prepare_cached("DELETE FROM attempts WHERE notification_id = ?1")?;
        let mut named = tx.prepare_cached("DELETE FROM notification_sensors WHERE seq = ?1")?;
        for seq in seqs {
            let gone: Option<(String, bool)> = gone
                .query_row(params![seq, before], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((id, of_site)) = gone {
                pruned.notifications += 1;
                pruned.attempts += attempts.execute([id])? as u64;
                if of_site {
                    named.execute([seq])?;
                }
            }
        }
    }
    tx.commit()?;
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_after_before_id_starts_at_the_id() {
        let mut ids = ["a", "a0", "aZ", "ab", "b", "Z9", "0", "zz"];
        ids.sort();
        for (i, id) in ids.iter().enumerate() {
            let from = before_id(id);
            let after: Vec<_> = ids.iter().filter(|x| **x > from.as_str()).collect();
            assert_eq!(after.first(), Some(&id), "{from:?}");
            assert_eq!(after.len(), ids.len() - i);
        }
    }
}
