//! When a sensor was last heard from, written at most once a second.
//!
//! Most readings change nothing but their sensor's `last_ts` and `last_seen_at` (a repeat,
//! or a late reading): rewriting its `sensor_state` row in every group commit made the
//! state table's pages about half of what a commit wrote under load (BENCHMARKS.md, #53).
//! Such an update ([`crate::store::StateUpdate::seen_only`]) is kept here instead,
//! and written with every other one kept at the next flush: in the first group commit a
//! second or more after the last flush, and before anything takes readings out of the
//! journal (the archive's move, the ClickHouse shipment) or reads these columns on the
//! writer (a site's decision, a silence's reconciliation).
//!
//! **Nothing acknowledged is lost.** Every reading's journal row is still in its group
//! commit, and `state_flush.through` names the last reading whose times `sensor_state`
//! holds (a flush writes it in the same transaction). At open, before anything reads the
//! store, [`recover`] takes the journal's readings past it into `sensor_state`: the
//! times are maxima (`last_seen_at` of every reading, `last_ts` of those not late, as
//! `engine::rules::apply` sets them), so replaying a reading twice or in another order
//! gives the same row. The journal keeps those readings until a flush covers them, or a
//! commit after which nothing is kept (`Seen::through` bounds the archive's move and the
//! shipment).
//!
//! **No read sees older times.** Reads of sensors on a reader take the times kept here
//! over the row's ([`Kept::patch_views`], [`Kept::patch_runtime`]) under this map's read
//! lock, held across the query: the writer changes the map (after a commit that wrote
//! rows, or kept updates) under the write lock, so a reader either read the rows before
//! that commit and still finds the times kept here, or read them after it.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, params};

use super::SqliteStore;
use crate::domain::{Millis, SensorId};
use crate::store::{Result, SensorRuntime, SensorView};

/// Longest a kept update waits for its write while group commits go on.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// A sensor's times as the engine last committed them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Times {
    pub last_ts: Option<Millis>,
    pub last_seen_at: Option<Millis>,
}

/// What one commit did to the times: the updates it kept, the sensors whose whole row it
/// wrote (their times with it), those whose row it looked up and found (not yet in
/// [`Seen::rows`]), and its last reading's journal id.
#[derive(Debug, Default)]
pub(super) struct Deferred {
    pub kept: Vec<(SensorId, Times)>,
    pub written: Vec<SensorId>,
    pub found: Vec<SensorId>,
    pub last_reading: Option<i64>,
}

/// The times not written yet, and the mark of the last flush.
#[derive(Debug)]
pub(super) struct Kept {
    times: HashMap<SensorId, Times>,
    /// The last reading (journal id) whose times `sensor_state` holds: the last flush's
    /// mark, or the last reading of a commit after which nothing was kept. It may be
    /// past the mark in `state_flush`, which only says where a replay starts.
    through: i64,
    flushed_at: Instant,
}

/// [`Kept`], shared by the writer (which alone changes it) and the readers; and the
/// sensors the writer knows to have a `sensor_state` row.
#[derive(Debug)]
pub(super) struct Seen {
    kept: RwLock<Kept>,
    /// Sensors whose `sensor_state` row a committed transaction found or wrote: a kept
    /// update of one needs no look-up of its row (one B-tree search a reading's sensor, a
    /// fifth of the writer's time under load). The writer alone uses it; a delete of the
    /// sensor ([`Seen::forget`]) is the only way a row goes.
    rows: Mutex<HashSet<SensorId>>,
}

/// Writes a sensor's times as the later of the row's and these: a flush and a replay may
/// meet a row a later full write already holds.
const WRITE_TIMES: &str = "UPDATE sensor_state SET \
     last_ts = max(coalesce(last_ts, ?2), coalesce(?2, last_ts)), \
     last_seen_at = max(coalesce(last_seen_at, ?3), coalesce(?3, last_seen_at)) \
     WHERE sensor_id = ?1";

