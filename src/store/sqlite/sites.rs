//! Sites, each read with its sensors counted by connection.

use crate::store::types::filter_sql;
use async_trait::async_trait;
use rusqlite::{OptionalExtension, Row, params};

use super::super::rows::{self as row, SENSOR_COLS, SITE_TOTALS};
use super::super::{
    Decided, Error, NotificationRef, Page, PageRequest, Result, SensorView, Sites, limit_plus_one,
};
use super::SqliteStore;
use crate::domain::site::decide::Rules;
use crate::domain::site::{Site, SiteCounts, SiteTotals};
use crate::domain::{Millis, SensorId};
use crate::store::SensorFilter;

/// A site and its counts, over `sites si`: [`site`].
const SITE_COLS: &str = "si.id, si.name, si.address, si.gateway_sensor_id, si.created_at, \
     si.updated_at, \
     (SELECT COUNT(*) FROM sensors s WHERE s.site_id = si.id), \
     (SELECT COUNT(*) FROM sensors s JOIN sensor_state st ON st.sensor_id = s.id \
      WHERE s.site_id = si.id AND st.connection = 'lost'), \
     COALESCE((SELECT st.connection = 'lost' FROM sensor_state st \
      WHERE st.sensor_id = si.gateway_sensor_id), 0), si.down, si.since";

fn site(r: &Row) -> rusqlite::Result<(Site, SiteCounts)> {
    let gateway: Option<String> = r.get(3)?;
    Ok((
        Site {
            id: r.get(0)?,
            name: r.get(1)?,
            address: r.get(2)?,
            gateway_sensor_id: gateway.and_then(|g| SensorId::parse(&g).ok()),
            created_at: r.get(4)?,
            updated_at: r.get(5)?,
        },
        SiteCounts {
            sensors: r.get::<_, i64>(6)? as u64,
            lost: r.get::<_, i64>(7)? as u64,
            gateway_lost: r.get(8)?,
            down: r.get(9)?,
            since: r.get(10)?,
        },
    ))
}

