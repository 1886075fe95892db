//! What the simulation knows beside latch: the seeded generator, the trace, the violations
//! found, and the state of each simulated node as the faults left it.
//!
//! Everything here is behind `std::sync::Mutex`es held for a few statements and never
//! across an `.await`: the whole simulation runs on one thread, so they are never
//! contended, only needed because latch's traits want `Send + Sync`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use latch::clock::Clock;
use latch::domain::Millis;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

/// How a simulated process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    Running,
    /// SIGSTOP: nothing it does reaches the store or a receiver until it is thawed.
    Frozen,
    /// `kill -9` (or a SIGTERM's stop finished): nothing of it ever runs again.
    Dead,
}

/// A violation of one of the book's guarantees.
#[derive(Debug, Clone)]
pub struct Violation {
    pub at: Millis,
    /// Which guarantee.
    pub invariant: &'static str,
    pub detail: String,
    /// What the trace is shortened to: lines naming any of these.
    pub keys: Vec<String>,
}

/// The simulation's shared state.
pub struct World {
    pub clock: Clock,
    rng: Mutex<StdRng>,
    trace: Mutex<Vec<String>>,
    violations: Mutex<Vec<Violation>>,
    /// Per process (life) name, how it is; a frozen process's calls wake when it thaws, a
    /// dead one's hang for good.
    lives: Mutex<BTreeMap<String, Arc<Cell>>>,
}

/// A process's life and what wakes its waiters. Not a `watch` channel: its receivers
/// wake in an order Tokio draws at random, and the same seed must wake them in the same
/// order; `Notify` wakes its waiters in the order they came.
#[derive(Debug)]
pub struct Cell {
    life: Mutex<Life>,
    changed: Notify,
}

impl World {
    pub fn new(clock: Clock, seed: u64) -> Self {
        Self {
            clock,
            // Not the clock's own generator: what latch draws must not depend on what the
            // simulation draws, so a change to the workload leaves latch's draws alone.
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed_5eed_5eed_5eed)),
            trace: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            lives: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// A draw from the simulation's generator.
    pub fn rng<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        f(&mut self.rng.lock().unwrap())
    }

    /// `true` with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        self.rng(|r| r.r#gen::<f64>() < p)
    }

    /// A number in `[lo, hi)`.
    pub fn between(&self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        self.rng(|r| r.gen_range(lo..hi))
    }

    /// Adds a line to the trace, stamped with the virtual time.
    pub fn trace(&self, line: impl AsRef<str>) {
        let at = self.now();
        let mut t = self.trace.lock().unwrap();
        t.push(format!("{:>8} {}", at - crate::START, line.as_ref()));
    }

    /// The whole trace, for a file to read a failure by.
    pub fn trace_all(&self) -> Vec<String> {
        self.trace.lock().unwrap().clone()
    }

    pub fn trace_len(&self) -> usize {
        self.trace.lock().unwrap().len()
    }

    /// The trace's hash: the same seed gives the same one.
    pub fn trace_hash(&self) -> String {
        let mut h = Sha256::new();
        for line in self.trace.lock().unwrap().iter() {
            h.update(line.as_bytes());
            h.update(b"\n");
        }
        let digest = h.finalize();
        let mut out = String::new();
        for b in &digest[..8] {
            let _ = write!(out, "{b:02x}");
        }
        out
    }

    /// The trace lines that name any of `keys` (and every node fault), the last `max`.
    pub fn trace_about(&self, keys: &[String], max: usize) -> Vec<String> {
        let t = self.trace.lock().unwrap();
        let lines: Vec<&String> = t
            .iter()
            .filter(|l| l.contains("node ") || keys.iter().any(|k| l.contains(k.as_str())))
            .collect();
        let skip = lines.len().saturating_sub(max);
        lines.into_iter().skip(skip).cloned().collect()
    }

    pub fn violate(&self, invariant: &'static str, detail: String, keys: Vec<String>) {
        self.trace(format!("VIOLATION {invariant}: {detail}"));
        self.violations.lock().unwrap().push(Violation {
            at: self.now(),
            invariant,
            detail,
            keys,
        });
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.violations.lock().unwrap().clone()
    }

    pub fn has_violations(&self) -> bool {
        !self.violations.lock().unwrap().is_empty()
    }

    fn cell(&self, node: &str) -> Arc<Cell> {
        self.lives
            .lock()
            .unwrap()
            .entry(node.to_string())
            .or_insert_with(|| {
                Arc::new(Cell {
                    life: Mutex::new(Life::Running),
                    changed: Notify::new(),
                })
            })
            .clone()
    }

    pub fn set_life(&self, node: &str, life: Life) {
        let cell = self.cell(node);
        *cell.life.lock().unwrap() = life;
        cell.changed.notify_waiters();
    }

    pub fn life_now(&self, node: &str) -> Life {
        *self.cell(node).life.lock().unwrap()
    }

    /// Returns once `node` is in a life `until` accepts.
    pub async fn wait_life(&self, node: &str, until: impl Fn(Life) -> bool) {
        let cell = self.cell(node);
        loop {
            let changed = cell.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if until(*cell.life.lock().unwrap()) {
                return;
            }
            changed.await;
        }
    }
}

/// Waits while `node` is frozen; never returns once it is dead. What every call a node
/// makes to the outside goes through first.
pub async fn alive(world: &World, node: &str) {
    world.wait_life(node, |l| l != Life::Frozen).await;
    if world.life_now(node) == Life::Dead {
        std::future::pending::<()>().await;
    }
}
