//! Replay's two steps, shared by the retry of one dead letter and the bulk replay
//! ([`crate::store::Outbox`] in `outbox.rs`): whether the policy refuses it (a state older
//! than one its client already has), and putting it back to pending.

use rusqlite::{Connection, params};

use super::super::{Error, Result, retry_refusal};
use crate::domain::{Millis, Notification, policy};

/// Why a failed notification may not go back to pending ([`retry_refusal`]), reading
/// whether a newer one of its lane that outranks it was sent, or waits to be.
pub(super) fn refused(c: &Connection, n: &Notification) -> Result<Option<Error>> {
    let kinds = policy::outranked_by(n.kind);
    if kinds.is_empty() {
        return Ok(retry_refusal(n, false));
    }
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
