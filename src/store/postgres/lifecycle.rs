//! A client's lifecycle: secret rotation, the failure streak that disables it, enabling it
//! again, its endpoint health.

use super::super::rows::{self as row, CLIENT_COLS};
use super::super::{Outcome, Result};
use super::db::{Db, Sql, Tx};
use crate::domain::client::{Disabled, HEALTH_WINDOW_MS, Health};
use crate::domain::{Client, Millis, policy};

pub(super) async fn rotate_secret(
    db: &Db,
    id: String,
    secret: String,
    previous_until: Millis,
) -> Result<Option<Client>> {
    let c = db.get("rotate_secret").await?;
    // The right-hand sides read the row as it was, so `previous_secret = secret` keeps the
    // old one.
    c.query_opt(
        &format!(
            "UPDATE clients c SET previous_secret = c.secret, previous_secret_until = $3, \
             secret = $2 WHERE c.id = $1 RETURNING {CLIENT_COLS}"
        ),
        &[&id, &secret, &previous_until],
    )
    .await?
    .as_ref()
    .map(row::client)
    .transpose()
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

/// The attempts of one client, for the queries below.
const CLIENT_ATTEMPTS: &str =
    "attempts a JOIN notifications n ON n.id = a.notification_id WHERE n.client_id = $1";
/// `domain::notification::delivered`: a 2xx answer, or a broker's acknowledgement (no
/// status, no error).
const DELIVERED: &str =
    "(a.status_code BETWEEN 200 AND 299 OR (a.status_code IS NULL AND a.error IS NULL))";

pub(super) async fn client_health(db: &Db, id: String, now: Millis) -> Result<Option<Health>> {
    let c = db.get("client_health").await?;
    if c.query_opt("SELECT 1 FROM clients WHERE id = $1", &[&id])
        .await?
        .is_none()
    {
        return Ok(None);
    }
    let mut h = Health {
        last_success_at: c
            .query_one(
                &format!("SELECT MAX(a.at) FROM {CLIENT_ATTEMPTS} AND {DELIVERED}"),
                &[&id],
            )
            .await?
            .get(0),
        ..Health::default()
    };
    if let Some(r) = c
        .query_opt(
            &format!(
                "SELECT a.at, a.error FROM {CLIENT_ATTEMPTS} AND NOT \
                 COALESCE({DELIVERED}, false) ORDER BY a.at DESC, a.id DESC LIMIT 1"
            ),
            &[&id],
        )
        .await?
    {
        h.last_failure_at = Some(r.get(0));
        h.last_error = r.get(1);
    }
    let streak: i64 = c
        .query_one(
            &format!("SELECT COUNT(*) FROM {CLIENT_ATTEMPTS} AND a.at > $2"),
            &[&id, &h.last_success_at.unwrap_or(i64::MIN)],
        )
        .await?
        .get(0);
    h.consecutive_failures = streak as u64;
    let window: Vec<(Millis, bool, u32)> = c
        .query(
            &format!(
                "SELECT a.at, COALESCE({DELIVERED}, false), a.duration_ms FROM {CLIENT_ATTEMPTS} \
                 AND a.at >= $2"
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
            "SELECT COUNT(*) FILTER (WHERE status = 'pending'), \
             COUNT(*) FILTER (WHERE status = 'failed') FROM notifications WHERE client_id = $1",
            &[&id],
        )
        .await?;
    h.pending = counts.get::<_, i64>(0) as u64;
    h.failed = counts.get::<_, i64>(1) as u64;
    Ok(Some(h))
}
