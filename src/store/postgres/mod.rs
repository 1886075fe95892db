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
//! - Cluster mode (`cluster`): partition leases judged by the database's clock, and a
//!   fence in every commit that holds the batch's partitions' advisory locks shared and
//!   checks their epochs, so a node that lost a partition writes nothing for it.
//! - Migrations run under an advisory lock, so nodes starting together apply them once.
//! - History is partitioned by month; the current and next months' partitions are created
//!   at start, under the migration lock.
//! - Every connection has a connect timeout and TCP keepalive, and the pool bounds its
//!   waits; `db.rs` bounds each call on top, where it takes its connection, since a server
//!   that stops answering enforces none of its own timeouts.
//!
//! This file connects and migrates; each store trait is implemented in the module of its
//! concern (`registry`, `commit`, `outbox`, `history`, `tokens`, `cluster`), with the
//! column lists and row mappers of `store::rows`.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use super::{Backend, Error, Page, Pruned, Result, Retention, Space};
use crate::domain::partition::{DEFAULT_PARTITIONS, Partitioning};
use crate::domain::{Client, Millis};
use db::{Db, Sql};

mod alarms;
mod armed;
mod audit;
mod cluster;
mod commit;
mod db;
mod doubt;
mod escalations;
mod find;
mod history;
mod lifecycle;
mod outbox;
mod registry;
mod replay;
mod retention;
mod schedules;
mod secrets;
pub use secrets::RotationLock;
mod idempotency;
mod sessions;
mod silences;
mod site_moves;
mod site_rounds;
mod site_rows;
mod sites;
mod supersede;
mod tables;
#[cfg(test)]
pub(crate) mod tests;
mod tokens;

/// Schema versions, applied in order; `latch_migrations` records which ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/postgres/0001_init.sql"),
    include_str!("../migrations/postgres/0002_history_spool.sql"),
    include_str!("../migrations/postgres/0003_sensor_changes.sql"),
    include_str!("../migrations/postgres/0004_client_lifecycle.sql"),
    include_str!("../migrations/postgres/0005_api_tokens.sql"),
    include_str!("../migrations/postgres/0006_cluster.sql"),
    include_str!("../migrations/postgres/0007_lane_index.sql"),
    include_str!("../migrations/postgres/0008_outbox_fillfactor.sql"),
    include_str!("../migrations/postgres/0009_state_fillfactor.sql"),
    include_str!("../migrations/postgres/0010_outbox_room.sql"),
    include_str!("../migrations/postgres/0011_pending_table.sql"),
    include_str!("../migrations/postgres/0012_partition_handover.sql"),
    include_str!("../migrations/postgres/0013_cluster_secret.sql"),
    include_str!("../migrations/postgres/0014_rate_schedule.sql"),
    include_str!("../migrations/postgres/0015_delivery_choices.sql"),
    include_str!("../migrations/postgres/0016_client_health.sql"),
    include_str!("../migrations/postgres/0017_console_views.sql"),
    include_str!("../migrations/postgres/0018_node_links.sql"),
    include_str!("../migrations/postgres/0019_batches.sql"),
    include_str!("../migrations/postgres/0020_partition_scheme.sql"),
    include_str!("../migrations/postgres/0021_mqtt_unacked.sql"),
    include_str!("../migrations/postgres/0022_sealed_secrets.sql"),
    include_str!("../migrations/postgres/0023_sites_silences.sql"),
    include_str!("../migrations/postgres/0024_site_released.sql"),
    include_str!("../migrations/postgres/0025_silenced_pairs_site.sql"),
    include_str!("../migrations/postgres/0027_notifications_site.sql"),
    include_str!("../migrations/postgres/0030_notification_sensors.sql"),
    include_str!("../migrations/postgres/0031_node_keys.sql"),
    include_str!("../migrations/postgres/0032_idempotency.sql"),
    include_str!("../migrations/postgres/0033_silence_sensors.sql"),
    include_str!("../migrations/postgres/0034_site_retold.sql"),
    include_str!("../migrations/postgres/0035_sensor_changes_deleted.sql"),
    include_str!("../migrations/postgres/0036_door_signals.sql"),
    include_str!("../migrations/postgres/0037_reading_signals.sql"),
    include_str!("../migrations/postgres/0038_hold_alarms.sql"),
    include_str!("../migrations/postgres/0039_flapping.sql"),
    include_str!("../migrations/postgres/0040_alarms.sql"),
    include_str!("../migrations/postgres/0041_schedules.sql"),
    include_str!("../migrations/postgres/0042_armed.sql"),
    include_str!("../migrations/postgres/0043_silence_schedules.sql"),
    include_str!("../migrations/postgres/0044_escalations.sql"),
    include_str!("../migrations/postgres/0045_audit.sql"),
];

