//! The stages of [`super::run_with_clock`], each a `start` and a `stop`.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::cluster::Membership;
use crate::committer::{self, Committed};
use crate::config::Config;
use crate::delivery::Dispatcher;
use crate::domain::partition::Partitioning;
use crate::domain::{EventKind, Live};
use crate::engine::{self, Engine};
use crate::history::{self, History, shipper::Spooled};
use crate::store::{self, ClusterStore, Store};
use crate::tasks::{Supervisor, join};
use crate::telemetry::recent::{Measure, Recent};
use crate::{api, delivery, ingest};

/// The store, this node's id and address, and its cluster membership on PostgreSQL.
pub(super) struct Base {
    pub(super) store: Arc<dyn Store>,
    /// PostgreSQL's cluster side: leases, and the schedule clients' rate limits share.
    pub(super) cluster_store: Option<Arc<dyn ClusterStore>>,
    /// The embedded store's journal, moved into its archive.
    pub(super) journal: Option<Arc<dyn store::Journal>>,
    pub(super) node: String,
    /// The address other nodes reach this one at, when one is configured or derived.
    pub(super) address: Option<String>,
    pub(super) bound: std::net::SocketAddr,
    pub(super) membership: Option<Arc<Membership>>,
    pub(super) partitions: Partitioning,
    /// The last hour of this node's activity, for the console's charts.
    pub(super) recent: Arc<Recent>,
}

impl Base {
    pub(super) async fn open(config: &Config, listener: &TcpListener) -> anyhow::Result<Self> {
        let store::Opened {
            store,
            cluster: cluster_store,
            journal,
        } = store::connect_cluster(config).await?;
        let node = store::node_id(&config.data_dir)?;
        let bound = listener.local_addr()?;
        let address = config.advertise(bound);
        let parts = super::Parts {
            store,
            cluster_store,
            journal,
            node,
            address,
            transport: None,
            forwarder: None,
        };
        Self::assemble(config, parts, bound).await
    }

    /// The base of a node made of `parts`, bound (for the API) to `bound`.
    pub(super) async fn assemble(
        config: &Config,
        parts: super::Parts,
        bound: std::net::SocketAddr,
    ) -> anyhow::Result<Self> {
        let super::Parts {
            store,
            cluster_store,
            journal,
            node,
            address,
            forwarder,
            ..
        } = parts;
        // PostgreSQL: this node is one of a cluster (perhaps of one) and serves the
        // partitions it leases; the embedded store is one node serving them all.
        let membership = match cluster_store.clone() {
            Some(cs) => {
                Some(Membership::join(cs, node.clone(), address.clone(), config, forwarder).await?)
            }
            None => None,
        };
        let partitions = membership
            .as_ref()
            .map_or(Partitioning::md5(config.partitions()), |m| m.partitioning());
        Ok(Self {
            store,
            cluster_store,
            journal,
            node,
            address,
            bound,
            membership,
            partitions,
            recent: Arc::new(Recent::new()),
        })
    }

    /// A cluster node hands its partitions over and leaves, once everything of them is
    /// durable (after [`Core::stop`]); the dispatcher stops sending for them at once.
    pub(super) async fn leave(&self, delivery: &Delivery) {
        if let Some(m) = &self.membership {
            m.leave(&delivery.dispatcher).await;
        }
    }
}

/// The dispatcher, delivering notifications until stopped.
pub(super) struct Delivery {
    pub(super) dispatcher: Dispatcher,
    pub(super) stop: CancellationToken,
    pub(super) tasks: TaskTracker,
}

impl Delivery {
    pub(super) async fn start(
        config: &Config,
        base: &Base,
        clock: &Clock,
        transport: Option<Arc<dyn delivery::transport::Transport>>,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let dispatcher = delivery::Dispatcher::start(
            base.store.clone(),
            delivery::Settings {
                node: base.node.clone(),
                clock: clock.clone(),
                serves: base.membership.as_ref().map(|m| m.serves()),
                rate_grants: base.cluster_store.clone().map(delivery::RateGrants),
                recent: Some(base.recent.clone()),
                transport,
                shared: base.cluster_store.is_some(),
                ..delivery::Settings::from_config(config)
            },
            stop.clone(),
            config.shutdown_grace,
            &tasks,
        )
        .await?;
        Ok(Self {
            dispatcher,
            stop,
            tasks,
        })
    }

