//! A sensor leaving its site on PostgreSQL — moved, deleted, or its site deleted — by
//! [`rules::site_moves`], in the same transaction as the change.
//!
//! The caller holds the delete lock exclusive ([`super::DELETE_LOCK`]), so no group commit
//! holds an event of the sensor meanwhile; the sites' rows are locked here, so a round
//! deciding one is waited for.

use super::super::{NotificationRef, Result};
use super::db::{Sql, Tx};
use super::tables::Tables;
use crate::domain::client;
use crate::domain::silence::Match;
use crate::domain::site::decide::{HeldEvent, Linked, SiteState};
use crate::domain::{Connection, Millis, SensorId};
use crate::store::rules;

/// Takes the delete lock exclusive: group commits in flight end first, and the next wait
/// for this transaction (a sensor's site or existence changes under none of them).
pub(super) async fn lock_commits(tx: &Tx<'_>) -> Result<()> {
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
        &[&super::DELETE_LOCK],
    )
    .await?;
    Ok(())
}

/// `sensor`'s site was `from` and is now what its row says (written already in `tx`)
/// ([`rules::site_moves::moved`]); answers the notifications made, pending.
pub(super) async fn moved(
    tx: &Tx<'_>,
    sensor: SensorId,
    from: Option<&str>,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    rules::site_moves::moved(&mut Tables { tx }, sensor, from, now).await
}

/// `sensor`, of site `site`, is deleted at `now` (its row gone already in `tx`)
/// ([`rules::site_moves::deleted`]).
pub(super) async fn deleted(
    tx: &Tx<'_>,
    sensor: SensorId,
    site: Option<&str>,
    now: Millis,
) -> Result<()> {
    rules::site_moves::deleted(&mut Tables { tx }, sensor, site, now).await
}

impl rules::site_moves::MoveTables for Tables<'_> {
    async fn sensor_clients(&mut self, sensor: SensorId) -> Result<Vec<Linked>> {
        Ok(self
            .tx
            .query(
                "SELECT l.client_id, c.events FROM links l LEFT JOIN clients c \
                 ON c.id = l.client_id WHERE l.sensor_id = $1 ORDER BY l.client_id",
                &[&sensor.to_string()],
            )
            .await?
            .iter()
            .map(|r| Linked {
                client_id: r.get(0),
                events: client::events_from_column(r.get(1)),
                sensors: vec![sensor],
            })
            .collect())
    }

    /// Its row locked.
    async fn site_state(&mut self, id: &str) -> Result<Option<SiteState>> {
        Ok(self
            .tx
            .query_opt(
                "SELECT down, since, pending_since, told, told_clients, released, retold \
                 FROM sites WHERE id = $1 FOR UPDATE",
                &[&id],
            )
            .await?
            .map(|r| super::site_rows::state_of(&r, 0)))
    }

    async fn held_of(&mut self, site: &str, sensor: SensorId) -> Result<Vec<HeldEvent>> {
        Ok(super::site_rounds::held_rows(self.tx, site, Some(sensor))
            .await?
            .0)
    }

    async fn sensor_data(&mut self, sensor: SensorId) -> Result<Option<bool>> {
        Ok(self
            .tx
            .query_opt(
                "SELECT data FROM sensor_state WHERE sensor_id = $1",
                &[&sensor.to_string()],
            )
            .await?
            .and_then(|r| r.get(0)))
    }

    async fn forget_held(&mut self, site: &str, sensor: SensorId) -> Result<()> {
        self.tx
            .execute(
                "DELETE FROM site_held WHERE site_id = $1 AND sensor_id = $2",
                &[&site, &sensor.to_string()],
            )
            .await?;
        Ok(())
    }

    async fn write_moved(&mut self, site: &str, state: &SiteState) -> Result<()> {
        self.tx
            .execute(
                "UPDATE sites SET pending_since = $2, told = $3 WHERE id = $1",
                &[&site, &state.pending_since, &Match::listed(&state.told)],
            )
            .await?;
        Ok(())
    }

    async fn site_now(&mut self, sensor: SensorId) -> Result<Option<(String, bool)>> {
        let row = self
            .tx
            .query_opt(
                "SELECT s.site_id, COALESCE(st.connection, 'unknown') FROM sensors s \
                 LEFT JOIN sensor_state st ON st.sensor_id = s.id WHERE s.id = $1",
                &[&sensor.to_string()],
            )
            .await?;
        Ok(row.and_then(|r| {
            let site: Option<String> = r.get(0);
            Some((site?, Connection::parse(r.get(1)) == Some(Connection::Lost)))
        }))
    }

    async fn sites_with(&mut self, sensor: SensorId) -> Result<Vec<String>> {
        Ok(self
            .tx
            .query(
                "SELECT site_id FROM site_held WHERE sensor_id = $1 \
                 UNION SELECT id FROM sites WHERE down AND strpos(told, ',' || $1 || ',') > 0",
                &[&sensor.to_string()],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn forget_pairs(&mut self, sensor: SensorId) -> Result<()> {
        self.tx
            .execute(
                "DELETE FROM silenced_pairs WHERE sensor_id = $1",
                &[&sensor.to_string()],
            )
            .await?;
        Ok(())
    }
}
