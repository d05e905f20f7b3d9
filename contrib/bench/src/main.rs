//! lockbench: lockd against Redis locks, on loopback, with one load generator.
//!
//!     lockbench GROUP [--lockd ADDR --lockd-pid PID] [--label NAME] [--scrape ADDR]
//!                     [--tls-ca CA.pem] [--redis ADDR --redis-pid PID] [--quick]
//!     lockbench table ROWS.tsv
//!     lockbench compare ROWS.tsv
//!     lockbench peer --lockd ADDR --lockd-pid PID [--dflockd ADDR --dflockd-pid PID]
//!                    [--redis ADDR --redis-pid PID] [--rounds N] [--quick]
//!     lockbench peer-table ROWS.tsv
//!     lockbench certs DIR
//!     lockbench cluster|cluster-table|etcd-status|etcd-compact ...   (see cluster.rs)
//!
//! GROUP is `perf` (floor, unc, con and sem), a comma-separated list of those parts and
//! `conn` (`unc,con,conn`), `waiters`, `held` or `expiry`. `--scrape ADDR` fetches lockd's
//! metrics from ADDR once a second while the group runs. `--tls-ca` makes every lockd
//! connection TLS, trusting that CA alone; `certs DIR` makes a throwaway CA (`ca.pem`) and a
//! server certificate for 127.0.0.1 (`server.pem`, `server.key`) for lockd's `--tls-cert` and
//! `--tls-key`. `cluster` measures lockd front-ends on etcd, or etcd's own lock API (built with
//! the `etcd` feature); contrib/bench/etcd.sh drives it.
//!
//! A scenario prints rows `key<TAB>who<TAB>value` on stdout (progress goes to stderr);
//! `table` turns the rows of a whole run into one markdown table, `compare` the rows of
//! interleaved rounds of several lockd builds into another. contrib/bench/run.sh starts the
//! servers and drives it all.

mod certs;
mod cluster;
mod counters;
mod peer;
mod perf;
mod scale;
mod scrape;
mod stats;
mod table;
mod wire;

use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use perf::{Contention, Hold};

/// A server under test.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    Lockd(SocketAddr),
    Redis(SocketAddr),
    /// dflockd (`lockbench peer` only): uncontended and contended mutex scenarios.
    Dflockd(SocketAddr),
}

impl Target {
    /// The refusal of a scenario this target has no part in.
    pub fn lacks(self, what: &str) -> io::Error {
        io::Error::other(format!("no {what} scenario for {self:?} in this benchmark"))
    }
}

/// Where the rows of one system's run go.
pub struct Out {
    who: String,
}

impl Out {
    pub fn new(who: impl Into<String>) -> Self {
        Out { who: who.into() }
    }

    pub fn row(&self, key: &str, value: f64) {
        let mut stdout = io::stdout().lock();
        let _ = writeln!(stdout, "{key}\t{}\t{value}", self.who);
        let _ = stdout.flush();
        eprintln!("  {:<28} {:<14} {value:.3}", key, self.who);
    }
}

