//! The one way tests start lockd: the [`Lockd`] builder. Say what to run (the memory
//! backend by default, [`Lockd::data_dir`] or [`Lockd::etcd`], a [`Config`] for an in-process
//! server, extra flags and environment for a child process), then how:
//!
//! - [`Lockd::serve`]: in-process, on the test's own tokio runtime ([`TestServer`]);
//! - [`Lockd::serve_on`]: the same on a listener the test bound itself;
//! - [`Lockd::serve_in_background`]: in-process on a runtime of its own, for tests that
//!   drive programs synchronously ([`super::blocking::Server`]);
//! - [`Lockd::spawn`]: the real `lockd` binary as a child process ([`LockdProcess`]), its log
//!   collected; [`Lockd::command`] is its command line, for a test that runs it some other
//!   way (expecting it to refuse to start, say).
//!
//! Every handle stops its lockd when dropped.

use std::io::{self, BufRead as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use lockd::server::{self, Config};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{field, Raw, GUARD};

/// What to start, and how (see the module's documentation).
#[must_use]
#[derive(Clone)]
pub struct Lockd {
    config: Config,
    data_dir: Option<PathBuf>,
    etcd: Option<(String, String)>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    listen: String,
}

/// A default config whose shutdown does not keep a failing test waiting long.
pub fn config() -> Config {
    Config {
        shutdown_grace: Duration::from_secs(2),
        ..Config::default()
    }
}

impl Default for Lockd {
    fn default() -> Lockd {
        Lockd::new()
    }
}

impl Lockd {
    /// The memory backend on 127.0.0.1:0, with [`config`] when served in-process.
    pub fn new() -> Lockd {
        Lockd {
            config: config(),
            data_dir: None,
            etcd: None,
            args: Vec::new(),
            env: Vec::new(),
            listen: "127.0.0.1:0".to_string(),
        }
    }

    /// The config of an in-process server (a child process takes flags: [`Lockd::args`]).
    pub fn config(mut self, config: Config) -> Lockd {
        self.config = config;
        self
    }

    /// Keeps the locks in the data directory `dir` (`--data-dir`).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Lockd {
        self.data_dir = Some(dir.into());
        self
    }

    /// A cluster front-end: the locks in etcd at `endpoints` (comma-separated client URLs)
    /// under `prefix` (`--etcd`, `--etcd-prefix`). A child process only.
    pub fn etcd(mut self, endpoints: &str, prefix: &str) -> Lockd {
        self.etcd = Some((endpoints.to_string(), prefix.to_string()));
        self
    }

    /// Extra flags of a child process.
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Lockd {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// Extra environment variables of a child process (say, libfaketime's).
    pub fn envs(mut self, env: &[(String, String)]) -> Lockd {
        self.env.extend(env.iter().cloned());
        self
    }

    /// The `--listen` address of a child process (default 127.0.0.1:0), for one that must
    /// come back on the same port after a crash.
    pub fn listen(mut self, addr: impl Into<String>) -> Lockd {
        self.listen = addr.into();
        self
    }

    fn in_process_config(self) -> Config {
        assert!(
            self.args.is_empty() && self.env.is_empty(),
            "flags and environment are for a child process: spawn() it"
        );
        assert!(
            self.etcd.is_none(),
            "cluster front-ends run as child processes: spawn() it"
        );
        let mut config = self.config;
        if let Some(dir) = self.data_dir {
            config.data_dir = Some(dir);
        }
        config
    }

    /// Binds 127.0.0.1:0 and serves there, on the test's runtime, until
    /// [`TestServer::shutdown`] (or drop).
    pub async fn serve(self) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        self.serve_on(listener)
    }

    /// Serves `listener`, on the current runtime.
    pub fn serve_on(self, listener: TcpListener) -> TestServer {
        let addr = listener.local_addr().expect("local addr");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server::run(
            self.in_process_config(),
            listener,
            shutdown.clone(),
        ));
        TestServer {
            addr,
            shutdown,
            task: Some(task),
        }
    }

    /// Serves 127.0.0.1:0 from a runtime of its own (one worker thread), for a test with no
    /// runtime of its own.
    pub fn serve_in_background(self) -> (tokio::runtime::Runtime, TestServer) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let server = runtime.block_on(self.serve());
        (runtime, server)
    }

    /// The command line of the real binary: `lockd --listen <addr> [--data-dir <dir>]
    /// [--etcd <endpoints> --etcd-prefix <prefix>] <args>`, without `RUST_LOG` or any
    /// `LOCKD_*` variable from the test's environment; no stdin, no stdout, stderr piped.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockd"));
        cmd.args(["--listen", &self.listen]);
        if let Some(dir) = &self.data_dir {
            cmd.arg("--data-dir").arg(dir);
        }
        if let Some((endpoints, prefix)) = &self.etcd {
            cmd.args(["--etcd", endpoints, "--etcd-prefix", prefix]);
        }
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, _) in std::env::vars() {
            if key.starts_with("LOCKD_") {
                cmd.env_remove(key);
            }
        }
        cmd
    }

    /// Starts the real binary and waits until it logs the address it listens on.
    pub fn spawn(self) -> LockdProcess {
        self.try_spawn()
            .unwrap_or_else(|log| panic!("lockd did not start: {log:?}"))
    }

    /// [`Lockd::spawn`], for a caller that can do something about a lockd that exits before
    /// it listens (its port was taken meanwhile): an `Err` with its log.
    pub fn try_spawn(self) -> Result<LockdProcess, Vec<String>> {
        let mut cmd = self.command();
        let mut child = cmd.spawn().expect("spawn lockd");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let reader = {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    // The line protocol's "listening addr=..." (not the compat ports' lines).
                    // With --log-format json: "addr":"127.0.0.1:7000".
                    if line.contains("listening") {
                        if let Some(addr) = field(&line, "addr")
                            .or_else(|| json_addr(&line))
                            .filter(|a| a.parse::<SocketAddr>().is_ok())
                        {
                            let _ = tx.send(Some(addr));
                        }
                    }
                    log.lock().unwrap().push(line);
                }
            })
        };
        // An exit closes stderr, which ends the reader and disconnects the channel at once.
        let addr = match rx.recv_timeout(GUARD) {
            Ok(Some(addr)) => addr.parse().expect("listening address"),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                let log = log.lock().unwrap().clone();
                return Err(log);
            }
        };
        Ok(LockdProcess {
            child,
            addr,
            log,
            reader: Some(reader),
        })
    }
}