/// Key of the database-wide advisory lock migrations ran under before they were keyed by
/// schema ("latch" in ASCII). Taken shared now, so that schemas migrate side by side (a
/// test run's many schemas waited for each other's migrations, one at a time) while a node
/// of an older release, which takes it exclusive, still migrates alone in a rolling upgrade.
const MIGRATION_LOCK: i64 = 0x006c_6174_6368;
/// Class of the advisory lock (with the schema as the other half of the key) migrations
/// and partition upkeep run under: the nodes of one schema apply them one at a time.
const SCHEMA_MIGRATION_LOCK: i32 = 0x6c74_6d67;
/// Takes the migration locks (see [`MIGRATION_LOCK`]) for this session.
const MIGRATION_LOCK_TAKE: &str = "SELECT pg_advisory_lock_shared($1), \
     pg_advisory_lock($2, hashtext(current_schema()))";
/// Releases what [`MIGRATION_LOCK_TAKE`] took.
const MIGRATION_LOCK_GIVE: &str = "SELECT pg_advisory_unlock($2, hashtext(current_schema())), \
     pg_advisory_unlock_shared($1)";
/// Class of the advisory lock (with the schema as the other half of the key) that every
/// group commit holds shared and a sensor delete exclusive. Without it a commit in flight
/// when the delete runs (its rows not yet visible to the delete) lands after it, leaving
/// readings and state of a deleted sensor behind, which a sensor re-created under that id
/// would inherit. Deletes are rare, so commits almost never wait.
const DELETE_LOCK: i32 = 0x6c74_6364;

/// Class of the advisory lock (with the schema as the other half of the key) upkeep's
/// retention runs under: one node of a cluster at a time.
const UPKEEP_LOCK: i32 = 0x6c74_7570;

/// Class of the advisory lock (with the schema as the other half of the key) `latch
/// rotate-key` holds for its whole run: one rotation at a time, as two at once could each
/// drop the key the other made current.
const ROTATION_LOCK: i32 = 0x6c74_726b;

/// Most pooled connections.
const POOL_SIZE: usize = 16;

/// Months of history partitions created ahead of the current one.
const MONTHS_AHEAD: i32 = 3;

/// How often upkeep creates the history partitions ahead: a few times a day, far ahead of
/// a month's end (start does it too).
const PARTITIONS_EVERY: Millis = 6 * 3600 * 1000;

/// PostgreSQL implementation of [`Store`].
#[derive(Clone)]
pub struct PgStore {
    /// The pool, and the time bound every call is held to.
    db: Db,
    /// The data folder's lock, held for the store's life (see `store::lock_data_dir`).
    _lock: Option<std::sync::Arc<std::fs::File>>,
    /// Whether the database's disk was full at the last commit.
    space: std::sync::Arc<Space>,
    /// When upkeep last created the partitions ahead (start counts).
    partitions_at: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The database's partitioning, read (or fixed) once: every sensor's `hash` is written
    /// by it ([`PgStore::partitioning`]). Shared by clones.
    partitioning: std::sync::Arc<tokio::sync::OnceCell<Partitioning>>,
    /// The partition count to fix if this store is the database's first user.
    wanted: u32,
    /// Seals and opens clients' secrets ([`crate::store::sealing`]); none until
    /// [`PgStore::keyed`], so a store without keys seals nothing.
    keys: std::sync::Arc<crate::secrets::Keyring>,
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
        if e.code() == Some(&tokio_postgres::error::SqlState::DISK_FULL) {
            return Error::Full(describe(&e));
        }
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
pub fn settings(
    url: &str,
    timeout: Duration,
    idle_in_transaction: Duration,
) -> anyhow::Result<tokio_postgres::Config> {
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
    // A transaction left open by a process that stopped in the middle of it (SIGSTOP, a
    // hung VM, a call cut off by its deadline) is ended by the server: its row locks —
    // a commit's fence on partition leases among them — would otherwise hold up a
    // takeover for as long as that process stays stopped.
    let options = format!(
        "{} -c idle_in_transaction_session_timeout={}",
        pg.get_options().unwrap_or(""),
        idle_in_transaction.as_millis().max(1)
    );
    pg.options(options.trim_start());
    Ok(pg)
}

impl PgStore {
    /// Connects to `url` (`postgres://…`), applies pending migrations and creates the
    /// history partitions around now. Waiting for a pooled connection, opening one and
    /// checking one out again each take at most `timeout`.
    pub async fn connect(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        Self::connect_with(url, timeout, timeout).await
    }

