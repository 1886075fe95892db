//! The embedded store: SQLite in WAL mode, one writer connection and a few readers.
//!
//! SQLite allows one writer at a time, so writes share one connection behind a mutex and
//! the engine makes them count by committing whole batches in one transaction. Readers get
//! their own connections: in WAL mode they never block the writer nor wait for it. All
//! calls run on Tokio's blocking pool, since rusqlite is synchronous.
//!
//! This file opens the database and says, for each call, whether it reads or writes; the SQL
//! is in the module of its concern (`registry`, `commit`, `outbox`, `history`,
//! `lifecycle`), as plain
//! functions over a connection, with the column lists and row mappers of `store::rows`.

use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use rusqlite::Connection;

use super::{
    Claim, CommitBatch, ConnectionCounts, Error, HistorySink, NotificationFilter, NotificationRef,
    Outcome, Page, PageRequest, ReadingRecord, ReplayFilter, Result, SensorRuntime, SensorView,
    Store, Stored, TimeRange,
};
use crate::domain::client::{Disabled, Health};
use crate::domain::token::ApiToken;
use crate::domain::{
    Attempt, Client, Connection as Conn, Event, Millis, Notification, Sensor, SensorId,
};

mod commit;
mod history;
mod lifecycle;
mod outbox;
mod registry;
#[cfg(test)]
mod tests;
mod tokens;

const READERS: usize = 4;

/// Schema versions, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/sqlite/0001_init.sql"),
    include_str!("../migrations/sqlite/0002_history_spool.sql"),
    include_str!("../migrations/sqlite/0003_readings_archive.sql"),
    include_str!("../migrations/sqlite/0004_client_lifecycle.sql"),
    include_str!("../migrations/sqlite/0005_api_tokens.sql"),
    include_str!("../migrations/sqlite/0006_supersede_index.sql"),
    include_str!("../migrations/sqlite/0007_attempts_ship_mark.sql"),
];

/// The setting lives with the other settings; the store only maps it to its pragma.
pub use crate::config::Synchronous;

fn pragma(sync: Synchronous) -> &'static str {
    match sync {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    }
}

struct Inner {
    /// Held for the store's life: one process per data folder.
    _lock: std::fs::File,
    writer: Mutex<Writer>,
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

/// The writer connection and the durability it is at.
///
/// Claims and recorded results commit without waiting for the disk (a lost lease or
/// result means sending again: at least once, as on PostgreSQL); everything else waits
/// for it at the configured level. `relaxed` is set before the switch down and cleared
/// only after the switch back succeeded, so a failed switch or a panic in between leaves
/// it set, and the next durable write restores the level or is refused.
struct Writer {
    conn: Connection,
    configured: Synchronous,
    relaxed: bool,
}

impl Writer {
    /// The connection at the configured durability.
    fn durable(&mut self) -> Result<&mut Connection> {
        if self.relaxed {
            self.conn
                .pragma_update(None, "synchronous", pragma(self.configured))?;
            self.relaxed = false;
        }
        Ok(&mut self.conn)
    }

    /// The connection without a wait for the disk at commit (WAL frames still go in
    /// order, so the next durable commit's sync covers these too).
    fn relaxed(&mut self) -> Result<&mut Connection> {
        if self.configured == Synchronous::Full && !self.relaxed {
            self.relaxed = true;
            self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        }
        Ok(&mut self.conn)
    }
}

fn open_conn(path: &Path, sync: Synchronous) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", pragma(sync))?;
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
        // Checkpoint every ~40 MiB of WAL rather than 4: a page written by many commits
        // in between (an index's right edge, a hot leaf) goes to the database file once.
        writer.pragma_update(None, "wal_autocheckpoint", 10_000)?;
        migrate(&mut writer)?;
        commit::prepare(&writer)?;
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
                writer: Mutex::new(Writer {
                    conn: writer,
                    configured: sync,
                    relaxed: false,
                }),
                readers,
                next_reader: AtomicUsize::new(0),
            }),
        })
    }

    /// A write at the configured durability.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        self.on_writer(move |w| f(w.durable()?)).await
    }

    /// A write whose loss in a crash of the machine only means sending again: claims and
    /// recorded results.
    async fn write_relaxed<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        self.on_writer(move |w| f(w.relaxed()?)).await
    }

    async fn on_writer<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Writer) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut w = inner.writer.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut w)
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

