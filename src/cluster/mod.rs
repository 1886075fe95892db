//! Cluster mode: any number of latch nodes over one PostgreSQL behave like one node.
//!
//! The fleet is divided into a fixed number of partitions (a stable hash of the sensor id,
//! [`crate::domain::partition`]). Each partition is leased in the database by one node at
//! a time, with an epoch that grows at every change of owner ([`ClusterStore`]); the
//! database's clock judges when a lease ran out. The owner holds its partitions' sensors
//! and deadlines in its engine and delivers their notifications, so order per (client,
//! sensor) needs no coordination between nodes; every commit checks, in its transaction,
//! that the node still holds each partition it writes at its epoch (the fence), so a node
//! that was paused past its lease commits nothing for partitions it lost.
//!
//! [`Membership::run`] is each node's loop, once per tick (a third of the lease, at most a
//! second): heartbeat; renew its leases and drop those it lost; work out its fair share
//! (`P / live nodes`, the first `P % n` nodes by id taking one more); hand surplus
//! partitions over (flush, release, and drop their lanes from the dispatcher: attempts in
//! flight finish and are recorded, nothing new starts) or take free and expired ones (load
//! their sensors, serve them with the deadlines a live previous owner handed over, or
//! counted from the takeover after a crash, look for their pending notifications at
//! once); and publish who serves what, so readings entering this node for other
//! partitions are forwarded to their owners ([`forward`]).
//!
//! The plain AMQP queue and the MQTT subscription run on the node that holds partition 0
//! ([`Membership::leads`], [`lead`]), so they are consumed in one place, in order, as on
//! one node;
//! the AMQP exchange's partition queues are consumed by each partition's owner
//! ([`Membership::served`], [`crate::ingest::amqp::exchange`]).

pub mod forward;
pub mod lead;
pub mod trust;

use crate::hashing::FastMap as HashMap;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::delivery::{Dispatcher, Serves};
use crate::domain::partition::Partitioning;
use crate::domain::{Millis, SensorId, Source};
use crate::engine::{Engine, Route, Routing};
use crate::store::{ClusterStore, Lease, NodeRow, SensorRuntime, SourceLink};
use crate::telemetry::events::{ClusterLeft, Emit, PartitionsHeld, PartitionsTaken};
use crate::telemetry::families;

pub use forward::{HttpForwarder, SECRET_HEADER};