    /// Lets in-flight attempts finish within `grace`, cuts off and records those that do
    /// not; what is still pending stays in the store for the next start.
    pub(super) async fn stop(self, grace: Duration) {
        self.stop.cancel();
        self.tasks.close();
        // The grace, the wait for the attempts cut off, and their recording.
        let waited = tokio::time::timeout(grace + Duration::from_secs(10), self.tasks.wait());
        if waited.await.is_err() {
            tracing::warn!("Delivery did not stop within the grace period.");
        }
    }
}

/// History reads, the task that drains the store's history tables (the shipper to
/// ClickHouse, or the archiver that moves SQLite's journal into its archive), and the
/// store's upkeep with retention.
pub(super) struct Archive {
    pub(super) history: History,
    /// History rows committed since the last shipment, so a full batch moves early.
    pub(super) spooled: Arc<Spooled>,
    pub(super) stop: CancellationToken,
    /// The shipper, or the archiver of a store with a journal; `None`: PostgreSQL without
    /// ClickHouse keeps its history where it is written.
    pub(super) task: Option<JoinHandle<()>>,
    pub(super) upkeep: JoinHandle<()>,
}

impl Archive {
    pub(super) fn start(
        config: &Config,
        base: &Base,
        clock: &Clock,
        sup: &Supervisor,
    ) -> anyhow::Result<Self> {
        let clickhouse = match &config.clickhouse_url {
            Some(url) => Some(history::clickhouse::ClickHouse::new(
                &history::clickhouse::Target::parse(url, &config.clickhouse_database)?,
            )),
            None => None,
        };
        let history = History::new(base.store.clone(), clickhouse.clone());
        let spooled = Arc::new(Spooled::default());
        let stop = CancellationToken::new();
        let task = match (clickhouse.clone(), base.journal.clone()) {
            (Some(ch), _) => Some(sup.spawn(
                "history shipper",
                history::shipper::run(
                    base.store.clone(),
                    ch,
                    config.clickhouse_flush,
                    spooled.clone(),
                    history.shipping(),
                    stop.clone(),
                ),
            )),
            (None, Some(journal)) => Some(sup.spawn(
                "history archiver",
                history::archiver::run(journal, spooled.clone(), stop.clone()),
            )),
            (None, None) => None,
        };
        let upkeep = sup.spawn(
            "store upkeep",
            history::retention::run(
                base.store.clone(),
                clickhouse,
                history.clone(),
                history::retention::Settings::from_config(config),
                clock.clone(),
                stop.clone(),
            ),
        );
        Ok(Self {
            history,
            spooled,
            stop,
            task,
            upkeep,
        })
    }

    /// One last bounded shipment of everything committed, then stops.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            join(task).await;
        }
        join(self.upkeep).await;
    }
}

/// Where each successful commit goes: the dispatcher, the history counter, the live
/// stream; and a fenced commit's partitions to the lease loop.
struct Wiring {
    dispatcher: Dispatcher,
    spooled: Arc<Spooled>,
    live: broadcast::Sender<Live>,
    fenced: Option<mpsc::UnboundedSender<Vec<u32>>>,
    recent: Arc<Recent>,
}

impl committer::Listener for Wiring {
    fn wants_events(&self) -> bool {
        self.live.receiver_count() > 0
    }

    fn committed(&self, c: Committed) {
        self.spooled.add(c.history_rows);
        self.recent.add(Measure::Readings, c.readings as u64, c.at);
        for (kind, n) in EventKind::ALL.iter().zip(c.kinds) {
            if n > 0 && EventKind::DOOR_ALARMS.contains(kind) {
                crate::telemetry::families::DOOR_ALARMS
                    .counter_with(&[("type", kind.as_str())])
                    .increment(n as u64);
            }
            let measure = match kind {
                EventKind::StateChanged => Measure::Changes,
                EventKind::ConnectionLost => Measure::Lost,
                EventKind::ConnectionRestored => Measure::Restored,
                EventKind::StillLost
                | EventKind::SiteConnectionLost
                | EventKind::SiteConnectionRestored
                | EventKind::BatteryLow
                | EventKind::BatteryOk
                | EventKind::Tamper
                | EventKind::TamperCleared
                | EventKind::Fault
                | EventKind::FaultCleared
                | EventKind::StateHeld
                | EventKind::StateHeldCleared
                | EventKind::Flapping
                | EventKind::FlappingStopped
                | EventKind::AlarmAcknowledged
                | EventKind::StateOutOfSchedule
                | EventKind::AlarmEscalated => continue,
            };
            self.recent.add(measure, n as u64, c.at);
        }
        // Only those of sensors this node still serves: a commit that was under way as its
        // partition moved is the next owner's to send ([`Dispatcher::deliver_served`]).
        self.dispatcher.deliver_served(c.notifications);
        for e in c.events.into_iter().flatten() {
            // Only fails when the last listener just left.
            let _ = self.live.send(Live::Sensor(e));
        }
    }

