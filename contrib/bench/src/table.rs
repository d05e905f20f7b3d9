//! The rows of a run as one markdown table: lockd, Redis, lockd ÷ Redis, and the issue's
//! target where it sets one.

use std::collections::HashMap;

#[derive(Clone, Copy)]
pub(crate) enum Unit {
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
        "sem.h0.cps",
        "6 semaphore limit=8, H=0: grants/s, C=64",
        Rate,
        Higher,
        None,
    ),
    def(
        "sem.h0.gap_p50_us",
        "6 semaphore limit=8, H=0: handoff gap p50",
        Micros,
        Lower,
        None,
    ),
    def(
        "sem.h0.gap_p99_us",
        "6 semaphore limit=8, H=0: handoff gap p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "sem.h0.acq_p99_us",
        "6 semaphore limit=8, H=0: acquisition p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "sem.h0.jain",
        "6 semaphore limit=8, H=0: Jain's fairness index",
        Ratio,
        Higher,
        Some(AtLeast(0.99)),
    ),
    def(
        "sem.h0.peak",
        "6 semaphore limit=8, H=0: most holders at once",
        Count,
        Lower,
        Some(AtMost(8.0)),
    ),
    def(
        "sem.h0.violations",
        "6 semaphore limit=8, H=0: grants beyond the limit",
        Count,
        Lower,
        Some(Exactly(0.0)),
    ),
    def(
        "sem.sleep1ms.cps",
        "6 semaphore limit=8, 1 ms sleep held: grants/s",
        Rate,
        Higher,
        None,
    ),
    def(
        "sem.sleep1ms.gap_p50_us",
        "6 semaphore limit=8, 1 ms sleep held: handoff gap p50",
        Micros,
        Lower,
        None,
    ),
    def(
        "sem.sleep1ms.gap_p99_us",
        "6 semaphore limit=8, 1 ms sleep held: handoff gap p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "sem.sleep1ms.acq_p99_us",
        "6 semaphore limit=8, 1 ms sleep held: acquisition p99",
        Micros,
        Lower,
        None,
    ),
    def(
        "sem.sleep1ms.jain",
        "6 semaphore limit=8, 1 ms sleep held: Jain's fairness index",
        Ratio,
        Higher,
        Some(AtLeast(0.99)),
    ),
    def(
        "sem.sleep1ms.peak",
        "6 semaphore limit=8, 1 ms sleep held: most holders at once",
        Count,
        Lower,
        Some(AtMost(8.0)),
    ),
    def(
        "sem.sleep1ms.violations",
        "6 semaphore limit=8, 1 ms sleep held: grants beyond the limit",
        Count,
        Lower,
        Some(Exactly(0.0)),
    ),
    def(
        "conn.c1.p50_us",
        "7 new connection: connect (+ TLS handshake) to first PING reply, p50, C=1",
        Micros,
        Lower,
        None,
    ),
    def(
        "conn.c1.p99_us",
        "7 new connection: connect (+ TLS handshake) to first PING reply, p99, C=1",
        Micros,
        Lower,
        None,
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

pub(crate) fn show(unit: Unit, v: f64) -> String {
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

/// Counts of things that must not happen (and the most holders at once, which must stay
/// within a limit): over several rounds, the worst one is reported.
fn worst_of_rounds(key: &str) -> bool {
    key.ends_with("violations") || key.ends_with("early") || key.ends_with("peak")
}

/// Every value of each (measure, who) in the rows of a run, in the order they were taken: with
/// interleaved rounds, the n-th values of two builds come from the same round.
pub(crate) fn rounds(rows: &str) -> HashMap<(String, String), Vec<f64>> {
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
    all
}

/// The median of `values` (of an even count, the mean of the middle two), or their maximum
/// for a must-not-happen count.
pub(crate) fn typical(key: &str, values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if worst_of_rounds(key) {
        v[n - 1]
    } else if n % 2 == 0 {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
}

/// The rows of a run; a measure taken in several rounds is reported by its median (the
/// machine may be busy with other work during one of them), a must-not-happen count by its
/// maximum.
fn parse(rows: &str) -> HashMap<(String, String), f64> {
    let mut map: HashMap<(String, String), f64> = rounds(rows)
        .into_iter()
        .map(|(key, values)| {
            let v = typical(&key.0, &values);
            (key, v)
        })
        .collect();
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

/// The measures of the same-run comparisons between lockd builds.
const COMPARED: &[&str] = &[
    "unc.cps",
    "unc.p50_us",
    "unc.p99_us",
    "con.h0.cps",
    "con.h0.gap_p50_us",
    "con.h0.gap_p99_us",
    "con.h0.jain",
    "con.h0.violations",
    "con.h100.cps",
    "con.h100.gap_p50_us",
    "con.h100.gap_p99_us",
    "con.h100.violations",
    "sem.h0.cps",
    "sem.h0.gap_p50_us",
    "sem.h0.gap_p99_us",
    "sem.h0.jain",
    "sem.h0.peak",
    "sem.h0.violations",
    "sem.sleep1ms.cps",
    "sem.sleep1ms.gap_p50_us",
    "sem.sleep1ms.gap_p99_us",
    "sem.sleep1ms.jain",
    "sem.sleep1ms.peak",
    "sem.sleep1ms.violations",
    "conn.c1.p50_us",
    "conn.c1.p99_us",
];

/// The builds of a comparison, as run.sh labels their rows, and their columns.
const BUILDS: [(&str, &str); 4] = [
    ("base", "baseline"),
    ("new", "this lockd"),
    ("metrics", "this lockd, metrics on"),
    ("tls", "this lockd, TLS"),
];

/// The throughputs at C=64 whose TLS cost issue 12 bounds, with their names in the verdict.
const TLS_BOUNDED: [(&str, &str); 2] = [
    ("unc.cps", "uncontended cycles/s"),
    ("con.h0.cps", "contended H=0 critical sections/s"),
];

/// The bound on TLS's cost (plain ÷ TLS throughput), and how far either side of it a run on a
/// shared machine can't tell: ±15%, what rounds of the same build differ by.
const TLS_BOUND: f64 = 2.0;
const TLS_MARGIN: f64 = 0.15;

/// Per-round ratios `y ÷ x` of two builds (the n-th values of each come from the same round).
pub(crate) fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(x, _)| **x != 0.0)
        .map(|(x, y)| y / x)
        .collect()
}

/// TLS's cost on each bounded throughput, round by round, against the bound: met only if every
/// round is clearly under it, missed only if the median is clearly over it.
fn tls_cost(all: &HashMap<(String, String), Vec<f64>>) -> String {
    let get = |k: &str, w: &str| all.get(&(k.to_string(), w.to_string()));
    let mut out = String::new();
    for (key, name) in TLS_BOUNDED {
        let (Some(plain), Some(tls)) = (get(key, "new"), get(key, "tls")) else {
            continue;
        };
        // plain ÷ TLS: how many times longer the same work takes over TLS.
        let cost = ratios(tls, plain);
        if cost.is_empty() {
            continue;
        }
        let lo = cost.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = cost.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let median = typical(key, &cost);
        let (near, far) = (
            TLS_BOUND * (1.0 - TLS_MARGIN),
            TLS_BOUND * (1.0 + TLS_MARGIN),
        );
        let verdict = if hi < near {
            format!("met (every round under {near:.2}×)")
        } else if median > far {
            format!("**missed** (the median over {far:.2}×)")
        } else {
            format!("uncertain (a round at {near:.2}× or more)")
        };
        out.push_str(&format!(
            "TLS cost, {name} at C=64 (plain ÷ TLS, per round): {median:.2}× ({lo:.2}–{hi:.2}); well under {TLS_BOUND}×: {verdict}.\n"
        ));
    }
    out
}

/// `b ÷ a` round by round (the n-th values of each were taken in the same round): the median
/// and the range, as `1.02× (0.97–1.08)`. Counts have no ratio.
fn paired(key: &str, a: Option<&Vec<f64>>, b: Option<&Vec<f64>>) -> String {
    let (Some(a), Some(b)) = (a, b) else {
        return "–".into();
    };
    if worst_of_rounds(key) || key.ends_with("jain") {
        return "–".into();
    }
    let ratios = ratios(a, b);
    if ratios.is_empty() {
        return "–".into();
    }
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.2}× ({lo:.2}–{hi:.2})", typical(key, &ratios))
}

/// The markdown table of interleaved rounds of lockd builds: each build's median (the worst
/// round for counts), then each change as the median and range of its per-round ratios.
pub fn compare(rows: &str) -> String {
    let all = rounds(rows);
    let get = |k: &str, w: &str| all.get(&(k.to_string(), w.to_string()));
    let present: Vec<(&str, &str)> = BUILDS
        .iter()
        .copied()
        .filter(|(w, _)| COMPARED.iter().any(|k| get(k, w).is_some()))
        .collect();
    let has = |w: &str| present.iter().any(|(p, _)| *p == w);
    let mut out = String::from("| measure |");
    let mut rule = String::from("|---|");
    for (_, title) in &present {
        out.push_str(&format!(" {title} |"));
        rule.push_str("---:|");
    }
    if has("base") && has("new") {
        out.push_str(" this ÷ baseline |");
        rule.push_str("---:|");
    }
    if has("new") && has("metrics") {
        out.push_str(" metrics on ÷ off |");
        rule.push_str("---:|");
    }
    if has("new") && has("tls") {
        out.push_str(" TLS ÷ plain |");
        rule.push_str("---:|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    for key in COMPARED {
        let Some(d) = ROWS.iter().find(|d| d.key == *key) else {
            continue;
        };
        if !present.iter().any(|(w, _)| get(key, w).is_some()) {
            continue;
        }
        out.push_str(&format!("| {} |", d.label));
        for (w, _) in &present {
            let cell = get(key, w)
                .map(|v| show(d.unit, typical(key, v)))
                .unwrap_or_else(|| "–".into());
            out.push_str(&format!(" {cell} |"));
        }
        if has("base") && has("new") {
            out.push_str(&format!(
                " {} |",
                paired(key, get(key, "base"), get(key, "new"))
            ));
        }
        if has("new") && has("metrics") {
            let cell = paired(key, get(key, "new"), get(key, "metrics"));
            out.push_str(&format!(" {cell} |"));
        }
        if has("new") && has("tls") {
            let cell = paired(key, get(key, "new"), get(key, "tls"));
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    let rounds = COMPARED
        .iter()
        .flat_map(|k| present.iter().filter_map(|(w, _)| get(k, w).map(Vec::len)))
        .max()
        .unwrap_or(0);
    out.push_str(&format!("\nRounds: {rounds}.\n"));
    if let Some(ok) = get("scrape.ok", "metrics") {
        let failed: f64 = get("scrape.failed", "metrics").map_or(0.0, |v| v.iter().sum());
        let slowest =
            get("scrape.max_ms", "metrics").map_or(0.0, |v| v.iter().copied().fold(0.0, f64::max));
        out.push_str(&format!(
            "Metrics on: `/metrics` fetched every second throughout: {} answers, {failed} failed, the slowest in {slowest:.1} ms.\n",
            ok.iter().sum::<f64>()
        ));
    }
    out.push_str(&tls_cost(&all));
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

    #[test]
    fn compare_pairs_rounds() {
        let rows = "unc.cps\tbase\t100\nunc.cps\tnew\t110\nunc.cps\tmetrics\t99\n\
                    unc.cps\tbase\t50\nunc.cps\tnew\t45\nunc.cps\tmetrics\t45\n\
                    unc.cps\tbase\t80\nunc.cps\tnew\t80\nunc.cps\tmetrics\t88\n\
                    sem.h0.peak\tnew\t7\nsem.h0.peak\tnew\t8\nsem.h0.peak\tmetrics\t8\n";
        let t = compare(rows);
        // Per round new ÷ base: 1.10, 0.90, 1.00; metrics ÷ new: 0.90, 1.00, 1.10.
        assert!(
            t.contains("| 80/s | 80/s | 88/s | 1.00× (0.90–1.10) | 1.00× (0.90–1.10) |"),
            "{t}"
        );
        assert!(
            t.contains("most holders at once | – | 8 | 8 | – | – |"),
            "{t}"
        );
        assert!(t.contains("Rounds: 3."), "{t}");
    }

    #[test]
    fn tls_cost_is_plain_over_tls_and_uncertain_near_the_bound() {
        let rows = "unc.cps\tnew\t100\nunc.cps\ttls\t80\ncon.h0.cps\tnew\t100\ncon.h0.cps\ttls\t40\n\
                    unc.cps\tnew\t90\nunc.cps\ttls\t75\ncon.h0.cps\tnew\t100\ncon.h0.cps\ttls\t60\n\
                    unc.cps\tnew\t50\nunc.cps\ttls\t50\ncon.h0.cps\tnew\t100\ncon.h0.cps\ttls\t55\n";
        let t = compare(rows);
        assert!(
            t.contains("| this lockd | this lockd, TLS | TLS ÷ plain |"),
            "{t}"
        );
        // Per round TLS ÷ plain: 0.80, 0.83, 1.00.
        assert!(t.contains("| 0.83× (0.80–1.00) |"), "{t}");
        // Costs 1.25, 1.20, 1.00: all clearly under 2×.
        assert!(
            t.contains("uncontended cycles/s at C=64 (plain ÷ TLS, per round): 1.20× (1.00–1.25); well under 2×: met (every round under 1.70×)."),
            "{t}"
        );
        // Costs 2.50, 1.67, 1.82: the median is under 2×, one round is over it.
        assert!(
            t.contains("1.82× (1.67–2.50); well under 2×: uncertain (a round at 1.70× or more)."),
            "{t}"
        );
    }
}
