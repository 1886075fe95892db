//! A client's lifecycle: secret rotation, the failure streak that disables it, enabling it
//! again, its endpoint health.

use super::super::rows::{self as row, CLIENT_COLS};
use super::super::{Outcome, Result};
use super::db::{Db, Sql, Tx};
use crate::domain::client::{Disabled, HEALTH_WINDOW_MS, Health};
use crate::domain::{Client, Millis, policy};

/// The old secret moves to `previous_secret` as it is sealed (for the same client, so it
/// opens there); the new one is sealed under the store's key. Answers the client with its
/// values still sealed.
pub(super) async fn rotate_secret(
    db: &Db,
    keys: &crate::secrets::Keyring,
    id: String,
    secret: String,
    previous_until: Millis,
) -> Result<Option<Client>> {
    let mut c = db.get("rotate_secret").await?;
    let tx = c.transaction().await?;
    let kid = super::secrets::current(&tx).await?;
    let sealed = keys
        .seal(&kid, &id, &secret)
        .map_err(|e| super::super::Error::Backend(format!("client {id}: {e}")))?;
    // The right-hand sides read the row as it was, so `previous_secret = secret` keeps the
    // old one.
    let client = tx
        .query_opt(
            &format!(
                "UPDATE clients c SET previous_secret = c.secret, previous_secret_until = $3, \
                 secret = $2 WHERE c.id = $1 RETURNING {CLIENT_COLS}"
            ),
            &[&id, &sealed, &previous_until],
        )
        .await?
        .as_ref()
        .map(row::client)
        .transpose()?;
    tx.commit().await?;
    Ok(client)
}

pub(super) async fn enable_client(db: &Db, id: String) -> Result<Option<bool>> {
    let c = db.get("enable_client").await?;
    let was = c
        .query_opt(
            "UPDATE clients c SET disabled_at = NULL, disabled_reason = NULL, \
             failing_since = NULL FROM clients old WHERE c.id = $1 AND old.id = c.id \
             RETURNING old.disabled_at IS NOT NULL",
            &[&id],
        )
        .await?;
    Ok(was.map(|r| r.get(0)))
}

pub(super) async fn count_disabled(db: &Db) -> Result<u64> {
    let c = db.get("count_disabled").await?;
    let n: i64 = c
        .query_one(
            "SELECT COUNT(*) FROM clients WHERE disabled_at IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    Ok(n as u64)
}

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

/// `domain::notification::delivered`: a 2xx answer, or a broker's acknowledgement (no
/// status, no error).
const DELIVERED: &str =
    "(status_code BETWEEN 200 AND 299 OR (status_code IS NULL AND error IS NULL))";

/// From the client's running summary and its attempts of the last hour (by the index on
/// client and time): as fast after a year of attempts as after a day.
pub(super) async fn client_health(db: &Db, id: String, now: Millis) -> Result<Option<Health>> {
    let c = db.get("client_health").await?;
    let Some(r) = c
        .query_opt(
            "SELECT last_success_at, last_failure_at, last_error, failures_since_success \
             FROM clients WHERE id = $1",
            &[&id],
        )
        .await?
    else {
        return Ok(None);
    };
    let mut h = Health {
        last_success_at: r.get(0),
        last_failure_at: r.get(1),
        last_error: r.get(2),
        consecutive_failures: r.get::<_, i64>(3) as u64,
        ..Health::default()
    };
    let window: Vec<(Millis, bool, u32)> = c
        .query(
            &format!(
                "SELECT at, COALESCE({DELIVERED}, false), duration_ms FROM attempts \
                 WHERE client_id = $1 AND at >= $2"
            ),
            &[&id, &(now - HEALTH_WINDOW_MS)],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2) as u32))
        .collect();
    h.set_window(&window, now);
    let counts = c
        .query_one(
            "SELECT (SELECT COUNT(*) FROM notifications_pending WHERE client_id = $1), \
             (SELECT COUNT(*) FROM notifications WHERE client_id = $1 AND status = 'failed')",
            &[&id],
        )
        .await?;
    h.pending = counts.get::<_, i64>(0) as u64;
    h.failed = counts.get::<_, i64>(1) as u64;
    Ok(Some(h))
}
