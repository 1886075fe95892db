//! Sensors, clients, the links between them, bulk import, and a client's lifecycle: secret
//! rotation, enabling it again, its endpoint health.

use crate::store::types::filter_sql;
use async_trait::async_trait;

use super::super::rows::{self as row, CLIENT_COLS, SENSOR_COLS};
use super::super::{
    ConnectionCounts, Error, NotificationRef, Page, PageRequest, Result, SensorFilter, SensorView,
    limit_plus_one,
};
use super::DELETE_LOCK;
use super::PgStore;
use super::db::{Sql, Tx};
use crate::domain::armed::Armed;
use crate::domain::client::{HEALTH_WINDOW_MS, Health, events_column};
use crate::domain::escalation::Escalation;
use crate::domain::flap::Flap;
use crate::domain::sensor::SensorAlarms;
use crate::domain::{Client, Millis, Sensor, SensorId};
use crate::store::Registry;
use crate::store::sealing;

/// `domain::notification::delivered`: a 2xx answer, or a broker's acknowledgement (no
/// status, no error).
const DELIVERED: &str =
    "(status_code BETWEEN 200 AND 299 OR (status_code IS NULL AND error IS NULL))";

/// Cancels pending notifications whose `column` is `value`.
async fn cancel_pending(tx: &Tx<'_>, column: &str, value: &str, now: Millis) -> Result<()> {
    tx.execute(
        &super::outbox::unlist(
            "status = 'cancelled', updated_at = $2, lease_until = NULL, claimed_by = NULL",
            &format!(
                "status = 'pending' AND seq IN \
                 (SELECT seq FROM notifications_pending WHERE {column} = $1)"
            ),
        ),
        &[&value, &now],
    )
    .await?;
    Ok(())
}

async fn exists(c: &impl Sql, sql: &str, arg: &str) -> Result<bool> {
    Ok(c.query_opt(sql, &[&arg]).await?.is_some())
}

async fn check_pair(c: &impl Sql, client_id: &str, sensor_id: SensorId) -> Result<()> {
    if !exists(c, "SELECT 1 FROM clients WHERE id = $1", client_id).await? {
        return Err(Error::NotFound("client"));
    }
    if !exists(
        c,
        "SELECT 1 FROM sensors WHERE id = $1",
        &sensor_id.to_string(),
    )
    .await?
    {
        return Err(Error::NotFound("sensor"));
    }
    Ok(())
}

