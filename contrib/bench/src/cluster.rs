//! Cluster mode: lockd front-ends keeping their locks in an etcd cluster (`lockd --etcd`),
//! against etcd's own lock API (the v3lock service's Lock and Unlock, each client with a lease
//! of its own, through the etcd-client crate as its documentation shows). The same scenarios,
//! the same clock, the same load generator; contrib/bench/etcd.sh starts the etcd cluster and
//! the front-ends and drives the rounds.
//!
//!     lockbench cluster --lockd ADDR[,ADDR...] [--lockd-pid PID[,PID...]] --label NAME
//!                       [--etcd-metrics URL[,URL...]] [--etcd-pid PID[,PID...]] [--quick]
//!     lockbench cluster --etcd URL[,URL...] [--etcd-pid PID[,PID...]] --label NAME [--quick]
//!                                                                    (feature etcd)
//!     lockbench cluster-table ROWS.tsv
//!     lockbench etcd-status --etcd URL[,URL...]                      (feature etcd)
//!     lockbench etcd-compact --etcd URL[,URL...]                     (feature etcd)
//!
//! With several lockd front-ends, client `i` talks to front-end `i mod n`: the clients are
//! spread evenly over them, and a contended name is handed over between front-ends.
//!
//! Scenarios (rows `cl.*`):
//! - `cl.unc.c1`, `cl.unc.c16`, `cl.unc.c64`: 1, 16 and 64 clients, each locking and unlocking
//!   a name of its own; a cycle is the lock and the unlock, each one round trip.
//! - `cl.con.c16`, `cl.con.c64`: 16 and 64 clients on one name, holding for no time. A critical
//!   section runs from the grant's arrival to the release's departure; the hand-over is the
//!   time from one section's release to the next section's grant, as in the embedded contended
//!   scenario.
//!
//! What each run costs (rows `cl.*.etcd_txn_pc` and the like; see counters.rs): etcd's own
//! counters from each member's `/metrics` (`--etcd-metrics`, by default the `--etcd` URLs) and
//! the CPU time of the front-ends (`--lockd-pid`) and of etcd's members (`--etcd-pid`), read
//! once the clients have connected and again once they have all made their last request, over
//! every cycle in between (the warm-up's too).
//!
//! A reply that is not a grant (or an unlock that is refused) ends the run with that reply: in
//! this benchmark nothing may fail. lockd's tokens are checked as they come: on one name they
//! must grow in grant order, and each client's must grow from one grant to the next.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::counters::{Probe, Reading};
use crate::perf::{clients_after, window_of};
use crate::stats::{self, Held};
use crate::table::{ratios, rounds, show, typical, Unit};
use crate::wire::Line;
use crate::Out;

/// The system under test.
pub enum System {
    /// lockd front-ends (`lockd --etcd`); client `i` uses front-end `i mod n`.
    Lockd(Vec<SocketAddr>),
    /// etcd's own lock API on these client URLs (every client is given all of them, as an
    /// etcd user's client would be).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Etcd(Vec<String>),
}

/// The lease each benchmark lock asks for (lockd) or each client's etcd lease lasts: far
/// longer than a run, so that nothing expires while it is measured.
const LOCKD_TTL: &str = "ttl=30s";
#[cfg(feature = "etcd")]
const ETCD_LEASE_SECS: i64 = 120;

/// The clients of the scenarios.
const ONE: usize = 1;
const MANY: usize = 16;
const MOST: usize = 64;

/// What a grant gives back: lockd's fencing token, or etcd's lock key (the key to unlock).
enum Grant {
    Token(u64),
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Key(Vec<u8>),
}

impl Grant {
    fn token(&self) -> Option<u64> {
        match self {
            Grant::Token(t) => Some(*t),
            Grant::Key(_) => None,
        }
    }
}

/// One benchmark client's connection.
enum Conn {
    Lockd(Line),
    /// Boxed: a client is large, and a connection is made once per client.
    #[cfg(feature = "etcd")]
    Etcd {
        client: Box<etcd_client::Client>,
        lease: i64,
    },
}

#[cfg(feature = "etcd")]
fn etcd_err(what: &str, e: etcd_client::Error) -> io::Error {
    io::Error::other(format!("etcd {what}: {e}"))
}

impl Conn {
    /// Client `i`'s connection: to its front-end, or to etcd with a lease of its own.
    async fn open(system: &System, i: usize) -> io::Result<Conn> {
        match system {
            System::Lockd(addrs) => Ok(Conn::Lockd(Line::connect(addrs[i % addrs.len()]).await?)),
            #[cfg(feature = "etcd")]
            System::Etcd(endpoints) => {
                let mut client = etcd_client::Client::connect(endpoints, None)
                    .await
                    .map_err(|e| etcd_err("connect", e))?;
                let lease = client
                    .lease_grant(ETCD_LEASE_SECS, None)
                    .await
                    .map_err(|e| etcd_err("lease grant", e))?
                    .id();
                Ok(Conn::Etcd {
                    client: Box::new(client),
                    lease,
                })
            }
            #[cfg(not(feature = "etcd"))]
            System::Etcd(_) => Err(io::Error::other(
                "this lockbench was built without the etcd feature",
            )),
        }
    }

