//! A client's lifecycle: secret rotation, the failure streak that disables it, enabling it
//! again, its endpoint health.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::super::{Outcome, Result};
use crate::domain::client::{Disabled, HEALTH_WINDOW_MS, Health};
use crate::domain::{Millis, policy};

/// The old secret moves to `previous_secret` as it is sealed (for the same client, so it
/// opens there); the new one is sealed under the store's key.
pub(super) fn rotate_secret(
    c: &mut Connection,
    keys: &crate::secrets::Keyring,
    id: &str,
    secret: String,
    previous_until: Millis,
) -> Result<bool> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let kid = super::secrets::current(&tx)?;
    let sealed = keys
        .seal(&kid, id, &secret)
        .map_err(|e| super::super::Error::Backend(format!("client {id}: {e}")))?;
    let n = tx.execute(
        "UPDATE clients SET previous_secret = secret, previous_secret_until = ?3, secret = ?2 \
         WHERE id = ?1",
        params![id, sealed, previous_until],
    )?;
    tx.commit()?;
    Ok(n > 0)
}

/// Whether the client exists.
pub(super) fn client_exists(c: &Connection, id: &str) -> Result<bool> {
    Ok(c.query_row(
        "SELECT EXISTS (SELECT 1 FROM clients WHERE id = ?1)",
        [id],
        |r| r.get(0),
    )?)
}

pub(super) fn enable_client(c: &Connection, id: String) -> Result<Option<bool>> {
    let Some(disabled_at) = c
        .query_row(
            "SELECT disabled_at FROM clients WHERE id = ?1",
            [&id],
            |r| r.get::<_, Option<i64>>(0),
        )
        .optional()?
    else {
        return Ok(None);
    };
    c.execute(
        "UPDATE clients SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL \
         WHERE id = ?1",
        [&id],
    )?;
    Ok(Some(disabled_at.is_some()))
}

pub(super) fn count_disabled(c: &Connection) -> Result<u64> {
    Ok(c.query_row(
        "SELECT COUNT(*) FROM clients WHERE disabled_at IS NOT NULL",
        [],
        |r| r.get(0),
    )?)
}

/// Keeps each client's failure streak from a batch of attempts and disables the clients
/// the policy says to, in the recording transaction.
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
            tx.execute(
                "UPDATE clients SET failing_since = NULL \
                 WHERE id = ?1 AND failing_since IS NOT NULL",
                [&c.client_id],
            )?;
            continue;
        };
        let found = tx
            .query_row(
                "UPDATE clients SET failing_since = \
                 CASE WHEN ?2 THEN ?3 ELSE COALESCE(failing_since, ?3) END \
                 WHERE id = ?1 AND disabled_at IS NULL RETURNING failing_since",
                params![c.client_id, c.succeeded, failed_at],
                |r| r.get::<_, Option<i64>>(0),
            )
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

/// `domain::notification::delivered`: a 2xx answer, or a broker's acknowledgement (no
/// status, no error).
const DELIVERED: &str =
    "(status_code BETWEEN 200 AND 299 OR (status_code IS NULL AND error IS NULL))";

/// From the client's running summary and its attempts of the last hour (by the index on
/// client and time): as fast after a year of attempts as after a day.
pub(super) fn client_health(c: &Connection, id: String, now: Millis) -> Result<Option<Health>> {
    let Some(mut h) = c
        .query_row(
            "SELECT last_success_at, last_failure_at, last_error, failures_since_success \
             FROM clients WHERE id = ?1",
            [&id],
            |r| {
                Ok(Health {
                    last_success_at: r.get(0)?,
                    last_failure_at: r.get(1)?,
                    last_error: r.get(2)?,
                    consecutive_failures: r.get(3)?,
                    ..Health::default()
                })
            },
        )
        .optional()?
    else {
        return Ok(None);
    };
    let window = c
        .prepare_cached(&format!(
            "SELECT at, COALESCE({DELIVERED}, 0), duration_ms FROM attempts \
             WHERE client_id = ?1 AND at >= ?2"
        ))?
        .query_map(params![id, now - HEALTH_WINDOW_MS], |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)? != 0, r.get(2)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    h.set_window(&window, now);
    (h.pending, h.failed) = c.query_row(
        "SELECT (SELECT COUNT(*) FROM notifications WHERE client_id = ?1 AND status = 'pending'), \
         (SELECT COUNT(*) FROM notifications WHERE client_id = ?1 AND status = 'failed')",
        [&id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(Some(h))
}