    /// As [`PgStore::connect`]; the server ends a transaction of ours left idle for
    /// `idle_in_transaction` (cluster mode: within a partition lease).
    pub async fn connect_with(
        url: &str,
        timeout: Duration,
        idle_in_transaction: Duration,
    ) -> anyhow::Result<Self> {
        let pg = settings(url, timeout, idle_in_transaction)?;
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
        let store = Self {
            db: Db::new(pool, timeout),
            _lock: None,
            space: Default::default(),
            // Never yet by the clock upkeep runs on: its first round makes its month's.
            partitions_at: Default::default(),
            partitioning: Default::default(),
            wanted: DEFAULT_PARTITIONS,
            keys: std::sync::Arc::new(crate::secrets::Keyring::with_keys(&[])),
        };
        store
            .migrate()
            .await
            .map_err(|e| anyhow::anyhow!("database_url: cannot prepare the database: {e}"))?;
        Ok(store)
    }

    /// Fixes `partitions` (`cluster_partitions`) if this store is the database's first
    /// user; otherwise the database's count stands.
    pub fn wanting(mut self, partitions: u32) -> Self {
        self.wanted = partitions;
        self
    }

    /// The database's partitioning, fixed by its first user: the cluster's first node, or
    /// whatever registers the first sensor (`latch bench`'s import), with the partition
    /// count it was given ([`PgStore::wanting`]). Read once, since it never changes.
    pub async fn partitioning(&self) -> Result<Partitioning> {
        self.fixed(self.wanted).await
    }

    async fn fixed(&self, wanted: u32) -> Result<Partitioning> {
        self.partitioning
            .get_or_try_init(|| cluster::fix_partitioning(&self.db, wanted))
            .await
            .copied()
    }

    /// Seals clients' secrets with `keys` from now on, after getting them ready for this
    /// database ([`crate::store::prepare_secrets`]: the key is recorded at the first keyed
    /// start, and secrets not sealed under it are sealed now).
    pub async fn keyed(
        mut self,
        keys: std::sync::Arc<crate::secrets::Keyring>,
    ) -> anyhow::Result<Self> {
        self.keys = keys;
        let resealed = crate::store::prepare_secrets(&self, &self.keys).await?;
        if resealed > 0 {
            tracing::info!(
                clients = resealed,
                "Sealed clients' secrets under the current key."
            );
        }
        Ok(self)
    }

    /// Seals with `keys` as they are (`latch rotate-key`, which gets them ready itself).
    pub(crate) fn using_keys(mut self, keys: std::sync::Arc<crate::secrets::Keyring>) -> Self {
        self.keys = keys;
        self
    }

    /// A client read from the store, its secrets opened.
    fn opened(&self, mut c: Client) -> Result<Client> {
        crate::store::sealing::open_client(&self.keys, &mut c)?;
        Ok(c)
    }

    /// [`PgStore::opened`] for a page of clients.
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

    /// Keeps the data folder's lock for as long as the store lives.
    pub fn holding(mut self, lock: std::fs::File) -> Self {
        self._lock = Some(std::sync::Arc::new(lock));
        self
    }

