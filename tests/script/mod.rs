//! Scripted protocol tests: tests/scripts/*.lockd are conversations with one lockd (lines
//! sent, lines expected, wildcards for tokens and times), each run against a fresh lockd
//! child process on the embedded backend and, with the `etcd` feature, on a real etcd
//! cluster, and on two front-ends in this process over the in-memory etcd (`sim`). The
//! grammar is in tests/scripts/README.md; [`parse`] reads a script, [`pattern`] matches
//! lines, `run` drives the connections.

pub mod coverage;
pub mod parse;
pub mod pattern;
mod run;
#[cfg(feature = "etcd")]
mod sim;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::common::etcd::LockdFrontEnd;
use crate::common::{Lockd, LockdProcess};
pub use parse::{BackendKind, Script};

/// The secret of a script's user `<name>` (`# user:`): `AUTH <name> <name>-secret-0123456789abcdef`.
pub fn secret(user: &str) -> String {
    format!("{user}-secret-0123456789abcdef")
}

/// tests/scripts, where the scripts and their README live.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts")
}

/// Every `*.lockd` file of [`dir`], by name, parsed (or why not).
pub fn load_all() -> Vec<(String, Result<Script, String>)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("read tests/scripts")
        .map(|e| e.expect("tests/scripts entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "lockd"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let name = p
                .file_stem()
                .expect("a file name")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(p).expect("read a script");
            let parsed = parse::parse(&name, &text);
            (name, parsed)
        })
        .collect()
}

/// Where the scripts' lockd runs.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub enum Target {
    /// A lockd child process keeping its locks in memory.
    Embedded,
    /// A lockd front-end on this etcd cluster (its `--etcd` endpoints), under a prefix of
    /// its own per script below `prefix`.
    Etcd { endpoints: String, prefix: String },
    /// Two lockd front-ends in this process over one in-memory etcd behind the simulated
    /// network, its faults off (`sim.rs`); the script's connections spread over both.
    /// Cluster mode: what a script says of etcd (`# backends:`, `# etcd differs:`) holds here.
    #[cfg(feature = "etcd")]
    Simulated,
}

impl Target {
    fn kind(&self) -> BackendKind {
        match self {
            Target::Embedded => BackendKind::Embedded,
            Target::Etcd { .. } => BackendKind::Etcd,
            #[cfg(feature = "etcd")]
            Target::Simulated => BackendKind::Etcd,
        }
    }

    /// The target's name, in reports and scratch directories.
    fn name(&self) -> &'static str {
        match self {
            #[cfg(feature = "etcd")]
            Target::Simulated => "simulated-cluster",
            _ => self.kind().name(),
        }
    }

    /// How long one read or poll may take before the script is declared hung.
    fn guard(&self) -> Duration {
        match self {
            Target::Embedded => Duration::from_secs(10),
            Target::Etcd { .. } => Duration::from_secs(60),
            #[cfg(feature = "etcd")]
            Target::Simulated => Duration::from_secs(30),
        }
    }
}

/// The lockd a script talks to.
enum Server {
    Child(LockdProcess),
    Front(Box<LockdFrontEnd>),
    #[cfg(feature = "etcd")]
    Simulated(sim::SimCluster),
}

impl Server {
    /// The addresses the script's connections go to.
    fn addrs(&self) -> Vec<std::net::SocketAddr> {
        match self {
            Server::Child(p) => vec![p.addr],
            Server::Front(f) => vec![f.process().addr],
            #[cfg(feature = "etcd")]
            Server::Simulated(c) => c.addrs.clone(),
        }
    }

    /// What `server:` steps do to it; `users` is its auth file.
    fn control(&self, users: PathBuf) -> Box<dyn run::ServerControl> {
        let pid = match self {
            Server::Child(p) => p.pid(),
            Server::Front(f) => f.process().pid(),
            #[cfg(feature = "etcd")]
            Server::Simulated(c) => return c.control(users),
        };
        Box::new(Control { pid, users })
    }

    /// The end of its log, for a failure's report (on the simulated cluster, and of the
    /// simulated etcd's trace).
    fn log_tail(&self, n: usize) -> String {
        let tail = |lines: Vec<String>| -> String {
            lines[lines.len().saturating_sub(n)..]
                .iter()
                .map(|l| format!("    {l}\n"))
                .collect()
        };
        match self {
            Server::Child(p) => format!("  lockd's log, last lines:\n{}", tail(p.log())),
            Server::Front(f) => {
                format!("  lockd's log, last lines:\n{}", tail(f.process().log()))
            }
            #[cfg(feature = "etcd")]
            Server::Simulated(c) => format!(
                "  the front-ends' log, last lines:\n{}  the simulated etcd's trace, last lines:\n{}",
                tail(c.log()),
                tail(c.trace()),
            ),
        }
    }
}

