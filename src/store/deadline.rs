//! A time bound on every call to a networked store.
//!
//! A database that stops answering without refusing (a frozen host, a network that drops
//! packets, a proxy that hangs) never enforces its own `statement_timeout`, and TCP may
//! take many minutes to notice. So the caller keeps the clock: each call either finishes
//! within the bound or fails with a backend error, which the API answers with 503 and
//! `/readyz` reports, instead of a request that hangs.

use std::time::Duration;

use async_trait::async_trait;

use super::{
    Claim, ClusterStore, CommitBatch, ConnectionCounts, Error, HistorySink, Lease, NodeRow,
    NotificationFilter, NotificationRef, Outcome, Owner, Page, PageRequest, ReadingRecord,
    ReplayFilter, Result, SensorRuntime, SensorView, Store, Stored, TimeRange,
};
use crate::domain::client::{Disabled, Health};
use crate::domain::token::ApiToken;
use crate::domain::{Attempt, Client, Connection, Event, Millis, Notification, Sensor, SensorId};

/// Time a shipment may spend in the history sink on top of the store's own bound: the
/// sink (ClickHouse) has its own timeouts per insert, and a shipment makes a few inserts.
const SINK_ALLOWANCE: Duration = Duration::from_secs(300);

/// How many times the bound the start-time loads may take: they read every sensor or every
/// pending notification at once, which on a large fleet is much more than one request's
/// work.
const BULK_FACTOR: u32 = 12;

/// A store whose every call finishes within `limit` (bulk loads and shipments: longer).
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
}

impl<S: Store> Deadline<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self { inner, limit }
    }

    async fn within<T>(
        &self,
        limit: Duration,
        what: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(limit, call).await {
            Ok(result) => result,
            Err(_) => {
                metrics::counter!("latch_store_timeouts_total", "call" => what).increment(1);
                Err(Error::Backend(format!(
                    "the database did not answer within {limit:?} ({what})"
                )))
            }
        }
    }

    async fn bound<T>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.within(self.limit, what, call).await
    }
}

#[async_trait]
impl<S: Store> Store for Deadline<S> {
    async fn ping(&self) -> Result<()> {
        self.bound("ping", self.inner.ping()).await
    }
    async fn create_sensor(&self, sensor: Sensor) -> Result<()> {
        self.bound("create_sensor", self.inner.create_sensor(sensor))
            .await
    }
    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        self.bound("get_sensor", self.inner.get_sensor(id)).await
    }
    async fn list_sensors(
        &self,
        connection: Option<Connection>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.bound("list_sensors", self.inner.list_sensors(connection, page))
            .await
    }
    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        heartbeat_timeout_s: Option<u32>,
    ) -> Result<Option<SensorView>> {
        let call = self.inner.replace_sensor(id, address, heartbeat_timeout_s);
        self.bound("replace_sensor", call).await
    }
    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        self.bound("delete_sensor", self.inner.delete_sensor(id, now))
            .await
    }
    async fn create_client(&self, client: Client) -> Result<()> {
        self.bound("create_client", self.inner.create_client(client))
            .await
    }
    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        self.bound("get_client", self.inner.get_client(id)).await
    }
    async fn list_clients(
        &self,
        page: PageRequest,
        disabled: Option<bool>,
    ) -> Result<Page<Client>> {
        self.bound("list_clients", self.inner.list_clients(page, disabled))
            .await
    }
    async fn replace_client(&self, client: Client) -> Result<bool> {
        self.bound("replace_client", self.inner.replace_client(client))
            .await
    }
    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        self.bound("delete_client", self.inner.delete_client(id, now))
            .await
    }
    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        previous_until: Millis,
    ) -> Result<Option<Client>> {
        let call = self.inner.rotate_secret(id, secret, previous_until);
        self.bound("rotate_secret", call).await
    }
    async fn enable_client(&self, id: String) -> Result<Option<bool>> {
        self.bound("enable_client", self.inner.enable_client(id))
            .await
    }
    async fn count_sensors(&self) -> Result<ConnectionCounts> {
        self.bound("count_sensors", self.inner.count_sensors())
            .await
    }
    async fn count_disabled_clients(&self) -> Result<u64> {
        let call = self.inner.count_disabled_clients();
        self.bound("count_disabled_clients", call).await
    }
    async fn client_health(&self, id: String, now: Millis) -> Result<Option<Health>> {
        self.bound("client_health", self.inner.client_health(id, now))
            .await
    }
    async fn link(&self, client_id: String, sensor_id: SensorId, now: Millis) -> Result<()> {
        self.bound("link", self.inner.link(client_id, sensor_id, now))
            .await
    }
    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        self.bound("unlink", self.inner.unlink(client_id, sensor_id))
            .await
    }
    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let call = self.inner.list_client_sensors(client_id, page);
        self.bound("list_client_sensors", call).await
    }
    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        let call = self.inner.list_sensor_clients(sensor_id, page);
        self.bound("list_sensor_clients", call).await
    }
    /// Not bounded: a bulk import of a large fleet takes as long as it takes, and only
    /// `latch bench` makes one.
    async fn import(&self, sensors: Vec<Sensor>, links: Vec<(String, SensorId)>) -> Result<()> {
        self.inner.import(sensors, links).await
    }
    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>> {
        let call = self.inner.load_runtime();
        self.within(self.limit * BULK_FACTOR, "load_runtime", call)
            .await
    }
    async fn registry_changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<(SensorId, Option<SensorRuntime>)>)> {
        self.bound("registry_changes", self.inner.registry_changes(after))
            .await
    }
    async fn newest_registry_change(&self) -> Result<i64> {
        let call = self.inner.newest_registry_change();
        self.bound("newest_registry_change", call).await
    }
    async fn prune_registry_changes(&self, before: Millis) -> Result<()> {
        let call = self.inner.prune_registry_changes(before);
        self.bound("prune_registry_changes", call).await
    }
    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>> {
        self.bound("commit", self.inner.commit(batch, now)).await
    }
    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        let call = self.inner.list_readings(sensor_id, range, page);
        self.bound("list_readings", call).await
    }
    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        let call = self.inner.list_events(sensor_id, range, page);
        self.bound("list_events", call).await
    }
    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        let call = self.inner.ship_history(limit, sink);
        self.within(
            self.limit * BULK_FACTOR + SINK_ALLOWANCE,
            "ship_history",
            call,
        )
        .await
    }
    async fn spool_depth(&self) -> Result<u64> {
        self.bound("spool_depth", self.inner.spool_depth()).await
    }
    async fn archive_history(&self, limit: usize) -> Result<usize> {
        self.bound("archive_history", self.inner.archive_history(limit))
            .await
    }
    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>> {
        let call = self.inner.load_pending(after_seq);
        self.within(self.limit * BULK_FACTOR, "load_pending", call)
            .await
    }
    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
    ) -> Result<Vec<Claim>> {
        let call = self.inner.claim(ids, node, now, lease_until);
        self.bound("claim", call).await
    }
    async fn record(
        &self,
        outcomes: Vec<Outcome>,
        now: Millis,
        disable_after: Millis,
    ) -> Result<Vec<Disabled>> {
        let call = self.inner.record(outcomes, now, disable_after);
        self.bound("record", call).await
    }
    async fn load_client_pending(&self, client_id: String) -> Result<Vec<NotificationRef>> {
        let call = self.inner.load_client_pending(client_id);
        self.within(self.limit * BULK_FACTOR, "load_client_pending", call)
            .await
    }
    async fn retry_notifications(
        &self,
        filter: ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        let call = self.inner.retry_notifications(filter, now);
        self.within(self.limit * BULK_FACTOR, "retry_notifications", call)
            .await
    }
    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        self.bound("get_notification", self.inner.get_notification(id))
            .await
    }
    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        let call = self.inner.list_notifications(filter, page);
        self.bound("list_notifications", call).await
    }
    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef> {
        let call = self.inner.retry_notification(id, now);
        self.bound("retry_notification", call).await
    }
    async fn count_pending(&self) -> Result<u64> {
        self.bound("count_pending", self.inner.count_pending())
            .await
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    async fn create_token(&self, token: ApiToken) -> Result<()> {
        self.bound("create_token", self.inner.create_token(token))
            .await
    }
    async fn list_tokens(&self) -> Result<Vec<ApiToken>> {
        self.bound("list_tokens", self.inner.list_tokens()).await
    }
    async fn delete_token(&self, id: String) -> Result<bool> {
        self.bound("delete_token", self.inner.delete_token(id))
            .await
    }
}

