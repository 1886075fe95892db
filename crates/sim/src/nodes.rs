//! The simulated processes: latch's real node core ([`latch::service::Node`]) on the
//! model of the store and the simulated receivers, started, stopped with SIGTERM, killed,
//! frozen and thawed as the faults say; and the forwarder that hands readings to the node
//! serving their partition, as the cluster's HTTP forwarding does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latch::config::Config;
use latch::domain::{Millis, Reading, RejectCode, Rejection, Source, Status};
use latch::engine::{Engine, Forwarder, Sequence, Verdicts, VerdictsRx};
use latch::service::{Node, Parts};
use tokio::sync::oneshot;

use crate::faults::StoreFaults;
use crate::model::{ModelStore, NodeStore};
use crate::receivers::{Receivers, SimTransport, lane_key};
use crate::world::{Life, World, alive};

/// How a simulated node is, as the faults left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    /// SIGTERM sent; its stop is under way.
    Stopping,
    Frozen,
    /// Exited (a stop finished) or killed.
    Down,
}

/// One simulated process slot: a node name, and its process when one runs.
struct Slot {
    state: State,
    /// The running process's store handle (its calls pass its life gate).
    store: Option<Arc<NodeStore>>,
    /// The running process, taken by a stop.
    node: Option<Node>,
    /// Its process's life in the world (the receivers' side of it): each start is a new
    /// life name, so what an old process left running never mixes with the new one's.
    life: String,
    /// When that life began.
    since: Millis,
    starts: u32,
}

/// Every simulated node.
pub struct Nodes {
    world: Arc<World>,
    model: ModelStore,
    receivers: Arc<Receivers>,
    config: Arc<Config>,
    slots: Mutex<BTreeMap<String, Slot>>,
    forwarder: Arc<SimForwarder>,
    /// The store's faults: a stop that could not write gives back what it could.
    faults: Arc<StoreFaults>,
    /// Stops under way.
    stopping: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Each change of the AMQP broker link: when, and whether it came up (it starts up).
    links: Mutex<Vec<(Millis, bool)>>,
    /// Each stop: the node, its SIGTERM, and when its process ended (exited, or killed).
    stops: Mutex<Vec<(String, Millis, Option<Millis>)>>,
    /// The processes killed so far. Kept, not dropped, because dropping a `Node` closes its
    /// channels and a closed channel wakes tasks a `kill -9` would never let run; and not
    /// `mem::forget`-ten, because each holds the run's world, model and trace (about 1 MB
    /// a run, kept until the `latch-sim` process ended). They go with the run.
    dead: Mutex<Vec<Node>>,
}

/// The run is over (nothing of it is polled again): its engines and their forwarder hold
/// each other, so the forwarder lets them go, or a run that ran out of time would keep
/// them and everything they reach.
impl Drop for Nodes {
    fn drop(&mut self) {
        self.forwarder.engines.lock().unwrap().clear();
    }
}