/// Brings the schema up to date. A data folder a newer latch has written is refused: this
/// latch would write rows that schema keeps differently, and a downgrade has no way back.
fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    let version: usize = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    anyhow::ensure!(
        version <= MIGRATIONS.len(),
        "the data folder's schema is at version {version}, newer than this latch knows ({}): \
         run the newer latch, or restore a backup taken before the upgrade",
        MIGRATIONS.len()
    );
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// Each call is a read on a reader or a write on the writer; the SQL is in the module of
/// its concern.
#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<()> {
        self.read(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn create_sensor(&self, s: Sensor) -> Result<()> {
        self.write(move |c| registry::create_sensor(c, s)).await
    }

    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        self.read(move |c| registry::get_sensor(c, id)).await
    }

    async fn list_sensors(
        &self,
        connection: Option<Conn>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.read(move |c| registry::list_sensors(c, connection, page))
            .await
    }

    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        timeout: Option<u32>,
    ) -> Result<Option<SensorView>> {
        let n = self
            .write(move |c| registry::replace_sensor(c, id, address, timeout))
            .await?;
        if n == 0 {
            return Ok(None);
        }
        self.get_sensor(id).await
    }

    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        self.write(move |c| registry::delete_sensor(c, id, now))
            .await
    }

    async fn create_client(&self, cl: Client) -> Result<()> {
        self.write(move |c| registry::create_client(c, cl)).await
    }

    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        self.read(move |c| registry::get_client(c, id)).await
    }

    async fn list_clients(
        &self,
        page: PageRequest,
        disabled: Option<bool>,
    ) -> Result<Page<Client>> {
        self.read(move |c| registry::list_clients(c, page, disabled))
            .await
    }

    async fn replace_client(&self, cl: Client) -> Result<bool> {
        self.write(move |c| registry::replace_client(c, cl)).await
    }

    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        self.write(move |c| registry::delete_client(c, id, now))
            .await
    }

    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        previous_until: Millis,
    ) -> Result<Option<Client>> {
        self.write(move |c| lifecycle::rotate_secret(c, id, secret, previous_until))
            .await
    }

    async fn enable_client(&self, id: String) -> Result<Option<bool>> {
        self.write(move |c| lifecycle::enable_client(c, id)).await
    }

    async fn count_sensors(&self) -> Result<ConnectionCounts> {
        self.read(registry::count_sensors).await
    }

    async fn count_disabled_clients(&self) -> Result<u64> {
        self.read(lifecycle::count_disabled).await
    }

    async fn client_health(&self, id: String, now: Millis) -> Result<Option<Health>> {
        self.read(move |c| lifecycle::client_health(c, id, now))
            .await
    }

    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()> {
        self.write(move |c| registry::link(c, client_id, sensor_id, now))
            .await
    }

    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        self.write(move |c| registry::unlink(c, client_id, sensor_id))
            .await
    }

    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.read(move |c| registry::list_client_sensors(c, client_id, page))
            .await
    }

    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        self.read(move |c| registry::list_sensor_clients(c, sensor_id, page))
            .await
    }

    async fn import(&self, sensors: Vec<Sensor>, links: Vec<(String, SensorId)>) -> Result<()> {
        self.write(move |c| registry::import(c, sensors, links))
            .await
    }

    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>> {
        self.read(registry::load_runtime).await
    }

    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>> {
        self.write(move |c| commit::commit(c, &batch, now)).await
    }

    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        self.read(move |c| history::list_readings(c, sensor_id, range, page))
            .await
    }

    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        self.read(move |c| history::list_events(c, sensor_id, range, page))
            .await
    }

    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>> {
        self.read(move |c| outbox::load_pending(c, after_seq)).await
    }

    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
    ) -> Result<Vec<Claim>> {
        // Every lease is released at open: a lost one costs nothing.
        self.write_relaxed(move |c| outbox::claim(c, ids, &node, now, lease_until))
            .await
    }

    async fn record(
        &self,
        outcomes: Vec<Outcome>,
        now: Millis,
        disable_after: Millis,
    ) -> Result<Vec<Disabled>> {
        self.write_relaxed(move |c| outbox::record(c, outcomes, now, disable_after))
            .await
    }

    async fn load_client_pending(&self, client_id: String) -> Result<Vec<NotificationRef>> {
        self.read(move |c| lifecycle::load_client_pending(c, client_id))
            .await
    }

    async fn retry_notifications(
        &self,
        filter: ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        self.write(move |c| lifecycle::retry_notifications(c, filter, now))
            .await
    }

    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        self.read(move |c| outbox::get_notification(c, id)).await
    }

    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        self.read(move |c| outbox::list_notifications(c, filter, page))
            .await
    }

    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef> {
        self.write(move |c| outbox::retry_notification(c, id, now))
            .await
    }

    async fn count_pending(&self) -> Result<u64> {
        self.read(outbox::count_pending).await
    }

    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        history::ship(self, limit, sink).await
    }

    async fn archive_history(&self, limit: usize) -> Result<usize> {
        self.write(move |c| history::archive(c, limit)).await
    }

    async fn spool_depth(&self) -> Result<u64> {
        self.read(history::spool_depth).await
    }

    async fn create_token(&self, token: ApiToken) -> Result<()> {
        self.write(move |c| tokens::create(c, token)).await
    }

    async fn list_tokens(&self) -> Result<Vec<ApiToken>> {
        self.read(tokens::list).await
    }

    async fn delete_token(&self, id: String) -> Result<bool> {
        self.write(move |c| tokens::delete(c, id)).await
    }
}
