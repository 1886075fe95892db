//! Replay: dead letters sent again, one or all of a client's, each judged by the policy
//! (a state older than one its client already has is refused), and the pending
//! notifications a re-enabled client resumes with.

use super::super::rows::{self as row, NOTIF_COLS};
use super::super::{Error, NotificationRef, ReplayFilter, Result, notification_ref, retry_refusal};
use super::db::{Bound, Db, Sql};
use crate::domain::{Millis, Notification, policy};

pub(super) async fn retry_notification(
    db: &Db,
    id: String,
    now: Millis,
) -> Result<NotificationRef> {
    let mut c = db.get("retry_notification").await?;
    let tx = c.transaction().await?;
    let found = tx
        .query_opt(
            &format!("SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = $1 FOR UPDATE"),
            &[&id],
        )
        .await?
        .ok_or(Error::NotFound("notification"))?;
    let n = row::notification(&found)?;
    if let Some(e) = refused(&tx, &n).await? {
        return Err(e);
    }
    back_to_pending(&tx, &id, now).await?;
    tx.commit().await?;
    Ok(NotificationRef {
        due_at: now,
        attempts: 0,
        batch_id: None,
        ..notification_ref(&n)
    })
}

/// Why a failed notification may not go back to pending ([`retry_refusal`]), reading
/// whether a newer one of its lane that outranks it was sent, or waits to be.
pub(super) async fn refused(c: &impl Sql, n: &Notification) -> Result<Option<Error>> {
    let kinds: Vec<&str> = policy::outranked_by(n.kind)
        .iter()
        .map(|k| k.as_str())
        .collect();
    let newer = c
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM notifications WHERE client_id = $1 \
             AND sensor_id = $2 AND kind = ANY($4) AND seq > $3 \
             AND status IN ('pending', 'delivered'))",
            &[&n.client_id, &n.sensor_id.to_string(), &n.seq, &kinds],
        )
        .await?
        .get::<_, bool>(0);
    Ok(retry_refusal(n, newer))
}

/// A retried notification: pending (and listed so), due now, with a fresh attempt budget.
pub(super) async fn back_to_pending(c: &impl Sql, id: &str, now: Millis) -> Result<()> {
    c.execute(
        "WITH b AS (UPDATE notifications SET status = 'pending', attempts = 0, \
         next_attempt_at = $2, updated_at = $2, claimed_by = NULL, lease_until = NULL, \
         batch_id = NULL WHERE id = $1 RETURNING seq, sensor_id, client_id) \
         INSERT INTO notifications_pending (seq, sensor_id, client_id) \
         SELECT seq, sensor_id, client_id FROM b ON CONFLICT (seq) DO NOTHING",
        &[&id, &now],
    )
    .await?;
    Ok(())
}

pub(super) async fn load_client_pending(
    db: &Db,
    client_id: String,
) -> Result<Vec<NotificationRef>> {
    let c = db.get_for("load_client_pending", Bound::Bulk).await?;
    c.query(
        &format!(
            "SELECT {NOTIF_COLS} FROM notifications_pending p \
             JOIN notifications n ON n.seq = p.seq \
             WHERE n.status = 'pending' AND p.client_id = $1 ORDER BY p.seq"
        ),
        &[&client_id],
    )
    .await?
    .iter()
    .map(|r| row::notification(r).map(|n| notification_ref(&n)))
    .collect()
}

/// The bulk replay, in one transaction, oldest first: each one is judged as a single
/// retry would judge it once the older ones went back to pending.
pub(super) async fn retry_notifications(
    db: &Db,
    f: ReplayFilter,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let mut c = db.get_for("retry_notifications", Bound::Bulk).await?;
    let tx = c.transaction().await?;
    if tx
        .query_opt("SELECT 1 FROM clients WHERE id = $1", &[&f.client_id])
        .await?
        .is_none()
    {
        return Err(Error::NotFound("client"));
    }
    let failed = tx
        .query(
            &format!(
                "SELECT {NOTIF_COLS} FROM notifications n WHERE n.client_id = $1 \
                 AND n.status = 'failed' AND ($2::text IS NULL OR n.sensor_id = $2) \
                 AND ($3::int8 IS NULL OR n.created_at >= $3) ORDER BY n.seq FOR UPDATE"
            ),
            &[&f.client_id, &f.sensor_id.map(|s| s.to_string()), &f.since],
        )
        .await?
        .iter()
        .map(row::notification)
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for n in failed {
        if refused(&tx, &n).await?.is_some() {
            continue;
        }
        back_to_pending(&tx, &n.id, now).await?;
        out.push(NotificationRef {
            due_at: now,
            attempts: 0,
            batch_id: None,
            ..notification_ref(&n)
        });
    }
    tx.commit().await?;
    Ok(out)
}
