//! Durable storage behind one trait, so the embedded SQLite default and PostgreSQL are
//! interchangeable to every caller. SQL lives only below this module.
//!
//! The store is the truth; the engine's and dispatcher's in-memory indexes are rebuilt from
//! it at start ([`Store::load_runtime`], [`Store::load_pending`]).

use async_trait::async_trait;

use crate::domain::sensor::SensorState;

use crate::domain::client::{Disabled, Health};
use crate::domain::policy;
use crate::domain::token::ApiToken;
use crate::domain::{
    Attempt, Client, Connection, Event, Millis, Notification, Sensor, SensorId, SensorStatus,
    Status,
};
// The outbox types and the claim rule live in the domain now; named here too, so the
// backends keep reaching them through `super::`.
pub(crate) use crate::domain::policy::{ClaimRow, ClaimStep, claim_step};
pub use crate::domain::{Claim, NotificationRef, Outcome, Sendable, Verdict};
// The conformance suite reaches it through `super::*`.
#[cfg(test)]
use crate::domain::EventKind;
pub use batch::{CommitBatch, Fence, ReadingRecord, StateUpdate};
pub use cluster::{ClusterStore, Lease, NodeRow, Owner};

mod batch;
pub mod cluster;
pub mod deadline;
pub mod postgres;
mod rows;
pub mod sqlite;

#[cfg(test)]
mod conformance;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("invalid cursor")]
    BadCursor,
    #[error("database error: {0}")]
    Backend(String),
    /// Cluster mode: the batch names partitions this node no longer holds at those epochs
    /// (another node took them over); nothing of it was written.
    #[error("partitions {0:?} are no longer held by this node (fenced); nothing written")]
    Fenced(Vec<u32>),
    /// The history sink refused a batch; it stays in the spool.
    #[error("history sink: {0}")]
    Sink(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A page request: at most `limit` items after the (decoded) cursor `after`.
#[derive(Debug, Clone, Default)]
pub struct PageRequest {
    pub limit: u32,
    pub after: Option<String>,
}

/// A page of results; `next` is the raw cursor of the next page, if there is one.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from up to `limit + 1` fetched rows: the extra row only proves there
    /// is a next page, whose cursor is the key of the last row kept.
    pub fn from_rows(mut rows: Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> Self {
        let limit = limit as usize;
        let next = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(key)
        } else {
            None
        };
        Page { items: rows, next }
    }
}

/// A half-open time range `[from, to)`; either end may be open.
#[derive(Debug, Clone, Copy, Default)]
pub struct TimeRange {
    pub from: Option<Millis>,
    pub to: Option<Millis>,
}

/// A history row with the id the store gave it. Ids are never reused, so a row keeps its
/// identity when it ships to ClickHouse: the id orders ties and removes duplicates.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<T> {
    pub id: i64,
    pub row: T,
}

/// A webhook attempt as history keeps it: with what it was about, so it can be queried by
/// sensor or client without the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub id: i64,
    pub client_id: String,
    pub sensor_id: String,
    /// The event kind the notification carried.
    pub kind: String,
    pub attempt: Attempt,
}

/// History rows taken from the spool for one shipment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryBatch {
    pub readings: Vec<Stored<ReadingRecord>>,
    pub events: Vec<Stored<Event>>,
    pub attempts: Vec<AttemptRecord>,
}