    async fn lock(&mut self, name: &str, id: &str) -> io::Result<Grant> {
        match self {
            Conn::Lockd(line) => {
                line.send(&format!("LOCK {name} {id} {LOCKD_TTL}")).await?;
                Ok(Grant::Token(line.recv_token().await?))
            }
            #[cfg(feature = "etcd")]
            Conn::Etcd { client, lease } => {
                let opts = etcd_client::LockOptions::new().with_lease(*lease);
                let resp = client
                    .lock(name, Some(opts))
                    .await
                    .map_err(|e| etcd_err("lock", e))?;
                Ok(Grant::Key(resp.key().to_vec()))
            }
        }
    }

    async fn unlock(&mut self, name: &str, grant: Grant) -> io::Result<()> {
        match (self, grant) {
            (Conn::Lockd(line), Grant::Token(token)) => {
                line.call_ok(&format!("UNLOCK {name} {token}")).await
            }
            #[cfg(feature = "etcd")]
            (Conn::Etcd { client, .. }, Grant::Key(key)) => {
                client
                    .unlock(key)
                    .await
                    .map_err(|e| etcd_err("unlock", e))?;
                Ok(())
            }
            _ => Err(io::Error::other("a grant of the other system")),
        }
    }

    /// Gives back what the connection holds: etcd's lease (lockd's locks are all unlocked).
    async fn close(self) -> io::Result<()> {
        match self {
            Conn::Lockd(line) => line.close().await,
            #[cfg(feature = "etcd")]
            Conn::Etcd { mut client, lease } => {
                client
                    .lease_revoke(lease)
                    .await
                    .map_err(|e| etcd_err("lease revoke", e))?;
                Ok(())
            }
        }
    }
}

/// Closes the connections of a run, all at once.
async fn close_all(conns: Vec<Conn>) -> io::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    for conn in conns {
        set.spawn(conn.close());
    }
    while let Some(done) = set.join_next().await {
        done.map_err(io::Error::other)??;
    }
    Ok(())
}

/// The readings around a run and the connections it leaves open: the costs' rows, then the
/// connections closed (etcd's leases revoked) once the second reading is taken.
async fn account(
    probe: &Probe,
    out: &Out,
    key: &str,
    before: Reading,
    cycles: u64,
    conns: Vec<Conn>,
) -> io::Result<()> {
    let after = probe.read().await?;
    // Every cycle (contended: every grant) is two requests, the lock and the unlock.
    probe.rows(out, key, before, after, cycles, 2 * cycles);
    close_all(conns).await
}

/// Names unique to one run, so that no run meets another's keys (etcd's lock names are keys
/// of the etcd cluster; lockd's front-ends get a fresh prefix per turn anyway).
fn run_tag() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("lockbench-{ms}")
}

/// Tokens that did not grow: `seq` in the order the grants were made.
fn disorder(seq: &[u64]) -> u64 {
    seq.windows(2).filter(|w| w[1] <= w[0]).count() as u64
}

/// Each of `c` clients locks and unlocks a name of its own, over and over.
async fn uncontended(
    system: Arc<System>,
    probe: &Probe,
    c: usize,
    warm: Duration,
    dur: Duration,
    out: &Out,
    key: &str,
) -> io::Result<()> {
    let tag = run_tag();
    let is_lockd = matches!(*system, System::Lockd(_));
    let (before, per) = clients_after(c, warm, dur, probe.read(), move |i, barrier, window| {
        let system = Arc::clone(&system);
        let name = format!("{tag}-unc-c{c}-{i}");
        async move {
            let mut conn = Conn::open(&system, i).await?;
            let id = format!("c{i}");
            let mut lat = Vec::new();
            let mut tokens = Vec::new();
            let mut cycles = 0u64;
            barrier.wait().await;
            barrier.wait().await;
            let w = window_of(&window);
            while !w.over() {
                let t0 = w.ns();
                let grant = conn.lock(&name, &id).await?;
                tokens.extend(grant.token());
                conn.unlock(&name, grant).await?;
                cycles += 1;
                if w.counts(t0) {
                    lat.push(w.ns() - t0);
                }
            }
            Ok((lat, disorder(&tokens), cycles, conn))
        }
    })
    .await?;
    let disordered: u64 = per.iter().map(|(_, d, _, _)| d).sum();
    let cycles: u64 = per.iter().map(|(_, _, n, _)| n).sum();
    let mut all = Vec::new();
    let mut conns = Vec::new();
    for (lat, _, _, conn) in per {
        all.extend(lat);
        conns.push(conn);
    }
    account(probe, out, key, before, cycles, conns).await?;
    out.row(&format!("{key}.cps"), all.len() as f64 / dur.as_secs_f64());
    let (p50, p99, worst) = stats::summary_us(&mut all);
    out.row(&format!("{key}.p50_us"), p50);
    out.row(&format!("{key}.p99_us"), p99);
    out.row(&format!("{key}.max_us"), worst);
    if is_lockd {
        out.row(&format!("{key}.token_disorder"), disordered as f64);
    }
    Ok(())
}

