//! Sensors, clients, the links between them, bulk import, and the registry changes other
//! nodes follow.

use async_trait::async_trait;

use super::super::rows::{self as row, CLIENT_COLS, RUNTIME_COLS, RUNTIME_JOIN, SENSOR_COLS};
use super::super::{
    ConnectionCounts, Error, Page, PageRequest, Result, SensorRuntime, SensorView, limit_plus_one,
};
use super::DELETE_LOCK;
use super::PgStore;
use super::db::{Bound, Db, Sql, Tx};
use crate::domain::client::{Health, events_column};
use crate::domain::partition::Partitioning;
use crate::domain::{Client, Connection as Conn, Millis, Sensor, SensorId};
use crate::secrets::Keyring;
use crate::store::Registry;
use crate::store::sealing;

/// Every sensor is inserted with its `hash` by the database's partitioning: the range
/// scan of its partition finds it there (`cluster::load_partitions`).
pub(super) async fn create_sensor(db: &Db, partitioning: Partitioning, s: Sensor) -> Result<()> {
    let c = db.get("create_sensor").await?;
    let n = c
        .execute(
            "WITH s AS (INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at, \
               debounce_s, hash, site_id) VALUES ($1, $2, $3, $4, $5, $6, $7) \
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
            ],
        )
        .await?;
    if n == 0 {
        return Err(Error::Conflict(format!(
            "sensor \"{}\" already exists",
            s.id
        )));
    }
    Ok(())
}

pub(super) async fn get_sensor(db: &Db, id: SensorId) -> Result<Option<SensorView>> {
    let c = db.get("get_sensor").await?;
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

pub(super) async fn list_sensors(
    db: &Db,
    connection: Option<Conn>,
    page: PageRequest,
) -> Result<Page<SensorView>> {
    let c = db.get("list_sensors").await?;
    let after = page.after.clone().unwrap_or_default();
    let conn_filter = connection.map(|c| c.as_str().to_string());
    let rows = c
        .query(
            &format!(
                "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                 ON st.sensor_id = s.id WHERE s.id > $1 \
                 AND ($2::text IS NULL OR COALESCE(st.connection, 'unknown') = $2) \
                 ORDER BY s.id LIMIT $3"
            ),
            &[&after, &conn_filter, &limit_plus_one(&page)],
        )
        .await?;
    let rows = rows
        .iter()
        .map(row::sensor_view)
        .collect::<Result<Vec<_>>>()?;
    Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
}

/// Sensors with a state row counted by connection; the rest never reported.
pub(super) async fn count_sensors(db: &Db) -> Result<ConnectionCounts> {
    let c = db.get("count_sensors").await?;
    let total: i64 = c
        .query_one("SELECT COUNT(*) FROM sensors", &[])
        .await?
        .get(0);
    let rows = c
        .query(
            "SELECT st.connection, COUNT(*) FROM sensor_state st \
             JOIN sensors s ON s.id = st.sensor_id GROUP BY st.connection",
            &[],
        )
        .await?;
    Ok(ConnectionCounts::from_rows(
        total,
        rows.iter().map(|r| (r.get(0), r.get(1))),
    ))
}

pub(super) async fn replace_sensor(
    db: &Db,
    id: SensorId,
    address: String,
    timeout: Option<u32>,
    debounce: Option<u32>,
    site_id: Option<String>,
) -> Result<Option<SensorView>> {
    let n = db
        .get("replace_sensor")
        .await?
        .execute(
            "WITH s AS (UPDATE sensors SET address = $2, heartbeat_timeout_s = $3, \
               debounce_s = $4, site_id = $5 WHERE id = $1 RETURNING id) \
             INSERT INTO sensor_changes (sensor_id) SELECT id FROM s",
            &[
                &id.to_string(),
                &address,
                &timeout.map(|t| t as i32),
                &debounce.map(|t| t as i32),
                &site_id,
            ],
        )
        .await?;
    if n == 0 {
        return Ok(None);
    }
    get_sensor(db, id).await
}

pub(super) async fn delete_sensor(db: &Db, id: SensorId, now: Millis) -> Result<bool> {
    let mut c = db.get("delete_sensor").await?;
    let id = id.to_string();
    let tx = c.transaction().await?;
    // Waits for the commits in flight; every statement after it sees their rows.
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
        &[&DELETE_LOCK],
    )
    .await?;
    let n = tx
        .execute("DELETE FROM sensors WHERE id = $1", &[&id])
        .await?;
    if n > 0 {
        for table in ["sensor_state", "links", "readings", "events"] {
            tx.execute(&format!("DELETE FROM {table} WHERE sensor_id = $1"), &[&id])
                .await?;
        }
        cancel_pending(&tx, "sensor_id", &id, now).await?;
        tx.execute("INSERT INTO sensor_changes (sensor_id) VALUES ($1)", &[&id])
            .await?;
    }
    tx.commit().await?;
    Ok(n > 0)
}

