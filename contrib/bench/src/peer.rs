//! `lockbench peer`: lockd against its closest peer, dflockd (and Redis, when given), in
//! interleaved rounds on the same servers, and `lockbench peer-table`: the medians, ranges and
//! ratios of such a run.
//!
//! The scenarios are the mutex ones of the Redis table: uncontended lock+unlock cycles (C=1
//! and C=64), and contended critical sections on one name (C=16 and C=64, held 0 and 100 µs).
//! Each round runs every scenario once per system, the systems' order rotating from round to
//! round, so that a burst of other work on a shared machine falls on all of them alike. Around
//! each run the server's CPU time is read from /proc: at hold 0 the load is CPU-bound (server
//! and clients share the cores), so CPU per grant is what a hand-over costs the server.
//!
//! Rows: `peer.<scenario>#<round>.<measure>`, who, value.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::time::{Duration, Instant};

use crate::perf::{self, Contention, Hold};
use crate::{Out, Target};

/// The scenarios, in the order a round runs them: (key, clients, contended hold in µs; `None`
/// for uncontended).
const SCENARIOS: [(&str, usize, Option<u64>); 6] = [
    ("unc.c1", 1, None),
    ("unc.c64", 64, None),
    ("con.c16.h0", 16, Some(0)),
    ("con.c64.h0", 64, Some(0)),
    ("con.c16.h100", 16, Some(100)),
    ("con.c64.h100", 64, Some(100)),
];

/// The retry sleeps a Redis client is run with in the contended scenarios; the table takes the
/// best of them, as a user would tune it.
const REDIS_RETRIES_MS: [u64; 3] = [1, 10, 100];

/// One system under test: its target, server pid (for its CPU time) and label.
pub struct System {
    pub target: Target,
    pub pid: u32,
    pub label: String,
}

/// CPU seconds (user + system) the process `pid` has used so far.
pub(crate) fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::other("bad /proc stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after the name.
    let ticks = |i: usize| -> io::Result<f64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| io::Error::other("bad /proc stat"))
    };
    // USER_HZ is 100 on every Linux this runs on.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// Runs `rounds` interleaved rounds of every scenario on every system.
