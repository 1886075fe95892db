//! Sensors, clients, the links between them, bulk import, and a client's lifecycle: secret
//! rotation, enabling it again, its endpoint health.

use crate::store::types::filter_sql;
use async_trait::async_trait;

use super::SqliteStore;
use crate::domain::client::{HEALTH_WINDOW_MS, Health, events_column};
use crate::store::Registry;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::super::rows::{self as row, CLIENT_COLS, SENSOR_COLS};
use super::super::{
    ConnectionCounts, Error, NotificationRef, Page, PageRequest, Result, SensorFilter, SensorView,
    limit_plus_one,
};
use crate::domain::armed::Armed;
use crate::domain::escalation::Escalation;
use crate::domain::flap::Flap;
use crate::domain::sensor::SensorAlarms;
use crate::domain::{Client, Millis, Sensor, SensorId};
use crate::store::sealing;

/// `domain::notification::delivered`: a 2xx answer, or a broker's acknowledgement (no
/// status, no error).
const DELIVERED: &str =
    "(status_code BETWEEN 200 AND 299 OR (status_code IS NULL AND error IS NULL))";

/// A client whose settings change (what it takes among them) may be owed what a site down
/// held back from it, once its loss told it: each such site is decided again at the next
/// round (`decide::due`; on a site down `pending_since` asks only that, whatever its time).
const SITES_TELLING_IT: &str = "UPDATE sites SET pending_since = COALESCE(pending_since, 0) \
     WHERE down AND instr(told_clients, ',' || ?1 || ',') > 0";

/// Cancels pending notifications matching `cond` (a WHERE fragment over `notifications`).
fn cancel_pending(tx: &Transaction, cond: &str, arg: &str, now: Millis) -> rusqlite::Result<usize> {
    tx.execute(
        &format!(
            "UPDATE notifications SET status = 'cancelled', updated_at = ?2, lease_until = NULL, \
             claimed_by = NULL WHERE status = 'pending' AND {cond} = ?1"
        ),
        params![arg, now],
    )
}

fn exists(c: &Connection, sql: &str, arg: &str) -> Result<bool> {
    Ok(c.prepare_cached(sql)?.exists([arg])?)
}

fn check_pair(tx: &Transaction, client_id: &str, sensor_id: SensorId) -> Result<()> {
    if !exists(tx, "SELECT 1 FROM clients WHERE id = ?1", client_id)? {
        return Err(Error::NotFound("client"));
    }
    if !exists(
        tx,
        "SELECT 1 FROM sensors WHERE id = ?1",
        &sensor_id.to_string(),
    )? {
        return Err(Error::NotFound("sensor"));
    }
    Ok(())
}

