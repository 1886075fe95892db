//! The embedded store: SQLite in WAL mode, one writer connection and a few readers.
//!
//! SQLite allows one writer at a time, so writes share one connection behind a mutex and
//! the engine makes them count by committing whole batches in one transaction. Readers get
//! their own connections: in WAL mode they never block the writer nor wait for it.
//! rusqlite is synchronous, so every call runs on a thread of the store's own ([`Threads`]):
//! one for the writer, one for the archive's writer, one for each reader.
//!
//! This file opens the database and says, for each call, whether it reads or writes; the SQL
//! is in the module of its concern (`registry`, `commit`, `outbox`, `history`,
//! `lifecycle`), as plain
//! functions over a connection, with the column lists and row mappers of `store::rows`.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Instant;

use async_trait::async_trait;
use rusqlite::Connection;

use super::{Backend, Error, Page, Pruned, Result, Retention, Space};
use crate::domain::{Client, Millis};
use crate::telemetry::families;
pub use secrets::{Offline, rotation_lock};

mod alarms;
mod archive;
mod armed;
mod audit;
mod backup;
mod checkpoint;
mod commit;
mod escalations;
mod find;
mod history;
mod idempotency;
mod lifecycle;
mod outbox;
mod registry;
mod replay;
mod retention;
mod schedules;
mod secrets;
mod seen;
mod sessions;
mod silences;
mod site_moves;
mod site_rounds;
mod site_rows;
mod sites;
mod supersede;
mod tables;
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
    include_str!("../migrations/sqlite/0008_delivery_choices.sql"),
    include_str!("../migrations/sqlite/0009_client_health.sql"),
    include_str!("../migrations/sqlite/0010_console_views.sql"),
    include_str!("../migrations/sqlite/0011_batches.sql"),
    include_str!("../migrations/sqlite/0012_archive_file.sql"),
    // 0013 is another change's; the runner numbers migrations by their place here.
    include_str!("../migrations/sqlite/0014_mqtt_unacked.sql"),
    include_str!("../migrations/sqlite/0015_sealed_secrets.sql"),
    include_str!("../migrations/sqlite/0016_attempts_ids_never_reused.sql"),
    include_str!("../migrations/sqlite/0017_sites_silences.sql"),
    include_str!("../migrations/sqlite/0018_state_flush.sql"),
    include_str!("../migrations/sqlite/0019_site_released.sql"),
    include_str!("../migrations/sqlite/0020_events_journal.sql"),
    include_str!("../migrations/sqlite/0021_silenced_pairs_site.sql"),
    include_str!("../migrations/sqlite/0022_archive_made.sql"),
    include_str!("../migrations/sqlite/0024_notifications_site.sql"),
    include_str!("../migrations/sqlite/0027_notification_sensors.sql"),
    include_str!("../migrations/sqlite/0028_idempotency.sql"),
    include_str!("../migrations/sqlite/0029_silence_sensors.sql"),
    include_str!("../migrations/sqlite/0030_site_retold.sql"),
    include_str!("../migrations/sqlite/0031_door_signals.sql"),
    include_str!("../migrations/sqlite/0032_reading_signals.sql"),
    include_str!("../migrations/sqlite/0033_hold_alarms.sql"),
    include_str!("../migrations/sqlite/0034_flapping.sql"),
    include_str!("../migrations/sqlite/0035_alarms.sql"),
    include_str!("../migrations/sqlite/0036_schedules.sql"),
    include_str!("../migrations/sqlite/0037_armed.sql"),
    include_str!("../migrations/sqlite/0038_silence_schedules.sql"),
    include_str!("../migrations/sqlite/0039_escalations.sql"),
    include_str!("../migrations/sqlite/0040_audit.sql"),
];

pub use backup::{backup, restore, vacuum};

/// The setting lives with the other settings; the store only maps it to its pragma.
pub use crate::config::Synchronous;

fn pragma(sync: Synchronous) -> &'static str {
    match sync {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    }
}

