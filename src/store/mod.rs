//! Durable storage behind a few small traits, one per kind of caller, so the embedded SQLite
//! default and PostgreSQL are interchangeable to each of them. SQL lives only below this
//! module.
//!
//! - [`Registry`]: sensors, clients, links (the API).
//! - [`Runtime`]: the group commit and what the engine loads and follows.
//! - [`Outbox`]: claims, results and replays of notifications (delivery, the API).
//! - [`HistoryStore`]: history reads and the spool that ships to ClickHouse.
//! - [`Tokens`]: API tokens.
//! - [`Backend`]: reachability and periodic upkeep.
//! - [`Find`]: the console's sensor search.
//! - [`Secrets`]: the key clients' secrets are sealed under ([`sealing`]).
//! - [`Sites`]: sites and their sensors' counts.
//! - [`Silences`]: maintenance windows and the reconciliation at their end.
//! - [`Idempotency`]: `Idempotency-Key`s and the answers kept for them.
//! - [`ClusterStore`]: partition leases and node rows (PostgreSQL only).
//!
//! [`Store`] is all of them but the cluster's, for the wiring that hands each part its
//! slice. No trait method has a default body: a backend that leaves one out does not
//! compile. Each backend implements a trait in the file of that concern
//! (`sqlite/registry.rs`, `postgres/outbox.rs`, …). On PostgreSQL the time bound of a call
//! is applied where its connection is taken (`postgres/db.rs`), not by a wrapper that
//! repeats every method.
//!
//! The store is the truth; the engine's and dispatcher's in-memory indexes are rebuilt from
//! it at start ([`Runtime::load_runtime`], [`Outbox::load_pending`]).

use async_trait::async_trait;

use crate::domain::client::{Disabled, Health};
use crate::domain::silence::{Silence, SilenceState};
use crate::domain::site::decide::Rules as SiteRules;
use crate::domain::site::{Site, SiteCounts, SiteEvent, SiteTotals};
use crate::domain::token::ApiToken;
use crate::domain::{Attempt, Client, Event, Millis, Notification, Sensor, SensorId};
// The outbox types live in the domain; named here too, so the backends keep reaching them
// through `super::`.
pub(crate) use crate::domain::policy::ClaimRow;
pub use crate::domain::{Claim, ClaimBatch, NotificationRef, Outcome, Sendable, Verdict};
// The conformance suite reaches these through `super::*`.
#[cfg(any(test, feature = "conformance"))]
use crate::domain::Connection;
#[cfg(test)]
use crate::domain::{EventKind, SensorStatus, Status};
pub use audit::{AuditFilter, AuditTrail};
pub use batch::{CommitBatch, Fence, Keyed, ReadingRecord, StateUpdate};
pub use cluster::{ClusterStore, Lease, NodeRow, Owner, SourceLink};
pub use data_dir::{lock_data_dir, node_id, private_dir, private_file, private_files, sync_dir};
pub use error::{Error, Result};
pub use idempotency::{HOLD_MS, Idempotency, KEY_TTL_MS, KeyRow, Taken};
pub use listing::{Search, find_clients};
pub use retention::{Pruned, Retention};
pub use sealing::{Rotated, prepare as prepare_secrets, rotate as rotate_secret_key};
pub use space::Space;
pub use types::{
    AlarmFilter, AttemptRecord, ConnectionCounts, HistoryBatch, HistorySink, NotificationFilter,
    Page, PageRequest, ReplayFilter, SensorFilter, SensorRuntime, SensorView, Stored,
    StoredSchedule, TimeRange, Unacked,
};
pub(crate) use types::{limit_plus_one, notification_ref, retry_refusal, split_cursor};

pub mod audit;
mod batch;
mod operators;
pub use operators::{Alarms, Schedules};
pub mod cluster;
mod data_dir;
mod error;
pub mod idempotency;
pub(crate) mod listing;
pub mod postgres;
mod retention;
mod rows;
pub mod rules;
pub(crate) mod sealing;
mod space;
pub mod sqlite;
mod types;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