/// The cluster calls under the same bound: a renew that hangs past the lease would let
/// another node take partitions this one still thinks it serves (the fence keeps that
/// safe, but the node should learn it early).
#[async_trait]
impl<S: Store + ClusterStore> ClusterStore for Deadline<S> {
    async fn partitions(&self, wanted: u32) -> Result<u32> {
        self.bound("partitions", self.inner.partitions(wanted))
            .await
    }
    async fn heartbeat(
        &self,
        node: &str,
        address: &str,
        live_within: Duration,
    ) -> Result<Vec<String>> {
        let call = self.inner.heartbeat(node, address, live_within);
        self.bound("heartbeat", call).await
    }
    async fn renew(&self, node: &str, lease: Duration) -> Result<Vec<Lease>> {
        self.bound("renew", self.inner.renew(node, lease)).await
    }
    async fn acquire(
        &self,
        node: &str,
        max: u32,
        lease: Duration,
        reclaim_own: bool,
    ) -> Result<Vec<Lease>> {
        let call = self.inner.acquire(node, max, lease, reclaim_own);
        self.bound("acquire", call).await
    }
    async fn release(&self, node: &str, leases: &[Lease]) -> Result<()> {
        self.bound("release", self.inner.release(node, leases))
            .await
    }
    async fn leave(&self, node: &str) -> Result<()> {
        self.bound("leave", self.inner.leave(node)).await
    }
    async fn owners(&self) -> Result<Vec<Owner>> {
        self.bound("owners", self.inner.owners()).await
    }
    async fn nodes(&self, live_within: Duration) -> Result<Vec<NodeRow>> {
        self.bound("nodes", self.inner.nodes(live_within)).await
    }
    /// A bulk load, like [`Store::load_runtime`]: a node taking over many partitions reads
    /// a large part of the fleet at once.
    async fn load_partitions(&self, parts: &[u32], partitions: u32) -> Result<Vec<SensorRuntime>> {
        let call = self.inner.load_partitions(parts, partitions);
        self.within(self.limit * BULK_FACTOR, "load_partitions", call)
            .await
    }
    async fn shared_secret(&self, candidate: &str) -> Result<String> {
        self.bound("shared_secret", self.inner.shared_secret(candidate))
            .await
    }
    async fn secret_disagreements(
        &self,
        node: &str,
        fingerprint: &str,
        live_within: Duration,
    ) -> Result<Vec<String>> {
        let call = self
            .inner
            .secret_disagreements(node, fingerprint, live_within);
        self.bound("secret_disagreements", call).await
    }
    async fn grant_rate(&self, client: &str, tokens: u32, interval_us: i64) -> Result<(i64, i64)> {
        let call = self.inner.grant_rate(client, tokens, interval_us);
        self.bound("grant_rate", call).await
    }
}