/// What the store's owner may tune beside durability; the defaults are what latch runs with.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Size of `latch.db`'s write-ahead log, in 4 KiB pages, past which it is checkpointed.
    /// Tests of the files on disk make it small, so that their short runs checkpoint often.
    pub checkpoint_pages: i32,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            checkpoint_pages: checkpoint::CHECKPOINT_PAGES,
        }
    }
}

struct Inner {
    /// Checkpoints the write-ahead log beside the writer. First, so that it stops before
    /// the rest goes.
    checkpointer: checkpoint::Checkpointer,
    /// Held for the store's life: one process per data folder.
    _lock: std::fs::File,
    /// Shared with the checkpointer, which holds it for a checkpoint's last pass.
    writer: Arc<Mutex<Writer>>,
    /// The thread the writer's calls run on.
    writing: Threads,
    /// Reader `i` is used by the `i`th thread of `reading` only.
    readers: Vec<Mutex<Connection>>,
    reading: Threads,
    /// The writer of `archive.db` and its thread, when the archive is there ([`archive`]).
    archiver: Option<(Mutex<Connection>, Threads)>,
    /// Whether the disk was full at the last write.
    space: Space,
    /// The data folder, whose file system readiness looks at while the disk is full.
    dir: std::path::PathBuf,
    /// Seals and opens clients' secrets ([`crate::store::sealing`]).
    keys: Arc<crate::secrets::Keyring>,
    /// Sensors' times not written yet ([`seen`]).
    seen: Arc<seen::Seen>,
}

/// SQLite implementation of [`Store`].
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

fn backend(e: rusqlite::Error) -> Error {
    // SQLITE_FULL: a write found no room on the disk (the WAL or the database could not
    // grow); the statement or transaction was rolled back.
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
        return Error::Full(e.to_string());
    }
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

/// What a write-ahead log file is cut back to once it starts over: a log is never shorter
/// on disk than the most it ever held, so one that grew while a checkpoint could not finish
/// (retention's reads keep a snapshot while it deletes, a checkpoint passes beside a burst
/// of writes) kept that size for good, and each such episode left it larger: `latch.db-wal`
/// went 42 → 104 MB and `archive.db-wal` 5 → 68 MB within three minutes under retention of
/// 20 s (`latch bench retention`). Cut to the size a log is checkpointed at, it grows past
/// that only until the checkpoint after the episode. `latch.db`'s log is checkpointed at
/// ~40 MiB ([`checkpoint`]), the archive's by its writer at SQLite's 1,000 pages.
const LOG_LIMITS: [(&str, i64); 2] = [
    ("main", checkpoint::LOG_BYTES),
    ("archive", checkpoint::log_bytes(1_000)),
];

