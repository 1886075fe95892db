//! The PostgreSQL store: for deployments that outgrow one machine's SQLite, and for several
//! latch nodes sharing one database.
//!
//! - A pool of connections (deadpool); every call takes one for its statement or
//!   transaction.
//! - Group commit writes each kind of row of a batch with one statement over `UNNEST`ed
//!   arrays, not one statement per row.
//! - Claims lock the rows they take with `FOR UPDATE SKIP LOCKED` and lease them
//!   (`claimed_by`, `lease_until`), so two nodes never send the same attempt at once and a
//!   dead node's leases run out and are taken over.
//! - Migrations run under an advisory lock, so nodes starting together apply them once.
//! - History is partitioned by month; the current and next months' partitions are created
//!   at start, under the migration lock.
//! - Every connection has a connect timeout and TCP keepalive, and the pool bounds its
//!   waits; [`super::deadline::Deadline`] bounds each call on top, since a server that stops
//!   answering enforces none of its own timeouts.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{
    AttemptRecord, ClaimRow, ClaimStep, HistoryBatch, HistorySink, Stored, claim_step,
    retry_refusal,
};
use super::{
    Claim, CommitBatch, Error, NotificationFilter, NotificationRef, Outcome, Page, PageRequest,
    ReadingRecord, Result, SensorRuntime, SensorView, Store, TimeRange, Verdict, limit_plus_one,
    notification_ref, split_cursor,
};
use crate::domain::{
    Attempt, Client, Connection as Conn, Event, EventKind, Millis, Notification, Sensor, SensorId,
    SensorStatus, Status, notification::new_notification_id,
};

/// Schema versions, applied in order; `latch_migrations` records which ran.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/postgres/0001_init.sql"),
    include_str!("migrations/postgres/0002_history_spool.sql"),
    include_str!("migrations/postgres/0003_sensor_changes.sql"),
];

/// Key of the advisory lock migrations run under ("latch" in ASCII).
const MIGRATION_LOCK: i64 = 0x006c_6174_6368;
/// Class of the advisory lock (with the schema as the other half of the key) that every
/// group commit holds shared and a sensor delete exclusive. Without it a commit in flight
/// when the delete runs (its rows not yet visible to the delete) lands after it, leaving
/// readings and state of a deleted sensor behind, which a sensor re-created under that id
/// would inherit. Deletes are rare, so commits almost never wait.
const DELETE_LOCK: i32 = 0x6c74_6364;

/// Most pooled connections.
const POOL_SIZE: usize = 16;

/// Months of history partitions created ahead of the current one.
const MONTHS_AHEAD: i32 = 3;

/// PostgreSQL implementation of [`Store`].
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// The data folder's lock, held for the store's life (see `store::lock_data_dir`).
    _lock: Option<std::sync::Arc<std::fs::File>>,
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

/// A PostgreSQL error in the server's own words: message, SQLSTATE, detail and hint when
/// the server answered; otherwise the client's description with its cause (`error
/// connecting to server: Connection refused …`). tokio-postgres alone says "db error".
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            text.push_str(&format!("; detail: {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::Backend(describe(&e))
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        use deadpool_postgres::PoolError;
        match e {
            PoolError::Backend(e) => e.into(),
            PoolError::Timeout(kind) => Error::Backend(format!(
                "no database connection within the timeout ({kind:?}); the database is not \
                 answering"
            )),
            e => backend(e),
        }
    }
}

/// TCP keepalive probes start after this long idle, so a connection to a host that vanished
/// is noticed and replaced rather than kept in the pool.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

/// The connection settings of `url` with latch's bounds: `timeout` to connect and for TCP
/// to see its data acknowledged, keepalive probes, and plaintext only where the URL does not
/// ask for TLS (`sslmode` require or verify-* is refused: this build speaks no TLS to
/// PostgreSQL, and falling back to plaintext would send credentials and data in the clear).
pub fn settings(url: &str, timeout: Duration) -> anyhow::Result<tokio_postgres::Config> {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    for (key, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        if key == "sslmode" && !matches!(value, "disable" | "allow" | "prefer") {
            anyhow::bail!(
                "invalid setting `database_url`: sslmode={value} asks for TLS, which latch does \
                 not speak to PostgreSQL; use sslmode=disable on a trusted network, or reach \
                 the database through a TLS tunnel (stunnel, a sidecar proxy)"
            );
        }
    }
    // `allow` is libpq's "plaintext first"; tokio-postgres does not know it.
    let url = url.replace("sslmode=allow", "sslmode=disable");
    let mut pg: tokio_postgres::Config = url
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid setting `database_url`: {e}"))?;
    // Without TLS support, `prefer` (tokio-postgres's default) means plaintext: say so.
    pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(timeout);
    }
    pg.keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .tcp_user_timeout(timeout.max(Duration::from_secs(1)));
    Ok(pg)
}

