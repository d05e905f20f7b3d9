//! The one test harness every integration test shares (`mod common;`): here, a real server
//! on 127.0.0.1:0 in the test's runtime, a raw line client, the real binary as a child
//! process, and an HTTP GET; in [`blocking`], a server for tests that drive programs
//! synchronously (bash, Python) and a proxy that cuts connections; in [`durable`], lockd
//! processes on a data directory that tests crash and restart; in [`lockctl`], lockctl as a
//! child process against an in-process server; in [`detail`], `STATUS <name> detail`
//! helpers; in [`pki`], certificates made at run time; in [`etcd`], a real etcd cluster of
//! child processes that tests kill and restart, and lockd front-ends on it (cluster mode); in
//! [`link`], a link between two processes that a test cuts and heals while both run; in
//! [`history`], the record of a chaos run and the checker of lockd's promises over it; in
//! [`chaos`], the fenced-counter chaos run on cluster front-ends; in [`netsplit`], packet
//! filters that cut etcd members off from each other.
//!
//! Every read has a generous timeout: it only turns a hang into a failure, it never asserts
//! how fast the server is.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

pub mod blocking;
pub mod chaos;
pub mod detail;
pub mod durable;
pub mod etcd;
pub mod history;
pub mod link;
pub mod lockctl;
pub mod netsplit;
pub mod pki;

use std::io::{self, BufRead as _};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockd::server::{self, Config};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any single wait may take before the test is declared hung.
pub const GUARD: Duration = Duration::from_secs(10);

/// A server running on the test's runtime.
pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<io::Result<()>>>,
}

/// Binds 127.0.0.1:0 and serves `config` there until [`TestServer::shutdown`] (or drop).
pub async fn start_server(config: Config) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::run(config, listener, shutdown.clone()));
    TestServer {
        addr,
        shutdown,
        task: Some(task),
    }
}

