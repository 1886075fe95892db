//! A client's failure streak, kept as attempts are recorded, and the policy's disabling of a
//! client whose streak ran too long.

use super::super::{Outcome, Result};
use super::db::{Sql, Tx};
use crate::domain::client::Disabled;
use crate::domain::{Millis, policy};

/// Keeps each client's failure streak from a batch of attempts and disables the clients
/// the policy says to, in the recording transaction.
pub(super) async fn note_attempts(
    tx: &Tx<'_>,
    outcomes: &[Outcome],
    now: Millis,
    disable_after: Millis,
) -> Result<Vec<Disabled>> {
    let mut disabled = Vec::new();
    for c in policy::client_attempts(outcomes) {
        // The running summary health reads, instead of every attempt the client had.
        let (failed_at, error) = c.last_failure.clone().unzip();
        tx.execute(
            "UPDATE clients SET last_success_at = COALESCE($2, last_success_at), \
             failures_since_success = CASE WHEN $2::int8 IS NULL \
               THEN failures_since_success + $3 ELSE $3 END, \
             last_failure_at = COALESCE($4, last_failure_at), \
             last_error = CASE WHEN $4::int8 IS NULL THEN last_error ELSE $5 END WHERE id = $1",
            &[
                &c.client_id,
                &c.last_success_at,
                &(c.failures_after as i64),
                &failed_at,
                &error.flatten(),
            ],
        )
        .await?;
        let Some(failed_at) = c.failing_since else {
            // Delivered last: the streak ends. A write (and a row lock other nodes'
            // recorders would wait for) only when there was one.
            tx.execute(
                "UPDATE clients SET failing_since = NULL \
                 WHERE id = $1 AND failing_since IS NOT NULL",
                &[&c.client_id],
            )
            .await?;
            continue;
        };
        let found = tx
            .query_opt(
                "UPDATE clients SET failing_since = \
                 CASE WHEN $2 THEN $3::int8 ELSE COALESCE(failing_since, $3::int8) END \
                 WHERE id = $1 AND disabled_at IS NULL RETURNING failing_since",
                &[&c.client_id, &c.succeeded, &failed_at],
            )
            .await?;
        let Some(found) = found else { continue };
        let failing_since: Option<i64> = found.get(0);
        if let Some(reason) = policy::disable_reason(c.gone, failing_since, now, disable_after) {
            tx.execute(
                "UPDATE clients SET disabled_at = $2, disabled_reason = $3 WHERE id = $1",
                &[&c.client_id, &now, &reason.as_str()],
            )
            .await?;
            disabled.push(Disabled {
                client_id: c.client_id,
                reason,
            });
        }
    }
    Ok(disabled)
}
