//! `latch-sim`: runs the simulation over seeds and prints what failed with the command
//! that replays it.
//!
//! ```text
//! cargo run -p latch-sim -- --seeds 500            # seeds 0..500
//! cargo run -p latch-sim -- --seeds 100000 --from 7000 --jobs 2
//! cargo run -p latch-sim -- --seed 4242            # one seed, its trace on failure
//! cargo run -p latch-sim -- --seed 4242 --trace t.txt   # and the whole trace in a file
//! cargo run -p latch-sim -- --seeds 500 --debounce  # half the sensors debounce
//! cargo run -p latch-sim -- --seeds 500 --signals   # door alarms: battery, tamper, fault, holds
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use latch_sim::{Options, run};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<u64> {
        let i = args.iter().position(|a| a == name)?;
        args.get(i + 1)?.parse().ok()
    };
    let mut opts = Options::default();
    if let Some(steps) = value("--steps") {
        opts.steps = steps as usize;
    }
    let trace_file = args
        .iter()
        .position(|a| a == "--trace")
        .and_then(|i| args.get(i + 1).cloned());
    opts.full_trace = trace_file.is_some();
    opts.debounce = args.iter().any(|a| a == "--debounce");
    opts.signals = args.iter().any(|a| a == "--signals");
    if let Some(seed) = value("--seed") {
        let out = run(seed, &opts);
        if let Some(path) = &trace_file {
            std::fs::write(path, out.full_trace.join("\n")).expect("the trace is written");
        }
        println!(
            "seed {seed}: {} nodes, {} s virtual, {} trace lines, trace {}",
            out.nodes,
            out.virtual_ms / 1000,
            out.trace_len,
            out.hash
        );
        if !out.ok() {
            println!("{}", out.report());
            std::process::exit(1);
        }
        return;
    }
    let seeds = value("--seeds").unwrap_or(100);
    let from = value("--from").unwrap_or(0);
    let jobs = value("--jobs").unwrap_or(2).max(1) as usize;
    let next = Arc::new(AtomicU64::new(from));
    let failed = Arc::new(AtomicUsize::new(0));
    // The longest run in virtual time and in wall time: (seed, ms).
    let longest = Arc::new(Mutex::new(((0, 0), (0, 0))));
    let started = Instant::now();
    let workers: Vec<_> = (0..jobs)
        .map(|_| {
            let (next, failed, opts) = (next.clone(), failed.clone(), opts.clone());
            let longest = longest.clone();
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= from + seeds {
                        return;
                    }
                    let began = Instant::now();
                    let out = run(seed, &opts);
                    let wall = began.elapsed().as_millis() as i64;
                    {
                        let mut l = longest.lock().unwrap();
                        if out.virtual_ms > l.0.1 {
                            l.0 = (seed, out.virtual_ms);
                        }
                        if wall > l.1.1 {
                            l.1 = (seed, wall);
                        }
                    }
                    if !out.ok() {
                        failed.fetch_add(1, Ordering::SeqCst);
                        println!("{}", out.report());
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let secs = started.elapsed().as_secs_f64();
    let failed = failed.load(Ordering::SeqCst);
    println!(
        "{seeds} seeds from {from}: {failed} failed, {secs:.1} s, {:.1} seeds/s",
        seeds as f64 / secs
    );
    let ((vseed, vms), (wseed, wms)) = *longest.lock().unwrap();
    println!(
        "longest: seed {vseed}, {:.1} s of virtual time; seed {wseed}, {:.2} s of wall time",
        vms as f64 / 1000.0,
        wms as f64 / 1000.0
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