impl Nodes {
    pub fn new(
        world: Arc<World>,
        model: ModelStore,
        receivers: Arc<Receivers>,
        faults: Arc<StoreFaults>,
        config: Arc<Config>,
        names: &[&str],
    ) -> Arc<Self> {
        let slots = names
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    Slot {
                        state: State::Down,
                        store: None,
                        node: None,
                        life: n.to_string(),
                        since: 0,
                        starts: 0,
                    },
                )
            })
            .collect();
        Arc::new(Self {
            forwarder: Arc::new(SimForwarder {
                world: world.clone(),
                engines: Mutex::new(BTreeMap::new()),
            }),
            world,
            model,
            receivers,
            faults,
            config,
            slots: Mutex::new(slots),
            stopping: Mutex::new(Vec::new()),
            links: Mutex::new(Vec::new()),
            stops: Mutex::new(Vec::new()),
            dead: Mutex::new(Vec::new()),
        })
    }

    /// Whether the AMQP broker link is up now.
    pub fn link_up(&self) -> bool {
        self.links.lock().unwrap().last().is_none_or(|&(_, up)| up)
    }

    /// Each change of the AMQP broker link so far.
    pub fn link_changes(&self) -> Vec<(Millis, bool)> {
        self.links.lock().unwrap().clone()
    }

    /// The AMQP broker link goes down or comes up: every process's engine learns it, as
    /// the nodes follow the links each node records (a frozen one too: its broker client
    /// sees the connection as it is when it runs again).
    pub fn set_link(&self, up: bool) {
        if self.link_up() == up {
            return;
        }
        let now = self.world.now();
        self.links.lock().unwrap().push((now, up));
        let slots = self.slots.lock().unwrap();
        for s in slots.values() {
            if matches!(s.state, State::Running | State::Frozen)
                && let Some(node) = &s.node
            {
                node.engine().set_link(Source::Amqp, up, now);
            }
        }
    }

    /// Each stop so far: the node, its SIGTERM, and when its process ended (now, for one
    /// still stopping).
    pub fn stops(&self) -> Vec<(String, Millis, Millis)> {
        let now = self.world.now();
        let stops = self.stops.lock().unwrap();
        stops
            .iter()
            .map(|(name, from, to)| (name.clone(), *from, to.unwrap_or(now)))
            .collect()
    }

    /// `name`'s process, stopping, has ended.
    fn stop_ended(&self, name: &str) {
        let now = self.world.now();
        let mut stops = self.stops.lock().unwrap();
        if let Some(stop) = stops
            .iter_mut()
            .rfind(|(n, _, to)| n == name && to.is_none())
        {
            stop.2 = Some(now);
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.slots.lock().unwrap().keys().cloned().collect()
    }

    /// The name of the life of `name`'s current (or last) process.
    pub fn life(&self, name: &str) -> String {
        self.slots.lock().unwrap()[name].life.clone()
    }

    pub fn state(&self, name: &str) -> State {
        self.slots.lock().unwrap()[name].state
    }

    /// The names of the nodes in `state`.
    pub fn in_state(&self, state: State) -> Vec<String> {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| s.state == state)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// A running node's engine and store, to send readings and registry changes through.
    pub fn entry(
        &self,
        name: &str,
    ) -> Option<(Engine, Arc<NodeStore>, latch::delivery::Dispatcher)> {
        let slots = self.slots.lock().unwrap();
        let s = slots.get(name)?;
        let node = s.node.as_ref()?;
        (s.state == State::Running).then(|| {
            (
                node.engine().clone(),
                s.store.clone().expect("a running node has a store"),
                node.dispatcher().clone(),
            )
        })
    }

    /// Starts a process on a slot that is down. `false` when it could not start (its
    /// store calls failed): a supervisor would try again.
    pub async fn start(&self, name: &str) -> bool {
        let (life, store) = {
            let mut slots = self.slots.lock().unwrap();
            let s = slots.get_mut(name).expect("a known node");
            if s.state != State::Down {
                return false;
            }
            s.starts += 1;
            s.life = format!("{name}.{}", s.starts);
            s.since = self.world.now();
            let store = self.model.for_node(name);
            s.store = Some(store.clone());
            (s.life.clone(), store)
        };
        self.world.set_life(&life, Life::Running);
        self.world.trace(format!("node {name} starts as {life}"));
        let address = format!("sim://{name}");
        let parts = Parts {
            store: store.clone(),
            cluster_store: self.model.shared().then(|| store.clone() as _),
            journal: None,
            node: name.to_string(),
            address: Some(address.clone()),
            transport: Some(Arc::new(SimTransport {
                node: life.clone(),
                receivers: self.receivers.clone(),
            })),
            forwarder: Some(self.forwarder.clone()),
        };
        match Node::start(&self.config, &self.world.clock, parts).await {
            Ok(node) => {
                // The links as the other nodes recorded them, as a node follows them from the
                // store: down, or up since the latest return (a return it did not see
                // counts as down and back).
                if let Some(&(at, up)) = self.links.lock().unwrap().last() {
                    node.engine().set_link(Source::Amqp, false, at);
                    if up {
                        node.engine().set_link(Source::Amqp, true, at);
                    }
                }
                self.forwarder
                    .engines
                    .lock()
                    .unwrap()
                    .insert(address, (node.engine().clone(), life.clone()));
                let mut slots = self.slots.lock().unwrap();
                let s = slots.get_mut(name).expect("a known node");
                s.node = Some(node);
                s.state = State::Running;
                true
            }
            Err(e) => {
                self.world
                    .trace(format!("node {name} failed to start: {e}"));
                store.kill();
                self.world.set_life(&life, Life::Dead);
                let mut slots = self.slots.lock().unwrap();
                let s = slots.get_mut(name).expect("a known node");
                s.store = None;
                false
            }
        }
    }

    /// SIGTERM: the node stops as `latch serve` does (within the grace), then exits.
    pub fn terminate(self: &Arc<Self>, name: &str) {
        let (node, store, life, since) = {
            let mut slots = self.slots.lock().unwrap();
            let s = slots.get_mut(name).expect("a known node");
            if s.state != State::Running {
                return;
            }
            s.state = State::Stopping;
            (s.node.take(), s.store.clone(), s.life.clone(), s.since)
        };
        let Some(node) = node else { return };
        self.world.trace(format!("node {name} SIGTERM"));
        self.stops
            .lock()
            .unwrap()
            .push((name.to_string(), self.world.now(), None));
        let me = self.clone();
        let name = name.to_string();
        let grace = self.config.shutdown_grace;
        let from = self.world.now();
        let task = tokio::spawn(async move {
            node.stop(grace).await;
            // Killed while it stopped: it gave back nothing, as any node killed (and its
            // stop ended then).
            let killed = me.world.life_now(&life) == Life::Dead;
            if !killed {
                me.gave_back(&name, since, from);
            }
            // The process exits: nothing of it runs any more.
            if let Some(store) = store {
                store.kill();
            }
            me.world.set_life(&life, Life::Dead);
            me.receivers.node_died(&life);
            me.forwarder.forget(&format!("sim://{name}"));
            me.world.trace(format!("node {name} exited"));
            if !killed {
                me.stop_ended(&name);
            }
            let mut slots = me.slots.lock().unwrap();
            let s = slots.get_mut(&name).expect("a known node");
            s.state = State::Down;
            s.store = None;
        });
        self.stopping.lock().unwrap().push(task);
    }

    /// A stop gives back what it holds (book, Guarantees): once its process exits, no
    /// pending notification is still leased to it, whatever its receivers took — each
    /// attempt still out when the grace ran out was cut off and recorded, which released
    /// its lease. Unless the store kept it from writing within a claim lease before: a
    /// write in doubt (a claim that landed unanswered), or an outcome whose write failed,
    /// leaves its lease to run out (seed 864 of 2,000 before this was widened). Leases
    /// an earlier process of the same name took (it was killed) are not this one's: a node
    /// may take its own back after a restart, but need not.
    fn gave_back(&self, name: &str, since: Millis, from: Millis) {
        let now = self.world.now();
        let claim_lease = 3 * self.config.delivery_timeout.as_millis() as Millis + 5_000;
        if self.faults.were_on(from - claim_lease, now, |_| true) {
            return;
        }
        let held: Vec<(String, String)> = self.model.read(|t| {
            t.notifications()
                .filter(|r| {
                    r.notification.status == Status::Pending
                        && r.claimed_by.as_deref() == Some(name)
                        && r.lease_until
                            .is_some_and(|until| until > now && until - claim_lease >= since)
                })
                .map(|r| {
                    let n = &r.notification;
                    (n.id.clone(), lane_key(&(n.client_id.clone(), n.sensor_id)))
                })
                .collect()
        });
        if held.is_empty() {
            return;
        }
        let ids: Vec<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
        self.world.violate(
            "a stop gives back what it holds",
            format!(
                "node {name} exited {} ms after its SIGTERM still leasing {}",
                now - from,
                ids.join(" ")
            ),
            held.into_iter().flat_map(|(id, lane)| [id, lane]).collect(),
        );
    }

    /// `kill -9`: nothing of the process runs, reaches the store or a receiver again.
    pub fn kill(&self, name: &str) {
        let mut slots = self.slots.lock().unwrap();
        let s = slots.get_mut(name).expect("a known node");
        if !matches!(s.state, State::Running | State::Frozen | State::Stopping) {
            return;
        }
        self.world.trace(format!("node {name} kill -9"));
        if s.state == State::Stopping {
            self.stop_ended(name);
        }
        if let Some(store) = s.store.take() {
            store.kill();
        }
        self.world.set_life(&s.life, Life::Dead);
        self.receivers.node_died(&s.life);
        self.forwarder.forget(&format!("sim://{name}"));
        // Its tasks stay behind, stuck on the store and the receivers for good.
        if let Some(node) = s.node.take() {
            self.dead.lock().unwrap().push(node);
        }
        s.state = State::Down;
    }

    /// SIGSTOP.
    pub fn freeze(&self, name: &str) {
        let mut slots = self.slots.lock().unwrap();
        let s = slots.get_mut(name).expect("a known node");
        if s.state != State::Running {
            return;
        }
        self.world.trace(format!("node {name} SIGSTOP"));
        if let Some(store) = &s.store {
            store.freeze();
        }
        self.world.set_life(&s.life, Life::Frozen);
        s.state = State::Frozen;
    }

    /// SIGCONT.
    pub fn thaw(&self, name: &str) {
        let mut slots = self.slots.lock().unwrap();
        let s = slots.get_mut(name).expect("a known node");
        if s.state != State::Frozen {
            return;
        }
        self.world.trace(format!("node {name} SIGCONT"));
        if let Some(store) = &s.store {
            store.thaw();
        }
        self.world.set_life(&s.life, Life::Running);
        s.state = State::Running;
    }

    /// Waits for the stops under way.
    pub async fn settle_stops(&self) {
        let tasks: Vec<_> = std::mem::take(&mut *self.stopping.lock().unwrap());
        for t in tasks {
            let _ = t.await;
        }
    }

    /// A task of a running node panicked.
    pub fn failure(&self) -> Option<String> {
        let slots = self.slots.lock().unwrap();
        slots
            .iter()
            .find_map(|(n, s)| s.node.as_ref()?.failure().map(|f| format!("{n}: {f}")))
    }

    /// Stops every node still running, as at the end of a run.
    pub async fn stop_all(self: &Arc<Self>) {
        for n in self.names() {
            self.thaw(&n);
            self.terminate(&n);
        }
        self.settle_stops().await;
    }

    pub fn grace(&self) -> Duration {
        self.config.shutdown_grace
    }
}

