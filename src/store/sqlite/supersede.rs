//! The supersede rule's statement (`rules::commit::CommitTables::supersede`), which a
//! commit and a silence's end both apply (book: Supersede).

use rusqlite::{Transaction, params};

use crate::domain::Millis;
use crate::store::Result;
use crate::store::rules::commit::Newer;

/// Supersedes, for each newer state, its lanes' older pending state notifications whose
/// lease is unset or ran out: an attempt in flight is not superseded. "Every lane" is every
/// linked client's: a client reached by an alarm's escalation, not linked, has in its lane
/// only that alarm's news, which no newer state it will never get may overtake.
pub(super) fn older(tx: &Transaction, newer: &[Newer<'_>], now: Millis) -> Result<()> {
    const PENDING_STATES: &str = "UPDATE notifications SET status = 'superseded', \
        updated_at = ?3 WHERE sensor_id = ?1 AND status = 'pending' \
        AND kind = 'sensor.state_changed' AND seq < ?2 \
        AND (lease_until IS NULL OR lease_until < ?3)";
    if newer.is_empty() {
        return Ok(());
    }
    // Prepared once for the batch: a commit supersedes for each sensor whose state changed.
    let mut every_lane = tx.prepare_cached(&format!(
        "{PENDING_STATES} AND EXISTS (SELECT 1 FROM links l \
         WHERE l.client_id = notifications.client_id AND l.sensor_id = notifications.sensor_id)"
    ))?;
    for n in newer {
        let sensor = n.sensor.to_string();
        match n.client {
            None => every_lane.execute(params![sensor, n.seq, now])?,
            Some(client) => tx
                .prepare_cached(&format!("{PENDING_STATES} AND client_id = ?4"))?
                .execute(params![sensor, n.seq, now, client])?,
        };
    }
    Ok(())
}
