//! What a restarted latch does next on a rebuilt folder, checked: the leases, attempts and
//! id counters the cut left, then new commits (the lost tail sent again, as devices whose
//! readings were lost do, and new ones), moves into the archive and delivery, each of which
//! must land whole.

use std::path::Path;

use latch::domain::{Millis, Status};
use latch::store::prelude::*;
use latch::store::sqlite::SqliteStore;
use latch::store::{PageRequest, TimeRange};

use super::START;
use super::check::Held;
use super::workload::{Recorded, Sent, States, batch, deliver_once};

/// How much later than first a lost reading is received again.
const RESENT: Millis = 1_000_000;
/// Lost commits sent again, and new commits, after a reopen.
const RESEND: usize = 4;
const FRESH: usize = 3;

/// What the cut left in the outbox and the id counters, read from the files (the store's
/// API does not show leases or ids).
pub fn leftovers(dir: &Path) -> Result<(), String> {
    let db = dir.join("latch.db");
    let c = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
    let q = |sql: &str| -> Result<i64, String> {
        c.query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
            .map(|v| v.unwrap_or(0))
            .map_err(|e| format!("{sql}: {e}"))
    };
    let leased = q("SELECT count(*) FROM notifications \
                    WHERE claimed_by IS NOT NULL OR lease_until IS NOT NULL")?;
    if leased > 0 {
        return Err(format!(
            "{leased} notifications are still leased after the reopen"
        ));
    }
    let bare = q(
        "SELECT count(*) FROM notifications n WHERE status = 'delivered' \
                  AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.notification_id = n.id)",
    )?;
    if bare > 0 {
        return Err(format!("{bare} delivered notifications have no attempt"));
    }
    let archive = dir.join("archive.db");
    if archive.exists() {
        c.execute("ATTACH DATABASE ?1 AS archive", [archive.to_string_lossy()])
            .map_err(|e| e.to_string())?;
        // A reading id handed out again can meet the archive's copy of a reading a lost
        // tail took from `latch.db`: same sensor, time and id, and the move (`INSERT OR
        // IGNORE`) and reads keep the old one.
        let next = q("SELECT seq FROM main.sqlite_sequence WHERE name = 'readings'")?;
        let archived = q("SELECT max(id) FROM archive.readings_archive")?;
        if archived > next {
            return Err(format!(
                "the readings' id counter is at {next}, below id {archived} in the archive: \
                 ids will be handed out again"
            ));
        }
    }
    Ok(())
}

/// New work on the reopened store, checked (see the module's documentation).
pub async fn work(store: &SqliteStore, held: Held, rec: &Recorded) -> Result<(), String> {
    let commits = &rec.commits;
    let mut states: States = match held.commits {
        0 => rec.ids.iter().map(|id| (*id, (None, None))).collect(),
        n => (*commits[n - 1].states).clone(),
    };
    // Readings of a sensor the store does not hold (a cut before it was registered) are
    // not kept: only the registered ones are sent.
    let mut registered = Vec::new();
    for id in &rec.ids {
        if store
            .get_sensor(*id)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            registered.push(*id);
        }
    }
    let last = commits.last().map_or(START, |c| c.at);
    let mut sent_all: Vec<Sent> = Vec::new();
    let mut made = Vec::new();
    let mut at = last + RESENT;
    // The lost tail again, received later: its readings as the devices sent them.
    let resend = commits[held.commits..].iter().take(RESEND).map(|c| {
        c.readings
            .iter()
            .filter(|r| registered.contains(&r.sensor_id))
            .map(|r| (r.sensor_id, r.data, r.ts, r.received_at + RESENT))
            .collect::<Vec<Sent>>()
    });
    // And new readings, after everything before the cut.
    let fresh = (0..FRESH).map(|k| {
        registered
            .iter()
            .enumerate()
            .filter(|(i, _)| (i + k) % 3 == 0)
            .map(|(i, id)| {
                let t = last + RESENT + 1_000 * (k as Millis + 1) + i as Millis;
                (*id, (i + k) % 2 == 0, t, t)
            })
            .collect::<Vec<Sent>>()
    });
    for sent in resend.chain(fresh).filter(|s| !s.is_empty()) {
        at = at.max(sent.iter().map(|s| s.3).max().unwrap_or(at));
        let (b, _) = batch(&mut states, &sent, at);
        let refs = store
            .commit(b.clone(), at)
            .await
            .map_err(|e| format!("a commit after the reopen fails: {e}"))?;
        made.extend(refs.into_iter().map(|r| r.id));
        sent_all.extend(
            b.readings
                .iter()
                .map(|r| (r.sensor_id, r.data, r.ts, r.received_at)),
        );
    }
    while store
        .archive_history(10_000)
        .await
        .map_err(|e| format!("a move after the reopen fails: {e}"))?
        > 0
    {}
    for _ in 0..200 {
        let n = deliver_once(store, at)
            .await
            .map_err(|e| format!("delivery after the reopen fails: {e}"))?;
        if n == 0 {
            break;
        }
    }
    let pending = store.count_pending().await.map_err(|e| e.to_string())?;
    if pending > 0 {
        return Err(format!(
            "{pending} notifications stay pending after the reopen: their claims are refused"
        ));
    }
    for id in &made {
        match store.get_notification(id.clone()).await {
            Ok(Some((n, attempts))) if n.status == Status::Delivered && !attempts.is_empty() => {}
            // A newer change of its sensor, for its client, came before it was sent.
            Ok(Some((n, _))) if n.status == Status::Superseded => {}
            other => {
                return Err(format!(
                    "notification {id} made after the reopen is neither delivered (with its \
                     attempt) nor superseded: {other:?}"
                ));
            }
        }
    }
    // Every reading sent after the reopen is listed once, as sent.
    for &(id, data, ts, received_at) in &sent_all {
        let page = store
            .list_readings(
                id,
                TimeRange {
                    from: Some(ts),
                    to: Some(ts + 1),
                },
                PageRequest {
                    limit: 100,
                    after: None,
                },
            )
            .await
            .map_err(|e| e.to_string())?;
        let found: Vec<_> = page
            .items
            .iter()
            .filter(|r| r.row.received_at == received_at)
            .collect();
        match found.as_slice() {
            [r] if r.row.data == data => {}
            _ => {
                let held: Vec<_> = page
                    .items
                    .iter()
                    .map(|r| r.row.received_at - START)
                    .collect();
                return Err(format!(
                    "reading {id} at {} sent after the reopen (received at {}) is listed {} \
                     times; the store lists it received at {held:?}",
                    ts - START,
                    received_at - START,
                    found.len()
                ));
            }
        }
    }
    for (id, state) in store.load_runtime().await.map_err(|e| e.to_string())? {
        let want = states.get(&id).copied().unwrap_or((None, None));
        if (state.data, state.last_ts) != want {
            return Err(format!(
                "after the reopen's commits sensor {id} holds {:?}, not {want:?}",
                (state.data, state.last_ts)
            ));
        }
    }
    Ok(())
}
