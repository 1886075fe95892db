//! The deterministic simulation of latch's delivery and cluster core (issue #48).
//!
//! A run takes a seed and plays, on one thread and a virtual clock (Tokio's paused time),
//! one to three of latch's real node cores ([`latch::service::Node`]: the engine and its
//! deadlines, the committer, the dispatcher with its lanes, batches, claimer and recorder,
//! the cluster's lease rounds and partition moves) against a model of the store
//! ([`model`], held to the store conformance suite) and simulated endpoints
//! ([`receivers`]). The seed draws the workload and the faults ([`workload`]); the
//! book's guarantees are checked as each request arrives, after every step and once the
//! run has healed ([`checks`]). The same seed gives the same trace: its hash is part of
//! the outcome, and a failure prints the seed, the command that replays it and the trace
//! about what failed.
//!
//! Layout: `world` (the generator, the trace, node lives), `receivers` (endpoints and the
//! lane checks), `nodes` (processes and their faults), `faults` (the store's),
//! `workload`, `checks`, and `model`.

pub mod checks;
pub mod faults;
pub mod log;
pub mod model;
pub mod nodes;
pub mod power;
pub mod receivers;
pub mod workload;
pub mod world;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use latch::clock::Clock;
use latch::config::Config;
use latch::domain::{Millis, SensorId, Source};

use crate::checks::Bounds;
use crate::faults::StoreFaults;
use crate::log::{Log, SimClient};
use crate::model::{Mode, ModelStore};
use crate::nodes::{Nodes, State};
use crate::receivers::Receivers;
use crate::workload::{SimSensor, Workload};
use crate::world::{Violation, World};

/// Where every run's clock starts (2030-03-17), so traces show times from here.
pub const START: Millis = 1_900_000_000_000;

/// The seed the hash maps of every run use (the maps' order is part of the trace).
const HASH_SEED: u64 = 0x0001_a7c4_5eed;

/// How a run goes beyond its seed.
#[derive(Debug, Clone)]
pub struct Options {
    /// Workload steps.
    pub steps: usize,
    /// Lines of trace a failure prints.
    pub trace_lines: usize,
    /// Keep the whole trace in the outcome.
    pub full_trace: bool,
    /// Half of the sensors debounce their changes (`debounce_s` 1): a workload of its
    /// own, so the seeds kept in the suite play as they were found.
    pub debounce: bool,
    /// The door alarms workload (issue #72): readings carry battery, tamper and fault
    /// reports now and then, and some sensors have hold alarms, set at registration and
    /// changed now and then (`workload::holds`): a workload of its own, like `debounce`.
    pub signals: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            steps: 250,
            trace_lines: 60,
            full_trace: false,
            debounce: false,
            signals: false,
        }
    }
}

impl Options {
    /// What `latch-sim` needs beside `--seed` to play a run with these options again.
    fn replay_args(&self) -> String {
        let mut args = String::new();
        if self.steps != Self::default().steps {
            args.push_str(&format!(" --steps {}", self.steps));
        }
        if self.debounce {
            args.push_str(" --debounce");
        }
        if self.signals {
            args.push_str(" --signals");
        }
        args
    }
}