#[derive(Default)]
struct Args {
    group: String,
    lockd: Option<(SocketAddr, u32)>,
    redis: Option<(SocketAddr, u32)>,
    dflockd: Option<(SocketAddr, u32)>,
    rounds: usize,
    label: Option<String>,
    scrape: Option<SocketAddr>,
    tls_ca: Option<String>,
    quick: bool,
    file: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    args.group = it
        .next()
        .ok_or("usage: lockbench perf|waiters|held|expiry|table|compare|certs ...")?;
    let (mut lockd, mut lockd_pid, mut redis, mut redis_pid) = (None, None, None, None);
    let (mut dflockd, mut dflockd_pid) = (None, None);
    args.rounds = 3;
    let mut scrape = None;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--lockd" => lockd = Some(value("--lockd")?),
            "--lockd-pid" => lockd_pid = Some(value("--lockd-pid")?),
            "--redis" => redis = Some(value("--redis")?),
            "--redis-pid" => redis_pid = Some(value("--redis-pid")?),
            "--dflockd" => dflockd = Some(value("--dflockd")?),
            "--dflockd-pid" => dflockd_pid = Some(value("--dflockd-pid")?),
            "--rounds" => {
                args.rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "--label" => args.label = Some(value("--label")?),
            "--scrape" => scrape = Some(value("--scrape")?),
            "--tls-ca" => args.tls_ca = Some(value("--tls-ca")?),
            "--quick" => args.quick = true,
            other if args.file.is_none() && !other.starts_with("--") => {
                args.file = Some(other.into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let server = |addr: Option<String>,
                  pid: Option<String>,
                  what: &str|
     -> Result<Option<(SocketAddr, u32)>, String> {
        match addr {
            None => Ok(None),
            Some(a) => {
                let addr = loopback(&a, what)?;
                let pid = pid
                    .ok_or(format!("--{what}-pid is needed with --{what}"))?
                    .parse()
                    .map_err(|e| format!("--{what}-pid: {e}"))?;
                Ok(Some((addr, pid)))
            }
        }
    };
    args.lockd = server(lockd, lockd_pid, "lockd")?;
    args.redis = server(redis, redis_pid, "redis")?;
    args.dflockd = server(dflockd, dflockd_pid, "dflockd")?;
    args.scrape = scrape.map(|a| loopback(&a, "scrape")).transpose()?;
    Ok(args)
}

/// The address given to `--{what}`, which must be a loopback one.
fn loopback(a: &str, what: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = a.parse().map_err(|e| format!("--{what} {a}: {e}"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "--{what} {addr}: the benchmark talks to loopback only"
        ));
    }
    Ok(addr)
}

/// How big and how long; `--quick` is for smoke runs.
struct Plan {
    warm: Duration,
    floor: Duration,
    run: Duration,
    clients: usize,
    waiters: usize,
    held: usize,
    expiring: usize,
    /// The retry sleep of Redis clients in the many-connection runs.
    scale_retry: Duration,
    /// Longest a drain of the waiters may take before it is extrapolated.
    drain_cap: Duration,
}

impl Plan {
    fn new(quick: bool) -> Self {
        let ms = Duration::from_millis;
        if quick {
            Plan {
                warm: ms(200),
                floor: ms(1000),
                run: ms(1000),
                clients: 64,
                waiters: 1000,
                held: 100_000,
                expiring: 1000,
                scale_retry: ms(100),
                drain_cap: ms(10_000),
            }
        } else {
            Plan {
                warm: ms(500),
                floor: ms(2000),
                run: ms(5000),
                clients: 64,
                waiters: 10_000,
                held: 1_000_000,
                expiring: 10_000,
                scale_retry: ms(100),
                drain_cap: ms(30_000),
            }
        }
    }
}

/// The parts of the throughput and latency group; `perf` is all of them, in this order.
const PERF_PARTS: [&str; 4] = ["floor", "unc", "con", "sem"];
/// Parts a list may name that `perf` leaves out: `conn`, the cost of a new connection (of
/// the TLS handshake, against plain TCP).
const EXTRA_PARTS: [&str; 1] = ["conn"];

/// The parts a group names: `perf`, or a comma-separated list of parts (`unc,con`).
fn perf_parts(group: &str) -> Option<Vec<&str>> {
    if group == "perf" {
        return Some(PERF_PARTS.to_vec());
    }
    let parts: Vec<&str> = group.split(',').collect();
    parts
        .iter()
        .all(|p| PERF_PARTS.contains(p) || EXTRA_PARTS.contains(p))
        .then_some(parts)
}

async fn perf(t: Target, parts: &[&str], plan: &Plan, label: &str, out: &Out) -> io::Result<()> {
    let (warm, run) = (plan.warm, plan.run);
    if parts.contains(&"floor") {
        perf::floor(t, 1, warm, plan.floor, out, "floor.c1").await?;
        perf::floor(t, plan.clients, warm, plan.floor, out, "floor.c64").await?;
    }
    if parts.contains(&"unc") {
        perf::uncontended(t, plan.clients, warm, run, out, "unc").await?;
    }
    if parts.contains(&"con") {
        for hold_us in [0u64, 100] {
            let key = format!("con.h{hold_us}");
            let mutex = Contention {
                clients: plan.clients,
                limit: 1,
                hold: Hold::Spin(Duration::from_micros(hold_us)),
                retry: Duration::ZERO,
            };
            match t {
                Target::Lockd(_) | Target::Dflockd(_) => {
                    perf::contended(t, mutex, warm, run, out, &key).await?
                }
                Target::Redis(_) => {
                    for r in [1u64, 10, 100] {
                        let out = Out::new(format!("{label}-r{r}"));
                        let retry = Duration::from_millis(r);
                        let how = Contention { retry, ..mutex };
                        perf::contended(t, how, warm, run, &out, &key).await?;
                    }
                }
            }
        }
    }
    if parts.contains(&"conn") {
        perf::connects(t, plan.floor, out, "conn.c1").await?;
    }
    if parts.contains(&"sem") {
        if let Target::Redis(_) = t {
            eprintln!("  (no semaphore scenario for Redis)");
            return Ok(());
        }
        // A slot held for no time measures the server's hand-over alone; a slot held 1 ms
        // (a sleep, so the holders really are inside together) shows the slots filled.
        let holds = [
            ("sem.h0", Hold::Spin(Duration::ZERO)),
            ("sem.sleep1ms", Hold::Sleep(Duration::from_millis(1))),
        ];
        for (key, hold) in holds {
            let semaphore = Contention {
                clients: plan.clients,
                limit: SEMAPHORE_LIMIT,
                hold,
                retry: Duration::ZERO,
            };
            perf::contended(t, semaphore, warm, run, out, key).await?;
        }
    }
    Ok(())
}

/// The slots of the semaphore scenario (64 clients share them).
const SEMAPHORE_LIMIT: u32 = 8;

async fn run(args: Args) -> io::Result<()> {
    let plan = Plan::new(args.quick);
    if args.group == "peer" {
        let mut systems = Vec::new();
        let add = |systems: &mut Vec<peer::System>,
                   s: Option<(SocketAddr, u32)>,
                   t: fn(SocketAddr) -> Target,
                   label: &str| {
            if let Some((addr, pid)) = s {
                systems.push(peer::System {
                    target: t(addr),
                    pid,
                    label: label.into(),
                });
            }
        };
        add(&mut systems, args.lockd, Target::Lockd, "lockd");
        add(&mut systems, args.dflockd, Target::Dflockd, "dflockd");
        add(&mut systems, args.redis, Target::Redis, "redis");
        if args.lockd.is_none() {
            return Err(io::Error::other("peer needs --lockd"));
        }
        return peer::run(&systems, args.rounds, plan.warm, plan.run).await;
    }
    let mut targets = Vec::new();
    if let Some((addr, pid)) = args.lockd {
        let label = args.label.clone().unwrap_or_else(|| "lockd".into());
        targets.push((Target::Lockd(addr), pid, label));
    }
    if let Some((addr, pid)) = args.redis {
        targets.push((Target::Redis(addr), pid, "redis".to_string()));
    }
    let ms = Duration::from_millis;
    for (t, pid, label) in targets {
        eprintln!("{} on {t:?}", args.group);
        let out = Out::new(label.clone());
        // Scrapes lockd's metrics, as Prometheus would, for as long as its scenarios run.
        let scraper = match (t, args.scrape) {
            (Target::Lockd(_), Some(addr)) => Some(scrape::Scraper::start(addr, SCRAPE_EVERY)),
            _ => None,
        };
        if let Some(parts) = perf_parts(&args.group) {
            perf(t, &parts, &plan, &label, &out).await?;
        } else {
            match args.group.as_str() {
                "waiters" => {
                    let (n, retry, cap) = (plan.waiters, plan.scale_retry, plan.drain_cap);
                    scale::waiters(t, n, pid, retry, cap, &out).await?
                }
                "held" => scale::held(t, plan.held, pid, &out).await?,
                "expiry" => {
                    // Where the leases' ends fall: spread over most of one second by default;
                    // LOCKBENCH_EXPIRY_SPREAD_MS=0 ends them all in one burst.
                    let spread = std::env::var("LOCKBENCH_EXPIRY_SPREAD_MS")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .map_or(ms(900), ms);
                    let ttl = Duration::from_secs(3);
                    scale::expiry(t, plan.expiring, ttl, spread, plan.scale_retry, &out).await?
                }
                other => return Err(io::Error::other(format!("unknown scenario group {other}"))),
            }
        }
        if let Some(scraper) = scraper {
            scraper.stop(&out).await;
        }
    }
    Ok(())
}

/// How often the metrics are scraped during a run: Prometheus's shortest usual interval.
const SCRAPE_EVERY: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Some(group) = argv.first() {
        if matches!(
            group.as_str(),
            "cluster" | "cluster-table" | "etcd-status" | "etcd-compact"
        ) {
            return cluster::main(group, &argv[1..]);
        }
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lockbench: {e}");
            return ExitCode::from(2);
        }
    };
    if args.group == "certs" {
        let Some(dir) = args.file.as_deref() else {
            eprintln!("lockbench: certs needs a directory");
            return ExitCode::from(2);
        };
        return match certs::write(std::path::Path::new(dir)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lockbench: certs: {e}");
                ExitCode::from(1)
            }
        };
    }
    if let Some(ca) = args.tls_ca.as_deref() {
        match certs::connector(std::path::Path::new(ca)) {
            Ok(tls) => wire::use_tls(tls),
            Err(e) => {
                eprintln!("lockbench: --tls-ca: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if args.group == "table" || args.group == "compare" || args.group == "peer-table" {
        let Some(file) = args.file.as_deref() else {
            eprintln!("lockbench: {} needs the rows file", args.group);
            return ExitCode::from(2);
        };
        return match std::fs::read_to_string(file) {
            Ok(rows) => {
                if args.group == "peer-table" {
                    print!("{}", peer::table(&rows));
                } else if args.group == "table" {
                    print!("{}", table::render(&rows, args.quick));
                } else {
                    print!("{}", table::compare(&rows));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("lockbench: {file}: {e}");
                ExitCode::from(1)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lockbench: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => {
            if let Some(tls) = wire::negotiated() {
                eprintln!("  TLS: {tls}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lockbench: {e}");
            ExitCode::from(1)
        }
    }
}