    fn fenced(&self, partitions: Vec<u32>) {
        if let Some(tx) = &self.fenced {
            let _ = tx.send(partitions);
        }
    }

    fn maybe_landed(&self, after_seq: i64) {
        self.dispatcher.look_for_pending(after_seq);
    }
}

/// The engine's shards and the committer behind them.
pub(super) struct Core {
    pub(super) engine: Engine,
    /// The sensors loaded at start (one node; a cluster node loads per partition).
    pub(super) sensors: Option<usize>,
    pub(super) follow: Option<engine::follow::Pokes>,
    pub(super) live: broadcast::Sender<Live>,
    pub(super) fenced: std::sync::Mutex<Option<mpsc::UnboundedReceiver<Vec<u32>>>>,
    pub(super) stop: CancellationToken,
    pub(super) tasks: TaskTracker,
    pub(super) committer: JoinHandle<()>,
}

impl Core {
    pub(super) async fn start(
        config: &Config,
        base: &Base,
        clock: &Clock,
        delivery: &Delivery,
        spooled: Arc<Spooled>,
        sup: &Supervisor,
    ) -> anyhow::Result<Self> {
        let store = &base.store;
        let (commit_tx, commit_rx) = mpsc::channel(64);
        let live = api::stream::channel();
        let (fenced_tx, fenced_rx) = mpsc::unbounded_channel();
        let wiring = Wiring {
            dispatcher: delivery.dispatcher.clone(),
            spooled,
            live: live.clone(),
            fenced: base.membership.is_some().then_some(fenced_tx),
            recent: base.recent.clone(),
        };
        let committer = sup.spawn(
            "committer",
            committer::run(
                store.clone(),
                base.cluster_store.is_some(),
                commit_rx,
                clock.clone(),
                Arc::new(wiring),
            ),
        );
        // Where following other nodes' registry changes begins: taken before the load,
        // so a change racing the load is applied again (harmlessly) rather than missed.
        let registry_seen = match &base.cluster_store {
            Some(cs) => Some((cs.clone(), cs.newest_registry_change().await?)),
            None => None,
        };
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let tuning = engine::Tuning {
            shards: config.engine_shards as usize,
            batch_max: config.engine_batch_max as usize,
            default_timeout: config.heartbeat_timeout,
            default_debounce: config.debounce,
            lost_reminder: config.lost_reminder,
            clock: clock.clone(),
            partitions: base.partitions,
            supervisor: sup.clone(),
        };
        let (engine, sensors) = match &base.membership {
            // Partitions come with their leases, each with its sensors.
            Some(m) => (
                Engine::launch_leased(tuning, commit_tx, stop.clone(), &tasks, m.routing()),
                None,
            ),
            None => {
                let runtime = store.load_runtime().await?;
                let n = runtime.len();
                let engine = Engine::launch(tuning, runtime, commit_tx, stop.clone(), &tasks);
                (engine, Some(n))
            }
        };
        let follow = registry_seen.map(|(cluster, seen)| {
            let (pokes, rx) = mpsc::channel(64);
            tasks.spawn(sup.watch(
                "registry follower",
                engine::follow::run(cluster, engine.clone(), seen, rx, stop.clone()),
            ));
            pokes
        });
        tasks.close();
        Ok(Self {
            engine,
            sensors,
            follow,
            live,
            fenced: std::sync::Mutex::new(Some(fenced_rx)),
            stop,
            tasks,
            committer,
        })
    }

    /// Flushes the shards' queues and lets the committer drain: once this returns,
    /// everything the engine accepted is durable.
    pub(super) async fn stop(self) {
        drop(self.engine);
        self.stop.cancel();
        self.tasks.wait().await;
        join(self.committer).await;
        tracing::info!("Engine flushed.");
    }
}