/// What a run came to.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    /// The trace's hash: the same seed gives the same one.
    pub hash: String,
    pub violations: Vec<Violation>,
    /// The trace about the first violation (empty when there is none).
    pub trace: Vec<String>,
    /// The whole trace, when asked for ([`Options::full_trace`]).
    pub full_trace: Vec<String>,
    pub nodes: usize,
    /// Virtual time the run took, ms.
    pub virtual_ms: Millis,
    pub trace_len: usize,
    /// The options beside the seed that replay it (`--steps`, `--debounce`).
    pub replay_args: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// What a failure prints: the seed, the command that replays it, what failed and the
    /// trace about it.
    pub fn report(&self) -> String {
        let mut out = format!(
            "seed {} failed ({} nodes, trace {}): replay with\n  cargo run -p latch-sim -- --seed {}{}\n",
            self.seed, self.nodes, self.hash, self.seed, self.replay_args
        );
        for v in self.violations.iter().take(5) {
            out.push_str(&format!(
                "  at {} ms: {}: {}\n",
                v.at - START,
                v.invariant,
                v.detail
            ));
        }
        out.push_str("trace about the first:\n");
        for l in &self.trace {
            out.push_str("  ");
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

/// Runs one seed to its end, on a runtime of its own.
///
/// Nothing of a run outlives it: `latch-sim` plays many seeds in one process, and a run
/// that kept its world (its model, trace, nodes: about 1 MB) made the book's
/// 100,000 seeds need 100 GB. Every piece of a run holds its [`World`], so a world still
/// held once the runtime is gone (its tasks dropped) is a violation of its own.
pub fn run(seed: u64, opts: &Options) -> Outcome {
    latch::hashing::fix_seed(HASH_SEED);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    // The clock reads its base from the runtime's paused time: made outside it, the
    // base was the wall's `Instant`, and the wall time between building the runtime and
    // making the clock (a few ms when other threads took the core) moved every virtual
    // time of the run, so a seed played another trace beside other seeds.
    let world = {
        let _in_runtime = rt.enter();
        Arc::new(World::new(Clock::simulated(START, seed), seed))
    };
    let kept = Arc::downgrade(&world);
    let mut out = rt.block_on(async move {
        // Virtual time: a run that never ends (a stop that hangs, a loop that never
        // settles) is a failure of its own, not a hung test.
        match tokio::time::timeout(RUN_LIMIT, simulate(seed, opts, world.clone())).await {
            Ok(out) => out,
            Err(_) => {
                world.violate(
                    "a run ends",
                    format!(
                        "still running after {} s of virtual time",
                        RUN_LIMIT.as_secs()
                    ),
                    Vec::new(),
                );
                Outcome {
                    seed,
                    hash: world.trace_hash(),
                    violations: world.violations(),
                    trace: world.trace_about(&[], opts.trace_lines),
                    full_trace: if opts.full_trace {
                        world.trace_all()
                    } else {
                        Vec::new()
                    },
                    nodes: 0,
                    virtual_ms: RUN_LIMIT.as_millis() as Millis,
                    trace_len: world.trace_len(),
                    replay_args: opts.replay_args(),
                }
            }
        }
    });
    drop(rt);
    if kept.strong_count() > 0 {
        out.violations.push(Violation {
            at: START + out.virtual_ms,
            invariant: "a run leaves nothing behind",
            detail: format!(
                "its world is still held {} time(s) once its runtime is gone",
                kept.strong_count()
            ),
            keys: Vec::new(),
        });
    }
    out
}

/// Virtual time a run may take: its steps take about a minute and a half.
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// The settings of a run: short timeouts, so a run of a minute sees many of them.
fn settings(cluster: bool) -> Config {
    let mut c = Config::load_from(None, &[]).expect("the defaults load");
    c.heartbeat_timeout = Duration::from_secs(12);
    c.lost_reminder = Some(Duration::from_secs(9));
    c.site_grace = Duration::from_secs(4);
    c.retry_base = Duration::from_millis(300);
    c.retry_max_delay = Duration::from_secs(4);
    c.retry_max_attempts = 6;
    c.delivery_timeout = Duration::from_secs(2);
    c.delivery_concurrency = 6;
    c.delivery_client_concurrency = 2;
    c.shutdown_grace = Duration::from_secs(1);
    c.endpoint_disable_after = Duration::from_secs(3600);
    c.engine_shards = 2;
    c.cluster_lease = Some(Duration::from_secs(3));
    c.cluster_partitions = Some(8);
    c.cluster_secret = Some("simulation".into());
    c.database_timeout = Duration::from_secs(5);
    // Short, so a run of a minute and a half sees its rows go: a finished notification
    // lives five seconds, history fifteen (the workload runs the rounds).
    c.retention_notifications = Duration::from_secs(5);
    c.retention_readings = Duration::from_secs(15);
    if cluster {
        c.database_url = Some("postgres://simulated".into());
    }
    c
}

async fn simulate(seed: u64, opts: &Options, world: Arc<World>) -> Outcome {
    let clock = world.clock.clone();
    let nodes_n = match seed % 3 {
        0 => 1,
        1 => 2,
        _ => 3,
    };
    let cluster = nodes_n > 1;
    // A quarter of the runs of each size are calm: their endpoints misbehave, nothing else.
    let calm = (seed / 3) % 4 == 1;
    let config = Arc::new(settings(cluster));
    let faults = StoreFaults::new(world.clone());
    let mode = match cluster {
        true => Mode::Shared {
            partitions: config.partitions(),
        },
        false => Mode::Single,
    };
    let model = ModelStore::new(mode, clock.clone(), faults.clone());
    model.decide_sites_per_call(1);
    let receivers = Receivers::new(
        world.clone(),
        config.delivery_timeout,
        latch::delivery::retry::RetryPolicy::from_config(&config),
    );
    let leases = model.clone();
    *receivers.lease_of.lock().unwrap() = Some(Arc::new(move |id: &str| {
        leases.read(|t| {
            t.notifications
                .values()
                .find(|r| r.notification.id == id)
                .map(|r| match (&r.claimed_by, r.lease_until) {
                    (Some(by), Some(until)) => format!(" (leased by {by} until {})", until - START),
                    _ => " (not leased)".to_string(),
                })
                .unwrap_or_default()
        })
    }));
    let vetting = model.clone();
    let claim_lease = 3 * config.delivery_timeout.as_millis() as Millis + 5_000;
    *receivers.vet.lock().unwrap() = Some(Arc::new(move |n: &latch::domain::Notification, now| {
        vetting.read(|t| {
            checks::sent_to_deleted(t, n, now, claim_lease)
                .or_else(|| checks::sent_unlinked(t, n, now))
        })
    }));
    let names: Vec<&str> = ["n1", "n2", "n3"][..nodes_n].to_vec();
    let nodes = Nodes::new(
        world.clone(),
        model.clone(),
        receivers.clone(),
        faults.clone(),
        config.clone(),
        &names,
    );
    world.trace(format!(
        "seed {seed}: {nodes_n} node(s){}{}",
        if calm { ", calm" } else { "" },
        if opts.debounce { ", debounced" } else { "" }
    ));
    for n in &names {
        nodes.start(n).await;
    }
    let sensors: Vec<SimSensor> = (0..world.between(5, 10))
        .map(|i| SimSensor {
            id: SensorId::parse(&format!("s{i}")).expect("a valid id"),
            data: false,
            silent_until: 0,
            source: if i % 3 == 2 {
                Source::Amqp
            } else {
                Source::Http
            },
            last_ts: START,
        })
        .collect();
    let clients: Vec<SimClient> = (0..world.between(2, 5))
        .map(|i| SimClient {
            id: format!("c{i}"),
            healthy: i == 0,
            links: sensors
                .iter()
                .filter(|_| i == 0 || world.chance(0.6))
                .map(|s| (s.id, START))
                .collect(),
        })
        .collect();
    let lease = config.lease().as_millis() as Millis;
    let next_client = clients.len();
    let mut w = Workload {
        world: world.clone(),
        model: model.clone(),
        nodes: nodes.clone(),
        receivers: receivers.clone(),
        faults: faults.clone(),
        sensors,
        clients,
        log: Arc::new(Mutex::new(Log::default())),
        timeout: config.heartbeat_timeout.as_millis() as Millis,
        lease,
        cluster,
        calm,
        debounce: opts.debounce,
        signals: opts.signals,
        next_client,
        gone: Vec::new(),
        keyed: Vec::new(),
        next_key: 0,
        retention: latch::history::retention::Settings::from_config(&config),
    };
    if let Err(e) = w.register().await {
        world.violate("the fleet registers", e.to_string(), Vec::new());
    }
    let mut reported = 0;
    let mut audit_reported = std::collections::BTreeSet::new();
    let mut describe_at: Option<Millis> = std::env::var("LATCH_SIM_DESCRIBE_AT")
        .ok()
        .and_then(|v| v.parse().ok());
    for _ in 0..opts.steps {
        if describe_at.is_some_and(|at| world.now() - START >= at) {
            describe_at = None;
            describe(&world, &nodes, &w.clients).await;
        }
        w.step().await;
        let dt = world.between(0, 400);
        tokio::time::sleep(Duration::from_millis(dt)).await;
        checks::during(&world, &model, &mut reported);
        checks::audited(&world, &model, &w.log.lock().unwrap(), &mut audit_reported);
        if let Some(f) = nodes.failure() {
            world.violate("no task of latch panics", f, Vec::new());
        }
    }
    let healed_at = heal(&mut w, &nodes, &faults, &receivers, &config).await;
    let claim_lease = 3 * config.delivery_timeout.as_millis() as Millis + 5_000;
    let bounds = Bounds {
        silences_told_by: silences_told_by(&w.model, &config),
        timeout: w.timeout,
        reminder: config.lost_reminder.map(|r| r.as_millis() as Millis),
        isolation: 3_000,
        lost_slack: 1_500,
        claim_lease,
        cluster,
        site_grace: config.site_grace.as_millis() as Millis,
        healed_at,
    };
    checks::during(&world, &model, &mut reported);
    if let Ok(id) = std::env::var("LATCH_SIM_TRAIL") {
        let trail = model.read(|t| t.audit.trail(&id).cloned());
        world.trace(format!("trail of {id}: {trail:#?}"));
    }
    if std::env::var("LATCH_SIM_DESCRIBE").is_ok() {
        describe(&world, &nodes, &w.clients).await;
    }
    {
        let mut log = w.log.lock().unwrap();
        log.links = nodes.link_changes();
        log.stops = nodes.stops();
        checks::at_end(&world, &model, &receivers, &log, &w.clients, &bounds, START);
    }
    if opts.signals {
        let bodies = receivers.hold_bodies();
        world.trace(model.read(|t| checks::holds_summary(t, &bodies)));
        world.trace(model.read(checks::flaps_summary));
    }
    let virtual_ms = world.now() - START;
    nodes.stop_all().await;
    let violations = world.violations();
    let trace = violations
        .first()
        .map(|v| world.trace_about(&v.keys, opts.trace_lines))
        .unwrap_or_default();
    Outcome {
        seed,
        hash: world.trace_hash(),
        violations,
        trace,
        full_trace: if opts.full_trace {
            world.trace_all()
        } else {
            Vec::new()
        },
        nodes: nodes_n,
        virtual_ms,
        trace_len: world.trace_len(),
        replay_args: opts.replay_args(),
    }
}

/// Every running node's lanes of every client, into the trace (debugging a failure).
async fn describe(world: &World, nodes: &Nodes, clients: &[SimClient]) {
    for n in nodes.in_state(State::Running) {
        if let Some((_, _, d)) = nodes.entry(&n) {
            for c in clients {
                world.trace(format!("{n} {}: {}", c.id, d.describe(&c.id).await));
            }
        }
    }
}

/// The longest a run settles on past its bound for clients with a rate limit.
const RATE_SETTLE_MAX_MS: Millis = 120_000;

/// Pending notifications of clients with a rate limit (seed 311960: one request a second
/// for the whole cluster, a backlog of its eight sensors' losses, returns and reminders).
fn rate_limited_pending(model: &ModelStore) -> usize {
    model.read(|t| {
        t.notifications
            .values()
            .filter(|n| n.notification.status == latch::domain::Status::Pending)
            .filter(|n| {
                t.clients
                    .get(&n.notification.client_id)
                    .is_some_and(|c| c.client.rate_limit.is_some())
            })
            .count()
    })
}

/// Faults stop: endpoints answer, the store works, links are up, every node runs again,
/// disabled clients are enabled and dead letters replayed; the sensors keep reporting
/// (without changes) while everything pending settles, up to the bound the book gives:
/// what a killed node leased waits out its lease, a retry its delay. Returns when every
/// node ran again: faults stopped then.
/// When the last silence's end is reconciled (`silence::settle_ms` after it): what it kept
/// reaches its clients from then on.
fn silences_told_by(model: &ModelStore, config: &Config) -> Millis {
    let last = model.read(|t| t.silences.values().map(|s| s.ends_at).max());
    last.map_or(0, |end| {
        end + latch::domain::silence::settle_ms(config.database_timeout)
    })
}

async fn heal(
    w: &mut Workload,
    nodes: &Arc<Nodes>,
    faults: &StoreFaults,
    receivers: &Receivers,
    config: &Config,
) -> Millis {
    let world = w.world.clone();
    world.trace("heal");
    faults.close();
    receivers.heal();
    nodes.settle_stops().await;
    for n in nodes.names() {
        nodes.thaw(&n);
        if nodes.state(&n) == State::Down {
            nodes.start(&n).await;
        }
    }
    nodes.set_link(true);
    let healed_at = world.now();
    w.quiet_holds().await;
    let claim_lease = 3 * config.delivery_timeout.as_millis() as Millis + 5_000;
    let bound = claim_lease
        + config.retry_max_delay.as_millis() as Millis
        + 2 * config.lease().as_millis() as Millis
        + 5_000;
    // Silences still running (some outlast retention) end first, and are reconciled.
    let until = world.now().max(silences_told_by(&w.model, config)) + bound;
    // A client with a rate limit sends what waits for it no faster than its rate, however
    // healthy the rest: the run settles on while one still has some, up to a cap (a lane
    // that never moves still fails the checks then).
    let cap = until + RATE_SETTLE_MAX_MS;
    let mut replays = 0;
    while world.now() < until || (world.now() < cap && rate_limited_pending(&w.model) > 0) {
        w.keep_alive();
        // At once, and again halfway: a client disabled or a notification failed while
        // the first replay's were settling.
        if replays == 0 || (replays == 1 && world.now() + bound / 2 >= until) {
            w.enable().await;
            w.replay_all().await;
            replays += 1;
        }
        // Upkeep goes on while everything settles: it must not hold up what is pending.
        w.retention().await;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    healed_at
}