/// Errors of the cluster layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error(transparent)]
    Engine(#[from] crate::engine::Error),
    /// A configuration with which nodes would refuse each other.
    #[error(transparent)]
    Mismatch(#[from] trust::Mismatch),
}

/// Path of a node's endpoint that makes it read the registry changes now.
pub const FOLLOW_PATH: &str = "/internal/v1/follow";

/// This node's part in the cluster; shared by the lease loop, the API and the dispatcher.
pub struct Membership {
    store: Arc<dyn ClusterStore>,
    node: String,
    /// Where other nodes reach this one; empty when unknown (a wildcard listen address
    /// and no `node_advertise`): nothing is forwarded here then.
    address: String,
    /// The cluster's partitions, fixed with the database.
    partitions: Partitioning,
    lease: Duration,
    /// The partitions this node serves, with their lease epochs.
    held: Mutex<BTreeMap<u32, i64>>,
    /// `held` as flags, read by the dispatcher's filter for every notification it sweeps.
    serving: Arc<Vec<AtomicBool>>,
    routing: Arc<Routing>,
    lead: lead::Lead,
    /// `held`'s partitions, for the AMQP exchange's consumers of their queues.
    served: watch::Sender<Arc<std::collections::BTreeSet<u32>>>,
    /// The broker links as this node's engine last heard of them ([`Membership::follow_links`]).
    links: Mutex<HashMap<Source, (bool, Millis)>>,
    /// Changes of this node's broker links the store did not take yet, oldest first. A
    /// Tokio mutex, held while they are written, so two writers never interleave.
    unpublished: tokio::sync::Mutex<Vec<SourceLink>>,
    ready: AtomicBool,
    http: reqwest::Client,
    /// What node-to-node requests carry and must carry ([`trust`]).
    secret: String,
}

impl Membership {
    /// Registers this node and fixes the partition count (at the database's first use).
    /// Readings of partitions other nodes serve go to them through `forwarder`; `None`:
    /// over HTTP ([`HttpForwarder`]).
    pub async fn join(
        store: Arc<dyn ClusterStore>,
        node: String,
        address: Option<String>,
        config: &crate::config::Config,
        forwarder: Option<Arc<dyn crate::engine::Forwarder>>,
    ) -> Result<Arc<Self>, Error> {
        let partitioning = store.partitions(config.partitions()).await?;
        let partitions = partitioning.count;
        // Beside each node's share, so an alert can tell partitions nobody serves.
        families::CLUSTER_PARTITIONS
            .gauge()
            .set(f64::from(partitions));
        if let Some(wanted) = config.cluster_partitions
            && wanted != partitions
        {
            tracing::warn!(
                wanted,
                partitions,
                "cluster_partitions differs from the count fixed when the database was first \
                 used; keeping the database's."
            );
        }
        let address = address.unwrap_or_default();
        if address.is_empty() {
            tracing::warn!(
                "Listening on a wildcard address without node_advertise: other nodes cannot \
                 hand readings to this one. Set LATCH_NODE_ADVERTISE when running several nodes."
            );
        }
        let secret = trust::secret(store.as_ref(), config.cluster_secret.as_deref()).await?;
        let forwarder = forwarder.unwrap_or_else(|| {
            Arc::new(HttpForwarder::new(
                &secret,
                config.database_timeout + Duration::from_secs(5),
            ))
        });
        let (served, _) = watch::channel(Arc::new(std::collections::BTreeSet::new()));
        let me = Arc::new(Self {
            store,
            node,
            address,
            partitions: partitioning,
            lease: config.lease(),
            held: Mutex::new(BTreeMap::new()),
            serving: Arc::new((0..partitions).map(|_| AtomicBool::new(false)).collect()),
            routing: Arc::new(Routing::new(partitions, forwarder)),
            lead: lead::Lead::new(),
            served,
            links: Mutex::new(HashMap::default()),
            unpublished: tokio::sync::Mutex::new(Vec::new()),
            ready: AtomicBool::new(false),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("a plain HTTP client builds"),
            secret,
        });
        me.store.heartbeat(&me.node, &me.address, me.lease).await?;
        let configured = config.cluster_secret.is_some();
        let joined = async {
            trust::agree(
                me.store.as_ref(),
                &me.node,
                &me.secret,
                configured,
                me.lease,
            )
            .await?;
            Ok::<_, Error>(me.store.forget_outbox_leases(&me.node).await?)
        };
        let forgot = match joined.await {
            Ok(n) => n,
            Err(e) => {
                // Not counted live any longer: the others keep their shares.
                let _ = me.store.leave(&me.node).await;
                return Err(e);
            }
        };
        if forgot > 0 {
            tracing::info!(
                notifications = forgot,
                "Gave back the delivery leases an earlier process of this node held."
            );
        }
        Ok(me)
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn partitions(&self) -> u32 {
        self.partitions.count
    }

    /// How sensors map to partitions in this cluster.
    pub fn partitioning(&self) -> Partitioning {
        self.partitions
    }

    /// The routing table the engine forwards by.
    pub fn routing(&self) -> Arc<Routing> {
        self.routing.clone()
    }

    /// The dispatcher's filter: notifications of sensors in partitions served here.
    pub fn serves(&self) -> Serves {
        let serving = self.serving.clone();
        let partitions = self.partitions;
        Serves(Arc::new(move |id: SensorId| {
            serving[partitions.of(id) as usize].load(Ordering::Relaxed)
        }))
    }

    /// Whether this node runs the broker sources (it holds partition 0).
    pub fn leads(&self) -> lead::Follower {
        self.lead.follower()
    }

    /// The partitions this node serves, as they change: the AMQP exchange's queues it
    /// consumes.
    pub fn served(&self) -> watch::Receiver<Arc<std::collections::BTreeSet<u32>>> {
        self.served.subscribe()
    }

    /// Whether the first lease round is done.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Live nodes and their lease counts, for `GET /v1/cluster`.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, Error> {
        Ok(self.store.nodes(self.lease).await?)
    }

    fn tick(&self) -> Duration {
        (self.lease / 3).min(Duration::from_secs(1))
    }

    /// The lease loop, until `stop`. `fenced` brings partitions a commit found lost.
    pub async fn run(
        self: Arc<Self>,
        engine: Engine,
        dispatcher: Dispatcher,
        mut fenced: mpsc::UnboundedReceiver<Vec<u32>>,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                Some(parts) = fenced.recv() => {
                    self.drop_lost(&engine, &dispatcher, &parts).await;
                }
                _ = tokio::time::sleep(self.tick()) => {}
            }
            if let Err(e) = self.round(&engine, &dispatcher, false).await {
                tracing::warn!(error = %e, "Cluster lease round failed; trying again.");
            }
        }
    }

    /// Stops serving partitions whose lease is gone, without committing anything more or
    /// starting any attempt for them.
    async fn drop_lost(&self, engine: &Engine, dispatcher: &Dispatcher, parts: &[u32]) {
        let mut lost = Vec::new();
        {
            let mut held = self.held.lock().expect("held");
            for p in parts {
                if held.remove(p).is_some() {
                    lost.push(*p);
                }
            }
        }
        for p in &lost {
            self.serving[*p as usize].store(false, Ordering::Relaxed);
            let _ = engine.release(*p, false).await;
        }
        if !lost.is_empty() {
            dispatcher.moved(self.sensors_of(&lost));
            tracing::warn!(partitions = ?lost, "Partitions lost to another node (fenced).");
            self.publish_held();
        }
    }

    /// One round: heartbeat, renew, rebalance, publish the routes.
    pub async fn round(
        &self,
        engine: &Engine,
        dispatcher: &Dispatcher,
        first: bool,
    ) -> Result<(), Error> {
        // Renewal first: it is what keeps the partitions here; a slow round must not
        // make it late.
        let renewed: BTreeMap<u32, i64> = self
            .store
            .renew(&self.node, self.lease)
            .await?
            .into_iter()
            .map(|l| (l.partition, l.epoch))
            .collect();
        let live = self
            .store
            .heartbeat(&self.node, &self.address, self.lease)
            .await?;
        // Served here but no longer ours at that epoch: another node has it.
        let held = self.held.lock().expect("held").clone();
        let lost: Vec<u32> = held
            .iter()
            .filter(|(p, e)| renewed.get(p) != Some(e))
            .map(|(p, _)| *p)
            .collect();
        self.drop_lost(engine, dispatcher, &lost).await;
        // Leased to this node but not served: left by an earlier process on this data
        // folder (taken back with a new epoch below), or a takeover that failed halfway.
        let strays: Vec<Lease> = renewed
            .iter()
            .filter(|(p, _)| !held.contains_key(p))
            .map(|(p, e)| Lease {
                partition: *p,
                epoch: *e,
            })
            .collect();
        if !first && !strays.is_empty() {
            self.store.release(&self.node, &strays).await?;
        }

        let target = fair_share(self.partitions.count, &live, &self.node);
        let serving = self.held.lock().expect("held").len() as u32;
        if serving > target {
            self.hand_over(engine, dispatcher, serving - target).await?;
        } else if serving < target || (first && !strays.is_empty()) {
            let want =
                (target - serving.min(target)).max(if first { strays.len() as u32 } else { 0 });
            self.take(engine, dispatcher, want, first).await?;
        }
        self.publish_routes().await?;
        if let Err(e) = self.follow_links(engine).await {
            tracing::warn!(error = %e, "Following the broker links failed; the next round tries again.");
        }
        self.ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// This node lost or made its connection to a broker at `at`: every node's engine
    /// follows ([`Membership::follow_links`]), so sensors heard through it are not declared
    /// lost on any node while it is down (the sensors a node consumes are of every node's
    /// partitions).
    pub async fn publish_link(&self, source: Source, up: bool, at: Millis) {
        let mut pending = self.unpublished.lock().await;
        // This engine has it already: a round must not take it back to an older one.
        self.links.lock().expect("links").insert(source, (up, at));
        pending.push(SourceLink { source, up, at });
        if let Err(e) = self.publish_pending(&mut pending).await {
            tracing::warn!(source = source.as_str(), up, error = %e,
                "Recording a broker link's state failed; the lease rounds try again.");
        }
    }

    /// Records the changes the store did not take yet, in order.
    async fn publish_pending(&self, pending: &mut Vec<SourceLink>) -> Result<(), Error> {
        while let Some(l) = pending.first().copied() {
            self.store
                .set_source_link(&self.node, l.source, l.up, l.at)
                .await?;
            pending.remove(0);
        }
        Ok(())
    }

    /// Hands the engine the broker links as the live nodes recorded them (down while any
    /// node's is), once a round.
    /// A link recorded up at a time not seen before counts as down and back, so a node
    /// that missed the outage between two rounds still counts deadlines from the return.
    /// Under the lock [`Membership::publish_link`] takes, so what is read is never older
    /// than what this node's engine was told.
    async fn follow_links(&self, engine: &Engine) -> Result<(), Error> {
        let mut pending = self.unpublished.lock().await;
        // What this node changed comes first: the store must not hand it back older.
        self.publish_pending(&mut pending).await?;
        for l in self.store.source_links(self.lease).await? {
            let seen = self.links.lock().expect("links").get(&l.source).copied();
            if seen == Some((l.up, l.at)) {
                continue;
            }
            engine.set_link(l.source, false, l.at);
            if l.up {
                engine.set_link(l.source, true, l.at);
            }
            self.links
                .lock()
                .expect("links")
                .insert(l.source, (l.up, l.at));
        }
        Ok(())
    }

    /// Hands `n` partitions over (the highest first, so partition 0 and the sources it
    /// carries move least): each is flushed by the engine, then its lease released, and
    /// the dispatcher drops their lanes (attempts in flight finish and are recorded; the
    /// new owner waits for them).
    async fn hand_over(
        &self,
        engine: &Engine,
        dispatcher: &Dispatcher,
        n: u32,
    ) -> Result<(), Error> {
        let give: Vec<Lease> = {
            let held = self.held.lock().expect("held");
            held.iter()
                .rev()
                .take(n as usize)
                .map(|(p, e)| Lease {
                    partition: *p,
                    epoch: *e,
                })
                .collect()
        };
        // The broker sources first, while every partition is still served here (what they
        // finish at their stop commits as usual): see `lead`.
        if give.iter().any(|l| l.partition == 0) && !self.lead.stop_here(self.lease / 2).await {
            tracing::warn!(
                "The broker sources did not stop in time; handing partition 0 over anyway."
            );
        }
        // Stop routing here first, so nothing new queues behind the flush, and start no
        // attempt for them any more.
        for l in &give {
            self.serving[l.partition as usize].store(false, Ordering::Relaxed);
            self.held.lock().expect("held").remove(&l.partition);
        }
        let parts: Vec<u32> = give.iter().map(|l| l.partition).collect();
        dispatcher.moved(self.sensors_of(&parts));
        let mut flushed = Ok(());
        for l in &give {
            flushed = flushed.and(engine.release(l.partition, true).await);
        }
        let released = self.store.release(&self.node, &give).await;
        // Again for what the flush committed (the committer hands it to the dispatcher
        // before the flush returns), whatever the release answered.
        dispatcher.moved(self.sensors_of(&parts));
        flushed?;
        released?;
        tracing::info!(partitions = give.len(), "Handed partitions over.");
        self.publish_held();
        Ok(())
    }

    /// The sensors of `parts`, for the dispatcher to drop their lanes.
    fn sensors_of(&self, parts: &[u32]) -> Serves {
        let partitions = self.partitions;
        let mut moved = vec![false; partitions.count as usize];
        for &p in parts {
            if let Some(m) = moved.get_mut(p as usize) {
                *m = true;
            }
        }
        Serves(Arc::new(move |id: SensorId| {
            moved[partitions.of(id) as usize]
        }))
    }

    /// Takes up to `n` free or expired partitions and starts serving them.
    async fn take(
        &self,
        engine: &Engine,
        dispatcher: &Dispatcher,
        n: u32,
        reclaim_own: bool,
    ) -> Result<(), Error> {
        if n == 0 {
            return Ok(());
        }
        let got = self
            .store
            .acquire(&self.node, n, self.lease, reclaim_own)
            .await?;
        if got.is_empty() {
            return Ok(());
        }
        let parts: Vec<u32> = got.iter().map(|l| l.partition).collect();
        let sensors = match self
            .store
            .load_partitions(&parts, self.partitions.count)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                // Not served: give them back rather than hold them idle, with the floor
                // the next owner is to carry on (a crash's grace is not lost by this).
                let now = engine.now();
                let _ = self
                    .store
                    .deadline_floors(&self.node, &got, now, self.lease)
                    .await;
                let _ = self.store.release(&self.node, &got).await;
                return Err(e.into());
            }
        };
        let mut by_part: HashMap<u32, Vec<SensorRuntime>> = HashMap::default();
        for s in sensors {
            by_part.entry(self.partitions.of(s.0)).or_default().push(s);
        }
        let since: Millis = engine.now();
        // Handed over by a live node: the deadlines it had; else counted from now.
        let floors: HashMap<u32, Millis> = match self
            .store
            .deadline_floors(&self.node, &got, since, self.lease)
            .await
        {
            Ok(f) => f.into_iter().collect(),
            Err(e) => {
                let _ = self.store.release(&self.node, &got).await;
                return Err(e.into());
            }
        };
        // The first round runs before this node serves its API: nothing can have been
        // registered through it meanwhile, and other nodes route nothing here yet.
        let unsure_until = if reclaim_own {
            since
        } else {
            since + crate::engine::TAKEOVER_GRACE_MS
        };
        for l in &got {
            let sensors = by_part.remove(&l.partition).unwrap_or_default();
            let floor = floors.get(&l.partition).copied().unwrap_or(since);
            engine
                .acquire(l.partition, Some(l.epoch), sensors, floor, unsure_until)
                .await?;
            self.held.lock().expect("held").insert(l.partition, l.epoch);
            self.serving[l.partition as usize].store(true, Ordering::Relaxed);
        }
        PartitionsTaken { partitions: &parts }.emit();
        // Their backlog of notifications is delivered from here now.
        dispatcher.sweep_now();
        self.publish_held();
        Ok(())
    }

    fn publish_held(&self) {
        let held = self.held.lock().expect("held");
        PartitionsHeld(held.len()).emit();
        self.lead.set(held.contains_key(&0));
        let now: std::collections::BTreeSet<u32> = held.keys().copied().collect();
        self.served.send_if_modified(|served| {
            let changed = **served != now;
            if changed {
                *served = Arc::new(now);
            }
            changed
        });
    }

    /// Reads who serves what and replaces the routing table.
    async fn publish_routes(&self) -> Result<(), Error> {
        let owners = self.store.owners().await?;
        let mut routes = vec![Route::Nobody; self.partitions.count as usize];
        let mut addresses: HashMap<String, Arc<str>> = HashMap::default();
        for o in owners {
            if o.node == self.node || o.address.is_empty() {
                continue;
            }
            let Some(r) = routes.get_mut(o.partition as usize) else {
                continue;
            };
            let addr = addresses
                .entry(o.address.clone())
                .or_insert_with(|| Arc::from(o.address.trim_end_matches('/')));
            *r = Route::Node(addr.clone());
        }
        for p in self.held.lock().expect("held").keys() {
            routes[*p as usize] = Route::Here;
        }
        self.routing.set(routes);
        Ok(())
    }

    /// A sensor was created, changed or deleted through this node: the node serving its
    /// partition reads the change now rather than at its next follow round, so the
    /// sensor's next reading meets the registry it was registered in.
    pub async fn registry_changed(&self, id: SensorId) {
        let p = self.partitions.of(id);
        let Route::Node(to) = &self.routing.get()[p as usize] else {
            return;
        };
        let req = self
            .http
            .post(format!("{to}{FOLLOW_PATH}"))
            .timeout(Duration::from_secs(3))
            .header(SECRET_HEADER, &self.secret);
        match req.send().await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                tracing::warn!(node = %to, status = %r.status(), "Registry poke refused; the node follows within a second.")
            }
            Err(e) => {
                tracing::warn!(node = %to, error = %e, "Registry poke failed; the node follows within a second.")
            }
        }
    }

    /// The other live nodes that can be reached (those with an address), for the views
    /// that take in the whole cluster (the console's rates and live events).
    pub async fn peers(&self) -> Result<Vec<NodeRow>, Error> {
        let mut nodes = self.nodes().await?;
        nodes.retain(|n| n.id != self.node && !n.address.is_empty());
        Ok(nodes)
    }

    /// A request to another node's internal API at `address`, carrying the cluster's
    /// secret. No timeout of its own: a caller that streams sets none, the others do.
    pub fn peer_get(&self, address: &str, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", address.trim_end_matches('/')))
            .header(SECRET_HEADER, &self.secret)
    }

    /// Whether a node-to-node request carries the cluster's secret.
    pub fn admits(&self, given: Option<&str>) -> bool {
        trust::admits(&self.secret, given)
    }

    /// A clean stop, once the engine has flushed: every lease given up at once (the other
    /// nodes take the partitions at their next round), the dispatcher told to start
    /// nothing more for them, and the registration removed.
    pub async fn leave(&self, dispatcher: &Dispatcher) {
        let held: Vec<Lease> = std::mem::take(&mut *self.held.lock().expect("held"))
            .into_iter()
            .map(|(partition, epoch)| Lease { partition, epoch })
            .collect();
        for l in &held {
            self.serving[l.partition as usize].store(false, Ordering::Relaxed);
        }
        if let Err(e) = self.store.release(&self.node, &held).await {
            tracing::warn!(error = %e, "Releasing partitions failed; they move when their leases run out.");
        }
        dispatcher.moved(Serves(Arc::new(|_| true)));
        if let Err(e) = self.store.leave(&self.node).await {
            tracing::warn!(error = %e, "Leaving the cluster failed.");
        }
        ClusterLeft {
            released: held.len(),
        }
        .emit();
    }
}

/// This node's fair share of `partitions` among the `live` nodes (sorted ids): an even
/// split, the first `partitions % n` nodes taking one more. A node not yet seen live
/// counts itself in.
pub fn fair_share(partitions: u32, live: &[String], node: &str) -> u32 {
    let mut ids: Vec<&str> = live.iter().map(String::as_str).collect();
    if !ids.contains(&node) {
        ids.push(node);
    }
    ids.sort_unstable();
    let n = ids.len() as u32;
    let idx = ids.iter().position(|i| *i == node).unwrap_or(0) as u32;
    partitions / n + u32::from(idx < partitions % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_shares_add_up_and_differ_by_at_most_one() {
        for n in 1..=7u32 {
            let live: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
            for p in [1u32, 16, 128, 1000] {
                let shares: Vec<u32> = live.iter().map(|id| fair_share(p, &live, id)).collect();
                assert_eq!(shares.iter().sum::<u32>(), p, "n={n} p={p}");
                let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(hi - lo <= 1, "n={n} p={p}: {shares:?}");
            }
        }
        // A node not yet in the live list counts itself.
        assert_eq!(fair_share(128, &[], "a"), 128);
        assert_eq!(fair_share(128, &["a".into()], "b"), 64);
    }
}