/// The `addr` of a JSON log line (`"addr":"127.0.0.1:7000"`), for a lockd started with
/// `--log-format json`.
fn json_addr(line: &str) -> Option<String> {
    let rest = line.split_once(r#""addr":""#)?.1;
    Some(rest.split_once('"')?.0.to_owned())
}

/// A server running on the test's runtime.
pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl TestServer {
    /// Starts the server's shutdown without waiting for it.
    pub fn cancel(&self) {
        self.shutdown.cancel();
    }

    /// Cancels the server and waits until `run` has returned.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(GUARD, task)
                .await
                .expect("server did not stop in time");
            result.expect("server task panicked").expect("server run");
        }
    }

    /// Waits (without cancelling it) until `run` returns on its own, and returns its result.
    pub async fn join(mut self) -> io::Result<()> {
        let task = self.task.take().expect("a running server");
        tokio::time::timeout(GUARD, task)
            .await
            .expect("server did not stop in time")
            .expect("server task panicked")
    }

    /// A raw connection to this server.
    pub async fn raw(&self) -> Raw {
        Raw::connect(self.addr).await
    }

    /// Connects again and again until a connection is served rather than refused with
    /// `ERR LIMIT`; fails with `what` after the guard.
    pub async fn wait_for_a_free_slot(&self, what: &str) {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let mut c = self.raw().await;
            c.send("PING").await;
            match c.try_line().await.ok().flatten().as_deref() {
                Some("OK PONG") => return,
                Some(line) if line.starts_with("ERR LIMIT ") => {}
                None => {}
                Some(line) => panic!("unexpected {line:?}"),
            }
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The real `lockd` binary as a child process listening on 127.0.0.1:0, its log collected.
/// Killed when dropped.
pub struct LockdProcess {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl LockdProcess {
    /// A raw connection to it.
    pub async fn raw(&self) -> Raw {
        Raw::connect(self.addr).await
    }

    /// Its process id, to signal it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory, from /proc (Linux).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// How many file descriptors it has open (sockets included), from /proc (Linux).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .expect("read /proc/<pid>/fd")
            .count()
    }

    /// Polls `open_fds` until `done` accepts it; fails after the guard.
    pub async fn wait_fds(&self, what: &str, done: impl Fn(usize) -> bool) -> usize {
        let deadline = Instant::now() + GUARD;
        loop {
            let fds = self.open_fds();
            if done(fds) {
                return fds;
            }
            assert!(Instant::now() < deadline, "{what}: still {fds} open fds");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its log so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// SIGTERM; waits for it to exit and returns its whole log.
    pub fn stop(mut self) -> Vec<String> {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + GUARD;
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "lockd did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log()
    }

    /// Waits (without signalling it) until it exits; fails the test after the guard.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + GUARD;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "lockd did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no chance to clean anything up; waits for it to be gone and returns its whole
    /// log.
    pub fn kill(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log()
    }
}

impl Drop for LockdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
