//! The cluster simulator: K lockd front-ends over an in-memory etcd, and M clients, on a
//! virtual clock, with one seeded random source choosing every delay and fault. Each seed
//! is one run, replayed exactly by `SIM_SEED=<seed>`; its history goes through the chaos
//! tests' checker (no holders at once that may not be, tokens in grant order, no grant to a
//! waiter told it left), then, with the faults off, every client must finish and every name
//! drain.
//!
//! - `SIM_SEEDS=<n>`: how many seeds (default [`DEFAULT_SEEDS`]), from `SIM_FIRST` (default 1);
//! - `SIM_SEED=<seed>`: that seed alone, with its whole trace printed;
//! - `SIM_STOP=1`: stop at the first failing seed (how `replant/run` counts the seeds a
//!   planted bug takes to find);
//! - `SIM_THREADS=<n>`: threads (default: one per core).
//!
//! Each failing seed and each known finding is said on stderr as it is found.
//!
//! A run prints one summary line: `sim: <n> seeds, <steps> steps, <v> violations`. See
//! README.md beside this file for the fault model and what it still cannot express.

// Cluster mode's simulator: nothing to run in a build without it.
#![cfg(feature = "etcd")]

mod client;
mod delays;
mod etcd_order;
#[path = "../common/history.rs"]
#[allow(dead_code)]
mod history;
mod mirrors;
mod run;
mod stall;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A long search says how far it got every this many seeds.
const PROGRESS: u64 = 10_000;

/// Seeds a plain `cargo test` tries.
const DEFAULT_SEEDS: u64 = 2000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Runs `seeds` from `first` on every core; returns the failed runs.
fn search(first: u64, seeds: u64) -> (u64, u64, u64, Vec<run::Outcome>) {
    let next = AtomicU64::new(first);
    let end = first + seeds;
    let steps = AtomicU64::new(0);
    let known = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let failed = Mutex::new(Vec::new());
    let threads = env_u64("SIM_THREADS")
        .map(|n| n.max(1) as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let stop_early = std::env::var_os("SIM_STOP").is_some();
    let stopped = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end || stopped.load(Ordering::Relaxed) {
                    return;
                }
                let outcome = run::run(seed);
                steps.fetch_add(outcome.steps, Ordering::Relaxed);
                known.fetch_add(outcome.known.len() as u64, Ordering::Relaxed);
                let done = done.fetch_add(1, Ordering::Relaxed) + 1;
                if done.is_multiple_of(PROGRESS) {
                    eprintln!(
                        "sim: {done} of {seeds} seeds, {} failed, {:.0}s",
                        failed.lock().unwrap().len(),
                        started.elapsed().as_secs_f64()
                    );
                }
                // Said as found, so a long search that is stopped still names its seeds.
                for finding in &outcome.known {
                    eprintln!("sim: seed {seed}: known finding: {finding}");
                }
                if let Some(first) = outcome.violations.first() {
                    eprintln!(
                        "sim: seed {seed} failed ({} violation(s)): {first}",
                        outcome.violations.len()
                    );
                    failed.lock().unwrap().push(outcome);
                    stopped.store(stop_early, Ordering::Relaxed);
                } else if seeds == 1 && !outcome.known.is_empty() {
                    // One seed asked for by name: its known findings' trace, to read.
                    for line in &outcome.trace {
                        eprintln!("  {line}");
                    }
                }
            });
        }
    });
    let mut failed = failed.into_inner().unwrap();
    failed.sort_by_key(|o| o.seed);
    let tried = next.into_inner().min(end) - first;
    (tried, steps.into_inner(), known.into_inner(), failed)
}

#[test]
fn seeds() {
    let started = Instant::now();
    let (first, seeds) = match env_u64("SIM_SEED") {
        Some(seed) => (seed, 1),
        None => (
            env_u64("SIM_FIRST").unwrap_or(1),
            env_u64("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS),
        ),
    };
    let (seeds, steps, known, failed) = search(first, seeds);
    let violations: usize = failed.iter().map(|o| o.violations.len()).sum();
    for o in &failed {
        eprintln!(
            "\n=== seed {} ({} steps): {} violation(s)",
            o.seed,
            o.steps,
            o.violations.len()
        );
        for v in &o.violations {
            eprintln!("  {v}");
        }
        let shown = if seeds == 1 { o.trace.len() } else { 80 };
        eprintln!("--- the trace's last {shown} lines:");
        for line in o.trace.iter().skip(o.trace.len().saturating_sub(shown)) {
            eprintln!("  {line}");
        }
        eprintln!("--- replay: SIM_SEED={} cargo test --test sim", o.seed);
    }
    println!(
        "sim: {seeds} seeds, {steps} steps, {violations} violations ({known} known findings; {:.1}s)",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} of {seeds} seeds failed",
        failed.len()
    );
}

/// The seeds that found a bug in lockd or in the simulator's checks (tests/sim/README.md's
/// findings; 8949: the lock-delay check's, which blamed another name's key), run on every
/// `cargo test` beside the first [`DEFAULT_SEEDS`]: each must run clean. Any change of lockd or
/// of the simulator moves every seed's run, so this pins today's runs only (`replant/` keeps
/// the bugs themselves); 650274's still fails without its fix.
const FOUND: [u64; 35] = [
    525, 943, 1890, 2361, 13041, 1519, 7967, 4957, 13953, 36838, 38467, 120939, 108087, 141739,
    147812, 160212, 158, 317, 617, 130753, 45109, 650274, 201, 88, 2944, 277780, 76, 43119, 194622,
    345844, 817871, 63724, 8949, 211709, 140536,
];

#[test]
fn the_seeds_that_found_bugs_run_clean() {
    for seed in FOUND {
        let outcome = run::run(seed);
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:?} (replay: SIM_SEED={seed} cargo test --test sim seeds -- --nocapture)",
            outcome.violations
        );
    }
}

/// A seed is one run: the same seed twice gives the same trace, line for line.
#[test]
fn a_seed_replays_exactly() {
    for seed in [7, 1234] {
        let a = run::run(seed);
        let b = run::run(seed);
        assert_eq!(a.steps, b.steps, "seed {seed}: steps differ");
        assert!(a.trace == b.trace, "seed {seed}: the traces differ");
    }
}