/// One client's record of a contended run.
#[derive(Default)]
struct Contender {
    held: Vec<Held>,
    /// Per grant: (asked at, granted at).
    grants: Vec<(u64, u64)>,
    /// Per grant: (granted at, token), lockd only.
    tokens: Vec<(u64, u64)>,
    /// Grants over the whole run, the warm-up's and the last one's too.
    cycles: u64,
}

/// `c` clients on one name: each asks, holds for no time, releases, and asks again.
async fn contended(
    system: Arc<System>,
    probe: &Probe,
    c: usize,
    warm: Duration,
    dur: Duration,
    out: &Out,
    key: &str,
) -> io::Result<()> {
    let name = format!("{}-con-c{c}", run_tag());
    let is_lockd = matches!(*system, System::Lockd(_));
    let (before, per) = clients_after(c, warm, dur, probe.read(), move |i, barrier, window| {
        let system = Arc::clone(&system);
        let name = name.clone();
        async move {
            let mut conn = Conn::open(&system, i).await?;
            let id = format!("c{i}");
            let mut me = Contender::default();
            barrier.wait().await;
            barrier.wait().await;
            let w = window_of(&window);
            while !w.over() {
                let asked = w.ns();
                let grant = conn.lock(&name, &id).await?;
                let start = w.ns();
                if let Some(t) = grant.token() {
                    me.tokens.push((start, t));
                }
                // Held for no time: the release leaves as soon as the grant is in.
                let end = w.ns();
                conn.unlock(&name, grant).await?;
                me.cycles += 1;
                me.held.push(Held { start, end });
                me.grants.push((asked, start));
            }
            Ok((i, me, conn))
        }
    })
    .await?;
    let mut held = Vec::new();
    let mut counts = vec![0u64; c];
    let mut acquire = Vec::new();
    let mut tokens = Vec::new();
    let from = warm.as_nanos() as u64;
    let until = (warm + dur).as_nanos() as u64;
    let cycles: u64 = per.iter().map(|(_, me, _)| me.cycles).sum();
    let mut conns = Vec::new();
    for (i, me, conn) in per {
        conns.push(conn);
        held.extend_from_slice(&me.held);
        tokens.extend_from_slice(&me.tokens);
        for &(asked, granted) in &me.grants {
            if granted >= from && granted < until {
                counts[i] += 1;
                acquire.push(granted - asked);
            }
        }
    }
    account(probe, out, key, before, cycles, conns).await?;
    let grants: u64 = counts.iter().sum();
    let mut slots = stats::slots(&held, 1);
    let (gap_p50, gap_p99, gap_max) = stats::summary_us(&mut slots.gaps);
    let (acq_p50, acq_p99, acq_max) = stats::summary_us(&mut acquire);
    out.row(&format!("{key}.cps"), grants as f64 / dur.as_secs_f64());
    out.row(&format!("{key}.gap_p50_us"), gap_p50);
    out.row(&format!("{key}.gap_p99_us"), gap_p99);
    out.row(&format!("{key}.gap_max_us"), gap_max);
    out.row(&format!("{key}.acq_p50_us"), acq_p50);
    out.row(&format!("{key}.acq_p99_us"), acq_p99);
    out.row(&format!("{key}.acq_max_us"), acq_max);
    out.row(&format!("{key}.jain"), stats::jain(&counts));
    out.row(&format!("{key}.violations"), slots.violations as f64);
    if is_lockd {
        // The sections of one name do not overlap (else the row above says so), so the
        // order of their starts is the order of the grants: the tokens must grow in it.
        tokens.sort_unstable();
        let seq: Vec<u64> = tokens.iter().map(|&(_, t)| t).collect();
        out.row(&format!("{key}.token_disorder"), disorder(&seq) as f64);
    }
    Ok(())
}

/// How big and how long; `--quick` is for smoke runs.
fn plan(quick: bool) -> (Duration, Duration) {
    if quick {
        (Duration::from_millis(200), Duration::from_millis(1000))
    } else {
        (Duration::from_millis(500), Duration::from_millis(5000))
    }
}

/// The scenarios of one system's turn.
pub async fn run(system: System, probe: &Probe, quick: bool, out: &Out) -> io::Result<()> {
    let (warm, dur) = plan(quick);
    let system = Arc::new(system);
    eprintln!("cluster scenarios, {}", out_name(&system));
    let s = || Arc::clone(&system);
    let only = std::env::var("LOCKBENCH_ONLY").unwrap_or_default();
    let on = |name: &str| only.is_empty() || only.split(',').any(|o| name.starts_with(o));
    if on("cl.unc.c1") {
        uncontended(s(), probe, ONE, warm, dur, out, "cl.unc.c1").await?;
    }
    if on("cl.unc.c16") {
        uncontended(s(), probe, MANY, warm, dur, out, "cl.unc.c16").await?;
    }
    if on("cl.unc.c64") {
        uncontended(s(), probe, MOST, warm, dur, out, "cl.unc.c64").await?;
    }
    if on("cl.con.c16") {
        contended(s(), probe, MANY, warm, dur, out, "cl.con.c16").await?;
    }
    if on("cl.con.c64") {
        contended(s(), probe, MOST, warm, dur, out, "cl.con.c64").await?;
    }
    Ok(())
}