/// The journal's last reading id (ids are never reused: `AUTOINCREMENT`).
fn last_reading(c: &Connection) -> rusqlite::Result<i64> {
    c.query_row(
        "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'readings'), 0), \
         coalesce((SELECT max(id) FROM readings), 0))",
        [],
        |r| r.get(0),
    )
}

/// Takes the readings the last flush did not cover into `sensor_state`, and moves the
/// mark past them. Runs at open, on the writer, before any read.
pub(super) fn recover(c: &mut Connection) -> rusqlite::Result<Seen> {
    let tx = c.transaction()?;
    let through: i64 = tx.query_row("SELECT through FROM state_flush", [], |r| r.get(0))?;
    let replayed = tx.execute(
        "UPDATE sensor_state SET \
           last_ts = max(coalesce(last_ts, j.ts), coalesce(j.ts, last_ts)), \
           last_seen_at = max(coalesce(last_seen_at, j.seen), coalesce(j.seen, last_seen_at)) \
         FROM (SELECT sensor_id, max(CASE WHEN late = 0 THEN ts END) AS ts, \
                 max(received_at) AS seen \
               FROM readings WHERE id > ?1 GROUP BY sensor_id) AS j \
         WHERE sensor_state.sensor_id = j.sensor_id",
        [through],
    )?;
    let last = last_reading(&tx)?;
    tx.execute("UPDATE state_flush SET through = ?1", [last])?;
    tx.commit()?;
    if replayed > 0 {
        tracing::info!(
            sensors = replayed,
            "Took the times of readings after the last state flush into sensor state."
        );
    }
    Ok(Seen {
        kept: RwLock::new(Kept {
            times: HashMap::new(),
            through: last,
            flushed_at: Instant::now(),
        }),
        rows: Mutex::new(HashSet::new()),
    })
}

impl Seen {
    fn read(&self) -> RwLockReadGuard<'_, Kept> {
        self.kept.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The sensors known to have a state row, for the writer's transaction: what it finds
    /// or writes joins them in [`Seen::after`], once committed.
    pub(super) fn rows(&self) -> MutexGuard<'_, HashSet<SensorId>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last reading whose times `sensor_state` holds: what may leave the journal.
    /// Read without the writer, so asking writes nothing (an empty write would end a
    /// full disk's episode in the store's eyes).
    fn through(&self) -> i64 {
        self.read().through
    }

    /// Whether a flush is due: something is kept and the last flush was a second ago or
    /// more.
    pub(super) fn due(&self) -> bool {
        let k = self.read();
        !k.times.is_empty() && k.flushed_at.elapsed() >= FLUSH_EVERY
    }

    /// Writes every kept time and those `d` keeps, and the mark, in `tx`; [`Seen::after`]
    /// forgets them once `tx` committed. Returns the new mark.
    pub(super) fn flush(&self, tx: &Transaction, d: &Deferred) -> Result<i64> {
        let mut write = tx.prepare_cached(WRITE_TIMES)?;
        let k = self.read();
        for (id, t) in k.times.iter().chain(d.kept.iter().map(|(id, t)| (id, t))) {
            write.execute(params![id.to_string(), t.last_ts, t.last_seen_at])?;
        }
        let through = last_reading(tx)?;
        tx.prepare_cached("UPDATE state_flush SET through = ?1")?
            .execute([through])?;
        Ok(through)
    }

