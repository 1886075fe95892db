//! What cluster mode needs of the database (PostgreSQL only): node registration, partition
//! leases judged by the database's clock, and loading the sensors of the partitions a node
//! takes over. The fencing half — every commit checks its partitions' epochs in its own
//! transaction — is in [`super::Store::commit`] through [`super::CommitBatch::fence`].

use std::time::Duration;

use async_trait::async_trait;

use super::{Result, SensorRuntime};
use crate::domain::partition::Partitioning;
use crate::domain::{Millis, SensorId, Source};

/// A partition lease this node holds.
pub type Lease = super::Fence;

/// A registered node, as `GET /v1/cluster` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    pub id: String,
    pub address: String,
    /// Last heartbeat, by the database's clock (ms since the epoch).
    pub heartbeat_at: Millis,
    /// Partitions whose lease it holds now.
    pub partitions: u32,
}

/// Who serves a partition now: a node whose lease has not run out.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub partition: u32,
    pub node: String,
    pub address: String,
    pub epoch: i64,
}

#[async_trait]
pub trait ClusterStore: Send + Sync + 'static {
    /// The cluster's partitioning: `wanted` partitions of the consistent-hash exchange's
    /// function when the database is used for the first time (and the leases created),
    /// else what was fixed then (MD5 ranges for databases older than the choice).
    async fn partitions(&self, wanted: u32) -> Result<Partitioning>;
    /// Registers this node or refreshes its heartbeat and address (database time), and
    /// returns the ids of the live nodes — heartbeat within `live_within` — sorted.
    async fn heartbeat(
        &self,
        node: &str,
        address: &str,
        live_within: Duration,
    ) -> Result<Vec<String>>;
    /// Extends every lease `node` holds to the database's now + `lease` and returns them.
    async fn renew(&self, node: &str, lease: Duration) -> Result<Vec<Lease>>;
    /// Takes up to `max` partitions whose lease is free or has run out (and, with
    /// `reclaim_own`, those still leased to `node` by an earlier process on the same data
    /// folder), each under a new epoch, leased until now + `lease`. Lowest partitions
    /// first; partitions another node is taking at the same moment are skipped.
    async fn acquire(
        &self,
        node: &str,
        max: u32,
        lease: Duration,
        reclaim_own: bool,
    ) -> Result<Vec<Lease>>;
    /// Gives back every outbox lease `node` holds on a pending notification, at its start:
    /// they are an earlier process's (killed with attempts in flight), and its lanes start
    /// empty. Kept, a claim would count them as this node's own lanes' and let a newer
    /// notification pass the older one leased, which then went after it. Answers how many.
    async fn forget_outbox_leases(&self, node: &str) -> Result<u64>;
    /// Gives up these leases (owner cleared, epoch bumped) where `node` still holds them
    /// at those epochs, so another node can take them at once; who released them, and
    /// when, is kept for [`ClusterStore::deadline_floors`].
    async fn release(&self, node: &str, leases: &[Lease]) -> Result<()>;
    /// The time the deadlines of partitions `node` just acquired (`leases`) count from: the
    /// previous owner's, when another node handed them over (released them at most
    /// `within` ago) — a handover from a live node keeps the sensors' deadlines — else
    /// `since`: a takeover after a crash, or after nobody served them, whose silence is not
    /// the sensors'. Kept with the lease for the next move.
    async fn deadline_floors(
        &self,
        node: &str,
        leases: &[Lease],
        since: Millis,
        within: Duration,
    ) -> Result<Vec<(u32, Millis)>>;
    /// Deletes the node's registration (a clean stop, after releasing its leases).
    async fn leave(&self, node: &str) -> Result<()>;
    /// The current owner of every partition that has one (lease not run out).
    async fn owners(&self) -> Result<Vec<Owner>>;
    /// Nodes with a heartbeat within `live_within`, by id, with their lease counts.
    async fn nodes(&self, live_within: Duration) -> Result<Vec<NodeRow>>;
    /// The sensors of `parts` (of `partitions`) with their committed state.
    async fn load_partitions(&self, parts: &[u32], partitions: u32) -> Result<Vec<SensorRuntime>>;
    /// The secret nodes authenticate each other with when none is configured: `candidate`
    /// for the first caller on this database, what that caller stored for every later one.
    /// Needs the cluster row ([`ClusterStore::partitions`] first).
    async fn shared_secret(&self, candidate: &str) -> Result<String>;
    /// Records the fingerprint of the secret `node` (registered) authenticates with,
    /// forgets every node's recorded in another form than `form` (how the given one begins:
    /// an older form is weaker, and must not stay in the database), and returns the other
    /// nodes live within `live_within` that recorded one, by id, with it. Whether two
    /// fingerprints name one secret is [`crate::cluster::trust`]'s to say, not the store's.
    async fn secret_fingerprints(
        &self,
        node: &str,
        fingerprint: &str,
        form: &str,
        live_within: Duration,
    ) -> Result<Vec<(String, String)>>;
    /// Leases the next `tokens` request slots of `client`'s cluster-wide `rate_limit`, one
    /// every `interval_us`, from the one schedule all nodes share (in one statement), and
    /// returns when the first starts and the database's now, in microseconds since the
    /// epoch by the database's clock.
    async fn grant_rate(&self, client: &str, tokens: u32, interval_us: i64) -> Result<(i64, i64)>;
    /// Records that `node` lost (`up` false) or made its connection to the broker of
    /// `source` at `at` (its clock).
    async fn set_source_link(&self, node: &str, source: Source, up: bool, at: Millis)
    -> Result<()>;
    /// Every broker link as the nodes live within `live_within` last recorded it, one per
    /// source: down while any of them is down, else up since the latest reconnect. What
    /// each node's engine follows: a sensor's readings may come through any node's
    /// connection (the AMQP exchange's queues are every node's), so none declares it lost
    /// while one of those connections is down.
    async fn source_links(&self, live_within: Duration) -> Result<Vec<SourceLink>>;
    /// Sensors created, changed or deleted after registry change `after`, each with its
    /// state now (`None`: deleted), and the newest change seen; so each node's engine
    /// follows what other nodes' APIs did. A sensor deleted meanwhile and made again is
    /// listed deleted first, then with its state ([`with_lives_ended`](super::with_lives_ended)).
    async fn registry_changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<(SensorId, Option<SensorRuntime>)>)>;
    /// The newest registry change (where a node starting now begins to follow).
    async fn newest_registry_change(&self) -> Result<i64>;
    /// Forgets registry changes made before `before`.
    async fn prune_registry_changes(&self, before: Millis) -> Result<()>;
}

/// A broker link as [`ClusterStore::source_links`] sums up the nodes' records.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceLink {
    pub source: Source,
    pub up: bool,
    pub at: Millis,
}