impl PgStore {
    /// Connects to `url` (`postgres://…`), applies pending migrations and creates the
    /// history partitions around now. Waiting for a pooled connection, opening one and
    /// checking one out again each take at most `timeout`.
    pub async fn connect(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let pg = settings(url, timeout)?;
        let manager = Manager::from_config(
            pg,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .timeouts(deadpool_postgres::Timeouts {
                wait: Some(timeout),
                create: Some(timeout),
                recycle: Some(timeout),
            })
            .build()
            .map_err(|e| anyhow::anyhow!("database_url: {e}"))?;
        let store = Self { pool, _lock: None };
        store
            .migrate()
            .await
            .map_err(|e| anyhow::anyhow!("database_url: cannot prepare the database: {e}"))?;
        Ok(store)
    }

    /// Keeps the data folder's lock for as long as the store lives.
    pub fn holding(mut self, lock: std::fs::File) -> Self {
        self._lock = Some(std::sync::Arc::new(lock));
        self
    }

    /// Applies pending migrations, one node at a time.
    pub async fn migrate(&self) -> Result<()> {
        let mut c = self.pool.get().await?;
        c.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        let result = async {
            c.batch_execute(
                "CREATE TABLE IF NOT EXISTS latch_migrations (version INTEGER PRIMARY KEY, \
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )
            .await?;
            let done: i32 = c
                .query_one(
                    "SELECT COALESCE(MAX(version), 0) FROM latch_migrations",
                    &[],
                )
                .await?
                .get(0);
            for (i, sql) in MIGRATIONS.iter().enumerate().skip(done as usize) {
                let tx = c.transaction().await?;
                tx.batch_execute(sql).await?;
                tx.execute(
                    "INSERT INTO latch_migrations (version) VALUES ($1)",
                    &[&(i as i32 + 1)],
                )
                .await?;
                tx.commit().await?;
            }
            // Under the same lock: two nodes creating one partition at once would race
            // (`CREATE TABLE IF NOT EXISTS` checks, then one of them fails on the catalog).
            ensure_partitions(&c, crate::domain::time::now_ms()).await
        }
        .await;
        c.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await?;
        result
    }
}

/// Creates the monthly partitions of `readings` and `events` for the month of `now` and the
/// next few, if they are missing. Runs under the migration lock.
async fn ensure_partitions(c: &tokio_postgres::Client, now: Millis) -> Result<()> {
    use chrono::{Datelike, TimeZone, Utc};
    let t = Utc
        .timestamp_millis_opt(now)
        .single()
        .ok_or_else(|| backend("time out of range"))?;
    for k in 0..=MONTHS_AHEAD {
        let month0 = t.year() * 12 + t.month0() as i32 + k;
        let start = |m: i32| {
            Utc.with_ymd_and_hms(m.div_euclid(12), m.rem_euclid(12) as u32 + 1, 1, 0, 0, 0)
                .single()
                .map(|d| d.timestamp_millis())
                .unwrap_or(0)
        };
        let (from, to) = (start(month0), start(month0 + 1));
        let name = format!(
            "{:04}_{:02}",
            month0.div_euclid(12),
            month0.rem_euclid(12) + 1
        );
        for table in ["readings", "events"] {
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {table}_{name} PARTITION OF {table} \
                     FOR VALUES FROM ({from}) TO ({to})"
            );
            if let Err(e) = c.batch_execute(&sql).await {
                // Rows of that month already in the default partition block it; they
                // stay queryable there, so this is worth a warning, not a failure.
                tracing::warn!(error = %describe(&e), table, month = %name,
                        "Could not create a history partition.");
            }
        }
    }
    Ok(())
}

// --- row mapping -----------------------------------------------------------------------

const RUNTIME_COLS: &str = "s.id, s.heartbeat_timeout_s, st.data, st.changed_at, st.last_ts, \
     st.last_seen_at, COALESCE(st.connection, 'unknown')";
const RUNTIME_JOIN: &str = "LEFT JOIN sensor_state st ON st.sensor_id = s.id";

fn runtime_row(r: &tokio_postgres::Row) -> Result<SensorRuntime> {
    let id: String = r.get(0);
    let conn: String = r.get(6);
    Ok(SensorRuntime {
        id: sensor_id(&id)?,
        heartbeat_timeout_s: opt_u32(r.get(1)),
        data: r.get(2),
        changed_at: r.get(3),
        last_ts: r.get(4),
        last_seen_at: r.get(5),
        connection: Conn::parse(&conn).unwrap_or(Conn::Unknown),
    })
}

fn sensor_id(s: &str) -> Result<SensorId> {
    SensorId::parse(s).map_err(|e| backend(format!("stored sensor id {s:?}: {e}")))
}

fn opt_u32(v: Option<i32>) -> Option<u32> {
    v.map(|v| v as u32)
}

const SENSOR_COLS: &str = "s.id, s.address, s.heartbeat_timeout_s, s.created_at, \
     st.data, st.changed_at, st.last_seen_at, COALESCE(st.connection, 'unknown')";

fn sensor_view(r: &Row) -> Result<SensorView> {
    let id: String = r.get(0);
    let conn: String = r.get(7);
    Ok((
        Sensor {
            id: sensor_id(&id)?,
            address: r.get(1),
            heartbeat_timeout_s: opt_u32(r.get(2)),
            created_at: r.get(3),
        },
        SensorStatus {
            data: r.get(4),
            changed_at: r.get(5),
            last_seen_at: r.get(6),
            connection: Conn::parse(&conn).unwrap_or(Conn::Unknown),
        },
    ))
}

const CLIENT_COLS: &str = "c.id, c.name, c.url, c.secret, c.created_at";

fn client(r: &Row) -> Client {
    Client {
        id: r.get(0),
        name: r.get(1),
        url: r.get(2),
        secret: r.get(3),
        created_at: r.get(4),
    }
}

const NOTIF_COLS: &str = "n.id, n.seq, n.client_id, n.sensor_id, n.kind, n.data, n.previous, \
     n.occurred_at, n.last_seen_at, n.status, n.attempts, n.next_attempt_at, n.created_at, \
     n.updated_at";

fn notification(r: &Row) -> Result<Notification> {
    let sensor: String = r.get(3);
    let kind: String = r.get(4);
    let status: String = r.get(9);
    Ok(Notification {
        id: r.get(0),
        seq: r.get(1),
        client_id: r.get(2),
        sensor_id: sensor_id(&sensor)?,
        kind: EventKind::parse(&kind).unwrap_or(EventKind::StateChanged),
        data: r.get(5),
        previous: r.get(6),
        occurred_at: r.get(7),
        last_seen_at: r.get(8),
        status: Status::parse(&status).unwrap_or(Status::Pending),
        attempts: r.get::<_, i32>(10) as u32,
        next_attempt_at: r.get(11),
        created_at: r.get(12),
        updated_at: r.get(13),
    })
}

/// Cancels pending notifications whose `column` is `value`.
async fn cancel_pending(
    tx: &deadpool_postgres::Transaction<'_>,
    column: &str,
    value: &str,
    now: Millis,
) -> Result<()> {
    tx.execute(
        &format!(
            "UPDATE notifications SET status = 'cancelled', updated_at = $2, lease_until = NULL, \
             claimed_by = NULL WHERE status = 'pending' AND {column} = $1"
        ),
        &[&value, &now],
    )
    .await?;
    Ok(())
}

async fn exists(c: &impl deadpool_postgres::GenericClient, sql: &str, arg: &str) -> Result<bool> {
    Ok(c.query_opt(sql, &[&arg]).await?.is_some())
}

async fn check_pair(
    c: &impl deadpool_postgres::GenericClient,
    client_id: &str,
    sensor_id: SensorId,
) -> Result<()> {
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
impl Store for PgStore {
    fn shared(&self) -> bool {
        true
    }

    async fn ping(&self) -> Result<()> {
        self.pool.get().await?.query_one("SELECT 1", &[]).await?;
        Ok(())
    }

    async fn create_sensor(&self, s: Sensor) -> Result<()> {
        let c = self.pool.get().await?;
        let n = c
            .execute(
                "WITH s AS (INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at) \
                   VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING RETURNING id) \
                 INSERT INTO sensor_changes (sensor_id) SELECT id FROM s",
                &[
                    &s.id.to_string(),
                    &s.address,
                    &s.heartbeat_timeout_s.map(|t| t as i32),
                    &s.created_at,
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

    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        let c = self.pool.get().await?;
        c.query_opt(
            &format!(
                "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                 ON st.sensor_id = s.id WHERE s.id = $1"
            ),
            &[&id.to_string()],
        )
        .await?
        .as_ref()
        .map(sensor_view)
        .transpose()
    }

    async fn list_sensors(
        &self,
        connection: Option<Conn>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let c = self.pool.get().await?;
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
        let rows = rows.iter().map(sensor_view).collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
    }

    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        timeout: Option<u32>,
    ) -> Result<Option<SensorView>> {
        let n = self
            .pool
            .get()
            .await?
            .execute(
                "WITH s AS (UPDATE sensors SET address = $2, heartbeat_timeout_s = $3 \
                   WHERE id = $1 RETURNING id) \
                 INSERT INTO sensor_changes (sensor_id) SELECT id FROM s",
                &[&id.to_string(), &address, &timeout.map(|t| t as i32)],
            )
            .await?;
        if n == 0 {
            return Ok(None);
        }
        self.get_sensor(id).await
    }

    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        let mut c = self.pool.get().await?;
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

    async fn create_client(&self, cl: Client) -> Result<()> {
        let n = self
            .pool
            .get()
            .await?
            .execute(
                "INSERT INTO clients (id, name, url, secret, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                &[&cl.id, &cl.name, &cl.url, &cl.secret, &cl.created_at],
            )
            .await?;
        if n == 0 {
            return Err(Error::Conflict(format!(
                "client \"{}\" already exists",
                cl.id
            )));
        }
        Ok(())
    }

    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        let c = self.pool.get().await?;
        Ok(c.query_opt(
            &format!("SELECT {CLIENT_COLS} FROM clients c WHERE c.id = $1"),
            &[&id],
        )
        .await?
        .as_ref()
        .map(client))
    }

    async fn list_clients(&self, page: PageRequest) -> Result<Page<Client>> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {CLIENT_COLS} FROM clients c WHERE c.id > $1 \
                     ORDER BY c.id LIMIT $2"
                ),
                &[
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                ],
            )
            .await?;
        let rows = rows.iter().map(client).collect();
        Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
    }

    async fn replace_client(&self, cl: Client) -> Result<bool> {
        Ok(self
            .pool
            .get()
            .await?
            .execute(
                "UPDATE clients SET name = $2, url = $3, secret = $4 WHERE id = $1",
                &[&cl.id, &cl.name, &cl.url, &cl.secret],
            )
            .await?
            > 0)
    }

    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        let mut c = self.pool.get().await?;
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

    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()> {
        let mut c = self.pool.get().await?;
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

    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        let mut c = self.pool.get().await?;
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

    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let c = self.pool.get().await?;
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
        let rows = rows.iter().map(sensor_view).collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
    }

    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        let c = self.pool.get().await?;
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
        let rows = rows.iter().map(client).collect();
        Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
    }

    async fn import(&self, sensors: Vec<Sensor>, links: Vec<(String, SensorId)>) -> Result<()> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        let ids: Vec<String> = sensors.iter().map(|s| s.id.to_string()).collect();
        let addresses: Vec<&str> = sensors.iter().map(|s| s.address.as_str()).collect();
        let timeouts: Vec<Option<i32>> = sensors
            .iter()
            .map(|s| s.heartbeat_timeout_s.map(|t| t as i32))
            .collect();
        let created: Vec<i64> = sensors.iter().map(|s| s.created_at).collect();
        tx.execute(
            "INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at) \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::int4[], $4::int8[]) \
             ON CONFLICT (id) DO NOTHING",
            &[&ids, &addresses, &timeouts, &created],
        )
        .await?;
        let clients: Vec<&str> = links.iter().map(|(c, _)| c.as_str()).collect();
        let sensors: Vec<String> = links.iter().map(|(_, s)| s.to_string()).collect();
        tx.execute(
            "INSERT INTO links (client_id, sensor_id, created_at) \
             SELECT u.c, u.s, $3 FROM UNNEST($1::text[], $2::text[]) AS u(c, s) \
             WHERE EXISTS (SELECT 1 FROM clients WHERE id = u.c) \
             AND EXISTS (SELECT 1 FROM sensors WHERE id = u.s) ON CONFLICT DO NOTHING",
            &[&clients, &sensors, &crate::domain::time::now_ms()],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                &format!("SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN}"),
                &[],
            )
            .await?;
        rows.iter().map(runtime_row).collect()
    }

    async fn registry_changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<(SensorId, Option<SensorRuntime>)>)> {
        let c = self.pool.get().await?;
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
                &format!(
                    "SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN} WHERE s.id = ANY($1)"
                ),
                &[&ids],
            )
            .await?
            .iter()
            .map(|r| runtime_row(r).map(|rt| (rt.id, rt)))
            .collect::<Result<_>>()?;
        let changed = ids
            .iter()
            .map(|id| {
                let id = sensor_id(id)?;
                Ok((id, now.get(&id).copied()))
            })
            .collect::<Result<_>>()?;
        Ok((newest, changed))
    }

    async fn prune_registry_changes(&self, before: Millis) -> Result<()> {
        self.pool
            .get()
            .await?
            .execute("DELETE FROM sensor_changes WHERE at < $1", &[&before])
            .await?;
        Ok(())
    }

    async fn newest_registry_change(&self) -> Result<i64> {
        let c = self.pool.get().await?;
        let row = c
            .query_one("SELECT COALESCE(MAX(seq), 0) FROM sensor_changes", &[])
            .await?;
        Ok(row.get(0))
    }

    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock_shared($1, hashtext(current_schema()))",
            &[&DELETE_LOCK],
        )
        .await?;
        let created = commit_batch(&tx, &batch, now).await?;
        tx.commit().await?;
        Ok(created)
    }

    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        let (after_ts, after_id) = match &page.after {
            Some(cur) => split_cursor(cur)?,
            None => (i64::MIN, i64::MIN),
        };
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT id, data, ts, received_at, late FROM readings \
                 WHERE sensor_id = $1 AND ts >= $2 AND ts < $3 AND (ts, id) > ($4, $5) \
                 ORDER BY ts, id LIMIT $6",
                &[
                    &sensor_id.to_string(),
                    &range.from.unwrap_or(i64::MIN),
                    &range.to.unwrap_or(i64::MAX),
                    &after_ts,
                    &after_id,
                    &limit_plus_one(&page),
                ],
            )
            .await?;
        let rows = rows.iter().map(|r| reading_row(r, sensor_id)).collect();
        Ok(Page::from_rows(rows, page.limit, |r| {
            format!("{}:{}", r.row.ts, r.id)
        }))
    }

    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        let (after_at, after_id) = match &page.after {
            Some(cur) => split_cursor(cur)?,
            None => (i64::MIN, i64::MIN),
        };
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT id, kind, at, data, previous, last_seen_at FROM events \
                 WHERE sensor_id = $1 AND at >= $2 AND at < $3 AND (at, id) > ($4, $5) \
                 ORDER BY at, id LIMIT $6",
                &[
                    &sensor_id.to_string(),
                    &range.from.unwrap_or(i64::MIN),
                    &range.to.unwrap_or(i64::MAX),
                    &after_at,
                    &after_id,
                    &limit_plus_one(&page),
                ],
            )
            .await?;
        let rows = rows.iter().map(|r| event_row(r, sensor_id)).collect();
        Ok(Page::from_rows(rows, page.limit, |e| {
            format!("{}:{}", e.row.at, e.id)
        }))
    }

    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {NOTIF_COLS} FROM notifications n \
                     WHERE n.status = 'pending' AND n.seq > $1 ORDER BY n.seq"
                ),
                &[&after_seq],
            )
            .await?;
        rows.iter()
            .map(|r| notification(r).map(|n| notification_ref(&n)))
            .collect()
    }

    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
    ) -> Result<Vec<Claim>> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        // Rows another node is claiming right now are skipped, not waited for.
        let rows = tx
            .query(
                &format!(
                    "SELECT {NOTIF_COLS}, n.lease_until, n.claimed_by, c.url, c.secret, s.address, \
                     l.client_id IS NOT NULL \
                     FROM notifications n \
                     LEFT JOIN clients c ON c.id = n.client_id \
                     LEFT JOIN sensors s ON s.id = n.sensor_id \
                     LEFT JOIN links l ON l.client_id = n.client_id AND l.sensor_id = n.sensor_id \
                     WHERE n.id = ANY($1) FOR UPDATE OF n SKIP LOCKED"
                ),
                &[&ids],
            )
            .await?;
        let mut found: HashMap<String, &Row> = HashMap::with_capacity(rows.len());
        for r in &rows {
            found.insert(r.get(0), r);
        }
        let locked: Vec<String> = if found.len() < ids.len() {
            // Absent from the locked rows: either gone or locked by another node.
            let missing: Vec<&String> = ids.iter().filter(|i| !found.contains_key(*i)).collect();
            tx.query(
                "SELECT id FROM notifications WHERE id = ANY($1)",
                &[&missing],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect()
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(ids.len());
        let (mut lease, mut cancel) = (Vec::new(), Vec::new());
        for id in ids {
            let Some(r) = found.get(&id) else {
                out.push(if locked.contains(&id) {
                    Claim::Leased {
                        id,
                        until: now + 1000,
                    }
                } else {
                    Claim::Done {
                        id,
                        status: Status::Cancelled,
                    }
                });
                continue;
            };
            let row = ClaimRow {
                notification: notification(r)?,
                lease_until: r.get(14),
                claimed_by: r.get(15),
                url: r.get(16),
                secret: r.get(17),
                address: r.get(18),
                linked: r.get(19),
            };
            match claim_step(row, &node, now) {
                ClaimStep::Lease(s) => {
                    lease.push(id);
                    out.push(Claim::Send(s));
                }
                ClaimStep::Cancel => {
                    cancel.push(id.clone());
                    out.push(Claim::Done {
                        id,
                        status: Status::Cancelled,
                    });
                }
                ClaimStep::Answer(c) => out.push(c),
            }
        }
        if !lease.is_empty() {
            tx.execute(
                "UPDATE notifications SET claimed_by = $2, lease_until = $3 WHERE id = ANY($1)",
                &[&lease, &node, &lease_until],
            )
            .await?;
        }
        if !cancel.is_empty() {
            tx.execute(
                "UPDATE notifications SET status = 'cancelled', updated_at = $2 WHERE id = ANY($1)",
                &[&cancel, &now],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn record(&self, outcomes: Vec<Outcome>, now: Millis) -> Result<()> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        let (mut a_id, mut a_at, mut a_code, mut a_err, mut a_dur) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut u_id, mut u_status, mut u_attempts, mut u_next) = (vec![], vec![], vec![], vec![]);
        for o in &outcomes {
            if let Some(a) = &o.attempt {
                a_id.push(o.notification_id.as_str());
                a_at.push(a.at);
                a_code.push(a.status_code.map(i32::from));
                a_err.push(a.error.as_deref());
                a_dur.push(a.duration_ms as i64);
            }
            let (status, next) = match o.verdict {
                Verdict::Delivered => (Status::Delivered, None),
                Verdict::Retry { next_at } => (Status::Pending, Some(next_at)),
                Verdict::Failed => (Status::Failed, None),
                Verdict::Superseded => (Status::Superseded, None),
            };
            u_id.push(o.notification_id.as_str());
            u_status.push(status.as_str());
            u_attempts.push(o.attempts as i32);
            u_next.push(next);
        }
        if !a_id.is_empty() {
            tx.execute(
                "INSERT INTO attempts (notification_id, at, status_code, error, duration_ms) \
                 SELECT u.n, u.a, u.c, u.e, u.d FROM UNNEST($1::text[], $2::int8[], $3::int4[], \
                 $4::text[], $5::int8[]) WITH ORDINALITY AS u(n, a, c, e, d, o) ORDER BY u.o",
                &[&a_id, &a_at, &a_code, &a_err, &a_dur],
            )
            .await?;
        }
        if !u_id.is_empty() {
            tx.execute(
                "UPDATE notifications n SET status = u.status, attempts = u.attempts, \
                 next_attempt_at = u.next, updated_at = $5, claimed_by = NULL, lease_until = NULL \
                 FROM UNNEST($1::text[], $2::text[], $3::int4[], $4::int8[]) \
                 AS u(id, status, attempts, next) WHERE n.id = u.id AND n.status = 'pending'",
                &[&u_id, &u_status, &u_attempts, &u_next, &now],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        let c = self.pool.get().await?;
        let Some(row) = c
            .query_opt(
                &format!("SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = $1"),
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        let n = notification(&row)?;
        let attempts = c
            .query(
                "SELECT notification_id, at, status_code, error, duration_ms FROM attempts \
                 WHERE notification_id = $1 ORDER BY id",
                &[&id],
            )
            .await?
            .iter()
            .map(|r| Attempt {
                notification_id: r.get(0),
                at: r.get(1),
                status_code: r.get::<_, Option<i32>>(2).map(|c| c as u16),
                error: r.get(3),
                duration_ms: r.get::<_, i64>(4) as u32,
            })
            .collect();
        Ok(Some((n, attempts)))
    }

    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        let after: i64 = match &page.after {
            Some(cur) => cur.parse().map_err(|_| Error::BadCursor)?,
            None => 0,
        };
        let c = self.pool.get().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.seq > $1 \
                     AND ($2::text IS NULL OR n.client_id = $2) \
                     AND ($3::text IS NULL OR n.sensor_id = $3) \
                     AND ($4::text IS NULL OR n.status = $4) ORDER BY n.seq LIMIT $5"
                ),
                &[
                    &after,
                    &filter.client_id,
                    &filter.sensor_id.map(|s| s.to_string()),
                    &filter.status.map(|s| s.as_str().to_string()),
                    &limit_plus_one(&page),
                ],
            )
            .await?;
        let rows = rows.iter().map(notification).collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |n| n.seq.to_string()))
    }

    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        let row = tx
            .query_opt(
                &format!("SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = $1 FOR UPDATE"),
                &[&id],
            )
            .await?
            .ok_or(Error::NotFound("notification"))?;
        let n = notification(&row)?;
        let newer = n.kind == EventKind::StateChanged
            && tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM notifications WHERE client_id = $1 \
                     AND sensor_id = $2 AND kind = 'sensor.state_changed' AND seq > $3 \
                     AND status IN ('pending', 'delivered'))",
                    &[&n.client_id, &n.sensor_id.to_string(), &n.seq],
                )
                .await?
                .get::<_, bool>(0);
        if let Some(e) = retry_refusal(&n, newer) {
            return Err(e);
        }
        tx.execute(
            "UPDATE notifications SET status = 'pending', attempts = 0, next_attempt_at = $2, \
             updated_at = $2, claimed_by = NULL, lease_until = NULL WHERE id = $1",
            &[&id, &now],
        )
        .await?;
        tx.commit().await?;
        Ok(NotificationRef {
            due_at: now,
            attempts: 0,
            ..notification_ref(&n)
        })
    }

    async fn count_pending(&self) -> Result<u64> {
        let c = self.pool.get().await?;
        let n: i64 = c
            .query_one(
                "SELECT COUNT(*) FROM notifications WHERE status = 'pending'",
                &[],
            )
            .await?
            .get(0);
        Ok(n as u64)
    }

    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        let limit = limit as i64;
        let mut c = self.pool.get().await?;
        // Rows are deleted (or marked) and locked in a transaction that commits only once
        // the sink has them: a failure rolls back, other nodes skip the locked rows, and
        // readers keep seeing them in the spool until ClickHouse has them too.
        let tx = c.transaction().await?;
        let readings = tx
            .query(
                "DELETE FROM readings WHERE id = ANY(ARRAY(\
                   SELECT id FROM readings ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                 RETURNING id, data, ts, received_at, late, sensor_id",
                &[&limit],
            )
            .await?
            .iter()
            .map(|r| Ok(reading_row(r, sensor_id(r.get(5))?)))
            .collect::<Result<Vec<_>>>()?;
        let events = tx
            .query(
                "DELETE FROM events WHERE id = ANY(ARRAY(\
                   SELECT id FROM events ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                 RETURNING id, kind, at, data, previous, last_seen_at, sensor_id",
                &[&limit],
            )
            .await?
            .iter()
            .map(|r| Ok(event_row(r, sensor_id(r.get(6))?)))
            .collect::<Result<Vec<_>>>()?;
        let attempts = tx
            .query(
                "WITH a AS (UPDATE attempts SET shipped = true WHERE id = ANY(ARRAY(\
                   SELECT id FROM attempts WHERE NOT shipped ORDER BY id LIMIT $1 \
                   FOR UPDATE SKIP LOCKED)) \
                 RETURNING id, notification_id, at, status_code, error, duration_ms) \
                 SELECT a.id, a.notification_id, a.at, a.status_code, a.error, a.duration_ms, \
                   COALESCE(n.client_id, ''), COALESCE(n.sensor_id, ''), COALESCE(n.kind, '') \
                 FROM a LEFT JOIN notifications n ON n.id = a.notification_id ORDER BY a.id",
                &[&limit],
            )
            .await?
            .iter()
            .map(|r| AttemptRecord {
                id: r.get(0),
                attempt: Attempt {
                    notification_id: r.get(1),
                    at: r.get(2),
                    status_code: r.get::<_, Option<i32>>(3).map(|c| c as u16),
                    error: r.get(4),
                    duration_ms: r.get::<_, i64>(5) as u32,
                },
                client_id: r.get(6),
                sensor_id: r.get(7),
                kind: r.get(8),
            })
            .collect();
        let batch = HistoryBatch {
            readings,
            events,
            attempts,
        };
        if batch.is_empty() {
            return Ok(0);
        }
        sink.insert(&batch).await.map_err(Error::Sink)?;
        tx.commit().await?;
        Ok(batch.len())
    }

    async fn spool_depth(&self) -> Result<u64> {
        let c = self.pool.get().await?;
        let n: i64 = c
            .query_one(
                "SELECT (SELECT COUNT(*) FROM readings) + (SELECT COUNT(*) FROM events) \
                 + (SELECT COUNT(*) FROM attempts WHERE NOT shipped)",
                &[],
            )
            .await?
            .get(0);
        Ok(n as u64)
    }
}

