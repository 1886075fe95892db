//! The embedded store: SQLite in WAL mode, one writer connection and a few readers.
//!
//! SQLite allows one writer at a time, so writes share one connection behind a mutex and
//! the engine makes them count by committing whole batches in one transaction. Readers get
//! their own connections: in WAL mode they never block the writer nor wait for it. All
//! calls run on Tokio's blocking pool, since rusqlite is synchronous.

use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

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

const READERS: usize = 4;

/// Schema versions, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/sqlite/0001_init.sql"),
    include_str!("migrations/sqlite/0002_history_spool.sql"),
    include_str!("migrations/sqlite/0003_readings_archive.sql"),
];

/// How hard SQLite syncs to disk at each commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// fsync at every commit: survives power loss. The default.
    Full,
    /// fsync at checkpoints only: survives a crash of latch, not of the machine.
    Normal,
}

impl Synchronous {
    fn as_pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

struct Inner {
    /// Held for the store's life: one process per data folder.
    _lock: std::fs::File,
    writer: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
}

/// SQLite implementation of [`Store`].
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

fn backend(e: rusqlite::Error) -> Error {
    Error::Backend(e.to_string())
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        backend(e)
    }
}

fn open_conn(path: &Path, sync: Synchronous) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", sync.as_pragma())?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating if needed) `latch.db` in `dir` and brings its schema up to date.
    pub fn open(dir: &Path, sync: Synchronous) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("data_dir: cannot create {}: {e}", dir.display()))?;
        // The embedded store belongs to one process. The lock makes that a fact, which is
        // what lets us release every lease at open: whoever held them is gone.
        let lock = super::lock_data_dir(dir)?;
        let path = dir.join("latch.db");
        let mut writer = open_conn(&path, sync)?;
        migrate(&mut writer)?;
        writer.execute(
            "UPDATE notifications SET claimed_by = NULL, lease_until = NULL \
             WHERE lease_until IS NOT NULL",
            [],
        )?;
        let readers = (0..READERS)
            .map(|_| open_conn(&path, sync).map(Mutex::new))
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                _lock: lock,
                writer: Mutex::new(writer),
                readers,
                next_reader: AtomicUsize::new(0),
            }),
        })
    }

    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.writer.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| Error::Backend(format!("store task failed: {e}")))?
    }

    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let i = inner.next_reader.fetch_add(1, Ordering::Relaxed) % inner.readers.len();
            let conn = inner.readers[i].lock().unwrap_or_else(|p| p.into_inner());
            f(&conn)
        })
        .await
        .map_err(|e| Error::Backend(format!("store task failed: {e}")))?
    }
}

fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let version: usize = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i + 1)?;
        tx.commit()?;
    }
    Ok(())
}

// --- row mapping -----------------------------------------------------------------------

