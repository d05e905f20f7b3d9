//! Shared by the lockctl tests: a real lockd on 127.0.0.1:0 in the test's process, lockctl
//! as a child process exactly as a user runs it, and a proxy that breaks the network between
//! them.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd::client::Client;
use lockd::server::Config;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

use super::TestServer;

/// Only a guard against a hung test; nothing here should come close.
pub const GUARD: Duration = Duration::from_secs(30);

/// A lockd on a free loopback port ([`super::Lockd::serve_on`]) with helpers for lockctl
/// tests; stopped when dropped.
pub struct Server {
    pub addr: String,
    server: TestServer,
}

pub async fn lockd() -> Server {
    lockd_on(TcpListener::bind("127.0.0.1:0").await.unwrap())
}

/// A lockd serving `listener`.
pub fn lockd_on(listener: TcpListener) -> Server {
    let server = super::Lockd::new()
        .config(Config::default())
        .serve_on(listener);
    Server {
        addr: server.addr.to_string(),
        server,
    }
}

impl Server {
    pub async fn client(&self) -> Client {
        Client::connect(&self.addr).await.unwrap()
    }

    /// `lockctl` aimed at this server.
    pub fn lockctl(&self, args: &[&str]) -> Command {
        lockctl_at(&self.addr, args)
    }

    /// What `STATUS <name>` answers.
    pub async fn status_line(&self, name: &str) -> String {
        let mut lines = self.client().await.status(Some(name)).await.unwrap();
        lines.remove(0)
    }

    /// The token of the holder of `name`, if held.
    pub async fn holder(&self, name: &str) -> Option<u64> {
        let line = self.status_line(name).await;
        lockd::proto::field(&line, "token").map(|t| t.parse().unwrap())
    }

    pub async fn wait_free(&self, name: &str) {
        let give_up = Instant::now() + GUARD;
        while self.holder(name).await.is_some() {
            assert!(Instant::now() < give_up, "{name} never freed");
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls STATUS until `name` has `n` waiters.
    pub async fn wait_waiters(&self, name: &str, n: u64) {
        let give_up = Instant::now() + GUARD;
        loop {
            let line = self
                .client()
                .await
                .status(Some(name))
                .await
                .unwrap()
                .remove(0);
            if lockd::proto::field(&line, "waiters") == Some(&n.to_string()) {
                return;
            }
            assert!(Instant::now() < give_up, "never {n} waiters: {line}");
            sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn wait_held(&self, name: &str) -> u64 {
        let give_up = Instant::now() + GUARD;
        loop {
            if let Some(t) = self.holder(name).await {
                return t;
            }
            assert!(Instant::now() < give_up, "{name} never held");
            sleep(Duration::from_millis(20)).await;
        }
    }
}

pub fn lockctl_at(addr: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    cmd.args(args)
        .env("LOCKD_ADDR", addr)
        .env("LOCKCTL", env!("CARGO_BIN_EXE_lockctl"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

pub async fn output(mut cmd: Command) -> Output {
    let out = timeout(GUARD, cmd.output()).await.expect("lockctl hung");
    out.unwrap()
}

pub fn spawn(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

pub async fn finish(child: Child) -> Output {
    timeout(GUARD, child.wait_with_output())
        .await
        .expect("lockctl hung")
        .unwrap()
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A scratch directory of this test's own.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockctl-test-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub async fn wait_for_file(path: &Path) -> String {
    let give_up = Instant::now() + GUARD;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(Instant::now() < give_up, "{} never written", path.display());
        sleep(Duration::from_millis(20)).await;
    }
}

pub fn signal(child: &Child, sig: i32) {
    let pid = child.id().unwrap() as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// What lockctl writes to stderr, line by line.
pub type StderrLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>;

/// Reads stderr lines until one contains `needle`; returns it.
pub async fn line_with(lines: &mut StderrLines, needle: &str) -> String {
    let mut seen = String::new();
    loop {
        match timeout(GUARD, lines.next_line()).await {
            Ok(Ok(Some(line))) if line.contains(needle) => return line,
            Ok(Ok(Some(line))) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            other => panic!("no line with {needle:?} ({other:?}); saw:\n{seen}"),
        }
    }
}

pub fn stderr_lines(child: &mut Child) -> StderrLines {
    tokio::io::BufReader::new(child.stderr.take().unwrap()).lines()
}

/// Forwards connections to lockd, until told to break the network between the two.
pub struct Proxy {
    pub addr: String,
    silent: Arc<AtomicBool>,
    refuse: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
}

pub async fn proxy(to: String) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let silent = Arc::new(AtomicBool::new(false));
    let refuse = Arc::new(AtomicBool::new(false));
    let (cut, cuts) = watch::channel(0);
    let (flag, refusing) = (Arc::clone(&silent), Arc::clone(&refuse));
    tokio::spawn(async move {
        while let Ok((a, _)) = listener.accept().await {
            if refusing.load(Ordering::SeqCst) {
                continue;
            }
            let Ok(b) = TcpStream::connect(&to).await else {
                continue;
            };
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            tokio::spawn(pipe(ar, bw, Arc::clone(&flag), cuts.clone()));
            tokio::spawn(pipe(br, aw, Arc::clone(&flag), cuts.clone()));
        }
    });
    Proxy {
        addr,
        silent,
        refuse,
        cut,
    }
}

impl Proxy {
    /// From now on passes nothing and closes nothing, like a network partition: the server
    /// sees no close.
    pub fn go_silent(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }

    /// Closes every connection that passes through now, on both sides (a firewall resetting
    /// them); new ones pass as before.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Whether new connections are closed as soon as they are accepted (a server that stays
    /// unreachable).
    pub fn refuse(&self, on: bool) {
        self.refuse.store(on, Ordering::SeqCst);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
    mut cut: watch::Receiver<u64>,
) {
    cut.borrow_and_update();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = cut.changed() => return,
        };
        if silent.load(Ordering::SeqCst) {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if silent.load(Ordering::SeqCst) {
        // Keep both ends open: a partition sends no FIN.
        std::future::pending::<()>().await;
    }
}

/// Running, and not a zombie waiting for a reaper.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// The pid a test's command wrote to `path` (`echo $$ > path`).
pub async fn read_pid(path: &Path) -> i32 {
    let text = wait_for_file(path).await;
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}: not a pid: {text:?}", path.display()))
}

/// Polls until none of `pids` is alive; the unix-ms when that was first seen (no earlier than
/// the last of them died).
pub async fn wait_dead(pids: &[i32]) -> u128 {
    let give_up = Instant::now() + GUARD;
    while pids.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < give_up, "still alive: {pids:?}");
        sleep(Duration::from_millis(5)).await;
    }
    now_ms()
}

/// The server's unix-ms of the next `kind` event on a watch connection (`WATCH` sent), of
/// holder `id` if given.
pub async fn event_at(watch: &mut Client, kind: &str, id: Option<&str>) -> u128 {
    loop {
        let line = timeout(GUARD, watch.read_line()).await.unwrap().unwrap();
        let w: Vec<&str> = line.split(' ').collect();
        if w.get(1) == Some(&kind) && id.is_none_or(|id| w.get(3) == Some(&id)) {
            return w[5].parse().unwrap();
        }
    }
}

/// The token in one of lockctl's `-v` lines (`lockctl: acquired NAME token N (...)`).
pub fn token_after(line: &str) -> u64 {
    line.split("token ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
}