    /// Applies pending migrations, one node at a time.
    pub async fn migrate(&self) -> Result<()> {
        let mut c = self.db.unbounded().await?;
        c.execute(
            MIGRATION_LOCK_TAKE,
            &[&MIGRATION_LOCK, &SCHEMA_MIGRATION_LOCK],
        )
        .await?;
        let result = async {
            // Asked first: `IF NOT EXISTS` on a table that exists sends a notice, which
            // every node after the first would log at each start.
            if !exists(&c, "latch_migrations").await? {
                c.batch_execute(
                    "CREATE TABLE IF NOT EXISTS latch_migrations (version INTEGER PRIMARY KEY, \
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                )
                .await?;
            }
            let done: i32 = c
                .query_one(
                    "SELECT COALESCE(MAX(version), 0) FROM latch_migrations",
                    &[],
                )
                .await?
                .get(0);
            // A node older than the schema would write rows the newer schema keeps
            // differently (v11: pending notifications listed in a table of their own).
            if done as usize > MIGRATIONS.len() {
                return Err(Error::Backend(format!(
                    "the schema is at version {done}, newer than this latch knows ({}): \
                     run the newer latch on every node",
                    MIGRATIONS.len()
                )));
            }
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
            // This month by the database's clock (upkeep goes on by latch's own).
            let now: Millis = c
                .query_one("SELECT (extract(epoch FROM now()) * 1000)::bigint", &[])
                .await?
                .get(0);
            ensure_partitions(&c, now).await
        }
        .await;
        c.execute(
            MIGRATION_LOCK_GIVE,
            &[&MIGRATION_LOCK, &SCHEMA_MIGRATION_LOCK],
        )
        .await?;
        result
    }
}

/// Whether the table `name` exists on the search path.
async fn exists(c: &tokio_postgres::Client, name: &str) -> Result<bool> {
    Ok(c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await?
        .get(0))
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
            if exists(c, &format!("{table}_{name}")).await? {
                continue;
            }
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

/// Each trait is implemented in the file of its concern; this one is the backend's own.
#[async_trait]
impl Backend for PgStore {
    async fn ping(&self) -> Result<()> {
        self.db
            .get("ping")
            .await?
            .query_one("SELECT 1", &[])
            .await?;
        Ok(())
    }

    async fn maintain(&self, now: Millis, retention: Retention) -> Result<Pruned> {
        use std::sync::atomic::Ordering;
        let c = self.db.unbounded().await?;
        if now - self.partitions_at.load(Ordering::Relaxed) >= PARTITIONS_EVERY {
            // The migration lock, as at start: two nodes creating one partition would race.
            c.execute(
                MIGRATION_LOCK_TAKE,
                &[&MIGRATION_LOCK, &SCHEMA_MIGRATION_LOCK],
            )
            .await?;
            let made = ensure_partitions(&c, now).await;
            c.execute(
                MIGRATION_LOCK_GIVE,
                &[&MIGRATION_LOCK, &SCHEMA_MIGRATION_LOCK],
            )
            .await?;
            made?;
            self.partitions_at.store(now, Ordering::Relaxed);
        }
        // One node's retention is enough: a node that finds another at it skips the round.
        let locked: bool = c
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext(current_schema()))",
                &[&UPKEEP_LOCK],
            )
            .await?
            .get(0);
        if !locked {
            return Ok(Pruned {
                skipped: true,
                ..Pruned::default()
            });
        }
        let result = async {
            let expired = retention::expire_nodes(&c).await?;
            if expired > 0 {
                tracing::info!(nodes = expired, "Forgot cluster nodes silent for an hour.");
            }
            retention::prune(&self.db, &c, retention).await
        }
        .await;
        if let Err(e) = c
            .execute(
                "SELECT pg_advisory_unlock($1, hashtext(current_schema()))",
                &[&UPKEEP_LOCK],
            )
            .await
        {
            // A pooled connection must not keep the lock: close it instead.
            tracing::warn!(error = %describe(&e), "Could not release the upkeep lock; closing its connection.");
            let _ = deadpool_postgres::Object::take(c);
        }
        result
    }
}