fn open_conn(path: &Path, sync: Synchronous) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(Some(LOG_LIMITS[0].0), "journal_size_limit", LOG_LIMITS[0].1)?;
    conn.pragma_update(None, "synchronous", pragma(sync))?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating if needed) `latch.db` in `dir` and brings its schema up to date;
    /// clients' secrets are sealed with the data folder's key file.
    pub fn open(dir: &Path, sync: Synchronous) -> anyhow::Result<Self> {
        Self::open_tuned(dir, sync, Tuning::default())
    }

    /// As [`SqliteStore::open`], tuned.
    pub fn open_tuned(dir: &Path, sync: Synchronous, tuning: Tuning) -> anyhow::Result<Self> {
        let keys = crate::secrets::Source::File(dir.join(crate::secrets::KEY_FILE));
        Self::open_with(dir, sync, keys, tuning)
    }

    /// As [`SqliteStore::open`], with clients' secrets sealed by keys from `keys`. Secrets
    /// written before they were sealed are sealed now, before anything reads them.
    pub fn open_keyed(
        dir: &Path,
        sync: Synchronous,
        keys: crate::secrets::Source,
    ) -> anyhow::Result<Self> {
        Self::open_with(dir, sync, keys, Tuning::default())
    }

    fn open_with(
        dir: &Path,
        sync: Synchronous,
        keys: crate::secrets::Source,
        tuning: Tuning,
    ) -> anyhow::Result<Self> {
        // The embedded store belongs to one process. The lock makes that a fact, which is
        // what lets us release every lease at open: whoever held them is gone. It also
        // makes the folder and latch's files in it private (`store::private_dir`).
        let lock = super::lock_data_dir(dir)?;
        let path = dir.join("latch.db");
        // Made 0600 before SQLite first opens it: its log files take its mode.
        super::private_file(&path)?;
        let mut writer = open_conn(&path, sync)?;
        // The log is checkpointed beside the writer rather than in its commits.
        checkpoint::watch(&writer);
        migrate(&mut writer)?;
        // Before anything reads a sensor's state: the times of readings a crash left
        // unwritten (`seen.rs`).
        let seen = Arc::new(seen::recover(&mut writer)?);
        idempotency::release_all(&writer)?;
        let keys = Arc::new(crate::secrets::Keyring::new(keys));
        prepare_keys(&mut writer, &keys)?;
        let layout = archive::layout(&writer)?;
        if layout == archive::Layout::OwnFile {
            archive::ensure_present(&writer, &path)?;
            super::private_file(&archive::path(&path))?;
        }
        // The files' names are on the disk before anything in them counts on them (the
        // record below, a commit answered).
        super::sync_dir(dir);
        let attach = |c: Connection| -> rusqlite::Result<Connection> {
            if layout == archive::Layout::OwnFile {
                archive::attach(&c, &path)?;
                c.pragma_update(Some(LOG_LIMITS[1].0), "journal_size_limit", LOG_LIMITS[1].1)?;
            }
            Ok(c)
        };
        let writer = attach(writer)?;
        archive::opened(&writer, layout)?;
        commit::prepare(&writer)?;
        writer.execute(
            "UPDATE notifications SET claimed_by = NULL, lease_until = NULL \
             WHERE lease_until IS NOT NULL",
            [],
        )?;
        let readers = (0..READERS)
            .map(|_| open_conn(&path, sync).and_then(attach).map(Mutex::new))
            .collect::<rusqlite::Result<Vec<_>>>()?;
        // The archive's writer: its steps wait for the disk, whatever `sync` says. A move
        // deletes what it copied from the journal in `latch.db`, whose next commit syncs;
        // had the copy in this other file not reached the disk first, a power cut could
        // keep the delete and lose the copy: readings answered 202 in neither file. One
        // sync a step of 5,000 readings, on this writer's own thread.
        let archiver = match layout {
            archive::Layout::OwnFile => {
                let c = attach(open_conn(&path, sync)?)?;
                c.pragma_update(Some("archive"), "synchronous", "FULL")?;
                Some((Mutex::new(c), Threads::start("latch-store-archive", 1)?))
            }
            archive::Layout::InMain => None,
        };
        let writer = Arc::new(Mutex::new(Writer {
            conn: writer,
            configured: sync,
            relaxed: false,
        }));
        let checkpointer =
            checkpoint::Checkpointer::start(&path, sync, writer.clone(), tuning.checkpoint_pages)?;
        Ok(Self {
            inner: Arc::new(Inner {
                checkpointer,
                _lock: lock,
                writer,
                writing: Threads::start("latch-store-writer", 1)?,
                readers,
                reading: Threads::start("latch-store-reader", READERS)?,
                archiver,
                space: Space::default(),
                dir: dir.to_path_buf(),
                keys,
                seen,
            }),
        })
    }

    /// The keys clients' secrets are sealed with.
    fn keys(&self) -> Arc<crate::secrets::Keyring> {
        self.inner.keys.clone()
    }

    /// A client read from the store, its secrets opened.
    fn opened(&self, mut c: Client) -> Result<Client> {
        crate::store::sealing::open_client(&self.inner.keys, &mut c)?;
        Ok(c)
    }

    /// [`SqliteStore::opened`] for a page of clients.
    fn opened_page(&self, page: Page<Client>) -> Result<Page<Client>> {
        Ok(Page {
            items: page
                .items
                .into_iter()
                .map(|c| self.opened(c))
                .collect::<Result<_>>()?,
            next: page.next,
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

    /// A write whose loss in a crash of the machine only means sending again (claims and
    /// recorded results) or doing again (a delete of readings the archive holds already).
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
        let asked = Instant::now();
        self.inner
            .writing
            .run(move |_| {
                // The checkpointer holds it too, for a checkpoint's last pass.
                let mut w = inner.writer.lock().unwrap_or_else(|p| p.into_inner());
                families::STORE_WRITER_WAIT_SECONDS
                    .histogram()
                    .record(asked.elapsed().as_secs_f64());
                let result = f(&mut w);
                inner.space.note(&result);
                inner.checkpointer.after_write(&w.conn);
                result
            })
            .await
    }

    /// A write to the archive: on its own writer, durable whatever the store's level, when
    /// it has one; else as [`SqliteStore::write_relaxed`] (`latch.db`'s one log keeps the
    /// copy ahead of the delete that follows it).
    async fn write_archive<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let Some((_, archiving)) = &self.inner.archiver else {
            return self.write_relaxed(f).await;
        };
        let inner = self.inner.clone();
        archiving
            .run(move |_| {
                let (archiver, _) = inner.archiver.as_ref().expect("checked above");
                let mut c = archiver.lock().unwrap_or_else(|p| p.into_inner());
                let result = f(&mut c);
                inner.space.note(&result);
                result
            })
            .await
    }

    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        self.inner
            .reading
            .run(move |i| {
                let conn = inner.readers[i].lock().unwrap_or_else(|p| p.into_inner());
                f(&conn)
            })
            .await
    }
}

