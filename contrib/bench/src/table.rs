//! The rows of a run as one markdown table: lockd, Redis, lockd ÷ Redis, and the issue's
//! target where it sets one.

use std::collections::HashMap;

#[derive(Clone, Copy)]
enum Unit {
    Rate,
    Micros,
    Millis,
    Secs,
    Bytes,
    Ratio,
    Count,
}

/// Which way is good, to pick the best Redis retry setting for the ratio.
#[derive(Clone, Copy, PartialEq)]
enum Better {
    Higher,
    Lower,
}

#[derive(Clone, Copy)]
enum Goal {
    /// lockd ÷ Redis at least this.
    RatioAtLeast(f64),
    /// lockd ÷ Redis at most this.
    RatioAtMost(f64),
    /// lockd's own value at least / at most / exactly this.
    AtLeast(f64),
    AtMost(f64),
    Exactly(f64),
}

struct Def {
    key: &'static str,
    label: &'static str,
    unit: Unit,
    better: Better,
    goal: Option<Goal>,
}

const fn def(
    key: &'static str,
    label: &'static str,
    unit: Unit,
    better: Better,
    goal: Option<Goal>,
) -> Def {
    Def {
        key,
        label,
        unit,
        better,
        goal,
    }
}

use Better::{Higher, Lower};
use Goal::*;
use Unit::*;

const ROWS: &[Def] = &[
    def(
        "floor.c1.p50_us",
        "1 floor: PING round trip p50, C=1",
        Micros,
        Lower,
        None,
    ),
    def(
        "floor.c64.rps",
        "1 floor: PING requests/s, C=64",
        Rate,
        Higher,
        None,
    ),
    def(
        "floor.c64.p99_us",
        "1 floor: PING p99, C=64",
        Micros,
        Lower,
        None,
    ),
    def(
        "unc.cps",
        "2 uncontended: lock+unlock cycles/s, C=64",
        Rate,
        Higher,
        Some(RatioAtLeast(1.1)),
    ),
    def(
        "unc.p50_us",
        "2 uncontended: cycle p50",
        Micros,
        Lower,
        None,
    ),
    def(
        "unc.p99_us",
        "2 uncontended: cycle p99",
        Micros,
        Lower,
        Some(RatioAtMost(1.0)),
    ),
    def(
        "unc.max_us",
        "2 uncontended: cycle max",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h0.cps",
        "3 contended H=0: critical sections/s, C=64",
        Rate,
        Higher,
        Some(RatioAtLeast(1.5)),
    ),
    def(
        "con.h0.gap_p50_us",
        "3 contended H=0: handoff gap p50",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h0.gap_over_ping",
        "3 contended H=0: handoff gap p50 ÷ own PING p50 (C=1)",
        Ratio,
        Lower,
        Some(AtMost(1.5)),
    ),
    def(
        "con.h0.gap_p99_us",
        "3 contended H=0: handoff gap p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h0.acq_p50_us",
        "3 contended H=0: acquisition p50",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h0.acq_p99_us",
        "3 contended H=0: acquisition p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h0.acq_max_us",
        "3 contended H=0: acquisition max",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h0.jain",
        "3 contended H=0: Jain's fairness index",
        Ratio,
        Higher,
        Some(AtLeast(0.99)),
    ),
    def(
        "con.h0.minmax",
        "3 contended H=0: min/max share per client",
        Ratio,
        Higher,
        None,
    ),
    def(
        "con.h0.rpg",
        "3 contended H=0: requests per grant",
        Ratio,
        Lower,
        Some(Exactly(2.0)),
    ),
    def(
        "con.h0.violations",
        "3 contended H=0: mutual-exclusion violations",
        Count,
        Lower,
        Some(Exactly(0.0)),
    ),
    def(
        "con.h100.cps",
        "3 contended H=100µs: critical sections/s",
        Rate,
        Higher,
        None,
    ),
    def(
        "con.h100.gap_p50_us",
        "3 contended H=100µs: handoff gap p50",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h100.gap_p99_us",
        "3 contended H=100µs: handoff gap p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h100.acq_p50_us",
        "3 contended H=100µs: acquisition p50",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h100.acq_p99_us",
        "3 contended H=100µs: acquisition p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h100.acq_max_us",
        "3 contended H=100µs: acquisition max",
        Micros,
        Lower,
        None,
    ),
    def(
        "con.h100.jain",
        "3 contended H=100µs: Jain's fairness index",
        Ratio,
        Higher,
        None,
    ),
    def(
        "con.h100.minmax",
        "3 contended H=100µs: min/max share per client",
        Ratio,
        Higher,
        None,
    ),
    def(
        "con.h100.rpg",
        "3 contended H=100µs: requests per grant",
        Ratio,
        Lower,
        None,
    ),
    def(
        "con.h100.violations",
        "3 contended H=100µs: mutual-exclusion violations",
        Count,
        Lower,
        Some(Exactly(0.0)),
    ),
    def(
        "wait.rss_per_waiter_b",
        "4 scale: server memory per waiting connection",
        Bytes,
        Lower,
        Some(AtMost(4096.0)),
    ),
    def(
        "wait.drain_s",
        "4 scale: time to drain all waiters",
        Secs,
        Lower,
        None,
    ),
    def(
        "wait.drain_rate",
        "4 scale: waiters granted/s while draining",
        Rate,
        Higher,
        None,
    ),
    def(
        "wait.violations",
        "4 scale: mutual-exclusion violations while draining",
        Count,
        Lower,
        Some(Exactly(0.0)),
    ),
    def(
        "held.rss_per_lock_b",
        "4 scale: server memory per held lock (16-byte names)",
        Bytes,
        Lower,
        Some(AtMost(256.0)),
    ),
    def(
        "held.rate",
        "4 scale: locks taken/s while filling (pipelined)",
        Rate,
        Higher,
        None,
    ),
    def(
        "exp.late_p50_ms",
        "5 expiry: hand-over lateness p50",
        Millis,
        Lower,
        None,
    ),
    def(
        "exp.late_p99_ms",
        "5 expiry: hand-over lateness p99",
        Millis,
        Lower,
        Some(AtMost(50.0)),
    ),
    def(
        "exp.late_max_ms",
        "5 expiry: hand-over lateness max",
        Millis,
        Lower,
        None,
    ),
    def(
        "exp.spread_ms",
        "5 expiry: spread of the leases' ends",
        Millis,
        Lower,
        None,
    ),
    def(
        "exp.early",
        "5 expiry: hand-overs before the lease ended",
        Count,
        Lower,
        Some(Exactly(0.0)),
    ),
];