impl HistoryBatch {
    pub fn len(&self) -> usize {
        self.readings.len() + self.events.len() + self.attempts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where shipped history goes (ClickHouse). The store calls it between taking rows from the
/// spool and letting go of them, so a row leaves the spool only once the sink has it.
#[async_trait]
pub trait HistorySink: Send + Sync {
    /// Keeps the batch durably, or fails and leaves it to be shipped again.
    async fn insert(&self, batch: &HistoryBatch) -> std::result::Result<(), String>;
}

/// What the engine needs of a sensor at start: its id and its state (the one type for a
/// sensor's state in memory, [`SensorState`]).
pub type SensorRuntime = (SensorId, SensorState);

/// Filters of the notification list.
#[derive(Debug, Clone, Default)]
pub struct NotificationFilter {
    pub client_id: Option<String>,
    pub sensor_id: Option<SensorId>,
    pub status: Option<Status>,
}

/// Which failed notifications a bulk replay sends again.
#[derive(Debug, Clone)]
pub struct ReplayFilter {
    pub client_id: String,
    pub sensor_id: Option<SensorId>,
    /// Only those created at or after this time.
    pub since: Option<Millis>,
}

/// Sensor with its current status, as the API shows it.
pub type SensorView = (Sensor, SensorStatus);

/// How many registered sensors are in each connection state (the console's fleet page).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    pub online: u64,
    pub lost: u64,
    /// Registered, never reported.
    pub unknown: u64,
}

impl ConnectionCounts {
    /// From the count of registered sensors and the counts of their state rows by
    /// connection (as stored): whatever has no state row never reported.
    pub(crate) fn from_rows(total: i64, rows: impl IntoIterator<Item = (String, i64)>) -> Self {
        let mut counts = Self::default();
        let mut reported = 0;
        for (conn, n) in rows {
            match crate::domain::Connection::parse(&conn) {
                Some(crate::domain::Connection::Online) => counts.online = n as u64,
                Some(crate::domain::Connection::Lost) => counts.lost = n as u64,
                _ => continue,
            }
            reported += n;
        }
        counts.unknown = (total - reported).max(0) as u64;
        counts
    }
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Cheap liveness check of the backend (readiness).
    async fn ping(&self) -> Result<()>;

    // --- registry: sensors
    /// `Conflict` if the id exists.
    async fn create_sensor(&self, sensor: Sensor) -> Result<()>;
    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>>;
    async fn list_sensors(
        &self,
        connection: Option<Connection>,
        page: PageRequest,
    ) -> Result<Page<SensorView>>;
    /// Registered sensors counted by connection: one aggregate query, no rows returned.
    async fn count_sensors(&self) -> Result<ConnectionCounts>;
    /// Replaces address and timeout; `None` if the sensor does not exist.
    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        heartbeat_timeout_s: Option<u32>,
    ) -> Result<Option<SensorView>>;
    /// Deletes the sensor, its links, state and history; cancels its pending notifications.
    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool>;

    // --- registry: clients
    async fn create_client(&self, client: Client) -> Result<()>;
    async fn get_client(&self, id: String) -> Result<Option<Client>>;
    /// Clients by id; only disabled ones (`Some(true)`) or enabled ones (`Some(false)`).
    async fn list_clients(&self, page: PageRequest, disabled: Option<bool>)
    -> Result<Page<Client>>;
    /// Replaces name, URL, secret and rate limit. `false` if the client does not exist.
    async fn replace_client(&self, client: Client) -> Result<bool>;
    /// Deletes the client and its links; cancels its pending notifications.
    async fn delete_client(&self, id: String, now: Millis) -> Result<bool>;