/// A call to run on one of a [`Threads`], given the index of the thread that runs it.
type Job = Box<dyn FnOnce(usize) + Send>;

/// A fixed set of threads that run the store's calls, in the order asked, each call on the
/// first thread free.
///
/// Not Tokio's blocking pool: a call waiting there for a connection held by another holds
/// a thread of the pool, so the pool grew with the calls waiting at the busiest moment, and
/// its threads ended after 10 s idle and started again under the next burst. Each new
/// thread takes allocator pages of its own, and the process's memory grew with them over a
/// million deliveries (`latch bench soak`, BENCHMARKS.md). Here a call waits in a queue,
/// not on a thread, and the threads are the connections' count and live as long as the
/// store. The pool stays for what else blocks (DNS lookups), and neither waits for the
/// other.
struct Threads {
    /// Dropped with the store: each thread then finds the queue closed and ends.
    queue: mpsc::Sender<Job>,
}

impl Threads {
    fn start(name: &str, n: usize) -> std::io::Result<Self> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..n {
            let jobs = jobs.clone();
            let name = if n == 1 {
                name.to_string()
            } else {
                format!("{name}-{i}")
            };
            std::thread::Builder::new().name(name).spawn(move || {
                loop {
                    // Held only to take the next call: the others wait for the queue here.
                    let next = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(job) = next else { return };
                    job(i);
                }
            })?;
        }
        Ok(Self { queue })
    }

    /// Runs `f` on one of the threads. A panic in it is this call's error; the thread goes
    /// on with the next call.
    async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(usize) -> Result<T> + Send + 'static,
    {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |i| {
            let _ = done.send(std::panic::catch_unwind(AssertUnwindSafe(|| f(i))));
        });
        let failed = |why: &str| Error::Backend(format!("store task failed: {why}"));
        self.queue
            .send(job)
            .map_err(|_| failed("its thread is gone"))?;
        match result.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(failed("it panicked")),
            Err(_) => Err(failed("its thread is gone")),
        }
    }
}

/// Free space on the data folder's file system that makes a store whose disk was full
/// ready again: room for the write-ahead log to take a few large group commits.
const FREE_TO_RESUME: u64 = 8 << 20;