/// Hands readings to the engine of the node at an address, as a node's HTTP forwarding
/// does, with that node's clock and life: a frozen owner answers once thawed, a dead one
/// never (the sender's request fails: `store_unavailable`, to be sent again).
pub struct SimForwarder {
    world: Arc<World>,
    engines: Mutex<BTreeMap<String, (Engine, String)>>,
}

impl SimForwarder {
    fn forget(&self, address: &str) {
        self.engines.lock().unwrap().remove(address);
    }
}

impl Forwarder for SimForwarder {
    fn forward(
        &self,
        to: Arc<str>,
        readings: Vec<Reading>,
        sequence: Option<Sequence>,
        source: Source,
        keyed: Option<latch::store::Keyed>,
    ) -> VerdictsRx {
        let (reply, rx) = oneshot::channel();
        let target = self.engines.lock().unwrap().get(&*to).cloned();
        let world = self.world.clone();
        let n = readings.len();
        tokio::spawn(async move {
            let refused = |why: &str| -> Verdicts {
                vec![
                    Some(Rejection::new(
                        RejectCode::StoreUnavailable,
                        why.to_string()
                    ));
                    n
                ]
            };
            let Some((engine, life)) = target else {
                let _ = reply.send(Ok(refused("the owner is not reachable")));
                return;
            };
            if world.life_now(&life) == Life::Dead {
                let _ = reply.send(Ok(refused("the owner is not reachable")));
                return;
            }
            alive(&world, &life).await;
            let items = readings.into_iter().map(Ok).collect();
            let ticket = engine
                .enqueue_here(
                    items,
                    engine.now(),
                    source,
                    sequence.as_ref(),
                    keyed.as_ref(),
                )
                .await;
            let verdicts = match ticket {
                Ok(t) => match t.wait().await {
                    Ok(report) => {
                        let mut v: Verdicts = vec![None; n];
                        for (i, rej) in report.rejected {
                            v[i] = Some(rej);
                        }
                        v
                    }
                    Err(e) => refused(&format!("not stored ({e})")),
                },
                Err(e) => refused(&format!("not stored ({e})")),
            };
            let _ = reply.send(Ok(verdicts));
        });
        rx
    }
}