/// Registry changes as a follower applies them, in order: each sensor of `deleted` (a
/// deletion among the changes read) that exists again is listed deleted before its state
/// now, so the node serving it drops the old life's memory (lost, its reminders) instead
/// of keeping it as the new one's.
pub fn with_lives_ended(
    changed: Vec<(SensorId, Option<SensorRuntime>)>,
    deleted: &std::collections::BTreeSet<SensorId>,
) -> Vec<(SensorId, Option<SensorRuntime>)> {
    let mut out = Vec::with_capacity(changed.len());
    for (id, now) in changed {
        if now.is_some() && deleted.contains(&id) {
            out.push((id, None));
        }
        out.push((id, now));
    }
    out
}

/// The registry: sensors, clients and the links between them, as the API reads and
/// changes them.
#[async_trait]
pub trait Registry: Send + Sync {
    /// `Conflict` if the id exists.
    async fn create_sensor(&self, sensor: Sensor) -> Result<()>;
    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>>;
    /// The first of `ids` that no sensor has (`None`: all exist), in one read however many
    /// they are (a silence may name 10,000).
    async fn first_missing_sensor(&self, ids: Vec<SensorId>) -> Result<Option<SensorId>>;
    async fn list_sensors(
        &self,
        filter: SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>>;
    /// Registered sensors counted by connection: one aggregate query, no rows returned.
    async fn count_sensors(&self) -> Result<ConnectionCounts>;
    /// Replaces address, timeout, debounce window, site and door-alarm settings at `now`;
    /// `None` if the sensor does not exist. A sensor that leaves a site takes what the site
    /// held of it along (`domain::site::moves`): answers the notifications that made,
    /// pending.
    #[allow(clippy::too_many_arguments)]
    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        heartbeat_timeout_s: Option<u32>,
        debounce_s: Option<u32>,
        site_id: Option<String>,
        alarms: crate::domain::sensor::SensorAlarms,
        now: Millis,
    ) -> Result<Option<(SensorView, Vec<NotificationRef>)>>;
    /// Deletes the sensor, its links, state and history; cancels its pending notifications;
    /// a site holds nothing of it any more, and one down is decided again.
    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool>;

    async fn create_client(&self, client: Client) -> Result<()>;
    async fn get_client(&self, id: String) -> Result<Option<Client>>;
    /// Clients by id; only disabled ones (`Some(true)`) or enabled ones (`Some(false)`).
    async fn list_clients(&self, page: PageRequest, disabled: Option<bool>)
    -> Result<Page<Client>>;
    /// Replaces name, URL, secret and rate limit. `false` if the client does not exist.
    async fn replace_client(&self, client: Client) -> Result<bool>;
    /// Deletes the client and its links; cancels its pending notifications.
    async fn delete_client(&self, id: String, now: Millis) -> Result<bool>;

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
    /// exist already and links whose ends are missing are skipped; links made at `now`.
    async fn import(
        &self,
        sensors: Vec<Sensor>,
        links: Vec<(String, SensorId)>,
        now: Millis,
    ) -> Result<()>;
}

/// What the engine loads at start, follows while running, and commits.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Every registered sensor with its last committed state.
    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>>;
    /// The committed state of each of `ids` that is registered: what memory must hold
    /// after a commit whose outcome is unknown ([`Error::Indeterminate`]).
    async fn load_states(&self, ids: Vec<SensorId>) -> Result<Vec<SensorRuntime>>;
    /// Makes a batch durable in one transaction and returns the notifications it created,
    /// in outbox order. Older pending, unleased state notifications of a sensor with a new
    /// state change become `superseded` in the same transaction. A transaction whose
    /// answer was lost is decided once it has ended (committed: `Ok`; rolled back: a
    /// determinate error); [`Error::Indeterminate`] only when the store could not learn
    /// how it ended.
    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>>;
}