    /// After a commit: `flushed` (the mark [`Seen::flush`] wrote in it) empties the map;
    /// otherwise the sensors written whole leave it and the kept updates join it, and
    /// when nothing is kept then, every reading so far is in `sensor_state`.
    pub(super) fn after(&self, d: Deferred, flushed: Option<i64>) {
        {
            let mut rows = self.rows();
            rows.extend(d.written.iter().chain(&d.found).copied());
        }
        if flushed.is_none() && d.kept.is_empty() && d.written.is_empty() {
            let k = self.read();
            let behind = d.last_reading.is_some_and(|r| r > k.through);
            if !(behind && k.times.is_empty()) {
                return;
            }
        }
        let mut k = self.kept.write().unwrap_or_else(|p| p.into_inner());
        if let Some(through) = flushed {
            k.times.clear();
            k.through = through;
            k.flushed_at = Instant::now();
            return;
        }
        for id in &d.written {
            k.times.remove(id);
        }
        for (id, t) in d.kept {
            k.times.insert(id, t);
        }
        if let Some(last) = d.last_reading
            && k.times.is_empty()
        {
            k.through = k.through.max(last);
        }
    }

    /// A sensor deleted: nothing of it is kept.
    pub(super) fn forget(&self, id: SensorId) {
        self.rows().remove(&id);
        let mut k = self.kept.write().unwrap_or_else(|p| p.into_inner());
        k.times.remove(&id);
    }
}

impl Kept {
    fn get(&self, id: SensorId) -> Option<&Times> {
        self.times.get(&id)
    }

    /// Sensors as a reader found them, with the times kept here.
    pub(super) fn patch_views(&self, views: &mut [SensorView]) {
        if self.times.is_empty() {
            return;
        }
        for (sensor, status) in views {
            if let Some(t) = self.get(sensor.id) {
                status.last_seen_at = later(status.last_seen_at, t.last_seen_at);
            }
        }
    }

    /// The engine's view of sensors as a reader found them, with the times kept here.
    pub(super) fn patch_runtime(&self, rows: &mut [SensorRuntime]) {
        if self.times.is_empty() {
            return;
        }
        for (id, state) in rows {
            if let Some(t) = self.get(*id) {
                state.last_ts = later(state.last_ts, t.last_ts);
                state.last_seen_at = later(state.last_seen_at, t.last_seen_at);
            }
        }
    }
}

fn later(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    a.max(b)
}

impl SqliteStore {
    /// A read on a reader that sees the kept times: `f` runs under [`Seen`]'s read lock
    /// and patches what it read with them.
    pub(super) async fn read_seen<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Kept) -> Result<T> + Send + 'static,
    {
        let seen = self.inner.seen.clone();
        self.read(move |c| {
            let kept = seen.read();
            f(c, &kept)
        })
        .await
    }

    /// Flushes the kept times when due (or, with `now`, whenever any are kept), in a
    /// transaction of its own, and answers the last reading that may leave the journal:
    /// the archive's move and the shipment ask first. Nothing kept: nothing written.
    pub(super) async fn flush_seen(&self, now: bool) -> Result<i64> {
        let seen = self.inner.seen.clone();
        let wanted = move |seen: &Seen| match now {
            true => !seen.read().times.is_empty(),
            false => seen.due(),
        };
        if !wanted(&seen) {
            return Ok(seen.through());
        }
        self.write(move |c| {
            if !wanted(&seen) {
                return Ok(seen.through());
            }
            let tx = c.transaction()?;
            let through = seen.flush(&tx, &Deferred::default())?;
            tx.commit()?;
            seen.after(Deferred::default(), Some(through));
            Ok(through)
        })
        .await
    }
}

/// Runs `f` in an immediate transaction on the writer that first writes every kept time:
/// for a write that reads the times of sensors in SQL (a site's decision, a silence's
/// reconciliation), which happens at most once a second and only when one is due.
pub(super) fn flushed<T>(
    seen: &Seen,
    c: &mut Connection,
    f: impl FnOnce(&Transaction) -> Result<T>,
) -> Result<T> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let kept = !seen.read().times.is_empty();
    let through = match kept {
        true => Some(seen.flush(&tx, &Deferred::default())?),
        false => None,
    };
    let out = f(&tx)?;
    tx.commit()?;
    seen.after(Deferred::default(), through);
    Ok(out)
}

#[cfg(test)]
#[path = "seen_tests.rs"]
mod tests;
