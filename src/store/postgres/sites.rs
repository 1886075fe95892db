//! Sites, each read with its sensors counted by connection.

use crate::store::types::filter_sql;
use async_trait::async_trait;
use tokio_postgres::Row;

use super::super::rows::{self as row, SENSOR_COLS, SITE_TOTALS};
use super::super::{
    Decided, Error, NotificationRef, Page, PageRequest, Result, SensorView, Sites, limit_plus_one,
};
use super::PgStore;
use super::db::Sql;
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
      WHERE st.sensor_id = si.gateway_sensor_id), false), si.down, si.since";

fn site(r: &Row) -> (Site, SiteCounts) {
    let gateway: Option<String> = r.get(3);
    (
        Site {
            id: r.get(0),
            name: r.get(1),
            address: r.get(2),
            gateway_sensor_id: gateway.and_then(|g| SensorId::parse(&g).ok()),
            created_at: r.get(4),
            updated_at: r.get(5),
        },
        SiteCounts {
            sensors: r.get::<_, i64>(6) as u64,
            lost: r.get::<_, i64>(7) as u64,
            gateway_lost: r.get(8),
            down: r.get(9),
            since: r.get(10),
        },
    )
}

#[async_trait]
impl Sites for PgStore {
    async fn create_site(&self, s: Site) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&s.id));
        let mut c = self.db.get("create_site").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                "INSERT INTO sites (id, name, address, gateway_sensor_id, created_at, \
                 updated_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                &[
                    &s.id,
                    &s.name,
                    &s.address,
                    &s.gateway_sensor_id.map(|g| g.to_string()),
                    &s.created_at,
                    &s.updated_at,
                ],
            )
            .await?;
        if n == 0 {
            return Err(Error::Conflict(format!("site {} already exists", s.id)));
        }
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await
    }

    async fn get_site(&self, id: String) -> Result<Option<(Site, SiteCounts)>> {
        let c = self.db.get("get_site").await?;
        let row = c
            .query_opt(
                &format!("SELECT {SITE_COLS} FROM sites si WHERE si.id = $1"),
                &[&id],
            )
            .await?;
        Ok(row.as_ref().map(site))
    }

    async fn list_sites(
        &self,
        down: Option<bool>,
        page: PageRequest,
    ) -> Result<Page<(Site, SiteCounts)>> {
        let c = self.db.get("list_sites").await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {SITE_COLS} FROM sites si WHERE si.id > $1 \
                     AND ($3::bool IS NULL OR si.down = $3) ORDER BY si.id LIMIT $2"
                ),
                &[
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                    &down,
                ],
            )
            .await?;
        let rows = rows.iter().map(site).collect();
        Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.clone()))
    }

    async fn site_sensors(
        &self,
        site_id: String,
        filter: SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let c = self.db.get("site_sensors").await?;
        let below = filter.battery_below.map(i32::from);
        let rows = c
            .query(
                &format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.site_id = $1 AND s.id > $2 \
                     AND ($3::text IS NULL OR COALESCE(st.connection, 'unknown') = $3) {} \
                     ORDER BY s.id LIMIT $4",
                    filter_sql(5, |i, t| format!("${i}::{t}"))
                ),
                &[
                    &site_id,
                    &page.after.clone().unwrap_or_default(),
                    &filter.connection.map(|c| c.as_str().to_string()),
                    &limit_plus_one(&page),
                    &below,
                    &filter.tamper,
                    &filter.held,
                    &filter.flapping,
                    &filter.battery_low,
                ],
            )
            .await?;
        let rows = rows
            .iter()
            .map(row::sensor_view)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
    }

    async fn site_totals(&self) -> Result<SiteTotals> {
        let c = self.db.get("site_totals").await?;
        let r = c.query_one(SITE_TOTALS, &[]).await?;
        Ok(SiteTotals {
            down: r.get::<_, i64>(0) as u64,
            held: r.get::<_, i64>(1) as u64,
            oldest_grace: r.get(2),
        })
    }

    async fn replace_site(&self, s: Site) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("replace_site").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                "UPDATE sites SET name = $2, address = $3, gateway_sensor_id = $4, \
                 updated_at = $5, pending_since = CASE \
                   WHEN gateway_sensor_id IS NOT DISTINCT FROM $4 THEN pending_since \
                   WHEN down THEN $5 \
                   WHEN COALESCE((SELECT st.connection = 'lost' FROM sensor_state st \
                     WHERE st.sensor_id = $4), false) THEN COALESCE(pending_since, $5) \
                   ELSE pending_since END \
                 WHERE id = $1",
                &[
                    &s.id,
                    &s.name,
                    &s.address,
                    &s.gateway_sensor_id.map(|g| g.to_string()),
                    &s.updated_at,
                ],
            )
            .await?;
        super::audit::audited(tx, n, audit.as_ref()).await
    }

    async fn delete_site(&self, id: String, now: Millis) -> Result<Option<Vec<NotificationRef>>> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("delete_site").await?;
        let tx = c.transaction().await?;
        // Its sensors leave it: no group commit may hold their events meanwhile.
        super::site_moves::lock_commits(&tx).await?;
        let members: Vec<String> = tx
            .query(
                "WITH m AS (UPDATE sensors SET site_id = NULL WHERE site_id = $1 RETURNING id) \
                 SELECT id FROM m ORDER BY id",
                &[&id],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut made = Vec::new();
        for m in members {
            let sensor = SensorId::parse(&m)
                .map_err(|e| Error::Backend(format!("stored sensor id: {e}")))?;
            made.extend(super::site_moves::moved(&tx, sensor, Some(&id), now).await?);
        }
        // What no member's leave took (rows of a kind this version does not know).
        tx.execute("DELETE FROM site_held WHERE site_id = $1", &[&id])
            .await?;
        let n = tx
            .execute("DELETE FROM sites WHERE id = $1", &[&id])
            .await?;
        // Its alarm ends with it.
        tx.execute(
            "UPDATE alarms SET state = 'resolved', resolved_at = GREATEST(opened_at, $2) \
             WHERE site_id = $1 AND state <> 'resolved'",
            &[&id, &now],
        )
        .await?;
        if n > 0 {
            super::audit::record(&tx, audit.as_ref()).await?;
        }
        tx.commit().await?;
        Ok((n > 0).then_some(made))
    }

    async fn decide_sites(&self, rules: Rules, now: Millis) -> Result<Decided> {
        let c = self.db.get("decide_sites").await?;
        // A round every second on every node: no transaction when nothing is due.
        let due: bool = c
            .query_one(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM sites WHERE {})",
                    super::site_rounds::DUE
                ),
                &[&(now - rules.grace)],
            )
            .await?
            .get(0);
        if !due {
            return Ok(Decided::default());
        }
        drop(c);
        // Every due site, a few per transaction (`SITES_PER_TX`), each with its own
        // deadline. A transaction that fails is tried again one site at a time, so that a
        // site that fails whatever is tried is passed (the next round tries it again) and
        // the sites after it are decided all the same.
        let mut decided = Decided::default();
        let mut after = String::new();
        let chunk = super::site_rounds::SITES_PER_TX;
        // Sites still to take one at a time after a chunk failed: as many as it held, so
        // that the failing one is not taken again in a chunk this call.
        let mut singles = 0;
        let mut failed: Option<Error> = None;
        loop {
            let step = async {
                let mut c = self.db.get("decide_sites").await?;
                let tx = c.transaction().await?;
                let per_tx = if singles > 0 { 1 } else { chunk };
                let step =
                    super::site_rounds::decide_sites(&tx, rules, now, &after, per_tx).await?;
                tx.commit().await?;
                Ok::<_, Error>(step)
            };
            match step.await {
                Ok((d, last)) => {
                    decided.made.extend(d.made);
                    decided.changed.extend(d.changed);
                    singles = (singles - 1).max(0);
                    match last {
                        Some(last) => after = last,
                        None => break,
                    }
                }
                Err(e) => {
                    decided.in_doubt |= e.maybe_written();
                    if singles == 0 {
                        // Again, one site at a time, to find the one that fails.
                        singles = chunk;
                    } else if let Ok(Some(site)) = self.next_due_site(rules, now, &after).await {
                        tracing::warn!(site = %site, error = %e,
                            "Could not decide a site; the next round tries it again.");
                        after = site;
                        singles -= 1;
                    } else {
                        failed.get_or_insert(e);
                        break;
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if decided.is_empty() && !decided.in_doubt => Err(e),
            Some(e) => {
                tracing::warn!(error = %e, "Could not decide some of the due sites.");
                Ok(decided)
            }
            None => Ok(decided),
        }
    }
}

impl PgStore {
    /// The first site after `after` (by id) that a round would decide.
    async fn next_due_site(
        &self,
        rules: Rules,
        now: Millis,
        after: &str,
    ) -> Result<Option<String>> {
        let c = self.db.get("decide_sites").await?;
        let row = c
            .query_opt(
                &format!(
                    "SELECT id FROM sites WHERE ({}) AND id > $2 ORDER BY id LIMIT 1",
                    super::site_rounds::DUE
                ),
                &[&(now - rules.grace), &after],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }
}
