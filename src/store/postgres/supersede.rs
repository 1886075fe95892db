//! The supersede rule's statement (`rules::commit::CommitTables::supersede`), which a
//! commit and a silence's end both apply (book: Supersede).

use super::db::{Sql, Tx};
use crate::domain::Millis;
use crate::store::Result;
use crate::store::rules::commit::Newer;

/// Newer states whose lanes' older pending state notifications are to be superseded, as
/// the columns of the statement's `UNNEST`: gathered by one operation and sent with the
/// next one's statements (a commit), or at once (a silence's end).
#[derive(Debug, Default)]
pub(super) struct Older {
    sensors: Vec<String>,
    /// `None`: every lane of the sensor.
    clients: Vec<Option<String>>,
    seqs: Vec<i64>,
}

impl Older {
    pub(super) fn of(newer: &[Newer<'_>]) -> Self {
        let mut o = Self::default();
        o.add(newer);
        o
    }

    pub(super) fn add(&mut self, newer: &[Newer<'_>]) {
        for n in newer {
            self.sensors.push(n.sensor.to_string());
            self.clients.push(n.client.map(str::to_string));
            self.seqs.push(n.seq);
        }
    }

    /// Supersedes them: the older pending state notifications of their lanes that no
    /// attempt holds (leased, by the database's clock: `outbox::claim`).
    pub(super) async fn send(&self, tx: &Tx<'_>, now: Millis) -> Result<()> {
        if self.seqs.is_empty() {
            return Ok(());
        }
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
                 AND (q.client_id = u.client_id OR (u.client_id IS NULL AND EXISTS (SELECT 1 \
                 FROM links l WHERE l.client_id = q.client_id AND l.sensor_id = q.sensor_id))) \
                 OFFSET 0) p)) \
                 AND n.status = 'pending' AND n.kind = 'sensor.state_changed' \
                 AND (n.lease_until IS NULL OR n.lease_until < {DB_NOW_MS}) RETURNING n.seq) \
                 DELETE FROM notifications_pending WHERE seq IN (SELECT seq FROM s)",
                    DB_NOW_MS = super::db::DB_NOW_MS
                ),
            )
            .await?,
            &[&self.sensors, &self.clients, &self.seqs, &now],
        )
        .await?;
        Ok(())
    }
}