/// The outbox: pending notifications claimed, sent and recorded by the dispatcher; read and
/// replayed through the API.
#[async_trait]
pub trait Outbox: Send + Sync {
    /// Pending notifications with `seq > after_seq` (`i64::MIN`: all), in outbox order.
    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>>;
    /// [`Outbox::load_pending`] without those whose seq is in `known`. A sweep of a shared
    /// store looks a few seconds back for transactions that committed late, so it reads
    /// what it read a second ago again: a backlog of a few seconds' notifications, read in
    /// full every second, cost the database more than sending them. A store shared by
    /// nodes reads the pending seqs first and only the notifications it was not told of;
    /// one of one node reads them all and drops the known ones.
    async fn load_pending_unknown(
        &self,
        after_seq: i64,
        known: std::sync::Arc<std::collections::BTreeSet<i64>>,
    ) -> Result<Vec<NotificationRef>> {
        let mut refs = self.load_pending(after_seq).await?;
        refs.retain(|r| !known.contains(&r.seq));
        Ok(refs)
    }
    /// Leases the given pending notifications to `node` until `lease_until`, reading each
    /// one's URL, secret and address from the registry; cancels those whose client is gone
    /// or no longer linked to the sensor. With `batch`, those leased are marked as sent in
    /// that batch, and its notifications `left_out` are unmarked (their next batch is
    /// another), in the same transaction.
    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
        batch: Option<ClaimBatch>,
    ) -> Result<Vec<Claim>>;
    /// Records attempts and their verdicts, releasing the leases, and keeps each client's
    /// failure streak: a client that answered `410 Gone`, or whose every attempt failed for
    /// `disable_after`, is disabled ([`crate::domain::policy::disable_reason`]). Returns the
    /// clients it disabled.
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
    /// order, as [`Outbox::retry_notification`] does one; those it would refuse (a newer
    /// state was sent since) are skipped. `NotFound("client")` if the client does not exist.
    async fn retry_notifications(
        &self,
        filter: ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>>;
    /// Pending notifications counted, for the gauge.
    async fn count_pending(&self) -> Result<u64>;
}

/// History: readings and events as the API reads them, and the spool that ships them to
/// ClickHouse when it is configured.
#[async_trait]
pub trait HistoryStore: Send + Sync {
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
    /// Takes up to `limit` of the oldest unshipped readings, events and attempts each, hands
    /// them to `sink`, and once it accepted them deletes the readings and events (ClickHouse
    /// holds them now) and marks the attempts shipped (the outbox still shows them). A sink
    /// failure leaves every row in place. Returns the rows shipped.
    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize>;
    /// Unshipped history rows (readings, events, attempts).
    async fn spool_depth(&self) -> Result<u64>;
    /// The time of the oldest reading the store keeps (`None`: none): how far back its
    /// history goes. One index look-up per sensor, so callers cache it.
    async fn history_from(&self) -> Result<Option<Millis>>;
}

/// The embedded store's journal: readings are committed to it and moved in the background
/// into the store's own archive (without ClickHouse), so the writer's file stays small.
/// Only a store that journals implements it; PostgreSQL indexes readings as they come.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Moves up to `limit` of the oldest readings from the journal into the archive,
    /// returning how many moved; history reads answer the same before and after.
    async fn archive_history(&self, limit: usize) -> Result<usize>;
}

/// What the console finds: sensors by an id prefix or words of their address
/// ([`listing`] says what keeps it fast). Clients by name are [`find_clients`].
#[async_trait]
pub trait Find: Send + Sync {
    /// Sensors, by id, whose id starts with the search's text or whose address has a word
    /// starting with each of its words; `filter` filters as in
    /// [`Registry::list_sensors`], `site_id` keeps a site's.
    async fn find_sensors(
        &self,
        search: Search,
        filter: SensorFilter,
        site_id: Option<String>,
        page: PageRequest,
    ) -> Result<Page<SensorView>>;
}

/// API tokens, kept hashed.
#[async_trait]
pub trait Tokens: Send + Sync {
    /// Keeps a token (its hash, never its secret); `Conflict` if the id exists.
    async fn create_token(&self, token: ApiToken) -> Result<()>;
    /// Every token, oldest first: few enough to hold in memory, as the API's cache does.
    async fn list_tokens(&self) -> Result<Vec<ApiToken>>;
    /// `false` if there was no such token.
    async fn delete_token(&self, id: String) -> Result<bool>;
}

/// The backend itself: whether it answers, and its upkeep.
#[async_trait]
pub trait Backend: Send + Sync {
    /// Cheap liveness check of the backend (readiness).
    async fn ping(&self) -> Result<()>;
    /// Periodic upkeep, at least once a minute (`history::retention`): deletes what
    /// `retention` says is too old, in small steps that let commits through between them
    /// (SQLite: batches of rows; PostgreSQL: whole monthly history partitions, the outbox
    /// in batches); on PostgreSQL also creates the history partitions of `now`'s month and
    /// the next few (every few hours), so a node that runs for months keeps writing
    /// history into monthly partitions rather than the default one, and forgets nodes
    /// that left without saying so. On a shared store one node does it at a time: the
    /// others skip the round ([`Pruned::skipped`]).
    async fn maintain(&self, now: Millis, retention: Retention) -> Result<Pruned>;
}

