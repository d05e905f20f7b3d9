//! lockbench: lockd against Redis locks, on loopback, with one load generator.
//!
//!     lockbench perf|waiters|held|expiry [--lockd ADDR --lockd-pid PID] [--label NAME]
//!                                        [--redis ADDR --redis-pid PID] [--quick]
//!     lockbench table ROWS.tsv
//!
//! A scenario prints rows `key<TAB>who<TAB>value` on stdout (progress goes to stderr);
//! `table` turns the rows of a whole run into one markdown table. contrib/bench/run.sh starts
//! the servers and drives it all.

mod perf;
mod scale;
mod stats;
mod table;
mod wire;

use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// A server under test.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    Lockd(SocketAddr),
    Redis(SocketAddr),
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
    label: Option<String>,
    quick: bool,
    file: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    args.group = it
        .next()
        .ok_or("usage: lockbench perf|waiters|held|expiry|table ...")?;
    let (mut lockd, mut lockd_pid, mut redis, mut redis_pid) = (None, None, None, None);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--lockd" => lockd = Some(value("--lockd")?),
            "--lockd-pid" => lockd_pid = Some(value("--lockd-pid")?),
            "--redis" => redis = Some(value("--redis")?),
            "--redis-pid" => redis_pid = Some(value("--redis-pid")?),
            "--label" => args.label = Some(value("--label")?),
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
                let addr: SocketAddr = a.parse().map_err(|e| format!("--{what} {a}: {e}"))?;
                if !addr.ip().is_loopback() {
                    return Err(format!(
                        "--{what} {addr}: the benchmark talks to loopback only"
                    ));
                }
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
    Ok(args)
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

async fn run(args: Args) -> io::Result<()> {
    let plan = Plan::new(args.quick);
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
        match args.group.as_str() {
            // perf = floor + unc + con; the parts run alone for profiling.
            "perf" | "floor" | "unc" | "con" => {
                let group = args.group.as_str();
                if matches!(group, "perf" | "floor") {
                    perf::floor(t, 1, plan.warm, plan.floor, &out, "floor.c1").await?;
                    perf::floor(t, plan.clients, plan.warm, plan.floor, &out, "floor.c64").await?;
                }
                if matches!(group, "perf" | "unc") {
                    perf::uncontended(t, plan.clients, plan.warm, plan.run, &out, "unc").await?;
                }
                let holds: &[u64] = if matches!(group, "perf" | "con") {
                    &[0, 100]
                } else {
                    &[]
                };
                for &hold_us in holds {
                    let hold = Duration::from_micros(hold_us);
                    let key = format!("con.h{hold_us}");
                    match t {
                        Target::Lockd(_) => {
                            perf::contended(
                                t,
                                plan.clients,
                                hold,
                                ms(0),
                                plan.warm,
                                plan.run,
                                &out,
                                &key,
                            )
                            .await?
                        }
                        Target::Redis(_) => {
                            for r in [1u64, 10, 100] {
                                let out = Out::new(format!("{label}-r{r}"));
                                perf::contended(
                                    t,
                                    plan.clients,
                                    hold,
                                    ms(r),
                                    plan.warm,
                                    plan.run,
                                    &out,
                                    &key,
                                )
                                .await?;
                            }
                        }
                    }
                }
            }
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
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lockbench: {e}");
            return ExitCode::from(2);
        }
    };
    if args.group == "table" {
        let Some(file) = args.file.as_deref() else {
            eprintln!("lockbench: table needs the rows file");
            return ExitCode::from(2);
        };
        return match std::fs::read_to_string(file) {
            Ok(rows) => {
                print!("{}", table::render(&rows, args.quick));
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
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockbench: {e}");
            ExitCode::from(1)
        }
    }
}
