//! A node's core — store, dispatcher, history upkeep, engine and committer, cluster
//! leases — started and stopped as one: what [`super::run_with_clock`] serves its API and
//! broker sources around, and what the simulation (crates/sim) runs many of, on a model
//! of the store and simulated receivers, with no socket of its own.

use std::sync::Arc;
use std::time::Duration;

use super::stages::{Archive, Base, Core, Delivery, Leases};
use crate::clock::Clock;
use crate::cluster::Membership;
use crate::config::Config;
use crate::delivery::Dispatcher;
use crate::delivery::transport::Transport;
use crate::engine::{Engine, Forwarder};
use crate::history::shipper::Spooled;
use crate::store::{ClusterStore, Store};
use crate::tasks::Supervisor;

/// What a node is made of beyond its settings.
pub struct Parts {
    pub store: Arc<dyn Store>,
    /// The cluster's side of the store (PostgreSQL): the node is one of a cluster.
    pub cluster_store: Option<Arc<dyn ClusterStore>>,
    /// The embedded store's journal, moved into its archive (without ClickHouse).
    pub journal: Option<Arc<dyn crate::store::Journal>>,
    /// This node's id on leases and outcomes.
    pub node: String,
    /// Where other nodes reach this one.
    pub address: Option<String>,
    /// Where attempts go out; `None`: the network.
    pub transport: Option<Arc<dyn Transport>>,
    /// Where readings of other nodes' partitions go; `None`: over HTTP.
    pub forwarder: Option<Arc<dyn Forwarder>>,
}

/// A running node's core.
pub struct Node {
    pub(super) base: Base,
    pub(super) delivery: Delivery,
    /// The history archiver or shipper and the store's upkeep; `None` in a simulation,
    /// whose model of the store keeps no history tables.
    pub(super) archive: Option<Archive>,
    pub(super) core: Core,
    pub(super) leases: Leases,
    /// Sites decided and ended silences reconciled, every second.
    rounds: (
        tokio_util::sync::CancellationToken,
        tokio::task::JoinHandle<()>,
    ),
    pub(super) sup: Supervisor,
}

impl Node {
    /// Starts a node made of `parts`, without the archive's tasks, the API or the broker
    /// sources: the simulation's node.
    pub async fn start(config: &Config, clock: &Clock, parts: Parts) -> anyhow::Result<Self> {
        let transport = parts.transport.clone();
        let base = Base::assemble(config, parts, ([127, 0, 0, 1], 0).into()).await?;
        Self::start_on(config, clock, base, transport, Supervisor::default(), false).await
    }

    /// Starts the stages a node's core is made of on `base`, in order.
    pub(super) async fn start_on(
        config: &Config,
        clock: &Clock,
        base: Base,
        transport: Option<Arc<dyn Transport>>,
        sup: Supervisor,
        archive: bool,
    ) -> anyhow::Result<Self> {
        let delivery = Delivery::start(config, &base, clock, transport).await?;
        let archive = match archive {
            true => Some(Archive::start(config, &base, clock, &sup)?),
            false => None,
        };
        let spooled = archive
            .as_ref()
            .map_or_else(|| Arc::new(Spooled::default()), |a| a.spooled.clone());
        let core = Core::start(config, &base, clock, &delivery, spooled, &sup).await?;
        let leases = Leases::start(&base, &core, &delivery, &sup).await?;
        let stop = tokio_util::sync::CancellationToken::new();
        let rounds = sup.spawn(
            "sites and silences",
            crate::app::rounds::run(
                base.store.clone(),
                delivery.dispatcher.clone(),
                core.live.clone(),
                clock.clone(),
                crate::app::rounds::Settings::from_config(config),
                stop.clone(),
            ),
        );
        Ok(Self {
            base,
            delivery,
            archive,
            core,
            leases,
            rounds: (stop, rounds),
            sup,
        })
    }

    /// Where readings go in.
    pub fn engine(&self) -> &Engine {
        &self.core.engine
    }

    /// Where notifications go out.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.delivery.dispatcher
    }

    /// Its part in a cluster, if it is a cluster node.
    pub fn membership(&self) -> Option<&Arc<Membership>> {
        self.base.membership.as_ref()
    }

    /// A task of the node panicked (it would stop serving a part of its work).
    pub fn failure(&self) -> Option<String> {
        self.sup.failure()
    }

    /// Stops in reverse order: no lease moves while the engine flushes, everything the
    /// engine accepted is made durable, a cluster node hands its partitions over, the last
    /// history ships, and the dispatcher lets in-flight attempts finish within `grace`,
    /// cutting off and recording those it must.
    pub async fn stop(self, grace: Duration) {
        // Readings are no longer taken: what the stop takes is latch's downtime.
        self.core.engine.stop_hearing();
        self.rounds.0.cancel();
        crate::tasks::join(self.rounds.1).await;
        self.leases.stop().await;
        self.core.stop().await;
        self.base.leave(&self.delivery).await;
        if let Some(archive) = self.archive {
            archive.stop().await;
        }
        self.delivery.stop(grace).await;
    }
}