#[async_trait]
impl Sites for SqliteStore {
    async fn create_site(&self, s: Site) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&s.id));
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "INSERT INTO sites (id, name, address, gateway_sensor_id, created_at, \
                 updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (id) DO NOTHING",
                params![
                    s.id,
                    s.name,
                    s.address,
                    s.gateway_sensor_id.map(|g| g.to_string()),
                    s.created_at,
                    s.updated_at
                ],
            )?;
            if n == 0 {
                return Err(Error::Conflict(format!("site {} already exists", s.id)));
            }
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn get_site(&self, id: String) -> Result<Option<(Site, SiteCounts)>> {
        self.read(move |c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {SITE_COLS} FROM sites si WHERE si.id = ?1"
            ))?
            .query_row([&id], site)
            .optional()?)
        })
        .await
    }

    async fn list_sites(
        &self,
        down: Option<bool>,
        page: PageRequest,
    ) -> Result<Page<(Site, SiteCounts)>> {
        self.read(move |c| {
            let rows = c
                .prepare_cached(&format!(
                    "SELECT {SITE_COLS} FROM sites si WHERE si.id > ?1 \
                     AND (?3 IS NULL OR si.down = ?3) ORDER BY si.id LIMIT ?2"
                ))?
                .query_map(
                    params![
                        page.after.clone().unwrap_or_default(),
                        limit_plus_one(&page),
                        down
                    ],
                    site,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.clone()))
        })
        .await
    }

    async fn site_sensors(
        &self,
        site_id: String,
        filter: SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        // Last seen as the sensor list shows it: the times kept in memory.
        self.read_seen(move |c, seen| {
            let mut rows = c
                .prepare_cached(&format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.site_id = ?1 AND s.id > ?2 \
                     AND (?3 = '' OR COALESCE(st.connection, 'unknown') = ?3) {} \
                     ORDER BY s.id LIMIT ?4",
                    filter_sql(5, |i, _| format!("?{i}"))
                ))?
                .query_map(
                    params![
                        site_id,
                        page.after.clone().unwrap_or_default(),
                        filter.connection.map(|c| c.as_str()).unwrap_or(""),
                        limit_plus_one(&page),
                        filter.battery_below,
                        filter.tamper,
                        filter.held,
                        filter.flapping,
                        filter.battery_low
                    ],
                    |r| row::sensor_view(r),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            seen.patch_views(&mut rows);
            Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
        })
        .await
    }

    async fn site_totals(&self) -> Result<SiteTotals> {
        self.read(move |c| {
            Ok(c.prepare_cached(SITE_TOTALS)?.query_row([], |r| {
                Ok(SiteTotals {
                    down: r.get::<_, i64>(0)? as u64,
                    held: r.get::<_, i64>(1)? as u64,
                    oldest_grace: r.get(2)?,
                })
            })?)
        })
        .await
    }

    async fn replace_site(&self, s: Site) -> Result<bool> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "UPDATE sites SET name = ?2, address = ?3, gateway_sensor_id = ?4, \
                 updated_at = ?5, pending_since = CASE \
                   WHEN gateway_sensor_id IS ?4 THEN pending_since WHEN down THEN ?5 \
                   WHEN COALESCE((SELECT st.connection = 'lost' FROM sensor_state st \
                     WHERE st.sensor_id = ?4), 0) THEN COALESCE(pending_since, ?5) \
                   ELSE pending_since END \
                 WHERE id = ?1",
                params![
                    s.id,
                    s.name,
                    s.address,
                    s.gateway_sensor_id.map(|g| g.to_string()),
                    s.updated_at
                ],
            )?;
            if n > 0 {
                super::audit::record(&tx, audit.as_ref())?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    async fn delete_site(&self, id: String, now: Millis) -> Result<Option<Vec<NotificationRef>>> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let members = tx
                .prepare_cached("SELECT id FROM sensors WHERE site_id = ?1 ORDER BY id")?
                .query_map([&id], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            tx.execute(
                "UPDATE sensors SET site_id = NULL WHERE site_id = ?1",
                [&id],
            )?;
            let mut made = Vec::new();
            for m in members {
                let sensor = SensorId::parse(&m)
                    .map_err(|e| Error::Backend(format!("stored sensor id: {e}")))?;
                made.extend(super::site_moves::moved(&tx, sensor, Some(&id), now)?);
            }
            // What no member's leave took (rows of a kind this version does not know).
            tx.execute("DELETE FROM site_held WHERE site_id = ?1", [&id])?;
            let n = tx.execute("DELETE FROM sites WHERE id = ?1", [&id])?;
            // Its alarm ends with it.
            tx.execute(
                "UPDATE alarms SET state = 'resolved', resolved_at = MAX(opened_at, ?2) \
                 WHERE site_id = ?1 AND state <> 'resolved'",
                rusqlite::params![&id, now],
            )?;
            if n > 0 {
                super::audit::record(&tx, audit.as_ref())?;
            }
            tx.commit()?;
            Ok((n > 0).then_some(made))
        })
        .await
    }

    async fn decide_sites(&self, rules: Rules, now: Millis) -> Result<Decided> {
        // Looked for on a reader first: a round every second must not write (an empty
        // write would also end a full disk's episode in the store's eyes).
        let since = now - rules.grace;
        let due: bool = self
            .read(move |c| {
                Ok(c.prepare_cached(&format!(
                    "SELECT EXISTS (SELECT 1 FROM sites WHERE {})",
                    super::site_rounds::DUE
                ))?
                .query_row([since], |r| r.get(0))?)
            })
            .await?;
        if !due {
            return Ok(Decided::default());
        }
        // Its SQL reads the sensors' `last_seen_at`: the kept times are written first.
        let seen = self.inner.seen.clone();
        self.write(move |c| {
            super::seen::flushed(&seen, c, |tx| {
                super::site_rounds::decide_sites(tx, rules, now)
            })
        })
        .await
    }
}