pub async fn run(
    systems: &[System],
    rounds: usize,
    warm: Duration,
    dur: Duration,
) -> io::Result<()> {
    // LOCKBENCH_PEER_SCENARIOS=con.c16.h0,unc.c64 runs only those (to profile one of them).
    let only = std::env::var("LOCKBENCH_PEER_SCENARIOS").unwrap_or_default();
    let wanted = |s: &str| only.is_empty() || only.split(',').any(|o| o == s);
    for round in 1..=rounds {
        eprintln!("peer: round {round} of {rounds}");
        for &(scenario, clients, hold) in SCENARIOS.iter().filter(|s| wanted(s.0)) {
            let n = systems.len();
            for k in 0..n {
                let s = &systems[(k + round) % n];
                let key = format!("peer.{scenario}#{round}");
                let runs: Vec<(String, Option<Duration>)> = match (s.target, hold) {
                    (Target::Redis(_), Some(_)) => REDIS_RETRIES_MS
                        .iter()
                        .map(|&r| (format!("{}-r{r}", s.label), Some(Duration::from_millis(r))))
                        .collect(),
                    _ => vec![(s.label.clone(), None)],
                };
                for (who, retry) in runs {
                    let out = Out::new(who);
                    let cpu = cpu_seconds(s.pid)?;
                    let wall = Instant::now();
                    match hold {
                        None => perf::uncontended(s.target, clients, warm, dur, &out, &key).await?,
                        Some(us) => {
                            let how = Contention {
                                clients,
                                limit: 1,
                                hold: Hold::Spin(Duration::from_micros(us)),
                                retry: retry.unwrap_or(Duration::ZERO),
                            };
                            perf::contended(s.target, how, warm, dur, &out, &key).await?
                        }
                    }
                    let cores = (cpu_seconds(s.pid)? - cpu) / wall.elapsed().as_secs_f64();
                    out.row(&format!("{key}.server_cores"), cores);
                }
            }
        }
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn rate(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// The rows of a `peer` run as a markdown table: per scenario the median rate of each system
/// with its range over the rounds, the ratios of lockd's median to each peer's (with the
/// range of the per-round ratios), the server's CPU per grant, and for contended runs the
/// worst Jain index and mutual-exclusion violations of any round.
pub fn table(rows: &str) -> String {
    // (scenario, measure) -> who -> per-round values (in round order).
    let mut data: BTreeMap<(String, String), BTreeMap<String, BTreeMap<u32, f64>>> =
        BTreeMap::new();
    for line in rows.lines() {
        let mut f = line.split('\t');
        let (Some(key), Some(who), Some(value)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Some(key) = key.strip_prefix("peer.") else {
            continue;
        };
        let Some((scenario, rest)) = key.split_once('#') else {
            continue;
        };
        let Some((round, measure)) = rest.split_once('.') else {
            continue;
        };
        let (Ok(round), Ok(value)) = (round.parse::<u32>(), value.parse::<f64>()) else {
            continue;
        };
        data.entry((scenario.to_owned(), measure.to_owned()))
            .or_default()
            .entry(who.to_owned())
            .or_default()
            .insert(round, value);
    }
    let series = |scenario: &str, measure: &str| -> BTreeMap<String, BTreeMap<u32, f64>> {
        data.get(&(scenario.to_owned(), measure.to_owned()))
            .cloned()
            .unwrap_or_default()
    };
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| workload | system | rate (median, range) | lockd ÷ it (median, range) | server CPU per op | Jain (worst) | violations |"
    );
    let _ = writeln!(text, "|---|---|---:|---:|---:|---:|---:|");
    for &(scenario, _, _) in &SCENARIOS {
        let rates = series(scenario, "cps");
        let cores = series(scenario, "server_cores");
        let jain = series(scenario, "jain");
        let violations = series(scenario, "violations");
        // Redis: the retry sleep with the best median stands for Redis.
        let mut best_redis: Option<(String, f64)> = None;
        for (who, v) in &rates {
            if who.starts_with("redis-r") {
                let m = median(&v.values().copied().collect::<Vec<_>>());
                if best_redis.as_ref().is_none_or(|(_, b)| m > *b) {
                    best_redis = Some((who.clone(), m));
                }
            }
        }
        let Some(lockd) = rates.get("lockd") else {
            continue;
        };
        let mut shown: Vec<String> = vec!["lockd".into()];
        shown.extend(rates.keys().filter(|w| *w == "dflockd").cloned());
        // Uncontended, Redis runs once, as `redis`; contended, once per retry sleep.
        shown.extend(rates.keys().filter(|w| *w == "redis").cloned());
        shown.extend(best_redis.map(|(w, _)| w));
        for who in shown {
            let Some(v) = rates.get(&who) else { continue };
            let vals: Vec<f64> = v.values().copied().collect();
            let (lo, hi) = range(&vals);
            let ratio = if who == "lockd" {
                String::new()
            } else {
                let per_round: Vec<f64> = v
                    .iter()
                    .filter_map(|(r, p)| lockd.get(r).map(|l| l / p))
                    .collect();
                let (rlo, rhi) = range(&per_round);
                let m = median(&lockd.values().copied().collect::<Vec<_>>()) / median(&vals);
                format!("{m:.2}× ({rlo:.2}–{rhi:.2})")
            };
            let cpu = cores.get(&who).map_or(String::new(), |c| {
                let per_op: Vec<f64> = c
                    .iter()
                    .filter_map(|(r, cores)| v.get(r).map(|rate| cores / rate * 1e6))
                    .collect();
                format!("{:.1} µs", median(&per_op))
            });
            let worst_jain = jain.get(&who).map_or(String::new(), |j| {
                format!("{:.3}", range(&j.values().copied().collect::<Vec<_>>()).0)
            });
            let worst_violations = violations.get(&who).map_or(String::new(), |j| {
                format!("{:.0}", range(&j.values().copied().collect::<Vec<_>>()).1)
            });
            let _ = writeln!(
                text,
                "| {scenario} | {who} | {} ({}–{}) | {ratio} | {cpu} | {worst_jain} | {worst_violations} |",
                rate(median(&vals)),
                rate(lo),
                rate(hi)
            );
        }
    }
    text.push_str(
        "\nRates are lock+unlock cycles/s (unc) or critical sections/s (con). \
         Server CPU per op: the server's user+system CPU during the run over its operations \
         (warm-up included in both). Redis: the retry sleep with the best median.\n",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_medians_ranges_and_ratios() {
        let mut rows = String::new();
        for (round, lockd, peer) in [(1, 100.0, 50.0), (2, 120.0, 60.0), (3, 110.0, 40.0)] {
            let _ = writeln!(rows, "peer.con.c16.h0#{round}.cps\tlockd\t{lockd}");
            let _ = writeln!(rows, "peer.con.c16.h0#{round}.cps\tdflockd\t{peer}");
            let _ = writeln!(rows, "peer.con.c16.h0#{round}.server_cores\tlockd\t0.5");
            let _ = writeln!(rows, "peer.con.c16.h0#{round}.jain\tlockd\t0.999");
            let _ = writeln!(rows, "peer.con.c16.h0#{round}.violations\tlockd\t0");
        }
        let t = table(&rows);
        assert!(t.contains("| con.c16.h0 | lockd | 110 (100–120) |"), "{t}");
        // Medians 110 / 50; per-round ratios 2.0, 2.0, 2.75.
        assert!(
            t.contains("| con.c16.h0 | dflockd | 50 (40–60) | 2.20× (2.00–2.75) |"),
            "{t}"
        );
        // 0.5 cores at 110 ops/s: about 4545 µs per op.
        assert!(t.contains("4545.5 µs | 0.999 | 0 |"), "{t}");
    }
}