/// `id, data, ts, received_at, late` of a reading of `sensor_id`.
fn reading_row(r: &tokio_postgres::Row, sensor_id: SensorId) -> Stored<ReadingRecord> {
    Stored {
        id: r.get(0),
        row: ReadingRecord {
            sensor_id,
            data: r.get(1),
            ts: r.get(2),
            received_at: r.get(3),
            late: r.get(4),
        },
    }
}

/// `id, kind, at, data, previous, last_seen_at` of an event of `sensor_id`.
fn event_row(r: &tokio_postgres::Row, sensor_id: SensorId) -> Stored<Event> {
    let kind: String = r.get(1);
    Stored {
        id: r.get(0),
        row: Event {
            sensor_id,
            kind: EventKind::parse(&kind).unwrap_or(EventKind::StateChanged),
            at: r.get(2),
            data: r.get(3),
            previous: r.get(4),
            last_seen_at: r.get(5),
        },
    }
}

/// The body of a group commit: one statement per kind of row. Rows of a sensor deleted
/// meanwhile are skipped (the `EXISTS` guards), so a delete racing a batch never
/// resurrects state.
async fn commit_batch(
    tx: &deadpool_postgres::Transaction<'_>,
    batch: &CommitBatch,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    if !batch.readings.is_empty() {
        let r = &batch.readings;
        let ids: Vec<String> = r.iter().map(|r| r.sensor_id.to_string()).collect();
        let ts: Vec<i64> = r.iter().map(|r| r.ts).collect();
        let recv: Vec<i64> = r.iter().map(|r| r.received_at).collect();
        let data: Vec<bool> = r.iter().map(|r| r.data).collect();
        let late: Vec<bool> = r.iter().map(|r| r.late).collect();
        tx.execute(
            "INSERT INTO readings (sensor_id, ts, received_at, data, late) \
             SELECT u.sensor_id, u.ts, u.received_at, u.data, u.late \
             FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::bool[], $5::bool[]) \
             WITH ORDINALITY AS u(sensor_id, ts, received_at, data, late, o) \
             WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id) ORDER BY u.o",
            &[&ids, &ts, &recv, &data, &late],
        )
        .await
        .map_err(backend)?;
    }
    if !batch.states.is_empty() {
        // One row per sensor (the last): an upsert may not touch a row twice.
        let mut last: HashMap<SensorId, usize> = HashMap::new();
        for (i, s) in batch.states.iter().enumerate() {
            last.insert(s.sensor_id, i);
        }
        let mut idx: Vec<usize> = last.into_values().collect();
        idx.sort_unstable();
        let st: Vec<_> = idx.iter().map(|&i| &batch.states[i]).collect();
        let ids: Vec<String> = st.iter().map(|s| s.sensor_id.to_string()).collect();
        let data: Vec<Option<bool>> = st.iter().map(|s| s.data).collect();
        let changed: Vec<Option<i64>> = st.iter().map(|s| s.changed_at).collect();
        let last_ts: Vec<Option<i64>> = st.iter().map(|s| s.last_ts).collect();
        let seen: Vec<Option<i64>> = st.iter().map(|s| s.last_seen_at).collect();
        let conn: Vec<&str> = st.iter().map(|s| s.connection.as_str()).collect();
        tx.execute(
            "INSERT INTO sensor_state AS st (sensor_id, data, changed_at, last_ts, last_seen_at, connection) \
             SELECT u.* FROM UNNEST($1::text[], $2::bool[], $3::int8[], $4::int8[], $5::int8[], $6::text[]) \
             AS u(sensor_id, data, changed_at, last_ts, last_seen_at, connection) \
             WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id) \
             ON CONFLICT (sensor_id) DO UPDATE SET data = excluded.data, \
             changed_at = COALESCE(excluded.changed_at, st.changed_at), last_ts = excluded.last_ts, \
             last_seen_at = excluded.last_seen_at, connection = excluded.connection",
            &[&ids, &data, &changed, &last_ts, &seen, &conn],
        )
        .await?;
    }
    if batch.events.is_empty() {
        return Ok(Vec::new());
    }
    let ev = &batch.events;
    let sids: Vec<String> = ev.iter().map(|e| e.sensor_id.to_string()).collect();
    let kinds: Vec<&str> = ev.iter().map(|e| e.kind.as_str()).collect();
    let at: Vec<i64> = ev.iter().map(|e| e.at).collect();
    let data: Vec<Option<bool>> = ev.iter().map(|e| e.data).collect();
    let prev: Vec<Option<bool>> = ev.iter().map(|e| e.previous).collect();
    let seen: Vec<Option<i64>> = ev.iter().map(|e| e.last_seen_at).collect();
    // Events of sensors still registered, in order; only those notify.
    let kept: Vec<i64> = tx
        .query(
            "WITH u AS (SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::bool[], \
             $5::bool[], $6::int8[]) WITH ORDINALITY AS u(sensor_id, kind, at, data, previous, \
             last_seen_at, o)), ins AS (INSERT INTO events (sensor_id, kind, at, data, previous, \
             last_seen_at) SELECT u.sensor_id, u.kind, u.at, u.data, u.previous, u.last_seen_at \
             FROM u WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id) ORDER BY u.o) \
             SELECT u.o FROM u WHERE EXISTS (SELECT 1 FROM sensors s WHERE s.id = u.sensor_id)",
            &[&sids, &kinds, &at, &data, &prev, &seen],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut wanted: Vec<&str> = kept
        .iter()
        .map(|&o| sids[o as usize - 1].as_str())
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let mut linked: HashMap<String, Vec<String>> = HashMap::new();
    for r in tx
        .query(
            "SELECT sensor_id, client_id FROM links WHERE sensor_id = ANY($1) \
             ORDER BY sensor_id, client_id",
            &[&wanted],
        )
        .await?
    {
        linked.entry(r.get(0)).or_default().push(r.get(1));
    }
    // One notification per event and linked client, in event order.
    let (mut n_id, mut n_client, mut n_sensor, mut n_kind, mut n_data, mut n_prev) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut n_at, mut n_seen) = (vec![], vec![]);
    for &o in &kept {
        let e = &ev[o as usize - 1];
        let sid = &sids[o as usize - 1];
        for client in linked.get(sid).into_iter().flatten() {
            n_id.push(new_notification_id());
            n_client.push(client.as_str());
            n_sensor.push(sid.as_str());
            n_kind.push(e.kind.as_str());
            n_data.push(e.data);
            n_prev.push(e.previous);
            n_at.push(e.at);
            n_seen.push(e.last_seen_at);
        }
    }
    if n_id.is_empty() {
        return Ok(Vec::new());
    }
    let params: [&(dyn ToSql + Sync); 9] = [
        &n_id, &n_client, &n_sensor, &n_kind, &n_data, &n_prev, &n_at, &n_seen, &now,
    ];
    let rows = tx
        .query(
            "INSERT INTO notifications (id, client_id, sensor_id, kind, data, previous, \
             occurred_at, last_seen_at, status, attempts, next_attempt_at, created_at, updated_at) \
             SELECT u.id, u.client_id, u.sensor_id, u.kind, u.data, u.previous, u.occurred_at, \
             u.last_seen_at, 'pending', 0, $9, $9, $9 \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bool[], \
             $7::int8[], $8::int8[]) WITH ORDINALITY AS u(id, client_id, sensor_id, kind, data, \
             previous, occurred_at, last_seen_at, o) ORDER BY u.o RETURNING id, seq",
            &params,
        )
        .await?;
    let seqs: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut created = Vec::with_capacity(n_id.len());
    // Per sensor, the first seq of its newest state change: older pending, unleased state
    // notifications of that sensor are superseded by it.
    let mut newest: HashMap<&str, i64> = HashMap::new();
    let mut i = 0;
    for &o in &kept {
        let e = &ev[o as usize - 1];
        let sid = sids[o as usize - 1].as_str();
        let n = linked.get(sid).map_or(0, Vec::len);
        for k in 0..n {
            let id = n_id[i + k].clone();
            let seq = seqs[&id];
            if k == 0 && e.kind == EventKind::StateChanged {
                newest.insert(sid, seq);
            }
            created.push(NotificationRef {
                id,
                seq,
                client_id: n_client[i + k].to_string(),
                sensor_id: e.sensor_id,
                kind: e.kind,
                due_at: now,
                attempts: 0,
            });
        }
        i += n;
    }
    if !newest.is_empty() {
        let (s, q): (Vec<&str>, Vec<i64>) = newest.into_iter().unzip();
        tx.execute(
            // Per sensor through the partial index of pending ones (a plain join of the
            // arrays with the outbox scans it).
            "UPDATE notifications n SET status = 'superseded', updated_at = $3 \
             FROM (SELECT p.seq FROM UNNEST($1::text[], $2::int8[]) AS u(sensor_id, seq) \
             CROSS JOIN LATERAL (SELECT q.seq FROM notifications q WHERE q.sensor_id = u.sensor_id \
             AND q.status = 'pending' AND q.seq < u.seq OFFSET 0) p) older \
             WHERE n.seq = older.seq AND n.status = 'pending' \
             AND n.kind = 'sensor.state_changed' \
             AND (n.lease_until IS NULL OR n.lease_until < $3)",
            &[&s, &q, &now],
        )
        .await?;
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

    /// A store on a fresh schema of the test database, or `None` (outside CI) without one.
    pub(crate) async fn fresh() -> Option<(PgStore, String)> {
        let base = std::env::var("TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let schema = format!("latch_t_{}", ulid::Ulid::new().to_string().to_lowercase());
        let admin = match tokio_postgres::connect(&base, tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                client
            }
            Err(e) => {
                if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                    panic!("PostgreSQL is required in CI and not reachable: {e}");
                }
                eprintln!("SKIPPED: PostgreSQL not reachable ({e}); CI runs this test.");
                return None;
            }
        };
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
        Some((
            PgStore::connect(&url, Duration::from_secs(5))
                .await
                .unwrap(),
            schema,
        ))
    }

    #[tokio::test]
    async fn errors_carry_the_servers_message_and_sqlstate() {
        let Some((store, _)) = fresh().await else {
            return;
        };
        let c = store.pool.get().await.unwrap();
        let e = c
            .execute("INSERT INTO no_such_table VALUES (1)", &[])
            .await
            .unwrap_err();
        let shown = Error::from(e).to_string();
        assert!(shown.contains("SQLSTATE 42P01"), "{shown}");
        assert!(shown.contains("no_such_table"), "{shown}");
    }

    #[test]
    fn urls_asking_for_tls_are_refused_not_sent_in_plaintext() {
        let t = Duration::from_secs(5);
        for mode in ["require", "verify-ca", "verify-full"] {
            let err = settings(&format!("postgres://u@db/x?sslmode={mode}"), t)
                .unwrap_err()
                .to_string();
            assert!(err.contains("database_url") && err.contains("TLS"), "{err}");
        }
        for url in [
            "postgres://u@db/x",
            "postgres://u@db/x?sslmode=disable",
            "postgres://u@db/x?sslmode=prefer",
            "postgresql://u@db/x?application_name=a&sslmode=allow",
        ] {
            let pg = settings(url, t).unwrap();
            assert_eq!(
                pg.get_ssl_mode(),
                tokio_postgres::config::SslMode::Disable,
                "{url}"
            );
            assert_eq!(pg.get_connect_timeout(), Some(&t));
            assert!(pg.get_keepalives());
        }
    }

    #[tokio::test]
    async fn conformance_suite() {
        let Some((store, _)) = fresh().await else {
            return;
        };
        conformance::run_all(std::sync::Arc::new(store)).await;
    }

    #[tokio::test]
    async fn migrations_are_idempotent_and_partitions_exist() {
        let Some((store, schema)) = fresh().await else {
            return;
        };
        store.migrate().await.unwrap();
        store.migrate().await.unwrap();
        let c = store.pool.get().await.unwrap();
        let n: i64 = c
            .query_one(
                "SELECT COUNT(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent \
                 JOIN pg_namespace ns ON ns.oid = p.relnamespace \
                 WHERE p.relname = 'readings' AND ns.nspname = $1",
                &[&schema],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            n >= (MONTHS_AHEAD + 2) as i64,
            "monthly partitions and the default: {n}"
        );
        let v: i32 = c
            .query_one("SELECT MAX(version) FROM latch_migrations", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(v as usize, MIGRATIONS.len());
    }
}