    // --- registry: a client's lifecycle
    /// Makes `secret` the client's secret; the one it replaces keeps signing until
    /// `previous_until`. `None` if the client does not exist.
    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        previous_until: Millis,
    ) -> Result<Option<Client>>;
    /// Clears `disabled_at` and the failure streak. `None` if the client does not exist,
    /// else whether it was disabled.
    async fn enable_client(&self, id: String) -> Result<Option<bool>>;
    /// Clients disabled now, for the gauge.
    async fn count_disabled_clients(&self) -> Result<u64>;
    /// The client's endpoint health at `now`; `None` if the client does not exist.
    async fn client_health(&self, id: String, now: Millis) -> Result<Option<Health>>;

    // --- registry: links
    /// Idempotent; `NotFound("client")` or `NotFound("sensor")` when one is missing.
    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()>;
    /// Idempotent; `NotFound` as for `link`.
    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()>;
    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>>;
    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>>;

    /// Bulk registration for preparing large fleets (benchmarks, imports): sensors that
    /// exist already and links whose ends are missing are skipped.
    async fn import(&self, sensors: Vec<Sensor>, links: Vec<(String, SensorId)>) -> Result<()>;

    // --- engine
    /// Every registered sensor with its last committed state.
    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>>;
    /// On a shared store: sensors created, changed or deleted after registry change
    /// `after`, each with its state now (`None`: deleted), and the newest change seen; so
    /// each node's engine follows what other nodes' APIs did. A store with one process has
    /// nothing to follow.
    async fn registry_changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<(SensorId, Option<SensorRuntime>)>)> {
        Ok((after, Vec::new()))
    }
    /// The newest registry change (where a node starting now begins to follow).
    async fn newest_registry_change(&self) -> Result<i64> {
        Ok(0)
    }
    /// Forgets registry changes made before `before`.
    async fn prune_registry_changes(&self, _before: Millis) -> Result<()> {
        Ok(())
    }
    /// Periodic upkeep of a shared store ([`upkeep`]): on PostgreSQL, the history
    /// partitions of `now`'s month and the next few, so a node that runs for months keeps
    /// writing history into monthly partitions rather than the default one.
    async fn maintain(&self, _now: Millis) -> Result<()> {
        Ok(())
    }
    /// Makes a batch durable in one transaction and returns the notifications it created,
    /// in outbox order. Older pending, unleased state notifications of a sensor with a new
    /// state change become `superseded` in the same transaction.
    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>>;

    // --- history
    /// A sensor's readings by `(ts, id)`; with ClickHouse configured, the unshipped ones.
    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>>;
    /// A sensor's events by `(at, id)`; with ClickHouse configured, the unshipped ones.
    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>>;

    // --- history spool (only drained when ClickHouse is configured)
    /// Takes up to `limit` of the oldest unshipped readings, events and attempts each, hands
    /// them to `sink`, and once it accepted them deletes the readings and events (ClickHouse
    /// holds them now) and marks the attempts shipped (the outbox still shows them). A sink
    /// failure leaves every row in place. Returns the rows shipped.
    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize>;
    /// Unshipped history rows (readings, events, attempts).
    async fn spool_depth(&self) -> Result<u64>;
    /// Without ClickHouse: moves up to `limit` of the oldest readings from the journal
    /// they are committed to into the store's own archive, returning how many moved.
    /// Backends that index readings as they come have nothing to move.
    async fn archive_history(&self, _limit: usize) -> Result<usize> {
        Ok(0)
    }

    // --- delivery
    /// Pending notifications with `seq > after_seq` (`i64::MIN`: all), in outbox order.
    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>>;
    /// Leases the given pending notifications to `node` until `lease_until`, reading each
    /// one's URL, secret and address from the registry; cancels those whose client is gone
    /// or no longer linked to the sensor.
    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
    ) -> Result<Vec<Claim>>;
    /// Records attempts and their verdicts, releasing the leases, and keeps each client's
    /// failure streak: a client that answered `410 Gone`, or whose every attempt failed for
    /// `disable_after`, is disabled ([`policy::disable_reason`]). Returns the clients it
    /// disabled.
    async fn record(
        &self,
        outcomes: Vec<Outcome>,
        now: Millis,
        disable_after: Millis,
    ) -> Result<Vec<Disabled>>;
    /// A client's pending notifications in outbox order (what an enabled client resumes).
    async fn load_client_pending(&self, client_id: String) -> Result<Vec<NotificationRef>>;
    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>>;
    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>>;
    /// Puts a `failed` notification back to `pending`, due now, with a fresh attempt budget.
    /// `NotFound`, or `Conflict` when it is not failed or a newer state of its sensor was
    /// notified to the client since.
    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef>;
    /// Puts every `failed` notification matching `filter` back to `pending` in outbox
    /// order, as [`Store::retry_notification`] does one; those it would refuse (a newer
    /// state was sent since) are skipped. `NotFound("client")` if the client does not exist.
    async fn retry_notifications(
        &self,
        filter: ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>>;
    /// Pending notifications counted, for the gauge.
    async fn count_pending(&self) -> Result<u64>;
    /// Whether other latch nodes may write this store too (so the dispatcher must look
    /// for work it was not handed).
    fn shared(&self) -> bool {
        false
    }

    // --- API tokens
    /// Keeps a token (its hash, never its secret); `Conflict` if the id exists.
    async fn create_token(&self, token: ApiToken) -> Result<()>;
    /// Every token, oldest first: few enough to hold in memory, as the API's cache does.
    async fn list_tokens(&self) -> Result<Vec<ApiToken>>;
    /// `false` if there was no such token.
    async fn delete_token(&self, id: String) -> Result<bool>;
}

