//! Scripted protocol tests: tests/scripts/*.lockd are conversations with one lockd (lines
//! sent, lines expected, wildcards for tokens and times), each run against a fresh lockd
//! child process on the embedded backend and, with the `etcd` feature, on a real etcd
//! cluster. The grammar is in tests/scripts/README.md; [`parse`] reads a script, [`pattern`]
//! matches lines, `run` drives the connections.

pub mod coverage;
pub mod parse;
pub mod pattern;
mod run;

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
}

impl Target {
    fn kind(&self) -> BackendKind {
        match self {
            Target::Embedded => BackendKind::Embedded,
            Target::Etcd { .. } => BackendKind::Etcd,
        }
    }

    /// How long one read or poll may take before the script is declared hung.
    fn guard(&self) -> Duration {
        match self {
            Target::Embedded => Duration::from_secs(10),
            Target::Etcd { .. } => Duration::from_secs(60),
        }
    }
}

/// The lockd a script talks to.
enum Server {
    Child(LockdProcess),
    Front(Box<LockdFrontEnd>),
}

impl Server {
    fn process(&self) -> &LockdProcess {
        match self {
            Server::Child(p) => p,
            Server::Front(f) => f.process(),
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

fn start(target: &Target, script: &Script, users: &Path) -> Result<Server, String> {
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
        target.kind().name(),
        script.name
    ));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("scratch dir: {e}"))?;
    let users = scratch.join("users");
    let server = start(target, script, &users)?;
    let control = Box::new(Control {
        pid: server.process().pid(),
        users,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut run = run::Run::new(server.process().addr, target.guard(), control);
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
        "tests/scripts/{}.lockd:{}: {}\n  {}\n  the conversation's last lines:\n{}  lockd's log, last lines:\n{}",
        script.name,
        f.line,
        f.source,
        f.what,
        tail(&run.transcript, transcript_lines()),
        tail(&server.process().log(), 15),
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
                let result = run_one(target, script);
                results
                    .lock()
                    .expect("results")
                    .push((script.name.clone(), *known, result));
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let backend = target.kind().name();
    let passed = results.iter().filter(|r| !r.1 && r.2.is_ok()).count();
    for (name, known, r) in results {
        match (known, r) {
            (false, Ok(())) => {}
            (false, Err(report)) => failures.push(format!("--- {name} on {backend}:\n{report}")),
            // Not a failure either way: the script's header already says it differs.
            (true, Ok(())) => eprintln!(
                "{name}: marked `{backend} differs` but passed on {backend} this time \
                 (fixed, or a race that went the other way?)"
            ),
            (true, Err(report)) => {
                let first = report.lines().take(3).collect::<Vec<_>>().join("\n  ");
                eprintln!("{name}: still differs on {backend}, as its header says:\n  {first}");
            }
        }
    }
    eprintln!(
        "{passed} scripts passed on the {backend} backend, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