#[async_trait]
impl Registry for SqliteStore {
    /// `Conflict` if the id exists.
    async fn create_sensor(&self, s: Sensor) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&s.id.to_string()));
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at, debounce_s, \
                 site_id, battery_low_pct, labels, hold_alarms, flap, armed) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
                 ON CONFLICT (id) DO NOTHING",
                params![
                    s.id.to_string(),
                    s.address,
                    s.heartbeat_timeout_s,
                    s.created_at,
                    s.debounce_s,
                    s.site_id,
                    s.battery_low_pct,
                    s.labels.to_column(),
                    s.hold_alarms.to_column(),
                    Flap::to_column(s.flap),
                    Armed::to_column(s.armed.as_ref())
                ],
            )?;
            if n == 0 {
                return Err(Error::Conflict(format!(
                    "sensor \"{}\" already exists",
                    s.id
                )));
            }
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        self.read_seen(move |c, seen| {
            let mut view = c
                .prepare_cached(&format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.id = ?1"
                ))?
                .query_row([id.to_string()], |r| row::sensor_view(r))
                .optional()?;
            seen.patch_views(view.as_mut_slice());
            Ok(view)
        })
        .await
    }

    async fn first_missing_sensor(&self, ids: Vec<SensorId>) -> Result<Option<SensorId>> {
        let ids = serde_json::to_string(&ids.iter().map(|i| i.to_string()).collect::<Vec<_>>())
            .expect("strings serialize");
        self.read(move |c| {
            let missing: Option<String> = c
                .prepare_cached(
                    "SELECT j.value FROM json_each(?1) j WHERE NOT EXISTS \
                     (SELECT 1 FROM sensors s WHERE s.id = j.value) ORDER BY j.key LIMIT 1",
                )?
                .query_row([ids], |r| r.get(0))
                .optional()?;
            missing
                .map(|m| SensorId::parse(&m))
                .transpose()
                .map_err(|e| super::super::Error::Backend(format!("sensor id: {e}")))
        })
        .await
    }

    async fn list_sensors(
        &self,
        filter: SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.read_seen(move |c, seen| {
            let after = page.after.clone().unwrap_or_default();
            let conn_filter = filter.connection.map(|c| c.as_str()).unwrap_or("");
            let mut rows = c
                .prepare_cached(&format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.id > ?1 \
                     AND (?2 = '' OR COALESCE(st.connection, 'unknown') = ?2) {} \
                     ORDER BY s.id LIMIT ?3",
                    filter_sql(4, |i, _| format!("?{i}"))
                ))?
                .query_map(
                    params![
                        after,
                        conn_filter,
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

    /// Sensors with a state row counted by connection; the rest never reported. A sensor's
    /// state row goes with it (`delete_sensor`), so the two counts add up.
    async fn count_sensors(&self) -> Result<ConnectionCounts> {
        self.read(move |c| {
            let total: i64 = c.query_row("SELECT COUNT(*) FROM sensors", [], |r| r.get(0))?;
            let mut stmt = c.prepare_cached(crate::store::types::COUNT_SENSORS)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get(0)?, r.get(1)?, [r.get(2)?, r.get(3)?, r.get(4)?]))
                })?
                .collect::<rusqlite::Result<Vec<(String, i64, [i64; 3])>>>()?;
            Ok(ConnectionCounts::from_rows(total, rows))
        })
        .await
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
        let made = self
            .write(move |c| {
                let tx = c.transaction()?;
                let Some(from) = tx
                    .prepare_cached("SELECT site_id FROM sensors WHERE id = ?1")?
                    .query_row([id.to_string()], |r| r.get::<_, Option<String>>(0))
                    .optional()?
                else {
                    return Ok(None);
                };
                tx.execute(
                    "UPDATE sensors SET address = ?2, heartbeat_timeout_s = ?3, debounce_s = ?4, \
                     site_id = ?5, battery_low_pct = ?6, labels = ?7, hold_alarms = ?8, \
                     flap = ?9, armed = ?10 WHERE id = ?1",
                    params![
                        id.to_string(),
                        address,
                        timeout,
                        debounce,
                        site_id,
                        alarms.battery_low_pct,
                        alarms.labels.to_column(),
                        alarms.hold_alarms.to_column(),
                        Flap::to_column(alarms.flap),
                        Armed::to_column(alarms.armed.as_ref())
                    ],
                )?;
                let made = match from == site_id {
                    true => Vec::new(),
                    false => super::site_moves::moved(&tx, id, from.as_deref(), now)?,
                };
                super::audit::record(&tx, audit.as_ref())?;
                tx.commit()?;
                Ok(Some(made))
            })
            .await?;
        let Some(made) = made else {
            return Ok(None);
        };
        Ok(self.get_sensor(id).await?.map(|v| (v, made)))
    }

    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        let seen = self.inner.seen.clone();
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let sensor = id;
            let id = id.to_string();
            // Immediate: it writes the archive's file too, whose own writer may be mid-step.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let site: Option<Option<String>> = tx
                .prepare_cached("SELECT site_id FROM sensors WHERE id = ?1")?
                .query_row([&id], |r| r.get(0))
                .optional()?;
            let n = tx.execute("DELETE FROM sensors WHERE id = ?1", [&id])?;
            if let Some(site) = site {
                super::site_moves::deleted(&tx, sensor, site.as_deref(), now)?;
            }
            if n > 0 {
                for table in [
                    "sensor_state",
                    "links",
                    "readings",
                    "readings_archive",
                    "events",
                    "events_journal",
                ] {
                    tx.execute(&format!("DELETE FROM {table} WHERE sensor_id = ?1"), [&id])?;
                }
                cancel_pending(&tx, "sensor_id", &id, now)?;
                // Its alarms end with it: a sensor made again under its id starts afresh.
                tx.execute(RESOLVE_ALARMS_OF_SENSOR, params![&id, now])?;
                super::audit::record(&tx, audit.as_ref())?;
            }
            tx.commit()?;
            // Its readings went with it: a sensor made again under its id starts afresh.
            seen.forget(sensor);
            Ok(n > 0)
        })
        .await
    }

    async fn create_client(&self, cl: Client) -> Result<()> {
        let keys = self.keys();
        let audit = crate::store::audit::take().map(|r| r.created(&cl.id));

        self.write(move |c| {
            // The key is read in the write's own transaction: `latch rotate-key` switching keys
            // waits for it, or it sees the new key.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let s = sealing::seal(&keys, &super::secrets::current(&tx)?, &cl)?;
            let n = tx.execute(
                "INSERT INTO clients (id, name, url, secret, created_at, rate_limit, events, \
                 batch_max_events, batch_max_wait_ms, url_password, headers, auth, tls, \
                 escalation) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
                 ON CONFLICT (id) DO NOTHING",
                params![
                    cl.id,
                    cl.name,
                    s.url,
                    s.secret,
                    cl.created_at,
                    cl.rate_limit,
                    events_column(&cl.events),
                    cl.batch.map(|b| b.max_events),
                    cl.batch.map(|b| b.max_wait_ms),
                    s.url_password,
                    s.headers,
                    s.auth,
                    s.tls,
                    Escalation::to_column(cl.escalation.as_ref())
                ],
            )?;
            if n == 0 {
                return Err(Error::Conflict(format!(
                    "client \"{}\" already exists",
                    cl.id
                )));
            }
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        let c = self
            .read(move |c| {
                Ok(c.prepare_cached(&format!(
                    "SELECT {CLIENT_COLS} FROM clients c WHERE c.id = ?1"
                ))?
                .query_row([id], |r| row::client(r))
                .optional()?)
            })
            .await?;
        c.map(|c| self.opened(c)).transpose()
    }

    async fn list_clients(
        &self,
        page: PageRequest,
        disabled: Option<bool>,
    ) -> Result<Page<Client>> {
        let page = self
            .read(move |c| {
                let rows = c
                    .prepare_cached(&format!(
                        "SELECT {CLIENT_COLS} FROM clients c WHERE c.id > ?1 \
                         AND (?3 IS NULL OR (c.disabled_at IS NOT NULL) = ?3) ORDER BY c.id LIMIT ?2"
                    ))?
                    .query_map(
                        params![
                            page.after.clone().unwrap_or_default(),
                            limit_plus_one(&page),
                            disabled
                        ],
                        |r| row::client(r),
                    )?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
            })
            .await?;
        self.opened_page(page)
    }

    async fn replace_client(&self, cl: Client) -> Result<bool> {
        let keys = self.keys();
        let audit = crate::store::audit::take();

        self.write(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let s = sealing::seal(&keys, &super::secrets::current(&tx)?, &cl)?;
            let n = tx.execute(
                "UPDATE clients SET name = ?2, url = ?3, secret = ?4, rate_limit = ?5, events = ?6, \
                 batch_max_events = ?7, batch_max_wait_ms = ?8, url_password = ?9, headers = ?10, \
                 auth = ?11, tls = ?12, escalation = ?13 WHERE id = ?1",
                params![
                    cl.id,
                    cl.name,
                    s.url,
                    s.secret,
                    cl.rate_limit,
                    events_column(&cl.events),
                    cl.batch.map(|b| b.max_events),
                    cl.batch.map(|b| b.max_wait_ms),
                    s.url_password,
                    s.headers,
                    s.auth,
                    s.tls,
                    Escalation::to_column(cl.escalation.as_ref())
                ],
            )?;
            tx.execute(SITES_TELLING_IT, [&cl.id])?;
            if n > 0 {
                super::audit::record(&tx, audit.as_ref())?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute("DELETE FROM clients WHERE id = ?1", [&id])?;
            tx.execute("DELETE FROM links WHERE client_id = ?1", [&id])?;
            // Nobody escalates to a client that is gone (its chain ends where it was).
            tx.execute(
                "UPDATE clients SET escalation = NULL \
                 WHERE json_extract(escalation, '$.to') = ?1",
                [&id],
            )?;
            cancel_pending(&tx, "client_id", &id, now)?;
            if n > 0 {
                super::audit::record(&tx, audit.as_ref())?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    /// The old secret moves to `previous_secret` as it is sealed (for the same client, so it
    /// opens there); the new one is sealed under the store's key.
    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        previous_until: Millis,
    ) -> Result<Option<Client>> {
        let (key, keys) = (id.clone(), self.keys());
        let audit = crate::store::audit::take();

        let rotated = self
            .write(move |c| {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let kid = super::secrets::current(&tx)?;
                let sealed = keys
                    .seal(&kid, &key, sealing::field::SIGNING, &secret)
                    .map_err(|e| Error::Backend(format!("client {key}: {e}")))?;
                let n = tx.execute(
                    "UPDATE clients SET previous_secret = secret, previous_secret_until = ?3, \
                     secret = ?2 WHERE id = ?1",
                    params![key, sealed, previous_until],
                )?;
                if n > 0 {
                    super::audit::record(&tx, audit.as_ref())?;
                }
                tx.commit()?;
                Ok(n > 0)
            })
            .await?;
        if !rotated {
            return Ok(None);
        }
        self.get_client(id).await
    }

    async fn enable_client(&self, id: String) -> Result<Option<bool>> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let Some(disabled_at) = tx
                .query_row(
                    "SELECT disabled_at FROM clients WHERE id = ?1",
                    [&id],
                    |r| r.get::<_, Option<i64>>(0),
                )
                .optional()?
            else {
                return Ok(None);
            };
            tx.execute(
                "UPDATE clients SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL \
                 WHERE id = ?1",
                [&id],
            )?;
            // Enabling one that is not disabled changes nothing: no record.
            super::audit::audited(tx, usize::from(disabled_at.is_some()), audit.as_ref())?;
            Ok(Some(disabled_at.is_some()))
        })
        .await
    }

    async fn count_disabled_clients(&self) -> Result<u64> {
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT COUNT(*) FROM clients WHERE disabled_at IS NOT NULL",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    /// From the client's running summary and its attempts of the last hour (by the index on
    /// client and time): as fast after a year of attempts as after a day.
    async fn client_health(&self, id: String, now: Millis) -> Result<Option<Health>> {
        self.read(move |c| {
            let Some(mut h) = c
                .query_row(
                    "SELECT last_success_at, last_failure_at, last_error, failures_since_success \
                     FROM clients WHERE id = ?1",
                    [&id],
                    |r| {
                        Ok(Health {
                            last_success_at: r.get(0)?,
                            last_failure_at: r.get(1)?,
                            last_error: r.get(2)?,
                            consecutive_failures: r.get(3)?,
                            ..Health::default()
                        })
                    },
                )
                .optional()?
            else {
                return Ok(None);
            };
            let window = c
                .prepare_cached(&format!(
                    "SELECT at, COALESCE({DELIVERED}, 0), duration_ms FROM attempts \
                     WHERE client_id = ?1 AND at >= ?2"
                ))?
                .query_map(params![id, now - HEALTH_WINDOW_MS], |r| {
                    Ok((r.get(0)?, r.get::<_, i64>(1)? != 0, r.get(2)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            h.set_window(&window, now);
            (h.pending, h.failed) = c.query_row(
                "SELECT (SELECT COUNT(*) FROM notifications WHERE client_id = ?1 AND status = 'pending'), \
                 (SELECT COUNT(*) FROM notifications WHERE client_id = ?1 AND status = 'failed')",
                [&id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok(Some(h))
        })
        .await
    }

    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            check_pair(&tx, &client_id, sensor_id)?;
            let n = tx.execute(
                "INSERT INTO links (client_id, sensor_id, created_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT DO NOTHING",
                params![client_id, sensor_id.to_string(), now],
            )?;
            super::audit::audited(tx, n, audit.as_ref())?;
            Ok(())
        })
        .await
    }

    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            check_pair(&tx, &client_id, sensor_id)?;
            let n = tx.execute(
                "DELETE FROM links WHERE client_id = ?1 AND sensor_id = ?2",
                params![client_id, sensor_id.to_string()],
            )?;
            super::audit::audited(tx, n, audit.as_ref())?;
            Ok(())
        })
        .await
    }

    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.read_seen(move |c, seen| {
            if !exists(c, "SELECT 1 FROM clients WHERE id = ?1", &client_id)? {
                return Err(Error::NotFound("client"));
            }
            let mut rows = c
                .prepare_cached(&format!(
                    "SELECT {SENSOR_COLS} FROM links l JOIN sensors s ON s.id = l.sensor_id \
                     LEFT JOIN sensor_state st ON st.sensor_id = s.id \
                     WHERE l.client_id = ?1 AND s.id > ?2 ORDER BY s.id LIMIT ?3"
                ))?
                .query_map(
                    params![
                        client_id,
                        page.after.clone().unwrap_or_default(),
                        limit_plus_one(&page)
                    ],
                    |r| row::sensor_view(r),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            seen.patch_views(&mut rows);
            Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
        })
        .await
    }

    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        let page = self
            .read(move |c| {
                let sid = sensor_id.to_string();
                if !exists(c, "SELECT 1 FROM sensors WHERE id = ?1", &sid)? {
                    return Err(Error::NotFound("sensor"));
                }
                let rows = c
                    .prepare_cached(&format!(
                        "SELECT {CLIENT_COLS} FROM links l JOIN clients c ON c.id = l.client_id \
                         WHERE l.sensor_id = ?1 AND c.id > ?2 ORDER BY c.id LIMIT ?3"
                    ))?
                    .query_map(
                        params![
                            sid,
                            page.after.clone().unwrap_or_default(),
                            limit_plus_one(&page)
                        ],
                        |r| row::client(r),
                    )?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
            })
            .await?;
        self.opened_page(page)
    }

    async fn import(
        &self,
        sensors: Vec<Sensor>,
        links: Vec<(String, SensorId)>,
        now: Millis,
    ) -> Result<()> {
        self.write(move |c| {
            let tx = c.transaction()?;
            {
                let mut ins = tx.prepare_cached(
                    "INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at, debounce_s, \
                     site_id, battery_low_pct, labels, hold_alarms, flap, armed) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
                     ON CONFLICT (id) DO NOTHING",
                )?;
                for s in &sensors {
                    ins.execute(params![
                        s.id.to_string(),
                        s.address,
                        s.heartbeat_timeout_s,
                        s.created_at,
                        s.debounce_s,
                        s.site_id,
                        s.battery_low_pct,
                        s.labels.to_column(),
                        s.hold_alarms.to_column(),
                        Flap::to_column(s.flap),
                        Armed::to_column(s.armed.as_ref())
                    ])?;
                }
                let mut link = tx.prepare_cached(
                    "INSERT INTO links (client_id, sensor_id, created_at) \
                     SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM clients WHERE id = ?1) \
                     AND EXISTS (SELECT 1 FROM sensors WHERE id = ?2) ON CONFLICT DO NOTHING",
                )?;
                for (client, sensor) in &links {
                    link.execute(params![client, sensor.to_string(), now])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

/// A deleted sensor's alarms not resolved yet, resolved at `?2`.
const RESOLVE_ALARMS_OF_SENSOR: &str = "UPDATE alarms SET state = 'resolved', resolved_at = MAX(opened_at, ?2) \
     WHERE sensor_id = ?1 AND state <> 'resolved'";