/// Bytes an unprivileged process may still write on `dir`'s file system.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a writable statvfs for the call.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Gets the keyring ready for this database ([`crate::store::sealing::prepare`]): the key
/// it seals under is recorded at its first keyed start, and secrets not sealed under it
/// are sealed now. Cells freed by the resealing are zeroed in their pages, so plain text
/// written by an earlier version is not left in them.
fn prepare_keys(c: &mut Connection, keys: &crate::secrets::Keyring) -> anyhow::Result<()> {
    let recorded = secrets::sealing_key(c)?;
    let current = keys.prepare(recorded.as_deref())?;
    if recorded.is_none() {
        // `latch rotate-key` beside a first start may have recorded one meanwhile.
        let stands = secrets::first_sealing_key(c, &current)?;
        if stands != current {
            keys.prepare(Some(&stands))?;
        }
    }
    c.pragma_update(None, "secure_delete", "FAST")?;
    let resealed = secrets::reseal(c, keys);
    c.pragma_update(None, "secure_delete", "OFF")?;
    let resealed = resealed?;
    // Every value is sealed bound now; this store is the only writer.
    keys.refuse_unbound();
    if resealed > 0 {
        tracing::info!(
            clients = resealed,
            "Sealed clients' secrets under the current key."
        );
    }
    Ok(())
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

/// Each trait is implemented in the file of its concern, as a read on a reader or a write
/// on the writer; this one is the backend's own.
#[async_trait]
impl Backend for SqliteStore {
    /// While the disk was full at the last write, ready again once its file system has
    /// [`FREE_TO_RESUME`] free: a write of a page or two may fit where a group commit does
    /// not (a failed commit leaves the write-ahead log grown), so a probe write would say
    /// ready too early. The next write that succeeds ends the episode.
    async fn ping(&self) -> Result<()> {
        if self.inner.space.is_full() {
            return match free_bytes(&self.inner.dir) {
                Some(free) if free >= FREE_TO_RESUME => Ok(()),
                free => Err(Error::Full(format!(
                    "{} bytes free in the data folder's file system",
                    free.map_or("unknown".to_string(), |f| f.to_string())
                ))),
            };
        }
        self.read(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    /// Retention only: one file, no partitions. What `retention` says is too old is deleted
    /// step by step (`retention.rs` says how a step keeps the writer free).
    async fn maintain(&self, _now: Millis, retention: Retention) -> Result<Pruned> {
        use super::retention::{HISTORY_STEP, OUTBOX_STEP, SENSORS_STEP, outbox_step};
        use retention::{
            JOURNAL_STEP, before_id, delete_history, delete_notifications, old_history, pace,
            scan_outbox,
        };
        let mut pruned = Pruned::default();
        if let Some(before) = retention.history_before {
            // What waits in the journal joins the archive first (as the archiver would within
            // a second), so this round sees every reading.
            history::archive(self, JOURNAL_STEP).await?;
            let mut after = String::new();
            loop {
                let from = after.clone();
                let sensors = self
                    .read(move |c| old_history(c, &from, before, SENSORS_STEP))
                    .await?;
                let Some(last) = sensors.last().cloned() else {
                    break;
                };
                let started = Instant::now();
                let (step, unfinished) = self
                    .write(move |c| delete_history(c, &sensors, before, HISTORY_STEP))
                    .await?;
                pruned.add(step);
                // A sensor with more old rows than one step deletes is taken up again.
                after = match unfinished {
                    Some(id) => before_id(&id),
                    None => last,
                };
                pace(started).await;
            }
        }
        if let Some(before) = retention.notifications_before {
            let mut after = i64::MIN;
            loop {
                let rows = self.read(move |c| scan_outbox(c, after)).await?;
                let (doomed, next, done) = outbox_step(&rows, before, OUTBOX_STEP);
                if !doomed.is_empty() {
                    let started = Instant::now();
                    let step = self
                        .write(move |c| delete_notifications(c, &doomed, before))
                        .await?;
                    pruned.add(step);
                    pace(started).await;
                }
                if done {
                    break;
                }
                after = next;
            }
            loop {
                let started = Instant::now();
                let shipped_only = retention.audit_unshipped_kept;
                let n = self
                    .write(move |c| audit::prune_step(c, before, shipped_only))
                    .await?;
                pruned.audit += n;
                if n < super::audit::PRUNE_STEP as u64 {
                    break;
                }
                pace(started).await;
            }
        }
        Ok(pruned)
    }
}