#[async_trait]
impl Registry for PgStore {
    /// Every sensor is inserted with its `hash` by the database's partitioning: the range
    /// scan of its partition finds it there (`cluster::load_partitions`).
    async fn create_sensor(&self, s: Sensor) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&s.id.to_string()));
        let partitioning = self.partitioning().await?;
        let mut c = self.db.get("create_sensor").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                "WITH s AS (INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at, \
                   debounce_s, hash, site_id, battery_low_pct, labels, hold_alarms, flap, armed) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
                   ON CONFLICT (id) DO NOTHING RETURNING id) \
                 INSERT INTO sensor_changes (sensor_id) SELECT id FROM s",
                &[
                    &s.id.to_string(),
                    &s.address,
                    &s.heartbeat_timeout_s.map(|t| t as i32),
                    &s.created_at,
                    &s.debounce_s.map(|t| t as i32),
                    &i64::from(partitioning.hash(s.id)),
                    &s.site_id,
                    &i32::from(s.battery_low_pct),
                    &s.labels.to_column(),
                    &s.hold_alarms.to_column(),
                    &Flap::to_column(s.flap),
                    &Armed::to_column(s.armed.as_ref()),
                ],
            )
            .await?;
        if n == 0 {
            return Err(Error::Conflict(format!(
                "sensor \"{}\" already exists",
                s.id
            )));
        }
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await
    }

    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        let c = self.db.get("get_sensor").await?;
        c.query_opt(
            &format!(
                "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                 ON st.sensor_id = s.id WHERE s.id = $1"
            ),
            &[&id.to_string()],
        )
        .await?
        .as_ref()
        .map(row::sensor_view)
        .transpose()
    }

    async fn first_missing_sensor(&self, ids: Vec<SensorId>) -> Result<Option<SensorId>> {
        let c = self.db.get("first_missing_sensor").await?;
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let missing = c
            .query_opt(
                "SELECT u.x FROM UNNEST($1::text[]) WITH ORDINALITY u(x, o) WHERE NOT EXISTS \
                 (SELECT 1 FROM sensors s WHERE s.id = u.x) ORDER BY u.o LIMIT 1",
                &[&ids],
            )
            .await?;
        missing
            .map(|r| SensorId::parse(r.get(0)))
            .transpose()
            .map_err(|e| Error::Backend(format!("sensor id: {e}")))
    }

    async fn list_sensors(
        &self,
        filter: SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let c = self.db.get("list_sensors").await?;
        let after = page.after.clone().unwrap_or_default();
        let conn_filter = filter.connection.map(|c| c.as_str().to_string());
        let below = filter.battery_below.map(i32::from);
        let rows = c
            .query(
                &format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.id > $1 \
                     AND ($2::text IS NULL OR COALESCE(st.connection, 'unknown') = $2) {} \
                     ORDER BY s.id LIMIT $3",
                    filter_sql(4, |i, t| format!("${i}::{t}"))
                ),
                &[
                    &after,
                    &conn_filter,
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

    /// Sensors with a state row counted by connection; the rest never reported.
    async fn count_sensors(&self) -> Result<ConnectionCounts> {
        let c = self.db.get("count_sensors").await?;
        let total: i64 = c
            .query_one("SELECT COUNT(*) FROM sensors", &[])
            .await?
            .get(0);
        let rows = c.query(crate::store::types::COUNT_SENSORS, &[]).await?;
        Ok(ConnectionCounts::from_rows(
            total,
            rows.iter()
                .map(|r| (r.get(0), r.get(1), [r.get(2), r.get(3), r.get(4)])),
        ))
    }

    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        timeout: Option<u32>,
        debounce: Option<u32>,
        site_id: Option<String>,
        alarms: SensorAlarms,
        now: Millis,
    ) -> Result<Option<(SensorView, Vec<NotificationRef>)>> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("replace_sensor").await?;
        let tx = c.transaction().await?;
        let site_of = async |tx: &super::db::Tx<'_>| -> Result<Option<Option<String>>> {
            Ok(tx
                .query_opt(
                    "SELECT site_id FROM sensors WHERE id = $1",
                    &[&id.to_string()],
                )
                .await?
                .map(|r| r.get(0)))
        };
        let Some(mut from) = site_of(&tx).await? else {
            return Ok(None);
        };
        if from != site_id {
            // A move: no group commit may hold the sensor's events meanwhile.
            super::site_moves::lock_commits(&tx).await?;
            let Some(now_from) = site_of(&tx).await? else {
                return Ok(None);
            };
            from = now_from;
        }
        tx.execute(
            "WITH s AS (UPDATE sensors SET address = $2, heartbeat_timeout_s = $3, \
               debounce_s = $4, site_id = $5, battery_low_pct = $6, labels = $7, \
               hold_alarms = $8, flap = $9, armed = $10 \
               WHERE id = $1 RETURNING id) \
             INSERT INTO sensor_changes (sensor_id) SELECT id FROM s",
            &[
                &id.to_string(),
                &address,
                &timeout.map(|t| t as i32),
                &debounce.map(|t| t as i32),
                &site_id,
                &i32::from(alarms.battery_low_pct),
                &alarms.labels.to_column(),
                &alarms.hold_alarms.to_column(),
                &Flap::to_column(alarms.flap),
                &Armed::to_column(alarms.armed.as_ref()),
            ],
        )
        .await?;
        let made = match from == site_id {
            true => Vec::new(),
            false => super::site_moves::moved(&tx, id, from.as_deref(), now).await?,
        };
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await?;
        drop(c);
        Ok(self.get_sensor(id).await?.map(|v| (v, made)))
    }

    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("delete_sensor").await?;
        let sensor = id;
        let id = id.to_string();
        let tx = c.transaction().await?;
        // Waits for the commits in flight; every statement after it sees their rows.
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
            &[&DELETE_LOCK],
        )
        .await?;
        let site = tx
            .query_opt(
                "DELETE FROM sensors WHERE id = $1 RETURNING site_id",
                &[&id],
            )
            .await?
            .map(|r| r.get::<_, Option<String>>(0));
        let n = u64::from(site.is_some());
        if let Some(site) = &site {
            super::site_moves::deleted(&tx, sensor, site.as_deref(), now).await?;
        }
        if n > 0 {
            for table in ["sensor_state", "links", "readings", "events"] {
                tx.execute(&format!("DELETE FROM {table} WHERE sensor_id = $1"), &[&id])
                    .await?;
            }
            cancel_pending(&tx, "sensor_id", &id, now).await?;
            // Its alarms end with it: a sensor made again under its id starts afresh.
            tx.execute(
                "UPDATE alarms SET state = 'resolved', resolved_at = GREATEST(opened_at, $2) \
                 WHERE sensor_id = $1 AND state <> 'resolved'",
                &[&id, &now],
            )
            .await?;
            tx.execute(
                "INSERT INTO sensor_changes (sensor_id, deleted) VALUES ($1, true)",
                &[&id],
            )
            .await?;
            super::audit::record(&tx, audit.as_ref()).await?;
        }
        tx.commit().await?;
        Ok(n > 0)
    }

    async fn create_client(&self, cl: Client) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&cl.id));
        let mut c = self.db.get("create_client").await?;
        let tx = c.transaction().await?;
        let s = sealing::seal(&self.keys, &super::secrets::current(&tx).await?, &cl)?;
        let n = tx
            .execute(
                "INSERT INTO clients (id, name, url, secret, created_at, rate_limit, events, \
                 batch_max_events, batch_max_wait_ms, url_password, headers, auth, tls, \
                 escalation) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
                 ON CONFLICT (id) DO NOTHING",
                &[
                    &cl.id,
                    &cl.name,
                    &s.url,
                    &s.secret,
                    &cl.created_at,
                    &cl.rate_limit.map(|r| r as i32),
                    &events_column(&cl.events),
                    &cl.batch.map(|b| b.max_events as i32),
                    &cl.batch.map(|b| b.max_wait_ms as i32),
                    &s.url_password,
                    &s.headers,
                    &s.auth,
                    &s.tls,
                    &Escalation::to_column(cl.escalation.as_ref()),
                ],
            )
            .await?;
        if n == 0 {
            return Err(Error::Conflict(format!(
                "client \"{}\" already exists",
                cl.id
            )));
        }
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await
    }

    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        let c = self.db.get("get_client").await?;
        c.query_opt(
            &format!("SELECT {CLIENT_COLS} FROM clients c WHERE c.id = $1"),
            &[&id],
        )
        .await?
        .as_ref()
        .map(row::client)
        .transpose()?
        .map(|cl| self.opened(cl))
        .transpose()
    }

    async fn list_clients(
        &self,
        page: PageRequest,
        disabled: Option<bool>,
    ) -> Result<Page<Client>> {
        let c = self.db.get("list_clients").await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {CLIENT_COLS} FROM clients c WHERE c.id > $1 \
                     AND ($3::bool IS NULL OR (c.disabled_at IS NOT NULL) = $3) \
                     ORDER BY c.id LIMIT $2"
                ),
                &[
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                    &disabled,
                ],
            )
            .await?;
        let rows = rows.iter().map(row::client).collect::<Result<Vec<_>>>()?;
        self.opened_page(Page::from_rows(rows, page.limit, |c| c.id.clone()))
    }

    async fn replace_client(&self, cl: Client) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("replace_client").await?;
        let tx = c.transaction().await?;
        let s = sealing::seal(&self.keys, &super::secrets::current(&tx).await?, &cl)?;
        let n = tx
            .execute(
                "UPDATE clients SET name = $2, url = $3, secret = $4, rate_limit = $5, \
                 events = $6, batch_max_events = $7, batch_max_wait_ms = $8, url_password = $9, \
                 headers = $10, auth = $11, tls = $12, escalation = $13 WHERE id = $1",
                &[
                    &cl.id,
                    &cl.name,
                    &s.url,
                    &s.secret,
                    &cl.rate_limit.map(|r| r as i32),
                    &events_column(&cl.events),
                    &cl.batch.map(|b| b.max_events as i32),
                    &cl.batch.map(|b| b.max_wait_ms as i32),
                    &s.url_password,
                    &s.headers,
                    &s.auth,
                    &s.tls,
                    &Escalation::to_column(cl.escalation.as_ref()),
                ],
            )
            .await?;
        // A client whose settings change (what it takes among them) may be owed what a site
        // down held back from it, once its loss told it: each such site is decided again at
        // the next round (`decide::due`; on a site down `pending_since` asks only that).
        tx.execute(
            "UPDATE sites SET pending_since = COALESCE(pending_since, 0) \
             WHERE down AND strpos(told_clients, ',' || $1 || ',') > 0",
            &[&cl.id],
        )
        .await?;
        super::audit::audited(tx, n, audit.as_ref()).await
    }

    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("delete_client").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute("DELETE FROM clients WHERE id = $1", &[&id])
            .await?;
        // Nobody escalates to a client that is gone (its chain ends where it was).
        tx.execute(
            "UPDATE clients SET escalation = NULL WHERE (escalation::jsonb ->> 'to') = $1",
            &[&id],
        )
        .await?;
        tx.execute("DELETE FROM links WHERE client_id = $1", &[&id])
            .await?;
        cancel_pending(&tx, "client_id", &id, now).await?;
        super::audit::audited(tx, n, audit.as_ref()).await
    }

    /// The old secret moves to `previous_secret` as it is sealed (for the same client, so it
    /// opens there); the new one is sealed under the store's key.
    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        previous_until: Millis,
    ) -> Result<Option<Client>> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("rotate_secret").await?;
        let tx = c.transaction().await?;
        let kid = super::secrets::current(&tx).await?;
        let sealed = self
            .keys
            .seal(&kid, &id, sealing::field::SIGNING, &secret)
            .map_err(|e| super::super::Error::Backend(format!("client {id}: {e}")))?;
        // The right-hand sides read the row as it was, so `previous_secret = secret` keeps the
        // old one.
        let client = tx
            .query_opt(
                &format!(
                    "UPDATE clients c SET previous_secret = c.secret, previous_secret_until = $3, \
                     secret = $2 WHERE c.id = $1 RETURNING {CLIENT_COLS}"
                ),
                &[&id, &sealed, &previous_until],
            )
            .await?
            .as_ref()
            .map(row::client)
            .transpose()?;
        if client.is_some() {
            super::audit::record(&tx, audit.as_ref()).await?;
        }
        tx.commit().await?;
        client.map(|cl| self.opened(cl)).transpose()
    }

    async fn enable_client(&self, id: String) -> Result<Option<bool>> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("enable_client").await?;
        let tx = c.transaction().await?;
        let was = tx
            .query_opt(
                "UPDATE clients c SET disabled_at = NULL, disabled_reason = NULL, \
                 failing_since = NULL FROM clients old WHERE c.id = $1 AND old.id = c.id \
                 RETURNING old.disabled_at IS NOT NULL",
                &[&id],
            )
            .await?;
        let was: Option<bool> = was.map(|r| r.get(0));
        // Enabling one that is not disabled changes nothing: no record.
        super::audit::audited(tx, u64::from(was == Some(true)), audit.as_ref()).await?;
        Ok(was)
    }

    async fn count_disabled_clients(&self) -> Result<u64> {
        let c = self.db.get("count_disabled").await?;
        let n: i64 = c
            .query_one(
                "SELECT COUNT(*) FROM clients WHERE disabled_at IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        Ok(n as u64)
    }

    /// From the client's running summary and its attempts of the last hour (by the index on
    /// client and time): as fast after a year of attempts as after a day.
    async fn client_health(&self, id: String, now: Millis) -> Result<Option<Health>> {
        let c = self.db.get("client_health").await?;
        let Some(r) = c
            .query_opt(
                "SELECT last_success_at, last_failure_at, last_error, failures_since_success \
                 FROM clients WHERE id = $1",
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        let mut h = Health {
            last_success_at: r.get(0),
            last_failure_at: r.get(1),
            last_error: r.get(2),
            consecutive_failures: r.get::<_, i64>(3) as u64,
            ..Health::default()
        };
        let window: Vec<(Millis, bool, u32)> = c
            .query(
                &format!(
                    "SELECT at, COALESCE({DELIVERED}, false), duration_ms FROM attempts \
                     WHERE client_id = $1 AND at >= $2"
                ),
                &[&id, &(now - HEALTH_WINDOW_MS)],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2) as u32))
            .collect();
        h.set_window(&window, now);
        let counts = c
            .query_one(
                "SELECT (SELECT COUNT(*) FROM notifications_pending WHERE client_id = $1), \
                 (SELECT COUNT(*) FROM notifications WHERE client_id = $1 AND status = 'failed')",
                &[&id],
            )
            .await?;
        h.pending = counts.get::<_, i64>(0) as u64;
        h.failed = counts.get::<_, i64>(1) as u64;
        Ok(Some(h))
    }

    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("link").await?;
        let tx = c.transaction().await?;
        check_pair(&tx, &client_id, sensor_id).await?;
        let n = tx
            .execute(
                "INSERT INTO links (client_id, sensor_id, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING",
                &[&client_id, &sensor_id.to_string(), &now],
            )
            .await?;
        super::audit::audited(tx, n, audit.as_ref()).await?;
        Ok(())
    }

    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("unlink").await?;
        let tx = c.transaction().await?;
        check_pair(&tx, &client_id, sensor_id).await?;
        let n = tx
            .execute(
                "DELETE FROM links WHERE client_id = $1 AND sensor_id = $2",
                &[&client_id, &sensor_id.to_string()],
            )
            .await?;
        super::audit::audited(tx, n, audit.as_ref()).await?;
        Ok(())
    }

    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let c = self.db.get("list_client_sensors").await?;
        if !exists(&c, "SELECT 1 FROM clients WHERE id = $1", &client_id).await? {
            return Err(Error::NotFound("client"));
        }
        let rows = c
            .query(
                &format!(
                    "SELECT {SENSOR_COLS} FROM links l JOIN sensors s ON s.id = l.sensor_id \
                     LEFT JOIN sensor_state st ON st.sensor_id = s.id \
                     WHERE l.client_id = $1 AND s.id > $2 ORDER BY s.id LIMIT $3"
                ),
                &[
                    &client_id,
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                ],
            )
            .await?;
        let rows = rows
            .iter()
            .map(row::sensor_view)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
    }

    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        let c = self.db.get("list_sensor_clients").await?;
        let sid = sensor_id.to_string();
        if !exists(&c, "SELECT 1 FROM sensors WHERE id = $1", &sid).await? {
            return Err(Error::NotFound("sensor"));
        }
        let rows = c
            .query(
                &format!(
                    "SELECT {CLIENT_COLS} FROM links l JOIN clients c ON c.id = l.client_id \
                     WHERE l.sensor_id = $1 AND c.id > $2 ORDER BY c.id LIMIT $3"
                ),
                &[
                    &sid,
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                ],
            )
            .await?;
        let rows = rows.iter().map(row::client).collect::<Result<Vec<_>>>()?;
        self.opened_page(Page::from_rows(rows, page.limit, |c| c.id.clone()))
    }

    async fn import(
        &self,
        sensors: Vec<Sensor>,
        links: Vec<(String, SensorId)>,
        now: Millis,
    ) -> Result<()> {
        let partitioning = self.partitioning().await?;
        let mut c = self.db.get("import").await?;
        let tx = c.transaction().await?;
        let ids: Vec<String> = sensors.iter().map(|s| s.id.to_string()).collect();
        let addresses: Vec<&str> = sensors.iter().map(|s| s.address.as_str()).collect();
        let timeouts: Vec<Option<i32>> = sensors
            .iter()
            .map(|s| s.heartbeat_timeout_s.map(|t| t as i32))
            .collect();
        let created: Vec<i64> = sensors.iter().map(|s| s.created_at).collect();
        let debounces: Vec<Option<i32>> = sensors
            .iter()
            .map(|s| s.debounce_s.map(|t| t as i32))
            .collect();
        let hashes: Vec<i64> = sensors
            .iter()
            .map(|s| i64::from(partitioning.hash(s.id)))
            .collect();
        let sites: Vec<Option<&str>> = sensors.iter().map(|s| s.site_id.as_deref()).collect();
        let thresholds: Vec<i32> = sensors
            .iter()
            .map(|s| i32::from(s.battery_low_pct))
            .collect();
        let labels: Vec<Option<String>> = sensors.iter().map(|s| s.labels.to_column()).collect();
        let holds: Vec<Option<String>> =
            sensors.iter().map(|s| s.hold_alarms.to_column()).collect();
        let flaps: Vec<Option<String>> = sensors.iter().map(|s| Flap::to_column(s.flap)).collect();
        let armed: Vec<Option<String>> = sensors
            .iter()
            .map(|s| Armed::to_column(s.armed.as_ref()))
            .collect();
        tx.execute(
            "INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at, debounce_s, \
             hash, site_id, battery_low_pct, labels, hold_alarms, flap, armed) SELECT * FROM \
             UNNEST($1::text[], $2::text[], $3::int4[], $4::int8[], $5::int4[], $6::int8[], \
             $7::text[], $8::int4[], $9::text[], $10::text[], $11::text[], $12::text[]) \
             ON CONFLICT (id) DO NOTHING",
            &[
                &ids,
                &addresses,
                &timeouts,
                &created,
                &debounces,
                &hashes,
                &sites,
                &thresholds,
                &labels,
                &holds,
                &flaps,
                &armed,
            ],
        )
        .await?;
        let clients: Vec<&str> = links.iter().map(|(c, _)| c.as_str()).collect();
        let sensors: Vec<String> = links.iter().map(|(_, s)| s.to_string()).collect();
        tx.execute(
            "INSERT INTO links (client_id, sensor_id, created_at) \
             SELECT u.c, u.s, $3 FROM UNNEST($1::text[], $2::text[]) AS u(c, s) \
             WHERE EXISTS (SELECT 1 FROM clients WHERE id = u.c) \
             AND EXISTS (SELECT 1 FROM sensors WHERE id = u.s) ON CONFLICT DO NOTHING",
            &[&clients, &sensors, &now],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
