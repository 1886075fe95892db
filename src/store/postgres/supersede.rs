//! The supersede rule's statement (`rules::commit::CommitTables::supersede`), which a
//! commit and a silence's end both apply (README: Supersede).

use super::db::{Sql, Tx};
use crate::domain::Millis;
use crate::store::Result;

/// Supersedes, for each `(sensor, client, seq)` (no client: every lane of the sensor), its
/// lanes' older pending state notifications that no attempt holds (leased, by the
/// database's clock: `outbox::claim`).
pub(super) async fn older(
    tx: &Tx<'_>,
    newer: &[(String, Option<String>, i64)],
    now: Millis,
) -> Result<()> {
    if newer.is_empty() {
        return Ok(());
    }
    let sensors: Vec<&str> = newer.iter().map(|n| n.0.as_str()).collect();
    let clients: Vec<Option<&str>> = newer.iter().map(|n| n.1.as_deref()).collect();
    let seqs: Vec<i64> = newer.iter().map(|n| n.2).collect();
    tx.execute(
        &tx.prepare_cached(
            // Per sensor through the list of pending ones (`OFFSET 0` keeps the lookups per
            // sensor: a plain join of the arrays with the outbox scans it), the seqs gathered
            // once, then the rows by seq. As a join with the outbox, a planner without
            // statistics yet (a new table) ran the lookups once per pending row: 3 s for one
            // commit of 500 changes.
            &format!(
                "WITH s AS (UPDATE notifications n SET status = 'superseded', updated_at = $4 \
                 WHERE n.seq = ANY (ARRAY(SELECT p.seq \
                 FROM UNNEST($1::text[], $2::text[], $3::int8[]) AS u(sensor_id, client_id, seq) \
                 CROSS JOIN LATERAL (SELECT q.seq FROM notifications_pending q \
                 WHERE q.sensor_id = u.sensor_id AND q.seq < u.seq \
                 AND (u.client_id IS NULL OR q.client_id = u.client_id) OFFSET 0) p)) \
                 AND n.status = 'pending' AND n.kind = 'sensor.state_changed' \
                 AND (n.lease_until IS NULL OR n.lease_until < {DB_NOW_MS}) RETURNING n.seq) \
                 DELETE FROM notifications_pending WHERE seq IN (SELECT seq FROM s)",
                DB_NOW_MS = super::db::DB_NOW_MS
            ),
        )
        .await?,
        &[
            &sensors as &(dyn tokio_postgres::types::ToSql + Sync),
            &clients,
            &seqs,
            &now,
        ],
    )
    .await?;
    Ok(())
}