/// Why a notification cannot be retried, when it cannot ([`policy::retry_refusal`], as the
/// store's error).
pub(crate) fn retry_refusal(n: &Notification, newer_state_sent: bool) -> Option<Error> {
    policy::retry_refusal(n, newer_state_sent).map(|r| Error::Conflict(r.to_string()))
}

/// The dispatcher's view of a stored notification.
pub(crate) fn notification_ref(n: &Notification) -> NotificationRef {
    NotificationRef::of(n)
}

/// A history cursor made of a time and a row id, `"{ms}:{id}"`.
pub(crate) fn split_cursor(c: &str) -> Result<(i64, i64)> {
    let (a, b) = c.split_once(':').ok_or(Error::BadCursor)?;
    Ok((
        a.parse().map_err(|_| Error::BadCursor)?,
        b.parse().map_err(|_| Error::BadCursor)?,
    ))
}

/// Rows to fetch for a page: one more than asked proves there is a next page.
pub(crate) fn limit_plus_one(p: &PageRequest) -> i64 {
    p.limit as i64 + 1
}

/// Locks a data folder for this process: one latch per folder, whatever the backend (the
/// folder also holds the node id that leases are taken under).
pub fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("data_dir: cannot create {}: {e}", dir.display()))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("latch.lock"))?;
    // A latch that just stopped in this folder (in this process too: a restart in a test
    // or a bench) lets go within moments, once its last blocking store call returns.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while lock.try_lock().is_err() {
        if std::time::Instant::now() >= deadline {
            anyhow::bail!(
                "data_dir: {} is in use by another latch process",
                dir.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(lock)
}

/// This node's name on leases, kept in the data folder: a node restarted on the same folder
/// takes its own unexpired leases back at once instead of waiting them out.
pub fn node_id(dir: &std::path::Path) -> anyhow::Result<String> {
    let path = dir.join("node-id");
    if let Ok(id) = std::fs::read_to_string(&path)
        && !id.trim().is_empty()
    {
        return Ok(id.trim().to_string());
    }
    let id = format!("latch-{}", ulid::Ulid::new());
    std::fs::write(&path, &id)
        .map_err(|e| anyhow::anyhow!("data_dir: cannot write {}: {e}", path.display()))?;
    Ok(id)
}

/// Opens the store the configuration names.
pub async fn connect(config: &crate::config::Config) -> anyhow::Result<std::sync::Arc<dyn Store>> {
    Ok(connect_cluster(config).await?.0)
}

/// Opens the store the configuration names and, on PostgreSQL, its cluster side: one
/// object behind both handles, so they share one pool and one time bound per call.
pub async fn connect_cluster(
    config: &crate::config::Config,
) -> anyhow::Result<(
    std::sync::Arc<dyn Store>,
    Option<std::sync::Arc<dyn ClusterStore>>,
)> {
    match &config.database_url {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let lock = lock_data_dir(&config.data_dir)?;
            // A commit's fence locks its partitions' lease rows: a node stopped in the middle
            // of one must not keep them past its lease.
            let idle = config.database_timeout.min(config.lease());
            let store = postgres::PgStore::connect_with(url, config.database_timeout, idle).await?;
            let store = std::sync::Arc::new(deadline::Deadline::new(
                store.holding(lock),
                config.database_timeout,
            ));
            Ok((store.clone(), Some(store)))
        }
        Some(url) => anyhow::bail!(
            "database_url: unsupported scheme in {url:?}; use postgres://… or leave it unset for the embedded SQLite store"
        ),
        None => {
            let store = sqlite::SqliteStore::open(&config.data_dir, config.sqlite_synchronous)?;
            Ok((std::sync::Arc::new(store), None))
        }
    }
}

/// How often [`upkeep`] runs [`Store::maintain`]: a few times a day, far ahead of a month's
/// end (start runs it too).
pub const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// Runs [`Store::maintain`] every [`UPKEEP_EVERY`] until `stop`.
pub async fn upkeep(store: std::sync::Arc<dyn Store>, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(UPKEEP_EVERY) => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) = store.maintain(crate::domain::time::now_ms()).await {
            tracing::warn!(error = %e, "Store upkeep failed; it runs again later.");
        }
    }
}