pub(super) async fn create_client(db: &Db, keys: &Keyring, cl: Client) -> Result<()> {
    let mut c = db.get("create_client").await?;
    let tx = c.transaction().await?;
    let s = sealing::seal(keys, &super::secrets::current(&tx).await?, &cl)?;
    let n = tx
        .execute(
            "INSERT INTO clients (id, name, url, secret, created_at, rate_limit, events, \
             batch_max_events, batch_max_wait_ms, url_password, headers, auth, tls) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
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
            ],
        )
        .await?;
    if n == 0 {
        return Err(Error::Conflict(format!(
            "client \"{}\" already exists",
            cl.id
        )));
    }
    tx.commit().await
}

pub(super) async fn get_client(db: &Db, id: String) -> Result<Option<Client>> {
    let c = db.get("get_client").await?;
    c.query_opt(
        &format!("SELECT {CLIENT_COLS} FROM clients c WHERE c.id = $1"),
        &[&id],
    )
    .await?
    .as_ref()
    .map(row::client)
    .transpose()
}

pub(super) async fn list_clients(
    db: &Db,
    page: PageRequest,
    disabled: Option<bool>,
) -> Result<Page<Client>> {
    let c = db.get("list_clients").await?;
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
    Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
}

pub(super) async fn replace_client(db: &Db, keys: &Keyring, cl: Client) -> Result<bool> {
    let mut c = db.get("replace_client").await?;
    let tx = c.transaction().await?;
    let s = sealing::seal(keys, &super::secrets::current(&tx).await?, &cl)?;
    let n = tx
        .execute(
            "UPDATE clients SET name = $2, url = $3, secret = $4, rate_limit = $5, \
             events = $6, batch_max_events = $7, batch_max_wait_ms = $8, url_password = $9, \
             headers = $10, auth = $11, tls = $12 WHERE id = $1",
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
            ],
        )
        .await?;
    tx.commit().await?;
    Ok(n > 0)
}

pub(super) async fn delete_client(db: &Db, id: String, now: Millis) -> Result<bool> {
    let mut c = db.get("delete_client").await?;
    let tx = c.transaction().await?;
    let n = tx
        .execute("DELETE FROM clients WHERE id = $1", &[&id])
        .await?;
    tx.execute("DELETE FROM links WHERE client_id = $1", &[&id])
        .await?;
    cancel_pending(&tx, "client_id", &id, now).await?;
    tx.commit().await?;
    Ok(n > 0)
}