/// Writes the auth file of `specs` (`<name> [rights]`, secrets by [`secret`]) to `file`.
fn write_users(file: &Path, specs: &[String]) -> Result<(), String> {
    let lines: Vec<String> = specs
        .iter()
        .map(|spec| {
            let user = spec.split_whitespace().next().unwrap_or_default();
            lockd::auth::user_line(spec, &secret(user), [7; 16])
                .map_err(|e| format!("user {spec}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let text = lines.join("\n") + "\n";
    std::fs::write(file, text).map_err(|e| format!("write the auth file: {e}"))
}

/// `server:` steps on a lockd process: signals by its pid, its auth file rewritten.
struct Control {
    pid: u32,
    users: PathBuf,
}

impl Control {
    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.pid as libc::pid_t, signal);
        }
    }
}

impl run::ServerControl for Control {
    fn stop(&mut self) {
        self.signal(libc::SIGTERM);
    }

    fn reload_users(&mut self, specs: &[String]) -> Result<(), String> {
        write_users(&self.users, specs)?;
        self.signal(libc::SIGHUP);
        Ok(())
    }
}

fn start(
    target: &Target,
    script: &Script,
    users: &Path,
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))] rt: &tokio::runtime::Runtime,
) -> Result<Server, String> {
    let mut args = script.flags.clone();
    if !script.users.is_empty() {
        write_users(users, &script.users)?;
        args.push("--auth-file".into());
        args.push(users.to_string_lossy().into_owned());
    }
    match target {
        Target::Embedded => Lockd::new()
            .args(&args)
            .try_spawn()
            .map(Server::Child)
            .map_err(|log| format!("lockd did not start: {log:#?}")),
        Target::Etcd { endpoints, prefix } => {
            let mut all = vec![
                "--etcd".to_string(),
                endpoints.clone(),
                "--etcd-prefix".into(),
                format!("{prefix}{}/", script.name),
            ];
            all.extend(args);
            // The harness panics when lockd does not start: that is this script's failure.
            std::panic::catch_unwind(|| Box::new(LockdFrontEnd::spawn(all)))
                .map(Server::Front)
                .map_err(|_| "lockd front-end did not start (see above)".to_string())
        }
        #[cfg(feature = "etcd")]
        Target::Simulated => {
            let mut all = vec![
                "--etcd".to_string(),
                "http://simulated-etcd:2379".into(),
                "--etcd-prefix".into(),
                format!("/lockd-scripts/{}/", script.name),
            ];
            all.extend(args);
            let seed = script.name.bytes().fold(0u64, |h, b| {
                h.wrapping_mul(0x100_0000_01b3).wrapping_add(u64::from(b))
            });
            rt.block_on(sim::SimCluster::start(all, seed))
                .map(Server::Simulated)
        }
    }
}

/// How many lines of the conversation a failure quotes: `LOCKD_TEST_SCRIPT_TAIL`, else 20.
fn transcript_lines() -> usize {
    std::env::var("LOCKD_TEST_SCRIPT_TAIL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// Runs one script on `target`; `Err` is the report of its failure.
fn run_one(target: &Target, script: &Script) -> Result<(), String> {
    let scratch = std::env::temp_dir().join(format!(
        "lockd-script-{}-{}-{}",
        std::process::id(),
        target.name(),
        script.name
    ));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("scratch dir: {e}"))?;
    let users = scratch.join("users");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = start(target, script, &users, &rt)?;
    let control = server.control(users);
    let mut addrs = server.addrs();
    if script.one_front_end.is_some() {
        addrs.truncate(1);
    }
    let mut run = run::Run::new(addrs, script.conn_names(), target.guard(), control);
    let result = rt.block_on(run.steps(&script.steps));
    let _ = std::fs::remove_dir_all(&scratch);
    let Err(f) = result else { return Ok(()) };
    let tail = |lines: &[String], n: usize| -> String {
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| format!("    {l}\n"))
            .collect()
    };
    Err(format!(
        "tests/scripts/{}.lockd:{}: {}\n  {}\n  the conversation's last lines:\n{}{}",
        script.name,
        f.line,
        f.source,
        f.what,
        tail(&run.transcript, transcript_lines()),
        server.log_tail(15),
    ))
}

/// Runs every script meant for `target` (`jobs` at once), each on a fresh lockd, and fails
/// with the report of every script that failed. `LOCKD_TEST_SCRIPTS=a,b` runs only the
/// scripts whose names contain `a` or `b`.
pub fn run_all(target: &Target, jobs: usize) {
    let only: Vec<String> = std::env::var("LOCKD_TEST_SCRIPTS")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let mut failures = Vec::new();
    let mut scripts = Vec::new();
    for (name, parsed) in load_all() {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        match parsed {
            Ok(s) if s.backends.contains(&target.kind()) => scripts.push((s, false)),
            // A known difference on this backend: run it too, to say whether it still is.
            Ok(s) if s.differs_on(target.kind()) => scripts.push((s, true)),
            Ok(_) => {}
            Err(e) => failures.push(format!("{name}: does not parse: {e}")),
        }
    }
    assert!(
        !scripts.is_empty() || !only.is_empty(),
        "no scripts found in tests/scripts"
    );
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((script, known)) = scripts.get(i) else {
                    break;
                };
                let began = std::time::Instant::now();
                let result = run_one(target, script);
                let took = began.elapsed();
                results
                    .lock()
                    .expect("results")
                    .push((script.name.clone(), *known, result, took));
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let backend = target.name();
    let mut slowest: Vec<(Duration, &str)> = results.iter().map(|r| (r.3, r.0.as_str())).collect();
    slowest.sort_by(|a, b| b.cmp(a));
    let slowest: Vec<String> = slowest
        .iter()
        .take(5)
        .map(|(took, name)| format!("{name} {:.1}s", took.as_secs_f64()))
        .collect();
    eprintln!("slowest scripts on {backend}: {}", slowest.join(", "));
    let marked = target.kind().name();
    let passed = results.iter().filter(|r| !r.1 && r.2.is_ok()).count();
    for (name, known, r, _) in results {
        match (known, r) {
            (false, Ok(())) => {}
            (false, Err(report)) => failures.push(format!("--- {name} on {backend}:\n{report}")),
            // Not a failure either way: the script's header already says it differs.
            (true, Ok(())) => eprintln!(
                "{name}: marked `{marked} differs` but passed on {backend} this time \
                 (fixed, or a race that went the other way?)"
            ),
            (true, Err(report)) => {
                let first = report.lines().take(3).collect::<Vec<_>>().join("\n  ");
                eprintln!("{name}: still differs on {backend}, as its header says:\n  {first}");
            }
        }
    }
    eprintln!(
        "{passed} scripts passed on {backend}, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
