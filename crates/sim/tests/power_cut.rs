//! Power cuts of the embedded store: the real store under a mixed workload, the power cut
//! at many points of what reached its files, each rebuilt folder opened and checked
//! ([`latch_sim::power`]). Its own test binary, since it makes its recording VFS the
//! process's default.
//!
//! `LATCH_POWER_CUTS` and `LATCH_POWER_COMMITS` make the run longer (or shorter).

use latch::config::Synchronous;
use latch_sim::power::{Settings, disk::Fate, run};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn settings(sync: Synchronous, seed: u64) -> Settings {
    Settings {
        sync,
        commits: env("LATCH_POWER_COMMITS", 600),
        cuts: env("LATCH_POWER_CUTS", 200),
        seed,
        fate: Fate {
            kept: 0.5,
            torn: 0.25,
            garbage: 0.2,
        },
        checkpoint_pages: 200,
    }
}

/// Both modes in one test: the VFS's record is one per process. `LATCH_POWER_SYNC` (`full`
/// or `normal`) runs one.
#[test]
fn a_power_cut_loses_nothing_acknowledged_with_full_sync_and_only_a_tail_with_normal() {
    let only = std::env::var("LATCH_POWER_SYNC").ok();
    for (sync, seed) in [(Synchronous::Full, 1), (Synchronous::Normal, 2)] {
        if only
            .as_deref()
            .is_some_and(|o| !format!("{sync:?}").eq_ignore_ascii_case(o))
        {
            continue;
        }
        let started = std::time::Instant::now();
        let report = run(settings(sync, seed));
        println!(
            "{sync:?} ({:.1} s): {report:?}",
            started.elapsed().as_secs_f64()
        );
        assert!(
            report.violations.is_empty(),
            "{sync:?}: {} of the cuts failed:\n{}",
            report.violations.len(),
            report.violations.join("\n")
        );
        // The record reached what the checks are about: moves into the archive, retention
        // rounds, syncs.
        assert!(
            report.archived > 0 && report.rounds > 0 && report.checkpoints > 0,
            "{report:?}"
        );
        // The folder's own operations were seen where they reach the C library: names made
        // (the store's files, its logs) and the folder's syncs.
        assert!(
            report.folder_ops > 0 && report.folder_syncs > 0,
            "{report:?}"
        );
        if sync == Synchronous::Full {
            assert_eq!(report.lost_tail, 0);
        }
    }
}
