//! Replay's two steps, shared by the retry of one dead letter and the bulk replay
//! ([`crate::store::Outbox`] in `outbox.rs`): whether the policy refuses it (a state older
//! than one its client already has), and putting it back to pending.

use super::super::{Error, Result, retry_refusal};
use super::db::Sql;
use crate::domain::{Millis, Notification, policy};

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
