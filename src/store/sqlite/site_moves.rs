//! A sensor leaving its site on the embedded store — moved, deleted, or its site deleted —
//! by [`rules::site_moves`], in the same transaction as the change.

use rusqlite::{OptionalExtension, Transaction, params};

use super::super::{NotificationRef, Result};
use super::tables::Tables;
use crate::domain::client;
use crate::domain::site::decide::{HeldEvent, Linked, SiteState};
use crate::domain::{Connection, Millis, SensorId};
use crate::store::rules;

/// `sensor`'s site was `from` and is now what its row says (written already in `tx`)
/// ([`rules::site_moves::moved`]); answers the notifications made, pending.
pub(super) fn moved(
    tx: &Transaction,
    sensor: SensorId,
    from: Option<&str>,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    rules::now_or_never(rules::site_moves::moved(
        &mut Tables { tx },
        sensor,
        from,
        now,
    ))
}

/// `sensor`, of site `site`, is deleted at `now` (its row gone already in `tx`)
/// ([`rules::site_moves::deleted`]).
pub(super) fn deleted(
    tx: &Transaction,
    sensor: SensorId,
    site: Option<&str>,
    now: Millis,
) -> Result<()> {
    rules::now_or_never(rules::site_moves::deleted(
        &mut Tables { tx },
        sensor,
        site,
        now,
    ))
}

impl rules::site_moves::MoveTables for Tables<'_> {
    async fn sensor_clients(&mut self, sensor: SensorId) -> Result<Vec<Linked>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT l.client_id, c.events FROM links l LEFT JOIN clients c \
                 ON c.id = l.client_id WHERE l.sensor_id = ?1 ORDER BY l.client_id",
            )?
            .query_map([sensor.to_string()], |r| {
                Ok(Linked {
                    client_id: r.get(0)?,
                    events: client::events_from_column(r.get(1)?),
                    sensors: vec![sensor],
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    async fn site_state(&mut self, id: &str) -> Result<Option<SiteState>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT down, since, pending_since, told, told_clients, released, retold \
                 FROM sites WHERE id = ?1",
            )?
            .query_row([id], |r| super::site_rows::state_of(r, 0))
            .optional()?)
    }

    async fn held_of(&mut self, site: &str, sensor: SensorId) -> Result<Vec<HeldEvent>> {
        Ok(super::site_rounds::held_rows(self.tx, site, Some(sensor))?.0)
    }

    async fn sensor_data(&mut self, sensor: SensorId) -> Result<Option<bool>> {
        Ok(self
            .tx
            .prepare_cached("SELECT data FROM sensor_state WHERE sensor_id = ?1")?
            .query_row([sensor.to_string()], |r| r.get(0))
            .optional()?
            .flatten())
    }

    async fn forget_held(&mut self, site: &str, sensor: SensorId) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM site_held WHERE site_id = ?1 AND sensor_id = ?2")?
            .execute(params![site, sensor.to_string()])?;
        Ok(())
    }

    async fn write_moved(&mut self, site: &str, state: &SiteState) -> Result<()> {
        self.tx
            .prepare_cached("UPDATE sites SET pending_since = ?2, told = ?3 WHERE id = ?1")?
            .execute(params![
                site,
                state.pending_since,
                crate::domain::silence::Match::listed(&state.told)
            ])?;
        Ok(())
    }

    async fn site_now(&mut self, sensor: SensorId) -> Result<Option<(String, bool)>> {
        let row = self
            .tx
            .prepare_cached(
                "SELECT s.site_id, COALESCE(st.connection, 'unknown') FROM sensors s \
                 LEFT JOIN sensor_state st ON st.sensor_id = s.id WHERE s.id = ?1",
            )?
            .query_row([sensor.to_string()], |r| {
                Ok((r.get::<_, Option<String>>(0)?, r.get::<_, String>(1)?))
            })
            .optional()?;
        Ok(row.and_then(|(site, connection)| {
            Some((
                site?,
                Connection::parse(&connection) == Some(Connection::Lost),
            ))
        }))
    }

    async fn sites_with(&mut self, sensor: SensorId) -> Result<Vec<String>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT site_id FROM site_held WHERE sensor_id = ?1 \
                 UNION SELECT id FROM sites WHERE down AND instr(told, ',' || ?1 || ',') > 0",
            )?
            .query_map([sensor.to_string()], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    async fn forget_pairs(&mut self, sensor: SensorId) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM silenced_pairs WHERE sensor_id = ?1")?
            .execute([sensor.to_string()])?;
        Ok(())
    }
}