/// Redis settings a contended row compares against: the retry sleeps, in ms.
const RETRIES: [u64; 3] = [1, 10, 100];

/// Marks a value the run extrapolated rather than measured to the end.
fn estimated(map: &HashMap<(String, String), f64>, key: &str, who: &str) -> &'static str {
    let flag = (
        format!("{}_estimated", key.trim_end_matches("_s")),
        who.to_string(),
    );
    if map.get(&flag).is_some_and(|&v| v > 0.0) {
        " (est.)"
    } else {
        ""
    }
}

fn show(unit: Unit, v: f64) -> String {
    match unit {
        Rate if v >= 1e6 => format!("{:.2}M/s", v / 1e6),
        Rate if v >= 1e4 => format!("{:.1}k/s", v / 1e3),
        Rate => format!("{v:.0}/s"),
        Micros if v >= 10_000.0 => format!("{:.1} ms", v / 1e3),
        Micros if v >= 1000.0 => format!("{:.2} ms", v / 1e3),
        Micros => format!("{v:.0} µs"),
        Millis => format!("{v:.1} ms"),
        Secs => format!("{v:.2} s"),
        Bytes if v >= 10_000.0 => format!("{:.1} KiB", v / 1024.0),
        Bytes => format!("{v:.0} B"),
        Ratio => format!("{v:.3}"),
        Count => format!("{v:.0}"),
    }
}

/// Counts of things that must not happen: over several rounds, the worst one is reported.
fn worst_of_rounds(key: &str) -> bool {
    key.ends_with("violations") || key.ends_with("early")
}

/// The rows of a run; a measure taken in several rounds is reported by its median (the
/// machine may be busy with other work during one of them), a must-not-happen count by its
/// maximum.
fn parse(rows: &str) -> HashMap<(String, String), f64> {
    let mut all: HashMap<(String, String), Vec<f64>> = HashMap::new();
    for line in rows.lines() {
        let mut f = line.split('\t');
        if let (Some(k), Some(w), Some(v)) = (f.next(), f.next(), f.next()) {
            if let Ok(v) = v.trim().parse::<f64>() {
                all.entry((k.to_string(), w.to_string()))
                    .or_default()
                    .push(v);
            }
        }
    }
    let mut map = HashMap::new();
    for (key, mut values) in all {
        values.sort_by(f64::total_cmp);
        let v = if worst_of_rounds(&key.0) {
            values[values.len() - 1]
        } else {
            values[(values.len() - 1) / 2]
        };
        map.insert(key, v);
    }
    // Derived: each system's handoff gap against its own PING round trip.
    let derived: Vec<_> = map
        .iter()
        .filter(|((k, _), _)| k == "con.h0.gap_p50_us")
        .map(|((_, who), &gap)| {
            let base = who.split("-r").next().unwrap_or(who).to_string();
            let ping = map.get(&("floor.c1.p50_us".to_string(), base)).copied();
            (who.clone(), ping.map(|p| gap / p))
        })
        .collect();
    for (who, v) in derived {
        if let Some(v) = v {
            map.insert(("con.h0.gap_over_ping".into(), who), v);
        }
    }
    map
}