/// Cluster mode: the lease rounds that keep this node's partitions and take its share.
pub(super) struct Leases {
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Leases {
    /// Runs the first round before the API serves: a node that starts alone serves every
    /// partition from its first request.
    pub(super) async fn start(
        base: &Base,
        core: &Core,
        delivery: &Delivery,
        sup: &Supervisor,
    ) -> anyhow::Result<Self> {
        let Some(m) = &base.membership else {
            return Ok(Self { running: None });
        };
        m.round(&core.engine, &delivery.dispatcher, true).await?;
        let stop = CancellationToken::new();
        let fenced = core
            .fenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("the lease loop starts once");
        let task = sup.spawn(
            "cluster leases",
            m.clone().run(
                core.engine.clone(),
                delivery.dispatcher.clone(),
                fenced,
                stop.clone(),
            ),
        );
        Ok(Self {
            running: Some((stop, task)),
        })
    }

    /// No lease moves while the engine flushes.
    pub(super) async fn stop(self) {
        if let Some((stop, task)) = self.running {
            stop.cancel();
            join(task).await;
        }
    }
}

/// The broker sources (AMQP, MQTT). In a cluster the plain queue and MQTT run on the node
/// holding partition 0, and every node consumes its partitions' queues of the AMQP exchange.
pub(super) struct Sources {
    pub(super) ingest: ingest::Ingest,
    pub(super) sources: ingest::Sources,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Sources {
    pub(super) fn start(config: &Arc<Config>, base: &Base, core: &Core, sup: &Supervisor) -> Self {
        let ingest = ingest::Ingest::new(core.engine.clone());
        let (published, to_publish) = mpsc::unbounded_channel();
        let engine = core.engine.clone();
        let cluster = base.membership.is_some();
        // Before a change shows anywhere (`/readyz`), the engine has it: no sensor is
        // declared lost for a silence the broker link explains once it is seen down.
        let sources = ingest::Sources::watched(Arc::new(move |source, up| {
            let at = engine.now();
            engine.set_link(source, up, at);
            if cluster {
                let _ = published.send((source, up, at));
            }
        }));
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let sessions: Arc<dyn store::Sessions> = base.store.clone();
        if let Some(m) = &base.membership {
            tasks.spawn(sup.watch(
                "broker links",
                publish_links(to_publish, m.clone(), stop.clone()),
            ));
        }
        match &base.membership {
            Some(m) => {
                tasks.spawn(sup.watch(
                    "broker sources",
                    ingest::sources::lead(
                        m.leads(),
                        config.clone(),
                        ingest.clone(),
                        sources.clone(),
                        sessions.clone(),
                        stop.clone(),
                    ),
                ));
                ingest::sources::exchange(
                    config,
                    m.partitioning(),
                    m.served(),
                    &ingest,
                    &sources,
                    &stop,
                    &tasks,
                );
            }
            None => ingest::sources::start(config, &ingest, &sources, &sessions, &stop, &tasks),
        }
        tasks.close();
        Self {
            ingest,
            sources,
            stop,
            tasks,
        }
    }

    /// Stops taking messages (without waiting): shutdown begins here.
    pub(super) fn stopping(&self) {
        self.stop.cancel();
    }

    /// Waits for the sources to finish and acknowledge what they hold.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

/// Cluster mode: records each change of this node's broker links in the store, for the
/// other nodes' engines ([`Membership::publish_link`]).
async fn publish_links(
    mut changes: mpsc::UnboundedReceiver<(crate::domain::Source, bool, crate::domain::Millis)>,
    membership: Arc<Membership>,
    stop: CancellationToken,
) {
    loop {
        let (source, up, at) = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            c = changes.recv() => match c {
                Some(c) => c,
                None => return,
            },
        };
        membership.publish_link(source, up, at).await;
    }
}

/// What follows the shared store in the background: the API tokens other nodes make.
pub(super) struct Followers {
    pub(super) tokens: api::tokens::Tokens,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Followers {
    pub(super) async fn start(base: &Base, sup: &Supervisor) -> anyhow::Result<Self> {
        let store = &base.store;
        // Auth reads the token table from memory; on a shared store it follows other nodes.
        let tokens = api::tokens::Tokens::load(store.as_ref()).await?;
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        if base.cluster_store.is_some() {
            tasks.push(sup.spawn(
                "token follower",
                api::tokens::follow(store.clone(), tokens.clone(), stop.clone()),
            ));
        }
        Ok(Self {
            tokens,
            stop,
            tasks,
        })
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            join(t).await;
        }
    }
}
