//! A model of latch's store: an in-memory, deterministic implementation of every store
//! trait (`latch::store::{Registry, Runtime, Outbox, HistoryStore, Tokens, Backend, Find}`
//! and `ClusterStore`) that the simulation runs many nodes against.
//!
//! It is faithful to the real backends rather than simpler than them. Every transaction
//! that carries a rule is written once (`latch::store::rules`: the group commit, a claim,
//! recording outcomes, a site's hold and decision, a sensor's move, a silence applied and
//! reconciled): the model implements only those sequences' table operations, as the
//! backends' statements write them, and runs latch's own sequences. The rest — the
//! registry's reads and writes, the outbox's loads and sweeps, replays, retention and the
//! cluster's leases — each concern's file here mirrors from the SQL of that concern in
//! `src/store/sqlite/` and `src/store/postgres/`, calling the domain's policy
//! (`latch::domain::policy`: `retry_refusal`, …) wherever that SQL mirrors it. The conformance
//! suite (`latch::store::conformance`) runs
//! against it in both modes (`crates/sim/tests/model_conformance.rs`).
//!
//! - [`Mode::Shared`] mirrors PostgreSQL: `shared()` is true, registry changes are kept for
//!   other nodes, a claim reads the notification's lane in the store
//!   (`policy::LaneInStore`), commits check their fences ([`latch::store::Error::Fenced`]),
//!   and the cluster's leases are judged by the model's clock.
//! - [`Mode::Single`] mirrors SQLite: one node; opening the store again
//!   ([`ModelStore::for_node`]) releases every lease, as `SqliteStore::open` does.
//!
//! Time: the model never reads the wall clock. What the backends take from their own
//! clock ("database now": leases, heartbeats, rate grants, registry changes) is the
//! simulation's [`Clock`]; what they take as a parameter (`now` of a commit, a claim, a
//! record) is the parameter. Ids are counters (notification ids are ULIDs of the clock's
//! time and a counter), and every table is an ordered map: a run is the same for a seed.
//!
//! Durability: the tables hold what committed, nothing else. Each call is applied whole,
//! under one lock, or not at all; a fault makes it fail before it is applied, or leaves
//! it applied but unanswered ([`faults`]).
//!
//! Nodes: the simulation reaches the store through one [`NodeStore`] per node process
//! ([`ModelStore::for_node`]). Each forwards every call to the shared tables with its
//! node's name, through the fault hooks and the process's [`faults::Gate`] (kill, freeze,
//! thaw). A node restarted is a new `NodeStore`; the killed one's calls never end.
//!
//! ```
//! use std::sync::Arc;
//! use latch::clock::Clock;
//! use latch::store::{ClusterStore, Store};
//! use latch_sim::model::{Mode, ModelStore, NoFaults};
//!
//! let clock = Clock::manual(1_700_000_000_000);
//! let model = ModelStore::new(Mode::Shared { partitions: 8 }, clock, Arc::new(NoFaults));
//! let n1 = model.for_node("n1");
//! let store: Arc<dyn Store> = n1.clone(); // what latch's wiring takes
//! let cluster: Arc<dyn ClusterStore> = n1.clone();
//! n1.freeze(); // SIGSTOP: its calls wait…
//! n1.thaw(); // …and go on
//! n1.kill(); // its calls never end; a restart is `model.for_node("n1")` again
//! assert!(model.read(|t| t.audit().violations().is_empty()));
//! # let _ = (store, cluster);
//! ```
//!
//! Not modelled: row locks between transactions (a claim never finds a row another node
//! is claiming at that instant, and upkeep never finds another node at it: calls are
//! atomic here); SQLite's relaxed durability of claims and results (a power cut is the
//! other half of issue #48, on the real store); PostgreSQL's history retention by whole
//! months (rows go one by one, as on SQLite); the full-text tokenizers' diacritic folding
//! in sensor search (words are matched lower-cased, as runs of letters and digits).

use std::sync::{Arc, Mutex};

use latch::clock::Clock;

