//! A client's failure streak, kept as attempts are recorded, and the policy's disabling of a
//! client whose streak ran too long.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::super::{Outcome, Result};
use crate::domain::client::Disabled;
use crate::domain::{Millis, policy};

/// Whether the client exists.
pub(super) fn client_exists(c: &Connection, id: &str) -> Result<bool> {
    Ok(c.query_row(
        "SELECT EXISTS (SELECT 1 FROM clients WHERE id = ?1)",
        [id],
        |r| r.get(0),
    )?)
}

/// Keeps each client's failure streak from a batch of attempts and disables the clients
/// the policy says to, in the recording transaction. Every statement comes from the
/// connection's cache: this runs with every batch of recorded outcomes, and parsing the
/// streak's update anew each time was ~1.3 % of delivery's CPU (BENCHMARKS.md, #53).
pub(super) fn note_attempts(
    tx: &Transaction,
    outcomes: &[Outcome],
    now: Millis,
    disable_after: Millis,
) -> Result<Vec<Disabled>> {
    let mut disabled = Vec::new();
    for c in policy::client_attempts(outcomes) {
        // The running summary health reads, instead of every attempt the client had.
        let (failed_at, error) = c.last_failure.clone().unzip();
        tx.prepare_cached(
            "UPDATE clients SET last_success_at = COALESCE(?2, last_success_at), \
             failures_since_success = CASE WHEN ?2 IS NULL THEN failures_since_success + ?3 \
               ELSE ?3 END, \
             last_failure_at = COALESCE(?4, last_failure_at), \
             last_error = CASE WHEN ?4 IS NULL THEN last_error ELSE ?5 END WHERE id = ?1",
        )?
        .execute(params![
            c.client_id,
            c.last_success_at,
            c.failures_after,
            failed_at,
            error.flatten()
        ])?;
        let Some(failed_at) = c.failing_since else {
            // Delivered last: the streak ends (a write only when there was one).
            tx.prepare_cached(
                "UPDATE clients SET failing_since = NULL \
                 WHERE id = ?1 AND failing_since IS NOT NULL",
            )?
            .execute([&c.client_id])?;
            continue;
        };
        let found = tx
            .prepare_cached(
                "UPDATE clients SET failing_since = \
                 CASE WHEN ?2 THEN ?3 ELSE COALESCE(failing_since, ?3) END \
                 WHERE id = ?1 AND disabled_at IS NULL RETURNING failing_since",
            )?
            .query_row(params![c.client_id, c.succeeded, failed_at], |r| {
                r.get::<_, Option<i64>>(0)
            })
            .optional()?;
        let Some(failing_since) = found else {
            continue;
        };
        if let Some(reason) = policy::disable_reason(c.gone, failing_since, now, disable_after) {
            tx.execute(
                "UPDATE clients SET disabled_at = ?2, disabled_reason = ?3 WHERE id = ?1",
                params![c.client_id, now, reason.as_str()],
            )?;
            disabled.push(Disabled {
                client_id: c.client_id,
                reason,
            });
        }
    }
    Ok(disabled)
}