fn sensor_id(s: &str) -> rusqlite::Result<SensorId> {
    SensorId::parse(s).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn opt_bool(v: Option<i64>) -> Option<bool> {
    v.map(|v| v != 0)
}

const SENSOR_COLS: &str = "s.id, s.address, s.heartbeat_timeout_s, s.created_at, \
     st.data, st.changed_at, st.last_seen_at, COALESCE(st.connection, 'unknown')";

fn sensor_view(r: &Row) -> rusqlite::Result<SensorView> {
    let id: String = r.get(0)?;
    let conn: String = r.get(7)?;
    Ok((
        Sensor {
            id: sensor_id(&id)?,
            address: r.get(1)?,
            heartbeat_timeout_s: r.get(2)?,
            created_at: r.get(3)?,
        },
        SensorStatus {
            data: opt_bool(r.get(4)?),
            changed_at: r.get(5)?,
            last_seen_at: r.get(6)?,
            connection: Conn::parse(&conn).unwrap_or(Conn::Unknown),
        },
    ))
}

/// `id, data, ts, received_at, late` of a reading of `sensor_id`.
fn reading_row(r: &Row, sensor_id: SensorId) -> rusqlite::Result<Stored<ReadingRecord>> {
    Ok(Stored {
        id: r.get(0)?,
        row: ReadingRecord {
            sensor_id,
            data: r.get::<_, i64>(1)? != 0,
            ts: r.get(2)?,
            received_at: r.get(3)?,
            late: r.get::<_, i64>(4)? != 0,
        },
    })
}

/// `id, kind, at, data, previous, last_seen_at` of an event of `sensor_id`.
fn event_row(r: &Row, sensor_id: SensorId) -> rusqlite::Result<Stored<Event>> {
    let kind: String = r.get(1)?;
    Ok(Stored {
        id: r.get(0)?,
        row: Event {
            sensor_id,
            kind: EventKind::parse(&kind).unwrap_or(EventKind::StateChanged),
            at: r.get(2)?,
            data: opt_bool(r.get(3)?),
            previous: opt_bool(r.get(4)?),
            last_seen_at: r.get(5)?,
        },
    })
}

/// `notification_id, at, status_code, error, duration_ms` from column `first` on.
fn attempt_row(r: &Row, first: usize) -> rusqlite::Result<Attempt> {
    Ok(Attempt {
        notification_id: r.get(first)?,
        at: r.get(first + 1)?,
        status_code: r.get(first + 2)?,
        error: r.get(first + 3)?,
        duration_ms: r.get(first + 4)?,
    })
}

const CLIENT_COLS: &str = "c.id, c.name, c.url, c.secret, c.created_at";

fn client(r: &Row) -> rusqlite::Result<Client> {
    Ok(Client {
        id: r.get(0)?,
        name: r.get(1)?,
        url: r.get(2)?,
        secret: r.get(3)?,
        created_at: r.get(4)?,
    })
}

const NOTIF_COLS: &str = "n.id, n.seq, n.client_id, n.sensor_id, n.kind, n.data, n.previous, \
     n.occurred_at, n.last_seen_at, n.status, n.attempts, n.next_attempt_at, n.created_at, \
     n.updated_at";

fn notification(r: &Row) -> rusqlite::Result<Notification> {
    let sensor: String = r.get(3)?;
    let kind: String = r.get(4)?;
    let status: String = r.get(9)?;
    Ok(Notification {
        id: r.get(0)?,
        seq: r.get(1)?,
        client_id: r.get(2)?,
        sensor_id: sensor_id(&sensor)?,
        kind: EventKind::parse(&kind).unwrap_or(EventKind::StateChanged),
        data: opt_bool(r.get(5)?),
        previous: opt_bool(r.get(6)?),
        occurred_at: r.get(7)?,
        last_seen_at: r.get(8)?,
        status: Status::parse(&status).unwrap_or(Status::Pending),
        attempts: r.get(10)?,
        next_attempt_at: r.get(11)?,
        created_at: r.get(12)?,
        updated_at: r.get(13)?,
    })
}

/// The claim itself, in one transaction.
fn claim_tx(
    c: &mut Connection,
    ids: Vec<String>,
    node: &str,
    now: Millis,
    lease_until: Millis,
) -> Result<Vec<Claim>> {
    {
        {
            let tx = c.transaction()?;
            let mut out = Vec::with_capacity(ids.len());
            {
                let mut select = tx.prepare_cached(&format!(
                    "SELECT {NOTIF_COLS}, n.lease_until, n.claimed_by, c.url, c.secret, s.address, \
                     l.client_id IS NOT NULL \
                     FROM notifications n \
                     LEFT JOIN clients c ON c.id = n.client_id \
                     LEFT JOIN sensors s ON s.id = n.sensor_id \
                     LEFT JOIN links l ON l.client_id = n.client_id AND l.sensor_id = n.sensor_id \
                     WHERE n.id = ?1"
                ))?;
                let mut lease = tx.prepare_cached(
                    "UPDATE notifications SET claimed_by = ?2, lease_until = ?3 WHERE id = ?1",
                )?;
                let mut cancel = tx.prepare_cached(
                    "UPDATE notifications SET status = 'cancelled', updated_at = ?2 WHERE id = ?1",
                )?;
                for id in ids {
                    let row = select
                        .query_row([&id], |r| {
                            Ok(ClaimRow {
                                notification: notification(r)?,
                                lease_until: r.get(14)?,
                                claimed_by: r.get(15)?,
                                url: r.get(16)?,
                                secret: r.get(17)?,
                                address: r.get(18)?,
                                linked: r.get(19)?,
                            })
                        })
                        .optional()?;
                    let Some(row) = row else {
                        out.push(Claim::Done {
                            id,
                            status: Status::Cancelled,
                        });
                        continue;
                    };
                    match claim_step(row, node, now) {
                        ClaimStep::Lease(s) => {
                            lease.execute(params![id, node, lease_until])?;
                            out.push(Claim::Send(s));
                        }
                        ClaimStep::Cancel => {
                            cancel.execute(params![id, now])?;
                            out.push(Claim::Done {
                                id,
                                status: Status::Cancelled,
                            });
                        }
                        ClaimStep::Answer(c) => out.push(c),
                    }
                }
            }
            tx.commit()?;
            Ok(out)
        }
    }
}

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

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<()> {
        self.read(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn create_sensor(&self, s: Sensor) -> Result<()> {
        self.write(move |c| {
            let n = c.execute(
                "INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (id) DO NOTHING",
                params![
                    s.id.to_string(),
                    s.address,
                    s.heartbeat_timeout_s,
                    s.created_at
                ],
            )?;
            if n == 0 {
                return Err(Error::Conflict(format!(
                    "sensor \"{}\" already exists",
                    s.id
                )));
            }
            Ok(())
        })
        .await
    }

    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        self.read(move |c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                 ON st.sensor_id = s.id WHERE s.id = ?1"
            ))?
            .query_row([id.to_string()], sensor_view)
            .optional()?)
        })
        .await
    }

    async fn list_sensors(
        &self,
        connection: Option<Conn>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.read(move |c| {
            let after = page.after.clone().unwrap_or_default();
            let conn_filter = connection.map(|c| c.as_str()).unwrap_or("");
            let rows = c
                .prepare_cached(&format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.id > ?1 \
                     AND (?2 = '' OR COALESCE(st.connection, 'unknown') = ?2) \
                     ORDER BY s.id LIMIT ?3"
                ))?
                .query_map(
                    params![after, conn_filter, limit_plus_one(&page)],
                    sensor_view,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
        })
        .await
    }

    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        timeout: Option<u32>,
    ) -> Result<Option<SensorView>> {
        let n = self
            .write(move |c| {
                Ok(c.execute(
                    "UPDATE sensors SET address = ?2, heartbeat_timeout_s = ?3 WHERE id = ?1",
                    params![id.to_string(), address, timeout],
                )?)
            })
            .await?;
        if n == 0 {
            return Ok(None);
        }
        self.get_sensor(id).await
    }

    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        self.write(move |c| {
            let id = id.to_string();
            let tx = c.transaction()?;
            let n = tx.execute("DELETE FROM sensors WHERE id = ?1", [&id])?;
            if n > 0 {
                for table in [
                    "sensor_state",
                    "links",
                    "readings",
                    "readings_archive",
                    "events",
                ] {
                    tx.execute(&format!("DELETE FROM {table} WHERE sensor_id = ?1"), [&id])?;
                }
                cancel_pending(&tx, "sensor_id", &id, now)?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    async fn create_client(&self, cl: Client) -> Result<()> {
        self.write(move |c| {
            let n = c.execute(
                "INSERT INTO clients (id, name, url, secret, created_at) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (id) DO NOTHING",
                params![cl.id, cl.name, cl.url, cl.secret, cl.created_at],
            )?;
            if n == 0 {
                return Err(Error::Conflict(format!("client \"{}\" already exists", cl.id)));
            }
            Ok(())
        })
        .await
    }

    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        self.read(move |c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {CLIENT_COLS} FROM clients c WHERE c.id = ?1"
            ))?
            .query_row([id], client)
            .optional()?)
        })
        .await
    }

    async fn list_clients(&self, page: PageRequest) -> Result<Page<Client>> {
        self.read(move |c| {
            let rows = c
                .prepare_cached(&format!(
                    "SELECT {CLIENT_COLS} FROM clients c WHERE c.id > ?1 ORDER BY c.id LIMIT ?2"
                ))?
                .query_map(
                    params![
                        page.after.clone().unwrap_or_default(),
                        limit_plus_one(&page)
                    ],
                    client,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
        })
        .await
    }

    async fn replace_client(&self, cl: Client) -> Result<bool> {
        self.write(move |c| {
            Ok(c.execute(
                "UPDATE clients SET name = ?2, url = ?3, secret = ?4 WHERE id = ?1",
                params![cl.id, cl.name, cl.url, cl.secret],
            )? > 0)
        })
        .await
    }

    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute("DELETE FROM clients WHERE id = ?1", [&id])?;
            tx.execute("DELETE FROM links WHERE client_id = ?1", [&id])?;
            cancel_pending(&tx, "client_id", &id, now)?;
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()> {
        self.write(move |c| {
            let tx = c.transaction()?;
            check_pair(&tx, &client_id, sensor_id)?;
            tx.execute(
                "INSERT INTO links (client_id, sensor_id, created_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT DO NOTHING",
                params![client_id, sensor_id.to_string(), now],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        self.write(move |c| {
            let tx = c.transaction()?;
            check_pair(&tx, &client_id, sensor_id)?;
            tx.execute(
                "DELETE FROM links WHERE client_id = ?1 AND sensor_id = ?2",
                params![client_id, sensor_id.to_string()],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.read(move |c| {
            if !exists(c, "SELECT 1 FROM clients WHERE id = ?1", &client_id)? {
                return Err(Error::NotFound("client"));
            }
            let rows = c
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
                    sensor_view,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
        })
        .await
    }

    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        self.read(move |c| {
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
                    client,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |c| c.id.clone()))
        })
        .await
    }

    async fn import(&self, sensors: Vec<Sensor>, links: Vec<(String, SensorId)>) -> Result<()> {
        self.write(move |c| {
            let tx = c.transaction()?;
            {
                let mut ins = tx.prepare_cached(
                    "INSERT INTO sensors (id, address, heartbeat_timeout_s, created_at) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (id) DO NOTHING",
                )?;
                for s in &sensors {
                    ins.execute(params![
                        s.id.to_string(),
                        s.address,
                        s.heartbeat_timeout_s,
                        s.created_at
                    ])?;
                }
                let mut link = tx.prepare_cached(
                    "INSERT INTO links (client_id, sensor_id, created_at) \
                     SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM clients WHERE id = ?1) \
                     AND EXISTS (SELECT 1 FROM sensors WHERE id = ?2) ON CONFLICT DO NOTHING",
                )?;
                let now = crate::domain::time::now_ms();
                for (client, sensor) in &links {
                    link.execute(params![client, sensor.to_string(), now])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>> {
        self.read(|c| {
            let rows = c
                .prepare(
                    "SELECT s.id, s.heartbeat_timeout_s, st.data, st.changed_at, st.last_ts, \
                     st.last_seen_at, COALESCE(st.connection, 'unknown') \
                     FROM sensors s LEFT JOIN sensor_state st ON st.sensor_id = s.id",
                )?
                .query_map([], |r| {
                    let id: String = r.get(0)?;
                    let conn: String = r.get(6)?;
                    Ok(SensorRuntime {
                        id: sensor_id(&id)?,
                        heartbeat_timeout_s: r.get(1)?,
                        data: opt_bool(r.get(2)?),
                        changed_at: r.get(3)?,
                        last_ts: r.get(4)?,
                        last_seen_at: r.get(5)?,
                        connection: Conn::parse(&conn).unwrap_or(Conn::Unknown),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>> {
        self.write(move |c| {
            let tx = c.transaction()?;
            let created = commit_batch(&tx, &batch, now)?;
            tx.commit()?;
            Ok(created)
        })
        .await
    }

    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        self.read(move |c| {
            let (after_ts, after_id) = match &page.after {
                Some(cur) => split_cursor(cur)?,
                None => (i64::MIN, i64::MIN),
            };
            let rows = c
                .prepare_cached(
                    // The archive by its key, the (small) journal by a scan; a move between
                    // them is one transaction, so this one statement sees each row once.
                    "SELECT * FROM (SELECT id, data, ts, received_at, late FROM readings_archive \
                       WHERE sensor_id = ?1 AND ts >= ?2 AND ts < ?3 AND (ts, id) > (?4, ?5) \
                       ORDER BY ts, id LIMIT ?6) \
                     UNION ALL \
                     SELECT * FROM (SELECT id, data, ts, received_at, late FROM readings \
                       WHERE sensor_id = ?1 AND ts >= ?2 AND ts < ?3 AND (ts, id) > (?4, ?5) \
                       ORDER BY ts, id LIMIT ?6) \
                     ORDER BY ts, id LIMIT ?6",
                )?
                .query_map(
                    params![
                        sensor_id.to_string(),
                        range.from.unwrap_or(i64::MIN),
                        range.to.unwrap_or(i64::MAX),
                        after_ts,
                        after_id,
                        limit_plus_one(&page)
                    ],
                    |r| reading_row(r, sensor_id),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |r| {
                format!("{}:{}", r.row.ts, r.id)
            }))
        })
        .await
    }

    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        self.read(move |c| {
            let (after_at, after_id) = match &page.after {
                Some(cur) => split_cursor(cur)?,
                None => (i64::MIN, i64::MIN),
            };
            let rows = c
                .prepare_cached(
                    "SELECT id, kind, at, data, previous, last_seen_at FROM events \
                     WHERE sensor_id = ?1 AND at >= ?2 AND at < ?3 AND (at, id) > (?4, ?5) \
                     ORDER BY at, id LIMIT ?6",
                )?
                .query_map(
                    params![
                        sensor_id.to_string(),
                        range.from.unwrap_or(i64::MIN),
                        range.to.unwrap_or(i64::MAX),
                        after_at,
                        after_id,
                        limit_plus_one(&page)
                    ],
                    |r| event_row(r, sensor_id),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |e| {
                format!("{}:{}", e.row.at, e.id)
            }))
        })
        .await
    }

    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>> {
        self.read(move |c| {
            let rows = c
                .prepare(&format!(
                    "SELECT {NOTIF_COLS} FROM notifications n \
                     WHERE n.status = 'pending' AND n.seq > ?1 ORDER BY n.seq"
                ))?
                .query_map([after_seq], notification)?
                .map(|n| n.map(|n| notification_ref(&n)))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
    ) -> Result<Vec<Claim>> {
        // Claims commit on the writer at its configured durability. Leases would not need
        // it (every lease is released at open), but switching `synchronous` off around a
        // claim would leave the connection that commits readings unsynced whenever the
        // switch back failed or a panic cut it short; an fsync per claim is the safer cost.
        self.write(move |c| claim_tx(c, ids, &node, now, lease_until))
            .await
    }

    async fn record(&self, outcomes: Vec<Outcome>, now: Millis) -> Result<()> {
        self.write(move |c| {
            let tx = c.transaction()?;
            {
                let mut attempt = tx.prepare_cached(
                    "INSERT INTO attempts (notification_id, at, status_code, error, duration_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                let mut update = tx.prepare_cached(
                    "UPDATE notifications SET status = ?2, attempts = ?3, next_attempt_at = ?4, \
                     updated_at = ?5, claimed_by = NULL, lease_until = NULL \
                     WHERE id = ?1 AND status = 'pending'",
                )?;
                for o in &outcomes {
                    if let Some(a) = &o.attempt {
                        attempt.execute(params![
                            o.notification_id,
                            a.at,
                            a.status_code,
                            a.error,
                            a.duration_ms
                        ])?;
                    }
                    let (status, next) = match o.verdict {
                        Verdict::Delivered => (Status::Delivered, None),
                        Verdict::Retry { next_at } => (Status::Pending, Some(next_at)),
                        Verdict::Failed => (Status::Failed, None),
                        Verdict::Superseded => (Status::Superseded, None),
                    };
                    update.execute(params![
                        o.notification_id,
                        status.as_str(),
                        o.attempts,
                        next,
                        now
                    ])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        self.read(move |c| {
            let Some(n) = c
                .prepare_cached(&format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = ?1"
                ))?
                .query_row([&id], notification)
                .optional()?
            else {
                return Ok(None);
            };
            let attempts = c
                .prepare_cached(
                    "SELECT notification_id, at, status_code, error, duration_ms FROM attempts \
                     WHERE notification_id = ?1 ORDER BY id",
                )?
                .query_map([&id], |r| attempt_row(r, 0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some((n, attempts)))
        })
        .await
    }

    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        self.read(move |c| {
            let after: i64 = match &page.after {
                Some(cur) => cur.parse().map_err(|_| Error::BadCursor)?,
                None => 0,
            };
            let rows = c
                .prepare_cached(&format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.seq > ?1 \
                     AND (?2 IS NULL OR n.client_id = ?2) AND (?3 IS NULL OR n.sensor_id = ?3) \
                     AND (?4 IS NULL OR n.status = ?4) ORDER BY n.seq LIMIT ?5"
                ))?
                .query_map(
                    params![
                        after,
                        filter.client_id,
                        filter.sensor_id.map(|s| s.to_string()),
                        filter.status.map(|s| s.as_str()),
                        limit_plus_one(&page)
                    ],
                    notification,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |n| n.seq.to_string()))
        })
        .await
    }

    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef> {
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx
                .prepare_cached(&format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = ?1"
                ))?
                .query_row([&id], notification)
                .optional()?
                .ok_or(Error::NotFound("notification"))?;
            let newer = n.kind == EventKind::StateChanged
                && tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM notifications WHERE client_id = ?1 \
                     AND sensor_id = ?2 AND kind = 'sensor.state_changed' AND seq > ?3 \
                     AND status IN ('pending', 'delivered'))",
                    params![n.client_id, n.sensor_id.to_string(), n.seq],
                    |r| r.get::<_, bool>(0),
                )?;
            if let Some(e) = retry_refusal(&n, newer) {
                return Err(e);
            }
            tx.execute(
                "UPDATE notifications SET status = 'pending', attempts = 0, next_attempt_at = ?2, \
                 updated_at = ?2, claimed_by = NULL, lease_until = NULL WHERE id = ?1",
                params![id, now],
            )?;
            tx.commit()?;
            Ok(NotificationRef {
                due_at: now,
                attempts: 0,
                ..notification_ref(&n)
            })
        })
        .await
    }

    async fn count_pending(&self) -> Result<u64> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT COUNT(*) FROM notifications WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        let batch = self.read(move |c| spooled(c, limit as i64)).await?;
        if batch.is_empty() {
            return Ok(0);
        }
        sink.insert(&batch).await.map_err(Error::Sink)?;
        // One writer hands out ids in commit order, so every row at or below the highest id
        // read was in the batch: a range delete lets go of exactly what shipped.
        let last_reading = batch.readings.iter().map(|r| r.id).max().unwrap_or(0);
        let last_event = batch.events.iter().map(|e| e.id).max().unwrap_or(0);
        let attempts: Vec<i64> = batch.attempts.iter().map(|a| a.id).collect();
        let shipped = batch.len();
        self.write(move |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM readings WHERE id <= ?1", [last_reading])?;
            tx.execute("DELETE FROM events WHERE id <= ?1", [last_event])?;
            {
                let mut mark =
                    tx.prepare_cached("UPDATE attempts SET shipped = 1 WHERE id = ?1")?;
                for id in attempts {
                    mark.execute([id])?;
                }
            }
            tx.commit()?;
            Ok(shipped)
        })
        .await
    }

    async fn archive_history(&self, limit: usize) -> Result<usize> {
        self.write(move |c| {
            let tx = c.transaction()?;
            // The id of the `limit`-th oldest reading, or of the newest when fewer wait.
            let last: Option<i64> = tx.query_row(
                "SELECT MAX(id) FROM (SELECT id FROM readings ORDER BY id LIMIT ?1)",
                [limit.clamp(1, 1 << 40) as i64],
                |r| r.get(0),
            )?;
            let Some(last) = last else {
                return Ok(0);
            };
            // Sorted by the archive's key: each of its pages is written once per move.
            let moved = tx.execute(
                "INSERT INTO readings_archive (sensor_id, ts, id, received_at, data, late) \
                 SELECT sensor_id, ts, id, received_at, data, late FROM readings \
                 WHERE id <= ?1 ORDER BY sensor_id, ts, id",
                [last],
            )?;
            tx.execute("DELETE FROM readings WHERE id <= ?1", [last])?;
            tx.commit()?;
            Ok(moved)
        })
        .await
    }

    async fn spool_depth(&self) -> Result<u64> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT (SELECT COUNT(*) FROM readings) + (SELECT COUNT(*) FROM events) \
                 + (SELECT COUNT(*) FROM attempts WHERE shipped = 0)",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }
}

/// The oldest `limit` unshipped rows of each kind.
fn spooled(c: &Connection, limit: i64) -> Result<HistoryBatch> {
    let sid = |r: &Row, i: usize| sensor_id(&r.get::<_, String>(i)?);
    let readings = c
        .prepare_cached(
            "SELECT id, data, ts, received_at, late, sensor_id FROM readings ORDER BY id LIMIT ?1",
        )?
        .query_map([limit], |r| reading_row(r, sid(r, 5)?))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let events = c
        .prepare_cached(
            "SELECT id, kind, at, data, previous, last_seen_at, sensor_id FROM events \
             ORDER BY id LIMIT ?1",
        )?
        .query_map([limit], |r| event_row(r, sid(r, 6)?))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let attempts = c
        .prepare_cached(
            "SELECT a.id, a.notification_id, a.at, a.status_code, a.error, a.duration_ms, \
             COALESCE(n.client_id, ''), COALESCE(n.sensor_id, ''), COALESCE(n.kind, '') \
             FROM attempts a LEFT JOIN notifications n ON n.id = a.notification_id \
             WHERE a.shipped = 0 ORDER BY a.id LIMIT ?1",
        )?
        .query_map([limit], |r| {
            Ok(AttemptRecord {
                id: r.get(0)?,
                attempt: attempt_row(r, 1)?,
                client_id: r.get(6)?,
                sensor_id: r.get(7)?,
                kind: r.get(8)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(HistoryBatch {
        readings,
        events,
        attempts,
    })
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

/// The body of a group commit. Rows of a sensor deleted meanwhile are skipped (the
/// `EXISTS` guards), so a delete racing a batch never resurrects state.
fn commit_batch(
    tx: &Transaction,
    batch: &CommitBatch,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let mut created = Vec::new();
    {
        let mut ins_reading = tx.prepare_cached(
            "INSERT INTO readings (sensor_id, ts, received_at, data, late) \
             SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM sensors WHERE id = ?1)",
        )?;
        for r in &batch.readings {
            ins_reading.execute(params![
                r.sensor_id.to_string(),
                r.ts,
                r.received_at,
                r.data as i64,
                r.late as i64
            ])?;
        }
        let mut upsert_state = tx.prepare_cached(
            "INSERT INTO sensor_state (sensor_id, data, changed_at, last_ts, last_seen_at, connection) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM sensors WHERE id = ?1) \
             ON CONFLICT (sensor_id) DO UPDATE SET data = excluded.data, \
             changed_at = COALESCE(excluded.changed_at, sensor_state.changed_at), last_ts = excluded.last_ts, \
             last_seen_at = excluded.last_seen_at, connection = excluded.connection",
        )?;
        for s in &batch.states {
            upsert_state.execute(params![
                s.sensor_id.to_string(),
                s.data.map(i64::from),
                s.changed_at,
                s.last_ts,
                s.last_seen_at,
                s.connection.as_str()
            ])?;
        }
        let mut ins_event = tx.prepare_cached(
            "INSERT INTO events (sensor_id, kind, at, data, previous, last_seen_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM sensors WHERE id = ?1)",
        )?;
        let mut linked = tx.prepare_cached("SELECT client_id FROM links WHERE sensor_id = ?1")?;
        let mut supersede = tx.prepare_cached(
            "UPDATE notifications SET status = 'superseded', updated_at = ?3 \
             WHERE sensor_id = ?1 AND status = 'pending' AND kind = 'sensor.state_changed' \
             AND seq < ?2 AND (lease_until IS NULL OR lease_until < ?3)",
        )?;
        let mut ins_notif = tx.prepare_cached(
            "INSERT INTO notifications (id, client_id, sensor_id, kind, data, previous, occurred_at, \
             last_seen_at, status, attempts, next_attempt_at, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', 0, ?9, ?9, ?9)",
        )?;
        for e in &batch.events {
            let sid = e.sensor_id.to_string();
            ins_event.execute(params![
                sid,
                e.kind.as_str(),
                e.at,
                e.data.map(i64::from),
                e.previous.map(i64::from),
                e.last_seen_at
            ])?;
            let clients = linked
                .query_map([&sid], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut first_seq = None;
            for client_id in clients {
                let id = new_notification_id();
                ins_notif.execute(params![
                    id,
                    client_id,
                    sid,
                    e.kind.as_str(),
                    e.data.map(i64::from),
                    e.previous.map(i64::from),
                    e.at,
                    e.last_seen_at,
                    now
                ])?;
                let seq = tx.last_insert_rowid();
                first_seq.get_or_insert(seq);
                created.push(NotificationRef {
                    id,
                    seq,
                    client_id,
                    sensor_id: e.sensor_id,
                    kind: e.kind,
                    due_at: now,
                    attempts: 0,
                });
            }
            if e.kind == EventKind::StateChanged
                && let Some(seq) = first_seq
            {
                supersede.execute(params![sid, seq, now])?;
            }
        }
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

    #[tokio::test]
    async fn conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
        conformance::run_all(Arc::new(store)).await;
    }

    /// A claim commits on the writer, whose durability is the configured one all along:
    /// a trigger records `PRAGMA synchronous` as the claim's lease update runs.
    #[tokio::test]
    async fn claims_keep_the_writers_durability() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
        let id = SensorId::parse("durable").unwrap();
        store
            .create_sensor(Sensor {
                id,
                address: "here".into(),
                heartbeat_timeout_s: None,
                created_at: 1,
            })
            .await
            .unwrap();
        store
            .create_client(Client {
                id: "c".into(),
                name: "c".into(),
                url: "http://127.0.0.1:9/".into(),
                secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
                created_at: 1,
            })
            .await
            .unwrap();
        store.link("c".into(), id, 1).await.unwrap();
        let batch = CommitBatch {
            readings: vec![],
            states: vec![crate::store::StateUpdate {
                sensor_id: id,
                data: Some(true),
                changed_at: Some(1),
                last_ts: Some(1),
                last_seen_at: Some(1),
                connection: Conn::Online,
            }],
            events: vec![Event {
                sensor_id: id,
                kind: EventKind::StateChanged,
                at: 1,
                data: Some(true),
                previous: None,
                last_seen_at: None,
            }],
        };
        let n = store.commit(batch, 1).await.unwrap().remove(0);
        {
            let c = Connection::open(dir.path().join("latch.db")).unwrap();
            c.execute_batch(
                "CREATE TABLE probe (synchronous INTEGER);
                 CREATE TRIGGER probe_sync AFTER UPDATE ON notifications BEGIN
                   INSERT INTO probe SELECT synchronous FROM pragma_synchronous;
                 END;",
            )
            .unwrap();
        }
        let claimed = store
            .claim(vec![n.id.clone()], "node".into(), 2, 10_000)
            .await
            .unwrap();
        assert!(matches!(claimed[0], Claim::Send(_)), "{claimed:?}");
        let seen: Vec<i64> = store
            .write(|c| {
                let mut s = c.prepare("SELECT synchronous FROM probe")?;
                let seen = s
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<i64>>>()?;
                Ok(seen)
            })
            .await
            .unwrap();
        assert_eq!(
            seen,
            vec![2],
            "PRAGMA synchronous of the writer during the claim (FULL = 2)"
        );
    }

    #[test]
    fn a_data_folder_serves_one_process() {
        let dir = tempfile::tempdir().unwrap();
        let _first = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
        let err = SqliteStore::open(dir.path(), Synchronous::Normal)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("in use by another latch"), "{err}");
    }

    #[tokio::test]
    async fn data_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let id = SensorId::parse("keep").unwrap();
        {
            let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
            store
                .create_sensor(Sensor {
                    id,
                    address: "here".into(),
                    heartbeat_timeout_s: Some(5),
                    created_at: 1,
                })
                .await
                .unwrap();
        }
        let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
        let (s, _) = store.get_sensor(id).await.unwrap().unwrap();
        assert_eq!(
            (s.address.as_str(), s.heartbeat_timeout_s),
            ("here", Some(5))
        );
    }

    #[tokio::test]
    async fn a_version_1_database_keeps_its_history_through_the_migrations() {
        let dir = tempfile::tempdir().unwrap();
        {
            let c = Connection::open(dir.path().join("latch.db")).unwrap();
            c.execute_batch(MIGRATIONS[0]).unwrap();
            c.pragma_update(None, "user_version", 1).unwrap();
            c.execute_batch(
                "INSERT INTO sensors VALUES ('old', 'here', NULL, 1);
                 INSERT INTO readings (id, sensor_id, ts, received_at, data, late)
                   VALUES (7, 'old', 1000, 1000, 1, 0), (8, 'old', 2000, 2000, 0, 0);
                 INSERT INTO events (id, sensor_id, kind, at, data, previous, last_seen_at)
                   VALUES (3, 'old', 'sensor.state_changed', 2000, 0, 1, NULL);",
            )
            .unwrap();
        }
        let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
        let id = SensorId::parse("old").unwrap();
        let all = |store: SqliteStore| async move {
            store
                .list_readings(
                    id,
                    TimeRange::default(),
                    PageRequest {
                        limit: 10,
                        after: None,
                    },
                )
                .await
                .unwrap()
                .items
        };
        let kept = all(store.clone()).await;
        assert_eq!(kept.iter().map(|r| r.id).collect::<Vec<_>>(), vec![7, 8]);
        assert_eq!(
            store.spool_depth().await.unwrap(),
            1,
            "old readings moved to the archive at the upgrade (the event stays)"
        );
        let events = store
            .list_events(
                id,
                TimeRange::default(),
                PageRequest {
                    limit: 10,
                    after: None,
                },
            )
            .await
            .unwrap();
        assert_eq!(events.items[0].id, 3);
        // New rows continue after the old ids, and moving to the archive changes nothing.
        let batch = CommitBatch {
            readings: vec![ReadingRecord {
                sensor_id: id,
                data: true,
                ts: 3000,
                received_at: 3000,
                late: false,
            }],
            ..Default::default()
        };
        store.commit(batch, 3000).await.unwrap();
        store.archive_history(100).await.unwrap();
        let after = all(store).await;
        assert_eq!(
            after.iter().map(|r| r.id).collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
    }
}
