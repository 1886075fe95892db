//! Replay: dead letters sent again, one or all of a client's, each judged by the policy
//! (a state older than one its client already has is refused), and the pending
//! notifications a re-enabled client resumes with.

use rusqlite::{Connection, OptionalExtension, params};

use super::super::rows::{self as row, NOTIF_COLS};
use super::super::{Error, NotificationRef, ReplayFilter, Result, notification_ref, retry_refusal};
use super::lifecycle;
use crate::domain::{Millis, Notification, policy};

pub(super) fn retry_notification(
    c: &mut Connection,
    id: String,
    now: Millis,
) -> Result<NotificationRef> {
    let tx = c.transaction()?;
    let n = tx
        .prepare_cached(&format!(
            "SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = ?1"
        ))?
        .query_row([&id], |r| row::notification(r))
        .optional()?
        .ok_or(Error::NotFound("notification"))?;
    if let Some(e) = refused(&tx, &n)? {
        return Err(e);
    }
    back_to_pending(&tx, &id, now)?;
    tx.commit()?;
    Ok(NotificationRef {
        due_at: now,
        attempts: 0,
        batch_id: None,
        ..notification_ref(&n)
    })
}

/// Why a failed notification may not go back to pending ([`retry_refusal`]), reading
/// whether a newer one of its lane that outranks it was sent, or waits to be.
pub(super) fn refused(c: &Connection, n: &Notification) -> Result<Option<Error>> {
    let kinds = policy::outranked_by(n.kind);
    // At most three kinds: the last one repeats where there are fewer.
    let kind = |i: usize| kinds.get(i).unwrap_or(&kinds[kinds.len() - 1]).as_str();
    let newer = c.query_row(
        "SELECT EXISTS (SELECT 1 FROM notifications WHERE client_id = ?1 \
         AND sensor_id = ?2 AND kind IN (?4, ?5, ?6) AND seq > ?3 \
         AND status IN ('pending', 'delivered'))",
        params![
            n.client_id,
            n.sensor_id.to_string(),
            n.seq,
            kind(0),
            kind(1),
            kind(2)
        ],
        |r| r.get::<_, bool>(0),
    )?;
    Ok(retry_refusal(n, newer))
}

/// A retried notification: pending, due now, with a fresh attempt budget.
pub(super) fn back_to_pending(c: &Connection, id: &str, now: Millis) -> Result<()> {
    c.execute(
        "UPDATE notifications SET status = 'pending', attempts = 0, next_attempt_at = ?2, \
         updated_at = ?2, claimed_by = NULL, lease_until = NULL, batch_id = NULL WHERE id = ?1",
        params![id, now],
    )?;
    Ok(())
}

pub(super) fn load_client_pending(
    c: &Connection,
    client_id: String,
) -> Result<Vec<NotificationRef>> {
    let rows = c
        .prepare(&format!(
            "SELECT {NOTIF_COLS} FROM notifications n \
             WHERE n.status = 'pending' AND n.client_id = ?1 ORDER BY n.seq"
        ))?
        .query_map([client_id], |r| row::notification(r))?
        .map(|n| n.map(|n| notification_ref(&n)))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// The bulk replay, in one transaction, oldest first: each one is judged as a single
/// retry would judge it once the older ones went back to pending.
pub(super) fn retry_notifications(
    c: &mut Connection,
    f: ReplayFilter,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let tx = c.transaction()?;
    if !lifecycle::client_exists(&tx, &f.client_id)? {
        return Err(Error::NotFound("client"));
    }
    let failed = tx
        .prepare(&format!(
            "SELECT {NOTIF_COLS} FROM notifications n WHERE n.client_id = ?1 \
             AND n.status = 'failed' AND (?2 IS NULL OR n.sensor_id = ?2) \
             AND (?3 IS NULL OR n.created_at >= ?3) ORDER BY n.seq"
        ))?
        .query_map(
            params![f.client_id, f.sensor_id.map(|s| s.to_string()), f.since],
            |r| row::notification(r),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for n in failed {
        if refused(&tx, &n)?.is_some() {
            continue;
        }
        back_to_pending(&tx, &n.id, now)?;
        out.push(NotificationRef {
            due_at: now,
            attempts: 0,
            batch_id: None,
            ..notification_ref(&n)
        });
    }
    tx.commit()?;
    Ok(out)
}
