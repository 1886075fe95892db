//! A group commit whose `COMMIT` answer never came, decided once its transaction has ended.
//!
//! The answer can be lost in several ways: the connection breaks, or `database_timeout`
//! runs out while the server commits (a WAL flush that stalls, a synchronous standby that
//! does not answer) or before it even got the `COMMIT` (a network that holds it). Reading
//! the batch's rows back at once decides too early: a transaction still open, or waiting
//! for its standby, is invisible to other sessions, and becomes visible only later. So the
//! commit records its transaction id and backend first ([`Doubt`]), and when its answer is
//! lost, another connection asks the server for that transaction until it has ended:
//! committed and visible to others, the commit succeeded; rolled back, nothing was written.
//!
//! A transaction still running without a commit record (its `COMMIT` never reached the
//! server: the backend sits idle in it, holding the sensors' row locks) would never end by
//! itself, so after `database_timeout` more its backend is terminated, which rolls it
//! back. One that has its commit record (waiting for a synchronous standby) cannot roll
//! back any more and is waited for, never cut: terminating it would make visible a
//! commit the standby does not have. If it has not ended after twelve
//! `database_timeout`s it is committed all the same (its rows become visible when the
//! standby answers): answering "unknown" then made the committer read the batch back,
//! find it missing (invisible, not absent) and refuse readings a broker would send again
//! and apply twice (issue #68). Only when the server cannot be asked for that long does
//! the outcome stay unknown ([`Error::Indeterminate`]).

use std::time::Duration;

use tokio::time::Instant;

use super::db::{Db, Sql};
use crate::store::{Error, Result};
use crate::telemetry::events::{DoubtOutcome, DoubtSettled, Emit};

/// How many `database_timeout`s an outcome is asked for before it is given up as unknown.
const SETTLE_FACTOR: u32 = 12;
/// Longest wait between two questions.
const ASK_MAX_WAIT: Duration = Duration::from_secs(1);

/// Whose outcome to ask for: the transaction and the backend that ran it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Doubt {
    /// `txid_current()`: epoch and xid, so it never wraps.
    pub xid: i64,
    pub pid: i32,
}

/// What the server says of the transaction now.
#[derive(Debug, PartialEq)]
enum Now {
    /// Ended, and committed: visible to every later snapshot.
    Committed,
    /// Rolled back (or never committed, and gone).
    Aborted,
    /// Its commit record is written; it ends once its wait (a standby) does.
    CommittedRunning,
    /// Running without a commit record.
    Running,
}