fn out_name(system: &System) -> String {
    match system {
        System::Lockd(a) => format!("{} lockd front-end(s)", a.len()),
        System::Etcd(e) => format!("etcd's lock API on {} member(s)", e.len()),
    }
}

/// The comma-separated loopback addresses of `--lockd`.
pub fn lockd_addrs(list: &str) -> Result<Vec<SocketAddr>, String> {
    list.split(',')
        .map(|a| crate::loopback(a.trim(), "lockd"))
        .collect()
}

/// The comma-separated client URLs of `--etcd`: http on a loopback address only.
pub fn etcd_urls(list: &str) -> Result<Vec<String>, String> {
    list.split(',')
        .map(|u| {
            let u = u.trim();
            let host = u
                .strip_prefix("http://")
                .ok_or(format!("--etcd {u}: an http:// URL, please"))?;
            crate::loopback(host.trim_end_matches('/'), "etcd")?;
            Ok(u.to_string())
        })
        .collect()
}

/// The comma-separated process ids of `--lockd-pid` and `--etcd-pid`.
fn pids(list: &str) -> Result<Vec<u32>, String> {
    list.split(',')
        .map(|p| p.trim().parse().map_err(|e| format!("pid {p}: {e}")))
        .collect()
}

/// The loopback addresses of `--etcd-metrics` URLs (each member serves `/metrics` there).
fn metrics_addrs(urls: &[String]) -> Result<Vec<SocketAddr>, String> {
    urls.iter()
        .map(|u| {
            let host = u.trim_start_matches("http://").trim_end_matches('/');
            crate::loopback(host, "etcd-metrics")
        })
        .collect()
}