fn verdict(goal: Goal, lockd: f64, ratio: Option<f64>) -> String {
    let (text, ok) = match goal {
        RatioAtLeast(x) => (format!("≥ {x}× Redis"), ratio.map(|r| r >= x)),
        RatioAtMost(x) => (format!("≤ {x}× Redis"), ratio.map(|r| r <= x)),
        AtLeast(x) => (format!("≥ {x}"), Some(lockd >= x)),
        AtMost(x) => (format!("≤ {x}"), Some(lockd <= x)),
        Exactly(x) => (format!("= {x}"), Some((lockd - x).abs() < 1e-3)),
    };
    match ok {
        Some(true) => format!("{text}: met"),
        Some(false) => format!("{text}: **missed**"),
        None => format!("{text}: n/a"),
    }
}

/// The markdown table for the rows of one run.
pub fn render(rows: &str, _quick: bool) -> String {
    let map = parse(rows);
    let get = |k: &str, w: &str| map.get(&(k.to_string(), w.to_string())).copied();
    let mut out = String::new();
    out.push_str(
        "| measure | lockd | Redis | lockd ÷ Redis | target |\n|---|---:|---:|---:|---|\n",
    );
    for d in ROWS {
        // Contended rows hold one Redis value per retry sleep; the ratio takes the best.
        let redis: Vec<(String, f64)> = if d.key.starts_with("con.") {
            RETRIES
                .iter()
                .filter_map(|r| {
                    get(d.key, &format!("redis-r{r}")).map(|v| (format!("R={r}ms: "), v))
                })
                .collect()
        } else {
            get(d.key, "redis")
                .map(|v| (String::new(), v))
                .into_iter()
                .collect()
        };
        let best = redis.iter().map(|(_, v)| *v).reduce(|a, b| {
            if (d.better == Higher) == (b > a) {
                b
            } else {
                a
            }
        });
        let redis_cell = if redis.is_empty() {
            "–".to_string()
        } else {
            redis
                .iter()
                .map(|(p, v)| format!("{p}{}{}", show(d.unit, *v), estimated(&map, d.key, "redis")))
                .collect::<Vec<_>>()
                .join("<br>")
        };
        for who in ["lockd", "lockd-datadir"] {
            let Some(lockd) = get(d.key, who) else {
                continue;
            };
            let ratio = best.filter(|b| *b != 0.0).map(|b| lockd / b);
            let label = if who == "lockd" {
                d.label.to_string()
            } else {
                format!("{} (lockd `--data-dir`)", d.label)
            };
            let target = d.goal.map(|g| verdict(g, lockd, ratio)).unwrap_or_default();
            out.push_str(&format!(
                "| {label} | {}{} | {redis_cell} | {} | {target} |\n",
                show(d.unit, lockd),
                estimated(&map, d.key, who),
                ratio
                    .map(|r| format!("{r:.2}×"))
                    .unwrap_or_else(|| "–".into()),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_ratio_and_best_redis() {
        let rows = "unc.cps\tlockd\t110000\nunc.cps\tredis\t100000\n\
                    con.h0.cps\tlockd\t30000\ncon.h0.cps\tredis-r1\t10000\ncon.h0.cps\tredis-r10\t5000\n";
        let t = render(rows, false);
        assert!(
            t.contains("| 110.0k/s | 100.0k/s | 1.10× | ≥ 1.1× Redis: met |"),
            "{t}"
        );
        assert!(
            t.contains("R=1ms: 10.0k/s<br>R=10ms: 5000/s | 3.00×"),
            "{t}"
        );
    }

    #[test]
    fn rounds_take_the_median_and_the_worst_violation_count() {
        let rows = "unc.cps\tlockd\t1\nunc.cps\tlockd\t9\nunc.cps\tlockd\t5\n\
                    con.h0.violations\tlockd\t0\ncon.h0.violations\tlockd\t2\n";
        let map = parse(rows);
        assert_eq!(map[&("unc.cps".to_string(), "lockd".to_string())], 5.0);
        assert_eq!(
            map[&("con.h0.violations".to_string(), "lockd".to_string())],
            2.0
        );
    }
}