/// Waits until the transaction of `doubt`, whose `COMMIT` answer was lost (`why`), has
/// ended: `Ok` when it committed, [`Error::Backend`] when it was rolled back (nothing
/// written), [`Error::Indeterminate`] when the server could not be asked long enough.
pub(super) async fn settle(db: &Db, doubt: Doubt, why: String) -> Result<()> {
    let started = Instant::now();
    let limit = db.limit();
    let give_up = limit * SETTLE_FACTOR;
    let mut wait = Duration::from_millis(50);
    let mut terminated = false;
    let mut committed = false;
    tracing::warn!(xid = doubt.xid, error = %why,
        "The answer to a commit was lost; waiting for its transaction to end.");
    loop {
        match ask(db, doubt).await {
            Ok(Now::Committed) => {
                settled(doubt, DoubtOutcome::Committed);
                return Ok(());
            }
            Ok(Now::Aborted) => {
                settled(doubt, DoubtOutcome::RolledBack);
                return Err(Error::Backend(format!(
                    "{why}; the transaction was rolled back, nothing of it was written"
                )));
            }
            Ok(Now::CommittedRunning) => committed = true,
            Ok(Now::Running) if !terminated && started.elapsed() >= limit => {
                terminated = terminate(db, doubt).await;
            }
            Ok(Now::Running) => {}
            Err(e) => {
                tracing::warn!(xid = doubt.xid, error = %e,
                    "Could not ask how a commit whose answer was lost ended; asking again.");
            }
        }
        if started.elapsed() >= give_up && committed {
            settled(doubt, DoubtOutcome::CommittedNotEnded);
            return Ok(());
        }
        if started.elapsed() >= give_up {
            settled(doubt, DoubtOutcome::Unknown);
            return Err(Error::Indeterminate(format!(
                "{why}; its outcome could not be learnt within {give_up:?}"
            )));
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(ASK_MAX_WAIT);
    }
}

/// One question: the transaction's status, and whether it has ended (no longer in
/// progress for a snapshot taken now).
async fn ask(db: &Db, doubt: Doubt) -> Result<Now> {
    let c = db.get("commit_outcome").await?;
    let row = c
        .query_one(
            "SELECT txid_status($1), txid_visible_in_snapshot($1, txid_current_snapshot()), \
             EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $2 AND wait_event = 'SyncRep' \
               AND backend_xid::text = ($1 % 4294967296)::text)",
            &[&doubt.xid, &doubt.pid],
        )
        .await?;
    let status: Option<String> = row.get(0);
    let (ended, standby): (bool, bool) = (row.get(1), row.get(2));
    Ok(now(status.as_deref(), ended, standby))
}

/// `standby`: its backend waits for a synchronous standby (`SyncRep`), which it does only
/// once its commit record is flushed and marked: `txid_status` still says "in progress"
/// then (it asks the running transactions first), but the transaction can no longer roll
/// back.
fn now(status: Option<&str>, ended: bool, standby: bool) -> Now {
    match (status, ended) {
        (Some("committed"), true) => Now::Committed,
        (Some("committed"), false) => Now::CommittedRunning,
        (Some("aborted"), _) => Now::Aborted,
        _ if standby => Now::CommittedRunning,
        // Too old for its status to be kept: it ended long ago, but how is not known.
        (None, _) => Now::Running,
        _ => Now::Running,
    }
}

/// Ends the backend that still runs the transaction, which rolls it back; `true` once
/// asked (the backend may have ended by itself meanwhile).
async fn terminate(db: &Db, doubt: Doubt) -> bool {
    let asked = async {
        let c = db.get("commit_outcome").await?;
        // Only while that backend still runs that transaction (a pid is reused once its
        // backend is gone), idle in it: a `COMMIT` that arrived since the question makes
        // it active, and a commit record written cannot be taken back (issue #68).
        c.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid = $1 AND backend_xid::text = ($2 % 4294967296)::text \
             AND state = 'idle in transaction' AND txid_status($2) = 'in progress'",
            &[&doubt.pid, &doubt.xid],
        )
        .await
    };
    match asked.await {
        Ok(_) => {
            tracing::warn!(
                xid = doubt.xid,
                pid = doubt.pid,
                "A transaction whose COMMIT never reached the server held its locks; ended its backend."
            );
            true
        }
        Err(e) => {
            tracing::warn!(xid = doubt.xid, error = %e,
                "Could not end the backend of a transaction whose COMMIT never arrived.");
            false
        }
    }
}

/// Counts and logs how a commit in doubt turned out.
fn settled(doubt: Doubt, outcome: DoubtOutcome) {
    DoubtSettled {
        xid: doubt.xid,
        outcome,
    }
    .emit();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_is_decided_only_once_it_has_ended() {
        assert_eq!(now(Some("committed"), true, false), Now::Committed);
        assert_eq!(now(Some("committed"), false, false), Now::CommittedRunning);
        assert_eq!(now(Some("aborted"), true, false), Now::Aborted);
        assert_eq!(now(Some("in progress"), false, false), Now::Running);
        assert_eq!(
            now(Some("in progress"), false, true),
            Now::CommittedRunning,
            "waiting for its standby: committed, not yet ended"
        );
        assert_eq!(now(None, true, false), Now::Running);
    }
}
