//! The store conformance suite (`latch::store::conformance`) against the model of the store,
//! in both modes: as SQLite (one node) and as PostgreSQL (shared). Every check runs on a
//! fresh model, as each runs on a fresh database for the real backends; a failing check is
//! reported by name, and the others still run.

use std::sync::Arc;

use latch::clock::Clock;
use latch::store::conformance::{CHECKS, Check, Subject};
use latch_sim::model::{Mode, ModelStore};

/// Where the model's clock starts: the checks pass their own times where the store takes
/// them, and this is what "database now" reads.
const START: i64 = 1_700_000_000_000;

/// Runs every check on a fresh store of `mode`, each in a task of its own so a panic is
/// one check's failure; returns the names of those that failed.
async fn run_all(mode: Mode) -> Vec<String> {
    let local = tokio::task::LocalSet::new();
    let mut failed = Vec::new();
    for &check in CHECKS {
        let run = local.spawn_local(async move { run_one(check, mode).await });
        if local.run_until(run).await.is_err() {
            failed.push(format!("{check:?}"));
        }
    }
    failed
}

async fn run_one(check: Check, mode: Mode) {
    let model = ModelStore::healthy(mode, Clock::manual(START));
    let node = model.for_node("conformance");
    let subject = Subject {
        store: node.clone(),
        cluster: model
            .shared()
            .then_some(node as Arc<dyn latch::store::ClusterStore>),
        journal: None,
    };
    (check.run)(&subject).await;
    assert!(
        model.violations().is_empty(),
        "{check:?}: {:?}",
        model.violations()
    );
}

#[tokio::test]
async fn the_model_as_sqlite_passes_the_conformance_suite() {
    let failed = run_all(Mode::Single).await;
    assert!(failed.is_empty(), "failed: {failed:?}");
}

#[tokio::test]
async fn the_model_as_postgresql_passes_the_conformance_suite() {
    let failed = run_all(Mode::Shared { partitions: 16 }).await;
    assert!(failed.is_empty(), "failed: {failed:?}");
}