/// `lockbench cluster|cluster-table|etcd-status|etcd-compact ...`: parses its own arguments.
pub fn main(group: &str, args: &[String]) -> std::process::ExitCode {
    use std::process::ExitCode;
    let mut lockd = None;
    let mut etcd = None;
    let mut metrics = None;
    let mut probe = Probe::default();
    let mut label = None;
    let mut quick = false;
    let mut file = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        let parsed: Result<(), String> = match a.as_str() {
            "--lockd" => value("--lockd")
                .and_then(|v| lockd_addrs(&v))
                .map(|v| lockd = Some(v)),
            "--etcd" => value("--etcd")
                .and_then(|v| etcd_urls(&v))
                .map(|v| etcd = Some(v)),
            "--etcd-metrics" => value("--etcd-metrics")
                .and_then(|v| etcd_urls(&v))
                .and_then(|v| metrics_addrs(&v))
                .map(|v| metrics = Some(v)),
            "--lockd-pid" => value("--lockd-pid")
                .and_then(|v| pids(&v))
                .map(|v| probe.frontends = v),
            "--etcd-pid" => value("--etcd-pid")
                .and_then(|v| pids(&v))
                .map(|v| probe.members = v),
            "--label" => value("--label").map(|v| label = Some(v)),
            "--quick" => {
                quick = true;
                Ok(())
            }
            other if file.is_none() && !other.starts_with("--") => {
                file = Some(other.to_string());
                Ok(())
            }
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = parsed {
            eprintln!("lockbench {group}: {e}");
            return ExitCode::from(2);
        }
    }
    if group == "cluster-table" {
        let Some(file) = file else {
            eprintln!("lockbench cluster-table needs the rows file");
            return ExitCode::from(2);
        };
        return match std::fs::read_to_string(&file) {
            Ok(rows) => {
                print!("{}", table(&rows));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("lockbench: {file}: {e}");
                ExitCode::from(1)
            }
        };
    }
    // The members' /metrics: as given, or etcd's own lock API's endpoints.
    let metrics = match metrics.map_or_else(|| metrics_addrs(etcd.as_deref().unwrap_or(&[])), Ok) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("lockbench {group}: {e}");
            return ExitCode::from(2);
        }
    };
    probe.metrics = metrics;
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
    let done = runtime.block_on(async {
        match (group, lockd, etcd) {
            ("cluster", Some(addrs), None) => {
                let out = Out::new(label.unwrap_or_else(|| "lockd".into()));
                run(System::Lockd(addrs), &probe, quick, &out).await
            }
            ("cluster", None, Some(urls)) => {
                if !probe.frontends.is_empty() {
                    return Err(io::Error::other("--lockd-pid goes with --lockd"));
                }
                let out = Out::new(label.unwrap_or_else(|| "etcd".into()));
                run(System::Etcd(urls), &probe, quick, &out).await
            }
            #[cfg(feature = "etcd")]
            ("etcd-status", None, Some(urls)) => admin::status(&urls).await,
            #[cfg(feature = "etcd")]
            ("etcd-compact", None, Some(urls)) => admin::compact(&urls).await,
            ("etcd-status" | "etcd-compact", _, _) if cfg!(not(feature = "etcd")) => Err(
                io::Error::other("this lockbench was built without the etcd feature"),
            ),
            _ => Err(io::Error::other(format!(
                "{group} needs exactly one of --lockd and --etcd (etcd-status, etcd-compact: --etcd)"
            ))),
        }
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockbench {group}: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(feature = "etcd")]
pub mod admin {
    //! What etcd.sh asks of the etcd cluster between turns.

    use std::io;

    use etcd_client::{Client, CompactionOptions};

    use super::etcd_err;

    /// One line per member: its id, the leader it knows, the raft term, the database size.
    /// The term grows by one per election: compared before and after a run, it says whether
    /// the cluster changed leader while it was measured.
    pub async fn status(endpoints: &[String]) -> io::Result<()> {
        for e in endpoints {
            let mut client = Client::connect([e], None)
                .await
                .map_err(|err| etcd_err("connect", err))?;
            let s = client
                .status()
                .await
                .map_err(|err| etcd_err("status", err))?;
            let member = s.header().map_or(0, |h| h.member_id());
            println!(
                "{e} member={member:x} leader={:x} raft_term={} raft_index={} db_size={}",
                s.leader(),
                s.raft_term(),
                s.raft_index(),
                s.db_size()
            );
        }
        Ok(())
    }

    /// Compacts the history to the current revision (physically), so that the database
    /// stops growing from turn to turn: etcd 3.4 keeps every revision unless told otherwise.
    pub async fn compact(endpoints: &[String]) -> io::Result<()> {
        let mut client = Client::connect(endpoints, None)
            .await
            .map_err(|err| etcd_err("connect", err))?;
        let rev = client
            .get("lockbench-revision-probe", None)
            .await
            .map_err(|err| etcd_err("get", err))?
            .header()
            .map_or(0, |h| h.revision());
        if rev > 1 {
            client
                .compact(rev, Some(CompactionOptions::new().with_physical()))
                .await
                .map_err(|err| etcd_err("compact", err))?;
        }
        println!("compacted at revision {rev}");
        Ok(())
    }
}

/// The systems of a run, as etcd.sh labels their rows, and their columns.
const SYSTEMS: [(&str, &str); 3] = [
    ("etcd", "etcd lock API"),
    ("lockd-1fe", "lockd, 1 front-end"),
    ("lockd-2fe", "lockd, 2 front-ends"),
];

#[derive(Clone, Copy)]
enum Goal {
    /// lockd ÷ etcd at least this, for a rate.
    AtLeastEtcd(f64),
    /// lockd's own value (µs) at most this.
    AtMostUs(f64),
    /// lockd's own count exactly 0 in every round.
    Zero,
}

struct Measure {
    key: &'static str,
    label: &'static str,
    unit: Unit,
    goal: Option<Goal>,
}

const fn m(key: &'static str, label: &'static str, unit: Unit, goal: Option<Goal>) -> Measure {
    Measure {
        key,
        label,
        unit,
        goal,
    }
}

const MEASURES: &[Measure] = &[
    m(
        "cl.unc.c1.cps",
        "uncontended C=1: lock+unlock cycles/s",
        Unit::Rate,
        Some(Goal::AtLeastEtcd(1.0)),
    ),
    m(
        "cl.unc.c1.p50_us",
        "uncontended C=1: cycle p50",
        Unit::Micros,
        None,
    ),
    m(
        "cl.unc.c1.p99_us",
        "uncontended C=1: cycle p99",
        Unit::Micros,
        None,
    ),
    m(
        "cl.unc.c16.cps",
        "uncontended C=16: lock+unlock cycles/s",
        Unit::Rate,
        Some(Goal::AtLeastEtcd(1.0)),
    ),
    m(
        "cl.unc.c16.p50_us",
        "uncontended C=16: cycle p50",
        Unit::Micros,
        None,
    ),
    m(
        "cl.unc.c16.p99_us",
        "uncontended C=16: cycle p99",
        Unit::Micros,
        None,
    ),
    m(
        "cl.unc.c64.cps",
        "uncontended C=64: lock+unlock cycles/s",
        Unit::Rate,
        None,
    ),
    m(
        "cl.unc.c64.p50_us",
        "uncontended C=64: cycle p50",
        Unit::Micros,
        None,
    ),
    m(
        "cl.unc.c64.p99_us",
        "uncontended C=64: cycle p99",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c16.cps",
        "contended C=16, one name: grants/s",
        Unit::Rate,
        Some(Goal::AtLeastEtcd(2.0)),
    ),
    m(
        "cl.con.c16.gap_p50_us",
        "contended C=16: hand-over p50",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c16.gap_p99_us",
        "contended C=16: hand-over p99",
        Unit::Micros,
        Some(Goal::AtMostUs(20_000.0)),
    ),
    m(
        "cl.con.c16.gap_max_us",
        "contended C=16: hand-over max",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c16.acq_p50_us",
        "contended C=16: acquisition p50",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c16.acq_p99_us",
        "contended C=16: acquisition p99",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c16.jain",
        "contended C=16: Jain's fairness index",
        Unit::Ratio,
        None,
    ),
    m(
        "cl.con.c16.violations",
        "contended C=16: mutual-exclusion violations",
        Unit::Count,
        Some(Goal::Zero),
    ),
    m(
        "cl.con.c16.token_disorder",
        "contended C=16: tokens not growing in grant order",
        Unit::Count,
        Some(Goal::Zero),
    ),
    m(
        "cl.con.c64.cps",
        "contended C=64, one name: grants/s",
        Unit::Rate,
        None,
    ),
    m(
        "cl.con.c64.gap_p50_us",
        "contended C=64: hand-over p50",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c64.gap_p99_us",
        "contended C=64: hand-over p99",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c64.gap_max_us",
        "contended C=64: hand-over max",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c64.acq_p50_us",
        "contended C=64: acquisition p50",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c64.acq_p99_us",
        "contended C=64: acquisition p99",
        Unit::Micros,
        None,
    ),
    m(
        "cl.con.c64.jain",
        "contended C=64: Jain's fairness index",
        Unit::Ratio,
        None,
    ),
    m(
        "cl.con.c64.violations",
        "contended C=64: mutual-exclusion violations",
        Unit::Count,
        Some(Goal::Zero),
    ),
    m(
        "cl.con.c64.token_disorder",
        "contended C=64: tokens not growing in grant order",
        Unit::Count,
        Some(Goal::Zero),
    ),
    m(
        "cl.unc.c16.token_disorder",
        "uncontended C=16: a client's tokens not growing",
        Unit::Count,
        Some(Goal::Zero),
    ),
    m(
        "cl.unc.c64.token_disorder",
        "uncontended C=64: a client's tokens not growing",
        Unit::Count,
        Some(Goal::Zero),
    ),
];

/// The scenarios of the costs table.
const SCENARIOS: [(&str, &str); 5] = [
    ("cl.unc.c1", "uncontended C=1"),
    ("cl.unc.c16", "uncontended C=16"),
    ("cl.unc.c64", "uncontended C=64"),
    ("cl.con.c16", "contended C=16"),
    ("cl.con.c64", "contended C=64"),
];

/// The costs table's columns: a scenario's row key, the heading, the unit (see counters.rs).
const COSTS: [(&str, &str, Unit); 9] = [
    ("cps", "cycles/s", Unit::Rate),
    ("etcd_txn_pc", "etcd txns / cycle", Unit::Ratio),
    ("txn_rpc_pc", "Txn RPCs / cycle", Unit::Ratio),
    ("range_rpc_pc", "Range RPCs / cycle", Unit::Ratio),
    ("lock_rpc_pc", "Lock+Unlock RPCs / cycle", Unit::Ratio),
    ("other_rpc_pc", "other etcd RPC msgs / cycle", Unit::Ratio),
    ("req_per_txn", "requests / etcd txn", Unit::Ratio),
    ("fe_cpu_us", "front-end CPU / request", Unit::Micros),
    ("etcd_cpu_us", "etcd CPU / request", Unit::Micros),
];

/// What the costs table's columns are.
const COSTS_LEGEND: &str = "\
Per cycle: per lock+unlock cycle (contended: per grant, each a lock and an unlock), over each \
whole run, from the moment every client has connected to the moment the last one's last \
request is answered (the warm-up included; connecting, etcd's leases and their revocation \
left out); each cell is the median over the rounds. **etcd txns**: raft proposals committed \
(`etcd_server_proposals_committed_total`, the leader's index): every etcd write is one (a \
client's Txn, Put or DeleteRange; the put and the delete that etcd's Lock and Unlock make \
inside etcd; a lease grant or revocation), reads are not, so it counts alike for both \
systems. (etcd's mvcc counter of transactions, `etcd_debugging_mvcc_txn_total` in 3.4, \
counts only those of more than one operation, an Unlock's delete not among them: not used.) \
**Txn, Range RPCs**: `grpc_server_handled_total` by method, summed over the members; 0 for \
etcd's lock API, whose Lock and Unlock reach etcd's store inside etcd, not over gRPC. \
**Lock+Unlock RPCs**: the same counter, etcd's v3lock service. **other**: \
`grpc_server_msg_received_total` of every other method (watch and lease keep-alive stream \
messages, lease grants, puts, deletes...). **requests / etcd txn**: requests answered \
(lockd: LOCK and UNLOCK lines; etcd: Lock and Unlock RPCs), two per cycle, per etcd txn. \
**front-end CPU / request**: the lockd front-ends' utime+stime (`/proc/PID/stat`, in 10 ms \
ticks, busy polling included) per request; none for etcd's lock API, which has no front-end. \
**etcd CPU / request**: the three etcd members' utime+stime per request, for every system.\n";

/// The second table: what each scenario's cycle costs etcd and the front-ends, per system.
fn costs_table(all: &std::collections::HashMap<(String, String), Vec<f64>>) -> String {
    let get = |k: String, w: &str| all.get(&(k, w.to_string()));
    let has_costs = |s: &str, w: &str| {
        COSTS[1..]
            .iter()
            .any(|(c, _, _)| get(format!("{s}.{c}"), w).is_some())
    };
    if !SCENARIOS
        .iter()
        .any(|(s, _)| SYSTEMS.iter().any(|(w, _)| has_costs(s, w)))
    {
        return String::new();
    }
    let mut out = String::from("| scenario | system |");
    let mut rule = String::from("|---|---|");
    for (_, heading, _) in COSTS {
        out.push_str(&format!(" {heading} |"));
        rule.push_str("---:|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    for (s, scenario) in SCENARIOS {
        for (w, system) in SYSTEMS {
            if !has_costs(s, w) {
                continue;
            }
            out.push_str(&format!("| {scenario} | {system} |"));
            for (c, _, unit) in COSTS {
                let key = format!("{s}.{c}");
                let cell =
                    get(key.clone(), w).map_or("–".into(), |v| show(unit, typical(&key, v)));
                out.push_str(&format!(" {cell} |"));
            }
            out.push('\n');
        }
    }
    out.push('\n');
    out.push_str(COSTS_LEGEND);
    out
}

/// Counts summed over the rounds rather than their median.
fn is_count(key: &str) -> bool {
    key.ends_with("violations") || key.ends_with("disorder")
}

/// The verdict of one lockd column on one measure.
fn verdict(goal: Goal, key: &str, lockd: &[f64], etcd: Option<&Vec<f64>>) -> Option<String> {
    match goal {
        Goal::AtLeastEtcd(x) => {
            let r = ratios(etcd?, lockd);
            if r.is_empty() {
                return None;
            }
            let median = typical(key, &r);
            let met = r.iter().filter(|v| **v >= x).count();
            let word = if median >= x { "met" } else { "**missed**" };
            Some(format!("{word} ({met} of {} rounds)", r.len()))
        }
        Goal::AtMostUs(x) => {
            let median = typical(key, lockd);
            let met = lockd.iter().filter(|v| **v <= x).count();
            let word = if median <= x { "met" } else { "**missed**" };
            Some(format!("{word} ({met} of {} rounds)", lockd.len()))
        }
        Goal::Zero => {
            let sum: f64 = lockd.iter().sum();
            Some(if sum == 0.0 {
                "met".into()
            } else {
                format!("**missed** ({sum:.0})")
            })
        }
    }
}

fn goal_text(goal: Goal) -> String {
    match goal {
        Goal::AtLeastEtcd(1.0) => "no worse than etcd".into(),
        Goal::AtLeastEtcd(x) => format!("≥ {x}× etcd"),
        Goal::AtMostUs(x) => format!("< {:.0} ms", x / 1000.0),
        Goal::Zero => "= 0".into(),
    }
}

/// The markdown table of a run's interleaved rounds: each system's median (the sum over the
/// rounds for counts), each lockd column against etcd as the median and range of per-round
/// ratios, and the targets.
pub fn table(rows: &str) -> String {
    let all = rounds(rows);
    let get = |k: &str, w: &str| all.get(&(k.to_string(), w.to_string()));
    let present: Vec<(&str, &str)> = SYSTEMS
        .iter()
        .copied()
        .filter(|(w, _)| MEASURES.iter().any(|m| get(m.key, w).is_some()))
        .collect();
    let lockds: Vec<(&str, &str)> = present
        .iter()
        .copied()
        .filter(|(w, _)| *w != "etcd")
        .collect();
    let has_etcd = present.iter().any(|(w, _)| *w == "etcd");
    let mut out = String::from("| measure |");
    let mut rule = String::from("|---|");
    for (_, title) in &present {
        out.push_str(&format!(" {title} |"));
        rule.push_str("---:|");
    }
    if has_etcd {
        for (w, _) in &lockds {
            out.push_str(&format!(" {} ÷ etcd |", short(w)));
            rule.push_str("---:|");
        }
    }
    out.push_str(" target |\n");
    rule.push_str("---|\n");
    out.push_str(&rule);
    for d in MEASURES {
        if !present.iter().any(|(w, _)| get(d.key, w).is_some()) {
            continue;
        }
        out.push_str(&format!("| {} |", d.label));
        for (w, _) in &present {
            let cell = match get(d.key, w) {
                Some(v) if is_count(d.key) => show(d.unit, v.iter().sum()),
                Some(v) => show(d.unit, typical(d.key, v)),
                None => "–".into(),
            };
            out.push_str(&format!(" {cell} |"));
        }
        if has_etcd {
            for (w, _) in &lockds {
                let cell = match (get(d.key, "etcd"), get(d.key, w)) {
                    (Some(e), Some(l)) if !is_count(d.key) && !d.key.ends_with("jain") => {
                        let r = ratios(e, l);
                        if r.is_empty() {
                            "–".into()
                        } else {
                            let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
                            let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                            format!("{:.2}× ({lo:.2}–{hi:.2})", typical(d.key, &r))
                        }
                    }
                    _ => "–".into(),
                };
                out.push_str(&format!(" {cell} |"));
            }
        }
        let target = d.goal.map(|g| {
            let verdicts: Vec<String> = lockds
                .iter()
                .filter_map(|(w, _)| {
                    let v = verdict(g, d.key, get(d.key, w)?, get(d.key, "etcd"))?;
                    Some(format!("{}: {v}", short(w)))
                })
                .collect();
            format!("{}: {}", goal_text(g), verdicts.join("; "))
        });
        out.push_str(&format!(" {} |\n", target.unwrap_or_default()));
    }
    let n = MEASURES
        .iter()
        .flat_map(|d| {
            present
                .iter()
                .filter_map(|(w, _)| get(d.key, w).map(Vec::len))
        })
        .max()
        .unwrap_or(0);
    out.push_str(&format!(
        "\nRounds: {n}. Each cell is the median over the rounds (counts: the sum); a ratio is the median of the per-round ratios, with their range.\n"
    ));
    let costs = costs_table(&all);
    if !costs.is_empty() {
        out.push('\n');
        out.push_str(&costs);
    }
    out
}

fn short(who: &str) -> &str {
    match who {
        "lockd-1fe" => "1 FE",
        "lockd-2fe" => "2 FE",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disorder_counts_tokens_that_do_not_grow() {
        assert_eq!(disorder(&[1, 2, 5, 9]), 0);
        assert_eq!(disorder(&[1, 3, 3, 2, 8]), 2);
        assert_eq!(disorder(&[]), 0);
    }

    #[test]
    fn urls_must_be_loopback_http() {
        assert!(etcd_urls("http://127.0.0.1:2379,http://127.0.0.1:2479").is_ok());
        assert!(etcd_urls("https://127.0.0.1:2379").is_err());
        assert!(etcd_urls("http://10.0.0.1:2379").is_err());
        assert_eq!(
            lockd_addrs("127.0.0.1:1,127.0.0.1:2").map(|v| v.len()),
            Ok(2)
        );
    }

    #[test]
    fn table_pairs_rounds_and_judges_targets() {
        let rows = "cl.con.c16.cps\tetcd\t100\ncl.con.c16.cps\tlockd-1fe\t250\ncl.con.c16.cps\tlockd-2fe\t150\n\
                    cl.con.c16.cps\tetcd\t200\ncl.con.c16.cps\tlockd-1fe\t500\ncl.con.c16.cps\tlockd-2fe\t500\n\
                    cl.con.c16.gap_p99_us\tlockd-1fe\t9000\ncl.con.c16.gap_p99_us\tlockd-1fe\t30000\n\
                    cl.con.c16.gap_p99_us\tlockd-1fe\t10000\n\
                    cl.con.c16.token_disorder\tlockd-2fe\t0\ncl.con.c16.token_disorder\tlockd-2fe\t1\n";
        assert_eq!(rounds(rows).len(), 5);
        let t = table(rows);
        // Per round 1 FE ÷ etcd: 2.5, 2.5; 2 FE ÷ etcd: 1.5, 2.5 (median 2.0).
        assert!(t.contains("| 150/s | 375/s | 325/s | 2.50× (2.50–2.50) | 2.00× (1.50–2.50) | ≥ 2× etcd: 1 FE: met (2 of 2 rounds); 2 FE: met (1 of 2 rounds) |"), "{t}");
        assert!(t.contains("< 20 ms: 1 FE: met (2 of 3 rounds) |"), "{t}");
        assert!(t.contains("= 0: 2 FE: **missed** (1) |"), "{t}");
        // No cost rows, no costs table.
        assert!(!t.contains("| scenario | system |"), "{t}");
    }

    #[test]
    fn costs_table_has_a_row_per_scenario_and_system() {
        let rows = "cl.unc.c1.cps\tetcd\t500\ncl.unc.c1.etcd_txn_pc\tetcd\t2\n\
                    cl.unc.c1.txn_rpc_pc\tetcd\t0\ncl.unc.c1.lock_rpc_pc\tetcd\t2\n\
                    cl.unc.c1.req_per_txn\tetcd\t1\ncl.unc.c1.etcd_cpu_us\tetcd\t700\n\
                    cl.unc.c1.cps\tlockd-1fe\t400\ncl.unc.c1.etcd_txn_pc\tlockd-1fe\t2\n\
                    cl.unc.c1.etcd_txn_pc\tlockd-1fe\t3\ncl.unc.c1.etcd_txn_pc\tlockd-1fe\t2\n\
                    cl.unc.c1.fe_cpu_us\tlockd-1fe\t180\n\
                    cl.con.c64.cps\tlockd-2fe\t300\ncl.con.c64.txn_rpc_pc\tlockd-2fe\t2\n";
        let t = table(rows);
        assert!(
            t.contains("| scenario | system | cycles/s | etcd txns / cycle |"),
            "{t}"
        );
        assert!(t.contains("| uncontended C=1 | etcd lock API | 500/s | 2.000 | 0.000 | – | 2.000 | – | 1.000 | – | 700 µs |"), "{t}");
        assert!(t.contains("| uncontended C=1 | lockd, 1 front-end | 400/s | 2.000 | – | – | – | – | – | 180 µs | – |"), "{t}");
        assert!(
            t.contains("| contended C=64 | lockd, 2 front-ends | 300/s | – | 2.000 |"),
            "{t}"
        );
        assert!(!t.contains("| uncontended C=16 |"), "{t}");
        assert!(t.contains("etcd_server_proposals_committed_total"), "{t}");
    }
}