pub(super) async fn link(
    db: &Db,
    client_id: String,
    sensor_id: SensorId,
    now: Millis,
) -> Result<()> {
    let mut c = db.get("link").await?;
    let tx = c.transaction().await?;
    check_pair(&tx, &client_id, sensor_id).await?;
    tx.execute(
        "INSERT INTO links (client_id, sensor_id, created_at) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
        &[&client_id, &sensor_id.to_string(), &now],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn unlink(db: &Db, client_id: String, sensor_id: SensorId) -> Result<()> {
    let mut c = db.get("unlink").await?;
    let tx = c.transaction().await?;
    check_pair(&tx, &client_id, sensor_id).await?;
    tx.execute(
        "DELETE FROM links WHERE client_id = $1 AND sensor_id = $2",
        &[&client_id, &sensor_id.to_string()],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn list_client_sensors(
    db: &Db,
    client_id: String,
    page: PageRequest,
) -> Result<Page<SensorView>> {
    let c = db.get("list_client_sensors").await?;
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

pub(super) async fn list_sensor_clients(
    db: &Db,
    sensor_id: SensorId,
    page: PageRequest,
) -> Result<Page<Client>> {
    let c = db.get("list_sensor_clients").await?;
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
    Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
}

pub(super) async fn import(
    db: &Db,
    partitioning: Partitioning,
    sensors: Vec<Sensor>,
    links: Vec<(String, SensorId)>,
    now: Millis,
) -> Result<()> {
    let mut c = db.get("import").await?;
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
    tx.execute(
        "INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at, debounce_s, hash, \
         site_id) SELECT * FROM UNNEST($1::text[], $2::text[], $3::int4[], $4::int8[], \
         $5::int4[], $6::int8[], $7::text[]) ON CONFLICT (id) DO NOTHING",
        &[
            &ids, &addresses, &timeouts, &created, &debounces, &hashes, &sites,
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

pub(super) async fn load_runtime(db: &Db) -> Result<Vec<SensorRuntime>> {
    let c = db.get_for("load_runtime", Bound::Bulk).await?;
    let rows = c
        .query(
            &format!("SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN}"),
            &[],
        )
        .await?;
    rows.iter().map(row::runtime).collect()
}

/// The committed state of those of `ids` that are registered.
pub(super) async fn load_states(db: &Db, ids: Vec<SensorId>) -> Result<Vec<SensorRuntime>> {
    let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    let c = db.get("load_states").await?;
    let rows = c
        .query(
            &format!("SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN} WHERE s.id = ANY($1)"),
            &[&ids],
        )
        .await?;
    rows.iter().map(row::runtime).collect()
}

pub(super) async fn registry_changes(
    db: &Db,
    after: i64,
) -> Result<(i64, Vec<(SensorId, Option<SensorRuntime>)>)> {
    let c = db.get("registry_changes").await?;
    let changes = c
        .query(
            "SELECT seq, sensor_id FROM sensor_changes WHERE seq > $1 ORDER BY seq",
            &[&after],
        )
        .await?;
    let newest = changes
        .iter()
        .map(|r| r.get::<_, i64>(0))
        .max()
        .unwrap_or(after);
    let mut ids: Vec<String> = changes.iter().map(|r| r.get(1)).collect();
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return Ok((newest, vec![]));
    }
    let now: std::collections::HashMap<SensorId, SensorRuntime> = c
        .query(
            &format!("SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN} WHERE s.id = ANY($1)"),
            &[&ids],
        )
        .await?
        .iter()
        .map(|r| row::runtime(r).map(|rt| (rt.0, rt)))
        .collect::<Result<_>>()?;
    let changed = ids
        .iter()
        .map(|id| {
            let id = SensorId::parse(id)
                .map_err(|e| Error::Backend(format!("stored sensor id {id:?}: {e}")))?;
            Ok((id, now.get(&id).copied()))
        })
        .collect::<Result<_>>()?;
    Ok((newest, changed))
}

pub(super) async fn prune_registry_changes(db: &Db, before: Millis) -> Result<()> {
    db.get("prune_registry_changes")
        .await?
        .execute("DELETE FROM sensor_changes WHERE at < $1", &[&before])
        .await?;
    Ok(())
}

pub(super) async fn newest_registry_change(db: &Db) -> Result<i64> {
    let c = db.get("newest_registry_change").await?;
    let row = c
        .query_one("SELECT COALESCE(MAX(seq), 0) FROM sensor_changes", &[])
        .await?;
    Ok(row.get(0))
}

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
    async fn create_sensor(&self, s: Sensor) -> Result<()> {
        create_sensor(&self.db, self.partitioning().await?, s).await
    }

    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        get_sensor(&self.db, id).await
    }

    async fn list_sensors(
        &self,
        connection: Option<Conn>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        list_sensors(&self.db, connection, page).await
    }

    async fn count_sensors(&self) -> Result<ConnectionCounts> {
        count_sensors(&self.db).await
    }

    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        timeout: Option<u32>,
        debounce: Option<u32>,
        site_id: Option<String>,
    ) -> Result<Option<SensorView>> {
        replace_sensor(&self.db, id, address, timeout, debounce, site_id).await
    }

    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        delete_sensor(&self.db, id, now).await
    }

    async fn create_client(&self, cl: Client) -> Result<()> {
        create_client(&self.db, &self.keys, cl).await
    }

    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        get_client(&self.db, id)
            .await?
            .map(|c| self.opened(c))
            .transpose()
    }

    async fn list_clients(
        &self,
        page: PageRequest,
        disabled: Option<bool>,
    ) -> Result<Page<Client>> {
        self.opened_page(list_clients(&self.db, page, disabled).await?)
    }

    async fn replace_client(&self, cl: Client) -> Result<bool> {
        replace_client(&self.db, &self.keys, cl).await
    }

    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        delete_client(&self.db, id, now).await
    }

    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        previous_until: Millis,
    ) -> Result<Option<Client>> {
        super::lifecycle::rotate_secret(&self.db, &self.keys, id, secret, previous_until)
            .await?
            .map(|c| self.opened(c))
            .transpose()
    }

    async fn enable_client(&self, id: String) -> Result<Option<bool>> {
        super::lifecycle::enable_client(&self.db, id).await
    }

    async fn count_disabled_clients(&self) -> Result<u64> {
        super::lifecycle::count_disabled(&self.db).await
    }

    async fn client_health(&self, id: String, now: Millis) -> Result<Option<Health>> {
        super::lifecycle::client_health(&self.db, id, now).await
    }

    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()> {
        link(&self.db, client_id, sensor_id, now).await
    }

    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        unlink(&self.db, client_id, sensor_id).await
    }

    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        list_client_sensors(&self.db, client_id, page).await
    }

    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        self.opened_page(list_sensor_clients(&self.db, sensor_id, page).await?)
    }

    async fn import(
        &self,
        sensors: Vec<Sensor>,
        links: Vec<(String, SensorId)>,
        now: Millis,
    ) -> Result<()> {
        import(&self.db, self.partitioning().await?, sensors, links, now).await
    }
}
