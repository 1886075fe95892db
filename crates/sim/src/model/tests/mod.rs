//! Tests of what the conformance suite does not reach: the cluster's calls (as
//! `store/postgres/cluster/tests.rs` tests them on PostgreSQL, with the model's clock moved
//! where those sleep), a claim's reading of its lane across nodes, the fault hooks and the
//! processes' gates, the audit, and that a run is the same every time.

use std::sync::Arc;
use std::time::Duration;

use latch::clock::Clock;
use latch::domain::SensorId;
use latch::store::Lease;

use super::{Mode, ModelStore, NodeStore};

mod audit;
mod cluster;
mod faults;
mod lanes;

/// Where the model's clock starts.
const START: i64 = 1_700_000_000_000;
const LONG: Duration = Duration::from_secs(60);
/// A liveness window that a node which beat 2.5 s ago is out of.
const RECENT: Duration = Duration::from_secs(2);

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn parts(leases: &[Lease]) -> Vec<u32> {
    leases.iter().map(|l| l.partition).collect()
}

/// A shared model with `p` partitions, its clock, and one node's handle.
fn shared(p: u32) -> (ModelStore, Clock, Arc<NodeStore>) {
    let clock = Clock::manual(START);
    let model = ModelStore::healthy(Mode::Shared { partitions: p }, clock.clone());
    let node = model.for_node("n");
    (model, clock, node)
}