/// A default config whose shutdown does not keep a failing test waiting long.
pub fn config() -> Config {
    Config {
        shutdown_grace: Duration::from_secs(2),
        ..Config::default()
    }
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

/// A raw line client: writes what it is told, reads one line at a time.
pub struct Raw {
    stream: BufReader<TcpStream>,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        let stream = tokio::time::timeout(GUARD, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        Raw::from_stream(stream)
    }

    /// Connects with a receive buffer of about `bytes`, so a client that does not read fills
    /// its side with little data.
    pub async fn connect_small(addr: SocketAddr, bytes: u32) -> Raw {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
        let stream = tokio::time::timeout(GUARD, socket.connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        Raw::from_stream(stream)
    }

    pub fn from_stream(stream: TcpStream) -> Raw {
        let _ = stream.set_nodelay(true);
        Raw {
            stream: BufReader::new(stream),
        }
    }

    pub fn stream(&self) -> &TcpStream {
        self.stream.get_ref()
    }

    /// Sends `line` and a `\n`.
    pub async fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\n").as_bytes()).await;
    }

    /// Sends bytes exactly as given.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        tokio::time::timeout(GUARD, self.stream.get_mut().write_all(bytes))
            .await
            .expect("write timed out")
            .expect("write");
    }

    /// Sends bytes exactly as given, for a test that expects the server may stop taking them.
    pub async fn try_send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.get_mut().write_all(bytes).await
    }

    /// Reads one line (without its `\n`); `None` at EOF.
    pub async fn try_line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(GUARD, self.stream.read_until(b'\n', &mut buf))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no line within the guard"))??;
        if n == 0 {
            return Ok(None);
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
        }
        Ok(Some(
            String::from_utf8(buf).expect("server sent invalid UTF-8"),
        ))
    }

    /// Reads one line; fails the test at EOF or on a timeout.
    pub async fn line(&mut self) -> String {
        match self.try_line().await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("expected a line, got EOF"),
            Err(e) => panic!("expected a line, got {e}"),
        }
    }

    /// Sends one request and returns its (first) reply line.
    pub async fn req(&mut self, line: &str) -> String {
        self.send(line).await;
        self.line().await
    }

    /// Reads one line and checks it.
    pub async fn expect(&mut self, want: &str) {
        assert_eq!(self.line().await, want);
    }

    /// Reads one line and checks it starts with `prefix`.
    pub async fn expect_prefix(&mut self, prefix: &str) -> String {
        let line = self.line().await;
        assert!(
            line.starts_with(prefix),
            "{line:?} should start with {prefix:?}"
        );
        line
    }

    /// Sends a LOCK that must be granted at once; returns the token.
    pub async fn lock(&mut self, args: &str) -> u64 {
        let reply = self.req(&format!("LOCK {args}")).await;
        token(&reply)
    }

    /// Asserts the server closed the connection cleanly (EOF, nothing more).
    pub async fn expect_eof(&mut self) {
        match self.try_line().await {
            Ok(None) => {}
            Ok(Some(line)) => panic!("expected EOF, got {line:?}"),
            Err(e) => panic!("expected EOF, got {e}"),
        }
    }

    /// Asserts the connection is closed: EOF or a reset both count (the server closed with
    /// unread input, so the kernel may answer with a reset).
    pub async fn expect_closed(&mut self) {
        let mut sink = [0u8; 64 * 1024];
        loop {
            match tokio::time::timeout(GUARD, self.stream.read(&mut sink)).await {
                Err(_) => panic!("connection still open after the guard"),
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Reads to the end of the connection: the lines before it, and whether it ended with a
    /// reset rather than a clean EOF. Fails the test if it is still open after the guard.
    pub async fn read_to_end(&mut self) -> (Vec<String>, bool) {
        let mut data = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        let reset = loop {
            match tokio::time::timeout(GUARD, self.stream.read(&mut buf)).await {
                Err(_) => panic!("connection still open after the guard"),
                Ok(Ok(0)) => break false,
                Ok(Ok(n)) => data.extend_from_slice(&buf[..n]),
                Ok(Err(_)) => break true,
            }
        };
        let text = String::from_utf8_lossy(&data);
        (text.lines().map(str::to_owned).collect(), reset)
    }

    /// Closes our sending side; the server sees end of input.
    pub async fn shutdown_write(&mut self) {
        self.stream.get_mut().shutdown().await.expect("shutdown");
    }

    /// Drops the connection with a reset instead of a FIN.
    pub fn reset(self) {
        self.stream().set_zero_linger().expect("SO_LINGER 0");
        drop(self);
    }
}

/// The token of an `OK <token>` reply.
pub fn token(reply: &str) -> u64 {
    reply
        .strip_prefix("OK ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("expected OK <token>, got {reply:?}"))
}

/// The value of `key=` in a reply line.
pub fn field(line: &str, key: &str) -> Option<String> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
}

/// The exact STATUS line of a held lock, with `ttl_ms` blanked as `*` (it counts down).
pub fn status_shape(line: &str) -> String {
    line.split(' ')
        .map(|w| {
            if w.starts_with("ttl_ms=") {
                "ttl_ms=*"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Polls `STATUS <name>` on `conn` until `done` accepts the reply; fails after the guard.
pub async fn wait_status(conn: &mut Raw, name: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let line = conn.req(&format!("STATUS {name}")).await;
        if done(&line) {
            return line;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "STATUS {name} never got there; last {line:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls until the lock `name` has exactly `n` waiters.
pub async fn wait_waiters(conn: &mut Raw, name: &str, n: usize) -> String {
    let want = n.to_string();
    wait_status(conn, name, |l| {
        field(l, "waiters").as_deref() == Some(&*want)
    })
    .await
}

/// Checks one `EVENT <kind> <name> <id> <token> <unix-ms>` line; returns its unix-ms.
pub fn assert_event(line: &str, kind: &str, name: &str, id: &str, token: u64) -> u64 {
    let prefix = format!("EVENT {kind} {name} {id} {token} ");
    let ms = line
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{line:?} should start with {prefix:?}"));
    let ms: u64 = ms
        .parse()
        .unwrap_or_else(|_| panic!("unix-ms of {line:?} is not a number"));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Wall clock, for people: only check that it is today's, not how exact.
    assert!(
        ms.abs_diff(now) < 3_600_000,
        "unix-ms {ms} is far from {now}"
    );
    ms
}

/// The real `lockd` binary as a child process listening on 127.0.0.1:0, its log collected.
/// Killed when dropped.
pub struct LockdProcess {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// Starts `lockd --listen 127.0.0.1:0 <args>` (no `LOCKD_*` variables from the test's
/// environment) and waits until it logs the address it listens on.
pub fn spawn_lockd(args: &[&str]) -> LockdProcess {
    try_spawn_lockd_at("127.0.0.1:0", args)
        .unwrap_or_else(|log| panic!("lockd did not start: {log:?}"))
}

/// [`spawn_lockd`] on a chosen `--listen` address, for a caller that must come back on the
/// same port after a crash ([`etcd::LockdFrontEnd`]). A lockd that exits before it listens
/// (its port was taken meanwhile) is an `Err` with its log, so the caller can pick another
/// port instead of failing the test.
pub fn try_spawn_lockd_at(listen: &str, args: &[&str]) -> Result<LockdProcess, Vec<String>> {
    try_spawn_lockd_with(listen, args, &[])
}

/// [`try_spawn_lockd_at`] with extra environment variables (say, libfaketime's).
pub fn try_spawn_lockd_with(
    listen: &str,
    args: &[&str],
    env: &[(String, String)],
) -> Result<LockdProcess, Vec<String>> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockd"));
    cmd.args(["--listen", listen])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, _) in std::env::vars() {
        if key.starts_with("LOCKD_") {
            cmd.env_remove(key);
        }
    }
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
                if line.contains("listening") {
                    if let Some(addr) =
                        field(&line, "addr").filter(|a| a.parse::<SocketAddr>().is_ok())
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

/// `GET path` over HTTP/1.1; the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    try_http_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// [`http_get`], for a server that may be going away.
pub async fn try_http_get(addr: std::net::SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: lockd\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut raw = String::new();
    tokio::time::timeout(GUARD, s.read_to_string(&mut raw))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer"))??;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response");
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}