mod alarms;
pub mod audit;
mod cluster;
mod commit;
mod escalations;
pub mod faults;
mod find;
mod history;
mod idempotency;
mod lifecycle;
mod node;
mod outbox;
mod registry;
mod replay;
mod schedules;
mod secrets;
mod sessions;
mod silences;
mod site_moves;
mod sites;
mod tables;
#[cfg(test)]
mod tests;
mod tokens;
mod trail;
mod upkeep;

pub use audit::{Audit, Change, Trail, Violation};
pub use faults::{Call, Fault, Faults, Life, NoFaults};
pub use node::NodeStore;
pub use tables::{
    AttemptRow, ClientRow, HeldWindow, NodeEntry, PartitionRow, StateRow, StoredNotification,
    Tables,
};

/// Which backend the model mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// SQLite: one node.
    Single,
    /// PostgreSQL shared by a cluster; `partitions` is `cluster_partitions`, fixed by the
    /// store's first use.
    Shared { partitions: u32 },
}

/// The store itself: its tables, its clock, and the harness's fault hooks. Cheap to clone;
/// clones share one store.
#[derive(Clone)]
pub struct ModelStore {
    inner: Arc<Inner>,
}

struct Inner {
    mode: Mode,
    /// A `std` mutex: no call awaits while it holds it, so a call is applied whole.
    tables: Mutex<Tables>,
    clock: Clock,
    faults: Arc<dyn Faults>,
}

impl ModelStore {
    pub fn new(mode: Mode, clock: Clock, faults: Arc<dyn Faults>) -> Self {
        let tables = match mode {
            Mode::Single => Tables::new(false, latch::domain::partition::DEFAULT_PARTITIONS),
            Mode::Shared { partitions } => Tables::new(true, partitions),
        };
        Self {
            inner: Arc::new(Inner {
                mode,
                tables: Mutex::new(tables),
                clock,
                faults,
            }),
        }
    }

    /// A store without faults.
    pub fn healthy(mode: Mode, clock: Clock) -> Self {
        Self::new(mode, clock, Arc::new(NoFaults))
    }

    /// Sites one call decides on the embedded store: SQLite's 500 unless set. A run sets
    /// one, so that its two sites down exceed a call as 501 would SQLite's (issue #68
    /// item 4: a round goes on while a call was full, and no site starves).
    pub fn decide_sites_per_call(&self, n: usize) {
        self.lock().sites_per_call = n.max(1);
    }

    /// The store as node `name`'s process reaches it. In [`Mode::Single`] this is opening
    /// the store, as a process does at start: every lease is released (whoever held them
    /// is gone; the harness stops or kills the previous process first, as the data
    /// folder's lock makes sure of).
    pub fn for_node(&self, name: &str) -> Arc<NodeStore> {
        let mut t = self.lock();
        if !t.shared {
            for r in t.notifications.values_mut() {
                if r.lease_until.is_some() {
                    r.lease_until = None;
                    r.claimed_by = None;
                }
            }
        }
        drop(t);
        Arc::new(NodeStore::new(self.clone(), name.into()))
    }

    /// Reads the tables as they are now: the simulation's invariant checks.
    pub fn read<R>(&self, f: impl FnOnce(&Tables) -> R) -> R {
        f(&self.lock())
    }

    /// Every change out of a final status so far (none, while the model and latch are
    /// right).
    pub fn violations(&self) -> Vec<Violation> {
        self.lock().audit.violations().to_vec()
    }

    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// Whether several nodes share this store (PostgreSQL's semantics).
    pub fn shared(&self) -> bool {
        matches!(self.inner.mode, Mode::Shared { .. })
    }

    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    pub(crate) fn faults(&self) -> &dyn Faults {
        &*self.inner.faults
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic inside a call (a bug of the model) must not hide the tables from the
        // checks that report it.
        self.inner.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one call whole, at the clock's time now.
    pub(crate) fn apply<T>(
        &self,
        call: &Call,
        f: impl FnOnce(&mut Tables, &tables::Cx) -> latch::store::Result<T>,
    ) -> latch::store::Result<T> {
        let cx = tables::Cx {
            now: self.inner.clock.now(),
            node: call.node.clone(),
            op: call.op,
        };
        f(&mut self.lock(), &cx)
    }
}
