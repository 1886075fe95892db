//! A client's lifecycle: secret rotation, the failure streak that disables it, enabling it
//! again, its endpoint health.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::super::{Outcome, Result};
use crate::domain::client::{Disabled, HEALTH_WINDOW_MS, Health};
use crate::domain::{Millis, policy};

pub(super) fn rotate_secret(
    c: &Connection,
    id: &str,
    secret: String,
    previous_until: Millis,
) -> Result<bool> {
    let n = c.execute(
        "UPDATE clients SET previous_secret = secret, previous_secret_until = ?3, secret = ?2 \
         WHERE id = ?1",
        params![id, secret, previous_until],
    )?;
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

/// The attempts of one client, for the queries below.
const CLIENT_ATTEMPTS: &str =
    "attempts a JOIN notifications n ON n.id = a.notification_id WHERE n.client_id = ?1";
/// `domain::notification::delivered`: a 2xx answer, or a broker's acknowledgement (no
/// status, no error).
const DELIVERED: &str =
    "(a.status_code BETWEEN 200 AND 299 OR (a.status_code IS NULL AND a.error IS NULL))";

pub(super) fn client_health(c: &Connection, id: String, now: Millis) -> Result<Option<Health>> {
    if !client_exists(c, &id)? {
        return Ok(None);
    }
    let mut h = Health {
        last_success_at: c.query_row(
            &format!("SELECT MAX(a.at) FROM {CLIENT_ATTEMPTS} AND {DELIVERED}"),
            [&id],
            |r| r.get(0),
        )?,
        ..Health::default()
    };
    if let Some((at, error)) = c
        .query_row(
            &format!(
                "SELECT a.at, a.error FROM {CLIENT_ATTEMPTS} AND NOT \
                 COALESCE({DELIVERED}, 0) ORDER BY a.at DESC, a.id DESC LIMIT 1"
            ),
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
    {
        h.last_failure_at = Some(at);
        h.last_error = error;
    }
    h.consecutive_failures = c.query_row(
        &format!("SELECT COUNT(*) FROM {CLIENT_ATTEMPTS} AND a.at > ?2"),
        params![id, h.last_success_at.unwrap_or(i64::MIN)],
        |r| r.get(0),
    )?;
    let window = c
        .prepare(&format!(
            "SELECT a.at, COALESCE({DELIVERED}, 0), a.duration_ms FROM {CLIENT_ATTEMPTS} \
             AND a.at >= ?2"
        ))?
        .query_map(params![id, now - HEALTH_WINDOW_MS], |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)? != 0, r.get(2)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    h.set_window(&window, now);
    (h.pending, h.failed) = c.query_row(
        "SELECT COALESCE(SUM(status = 'pending'), 0), COALESCE(SUM(status = 'failed'), 0) \
         FROM notifications WHERE client_id = ?1",
        [&id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(Some(h))
}