/// What a broker source keeps of its session across a stop: the MQTT publishes that
/// committed and were never acknowledged, which the broker resends to the session's next
/// connection, perhaps made by another process or node ([`crate::ingest::mqtt`]).
#[async_trait]
pub trait Sessions: Send + Sync {
    /// Replaces what `session` (the broker and client id) keeps with `unacked`.
    async fn keep_unacked(&self, session: String, unacked: Vec<Unacked>) -> Result<()>;
    /// What `session` kept, taken: gone from the store once answered, so that an entry
    /// can never outlive the process that goes on with the session.
    async fn take_unacked(&self, session: String) -> Result<Vec<Unacked>>;
}

/// The key clients' secrets are sealed under, and sealing them anew ([`sealing`]): at
/// every start and by `latch rotate-key`.
#[async_trait]
pub trait Secrets: Send + Sync {
    /// The id of the key new secrets are sealed under; `None` before the first keyed start.
    async fn sealing_key(&self) -> Result<Option<String>>;
    /// Seals new secrets under key `id` from now on. A write that seals reads the key in
    /// its own transaction, so it either comes before this or sees `id`.
    async fn set_sealing_key(&self, id: String) -> Result<()>;
    /// Records `id` as the key to seal under unless the store has one already (two nodes
    /// starting at once on a new database: the first wins); answers the store's key.
    async fn first_sealing_key(&self, id: String) -> Result<String>;
    /// Seals anew every client's secrets that are not all sealed under the current key
    /// (plain ones from before, a broker password still in its URL, an older key's), a
    /// few clients a transaction; answers how many changed.
    async fn reseal(&self) -> Result<u64>;
    /// The ids of the keys some client's secret is sealed under now: a rotation drops no
    /// key of these from the key file.
    async fn keys_in_use(&self) -> Result<Vec<String>>;
    /// The live nodes (heartbeat within `live_within`) that have not reported holding key
    /// `id`, each as `id (address)`: a rotation to `id` would leave them unable to deliver.
    /// None on a store no other node runs on.
    async fn nodes_without_key(
        &self,
        _id: &str,
        _live_within: std::time::Duration,
    ) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// Every store trait, for code that calls methods on a concrete store (a backend's own
/// tests, the bench): `use latch::store::prelude::*`.
pub mod prelude {
    pub use super::{
        Backend, ClusterStore, Find, HistoryStore, Journal, Outbox, Registry, Runtime, Secrets,
        Sessions, Tokens,
    };
}

/// Sites: buildings whose sensors fail together. A sensor's site is set with the sensor
/// ([`Sensor::site_id`]); these are the sites themselves.
#[async_trait]
pub trait Sites: Send + Sync {
    /// `Conflict` if the id exists.
    async fn create_site(&self, site: Site) -> Result<()>;
    /// The site and its sensors counted by connection.
    async fn get_site(&self, id: String) -> Result<Option<(Site, SiteCounts)>>;
    /// By id; `down` keeps only the sites down (`true`) or up (`false`).
    async fn list_sites(
        &self,
        down: Option<bool>,
        page: PageRequest,
    ) -> Result<Page<(Site, SiteCounts)>>;
    /// The site's sensors, by id, as [`Registry::list_sensors`] lists them (`filter`
    /// filters the same way).
    async fn site_sensors(
        &self,
        site_id: String,
        filter: SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>>;
    /// Sites down, and events held for the grace of those up, across the store.
    async fn site_totals(&self) -> Result<SiteTotals>;
    /// Writes every field but `created_at`; `false` if there is no such site. A new gateway
    /// has the site decided again as a sensor joining it would (`site::moves::join`): at the
    /// next round when it is down, after its grace when the gateway is lost.
    async fn replace_site(&self, site: Site) -> Result<bool>;
    /// Deletes it at `now`; its sensors stay, in no site, and what it held of them goes to
    /// their clients as their own (`domain::site::moves`). Answers the notifications that
    /// made, pending; `None` if there was no such site.
    async fn delete_site(&self, id: String, now: Millis) -> Result<Option<Vec<NotificationRef>>>;
    /// Decides every site due at `now` (its grace ran out, or it is down), each once across
    /// the cluster, by [`crate::domain::site::decide::decide`]: writes its new state, makes
    /// its notifications and consumes the events held for it. Answers those made, pending,
    /// and the sites that went down or came back.
    async fn decide_sites(&self, rules: SiteRules, now: Millis) -> Result<Decided>;
}

/// Counts notifications a silence kept (`latch_notifications_total{status="silenced"}`) as
/// the transaction that made them marks them: a commit that fails after (rare: the store
/// went away) has counted its own too.
pub(crate) fn count_silenced(n: usize) {
    if n > 0 {
        crate::telemetry::families::NOTIFICATIONS
            .counter_with(&[("status", crate::domain::Status::Silenced.as_str())])
            .increment(n as u64);
        crate::delivery::progress::ended(n as u64);
    }
}

/// What one call of [`Sites::decide_sites`] did.
#[derive(Debug, Default)]
pub struct Decided {
    /// The notifications it made, pending (those a silence matched are not among them).
    pub made: Vec<NotificationRef>,
    /// The sites that went down or came back, in the order decided.
    pub changed: Vec<SiteEvent>,
    /// A transaction of it failed with its answer lost: it may have made notifications
    /// that are not among `made`.
    pub in_doubt: bool,
    /// It decided as many sites as one call takes: more may be due.
    pub more: bool,
}

impl Decided {
    pub fn is_empty(&self) -> bool {
        self.made.is_empty() && self.changed.is_empty()
    }
}

/// Silences (maintenance windows). The group commit applies the active ones to the
/// notifications it makes ([`Runtime::commit`]); an ended one is reconciled once.
#[async_trait]
pub trait Silences: Send + Sync {
    async fn create_silence(&self, silence: Silence) -> Result<()>;
    async fn get_silence(&self, id: String) -> Result<Option<Silence>>;
    /// Newest first by id; `state` as of `now`.
    async fn list_silences(
        &self,
        state: Option<SilenceState>,
        now: Millis,
        page: PageRequest,
    ) -> Result<Page<Silence>>;
    /// Writes its times, comment, schedule, `ended_at` and `updated_at`; `false` if there
    /// is no such silence or its end was reconciled already (unless it follows a schedule:
    /// a window it is moved to that ends later is reconciled at its end again).
    async fn update_silence(&self, silence: Silence) -> Result<bool>;
    /// The silences that follow schedule `id` (no caller ended them), by id.
    async fn silences_following(&self, schedule_id: String) -> Result<Vec<Silence>>;
    /// Reconciles every silence ended by `ended_by` and not yet reconciled, each once
    /// across the cluster (`ended_by` trails `now` by what a commit stamped before the end
    /// may take to land, [`crate::domain::silence::settle_ms`]): for each (client, sensor) it kept a notification from and no other
    /// silence still holds, one notification where the client's view differs from the
    /// sensor's state now. Answers the notifications made, pending.
    async fn reconcile_silences(
        &self,
        ended_by: Millis,
        now: Millis,
    ) -> Result<Vec<NotificationRef>>;
}

/// Every store trait but the cluster's: what the wiring holds and hands out in slices
/// (`Arc<dyn Store>` coerces to `Arc<dyn Outbox>` and the others).
pub trait Store:
    Registry
    + Runtime
    + Outbox
    + HistoryStore
    + Tokens
    + Backend
    + Find
    + Sessions
    + Secrets
    + Sites
    + Silences
    + Alarms
    + Schedules
    + Idempotency
    + AuditTrail
    + 'static
{
}

impl<
    T: Registry
        + Runtime
        + Outbox
        + HistoryStore
        + Tokens
        + Backend
        + Find
        + Sessions
        + Secrets
        + Sites
        + Silences
        + Alarms
        + Schedules
        + Idempotency
        + AuditTrail
        + 'static,
> Store for T
{
}

/// Where the keys that seal clients' secrets come from: `secret_key`, else
/// `secret_key_file`, else the data folder's key file (which a shared store refuses:
/// [`crate::config::Config::check_secret_key`]).
pub fn key_source(config: &crate::config::Config) -> crate::secrets::Source {
    match (&config.secret_key, &config.secret_key_file) {
        (Some(keys), _) => crate::secrets::Source::Given(keys.clone()),
        (None, Some(path)) => crate::secrets::Source::GivenFile(path.clone()),
        (None, None) => {
            crate::secrets::Source::File(config.data_dir.join(crate::secrets::KEY_FILE))
        }
    }
}

/// `latch rotate-key`: every client's secrets sealed anew under a new key
/// ([`sealing::rotate`]), beside a latch that may be serving the store: the embedded one is
/// opened on a connection of its own (not through its data folder's lock), PostgreSQL
/// like any client of it.
pub async fn rotate_key(config: &crate::config::Config) -> anyhow::Result<Rotated> {
    config.check_secret_key()?;
    let keys = std::sync::Arc::new(crate::secrets::Keyring::new(key_source(config)));
    match &config.database_url {
        Some(url) => {
            let store = postgres::PgStore::connect(url, config.database_timeout)
                .await?
                .using_keys(keys.clone());
            let _one_at_a_time = store.rotation_lock().await?;
            sealing::rotate(&store, &keys, config.lease()).await
        }
        None => {
            let _one_at_a_time = sqlite::rotation_lock(&config.data_dir)?;
            let store = sqlite::Offline::open(&config.data_dir, keys.clone())?;
            let rotated = sealing::rotate(&store, &keys, config.lease()).await?;
            if !store.scrub_log()? {
                tracing::warn!(
                    "The write-ahead log could not be emptied while latch reads it: it may \
                     still hold values sealed under the retired key until its next checkpoint \
                     (latch vacuum, with latch stopped, rewrites everything)."
                );
            }
            Ok(rotated)
        }
    }
}

/// Opens the store the configuration names.
pub async fn connect(config: &crate::config::Config) -> anyhow::Result<std::sync::Arc<dyn Store>> {
    Ok(connect_cluster(config).await?.store)
}

/// A store as [`connect_cluster`] opens it: the handles its backend has, one object behind
/// them all (one pool, one time bound per call). Which of them exist is the one place
/// where "shared with other nodes" is decided.
pub struct Opened {
    pub store: std::sync::Arc<dyn Store>,
    /// PostgreSQL's cluster side: leases, registry changes to follow, rate schedules.
    pub cluster: Option<std::sync::Arc<dyn ClusterStore>>,
    /// The embedded store's journal, moved into its archive.
    pub journal: Option<std::sync::Arc<dyn Journal>>,
}

impl Opened {
    /// Whether other latch nodes may write this store too: the dispatcher must then look
    /// for work it was not handed, and commits may run side by side.
    pub fn shared(&self) -> bool {
        self.cluster.is_some()
    }
}

/// The checks of `database_url` that need no connection: a scheme latch speaks and, on
/// PostgreSQL, settings it can honour (no TLS asked for). `latch serve` and `latch config
/// --check` both make them through [`crate::load_config`], before anything touches the
/// network, so the check cannot pass what the start refuses.
pub fn check_database_url(config: &crate::config::Config) -> anyhow::Result<()> {
    match &config.database_url {
        None => Ok(()),
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let idle = config.database_timeout.min(config.lease());
            postgres::settings(url, config.database_timeout, idle).map(drop)
        }
        Some(url) => anyhow::bail!(
            "invalid setting `database_url`: unsupported scheme in {url:?}; use postgres://… \
             or leave it unset for the embedded SQLite store"
        ),
    }
}

/// Opens the store the configuration names with every handle of its backend.
/// Tests of the store (the conformance suite) open it here too, exactly as a server
/// does.
pub async fn connect_cluster(config: &crate::config::Config) -> anyhow::Result<Opened> {
    check_database_url(config)?;
    match &config.database_url {
        Some(url) => {
            config.check_secret_key()?;
            let lock = lock_data_dir(&config.data_dir)?;
            // A commit's fence locks its partitions' lease rows: a node stopped in the middle
            // of one must not keep them past its lease.
            let idle = config.database_timeout.min(config.lease());
            let keys = std::sync::Arc::new(crate::secrets::Keyring::new(key_source(config)));
            let store = postgres::PgStore::connect_with(url, config.database_timeout, idle)
                .await?
                .wanting(config.partitions())
                .keyed(keys)
                .await?;
            let store = std::sync::Arc::new(store.holding(lock));
            Ok(Opened {
                store: store.clone(),
                cluster: Some(store),
                journal: None,
            })
        }
        None => {
            let store = sqlite::SqliteStore::open_keyed(
                &config.data_dir,
                config.sqlite_synchronous,
                key_source(config),
            )?;
            let store = std::sync::Arc::new(store);
            Ok(Opened {
                store: store.clone(),
                cluster: None,
                journal: Some(store),
            })
        }
    }
}
