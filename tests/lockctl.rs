//! lockctl against a real lockd: the server runs in-process on 127.0.0.1:0, lockctl as a child
//! process, exactly as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd::client::Client;
use lockd::proto::Tie;
use lockd::server::{self, Config};
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

/// Only a guard against a hung test; nothing here should come close.
const GUARD: Duration = Duration::from_secs(30);

/// A lockd on a free loopback port, stopped when dropped.
struct Lockd {
    addr: String,
    stop: CancellationToken,
}

impl Drop for Lockd {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn lockd() -> Lockd {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    tokio::spawn(server::run(Config::default(), listener, stop.clone()));
    Lockd { addr, stop }
}

impl Lockd {
    async fn client(&self) -> Client {
        Client::connect(&self.addr).await.unwrap()
    }

    /// `lockctl` aimed at this server.
    fn lockctl(&self, args: &[&str]) -> Command {
        lockctl_at(&self.addr, args)
    }

    /// The token of the holder of `name`, if held.
    async fn holder(&self, name: &str) -> Option<u64> {
        let line = self
            .client()
            .await
            .status(Some(name))
            .await
            .unwrap()
            .remove(0);
        lockd::proto::field(&line, "token").map(|t| t.parse().unwrap())
    }

    async fn wait_free(&self, name: &str) {
        let give_up = Instant::now() + GUARD;
        while self.holder(name).await.is_some() {
            assert!(Instant::now() < give_up, "{name} never freed");
            sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_held(&self, name: &str) -> u64 {
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

fn lockctl_at(addr: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    cmd.args(args)
        .env("LOCKD_ADDR", addr)
        .env("LOCKCTL", env!("CARGO_BIN_EXE_lockctl"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: Command) -> Output {
    let out = timeout(GUARD, cmd.output()).await.expect("lockctl hung");
    out.unwrap()
}

fn spawn(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

async fn finish(child: Child) -> Output {
    timeout(GUARD, child.wait_with_output())
        .await
        .expect("lockctl hung")
        .unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A scratch directory of this test's own.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockctl-test-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn wait_for_file(path: &Path) -> String {
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

fn signal(child: &Child, sig: i32) {
    let pid = child.id().unwrap() as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_of_the_command_is_passed_through() {
    let d = lockd().await;
    let out = output(d.lockctl(&["run", "job", "--", "sh", "-c", "exit 7"])).await;
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    let out = output(d.lockctl(&["run", "job", "-c", "kill -KILL $$"])).await;
    assert_eq!(code(&out), 128 + 9);
    let out = output(d.lockctl(&["run", "job", "--", "true"])).await;
    assert_eq!(code(&out), 0);
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    assert_eq!(d.holder("job").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_sees_its_token() {
    let d = lockd().await;
    let script = r#"echo "$LOCKD_NAME $LOCKD_TOKEN"; "$LOCKCTL" status "$LOCKD_NAME" --json"#;
    let out = output(d.lockctl(&["run", "tok", "-c", script])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    let first: Vec<&str> = lines.next().unwrap().split(' ').collect();
    assert_eq!(first[0], "tok");
    let token: u64 = first[1].parse().unwrap();
    let status = lines.next().unwrap();
    assert!(status.contains(&format!(r#""token":{token},"#)), "{status}");
    assert!(status.contains(r#""session":true"#), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_runs_never_overlap() {
    let d = lockd().await;
    let dir = scratch("overlap");
    let log = dir.join("log");
    let script = format!(
        "echo start $$ >> {0}; sleep 0.05; echo end $$ >> {0}",
        log.display()
    );
    let children: Vec<Child> = (0..8)
        .map(|_| spawn(d.lockctl(&["run", "shared", "-c", &script])))
        .collect();
    for child in children {
        let out = finish(child).await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 16, "{text}");
    for pair in lines.chunks(2) {
        let (start, end) = (pair[0], pair[1]);
        assert!(start.starts_with("start "), "{text}");
        assert_eq!(start.replacen("start", "end", 1), end, "overlap:\n{text}");
    }
    assert_eq!(d.holder("shared").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonblock_gives_the_conflict_code_and_runs_nothing() {
    let d = lockd().await;
    let dir = scratch("nonblock");
    let ran = dir.join("ran");
    let mut holder = d.client().await;
    holder
        .lock("busy", "other", None, None, Tie::Plain)
        .await
        .unwrap();
    let touch = format!("touch {}", ran.display());
    // The lock stays held for the whole test: returning at all shows -n did not wait.
    let out = output(d.lockctl(&["run", "busy", "-n", "-c", &touch])).await;
    assert_eq!(code(&out), 1);
    assert!(out.stderr.is_empty(), "flock is silent: {}", stderr(&out));
    let out = output(d.lockctl(&["run", "busy", "-n", "-E", "75", "-c", &touch])).await;
    assert_eq!(code(&out), 75);
    let out = output(d.lockctl(&["acquire", "busy", "-n"])).await;
    assert_eq!(code(&out), 1);
    assert!(!ran.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_gives_up_after_its_time() {
    let d = lockd().await;
    let dir = scratch("wait");
    let ran = dir.join("ran");
    let mut holder = d.client().await;
    holder
        .lock("busy", "other", None, None, Tie::Plain)
        .await
        .unwrap();
    let touch = format!("touch {}", ran.display());
    let started = Instant::now();
    let out = output(d.lockctl(&["run", "busy", "-w", "300ms", "-v", "-c", &touch])).await;
    assert_eq!(code(&out), 1);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(stderr(&out).contains("held by other"), "{}", stderr(&out));
    assert!(!ran.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_reaches_the_command_and_the_lock_is_released_after() {
    let d = lockd().await;
    let dir = scratch("sigterm");
    let (ready, got) = (dir.join("ready"), dir.join("got"));
    let script = format!(
        "trap 'echo term > {got}; exit 3' TERM; echo ready > {ready}; sleep 60 & wait",
        got = got.display(),
        ready = ready.display()
    );
    let child = spawn(d.lockctl(&["run", "sig", "-c", &script]));
    wait_for_file(&ready).await;
    assert!(d.holder("sig").await.is_some());
    signal(&child, libc::SIGTERM);
    let out = finish(child).await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "term\n");
    assert_eq!(d.holder("sig").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_away_stops_the_command() {
    let d = lockd().await;
    let dir = scratch("lost");
    let (ready, got) = (dir.join("ready"), dir.join("got"));
    // The command ignores SIGTERM, so only the SIGKILL after the grace period stops it.
    let script = format!(
        "trap 'echo term > {got}' TERM; echo ready > {ready}; while :; do sleep 0.05; done",
        got = got.display(),
        ready = ready.display()
    );
    let child = spawn(d.lockctl(&[
        "run",
        "lost",
        "--ttl",
        "3s",
        "--kill-grace",
        "200ms",
        "-c",
        &script,
    ]));
    wait_for_file(&ready).await;
    let token = d.wait_held("lost").await;
    d.client().await.unlock("lost", token).await.unwrap();
    let out = finish(child).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("lock lost: lost token"), "{err}");
    assert!(err.contains(&token.to_string()), "{err}");
    assert!(err.contains("NOTHELD"), "{err}");
    let ours = err.lines().filter(|l| l.starts_with("lockctl:")).count();
    assert_eq!(ours, 1, "{err}");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "term\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_warn_lets_the_command_finish() {
    let d = lockd().await;
    let dir = scratch("warn");
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let script = format!(
        "echo ready > {ready}; while [ ! -e {go} ]; do sleep 0.05; done; exit 6",
        ready = ready.display(),
        go = go.display()
    );
    let child = spawn(d.lockctl(&[
        "run",
        "warned",
        "--ttl",
        "1s",
        "--on-lost",
        "warn",
        "-c",
        &script,
    ]));
    wait_for_file(&ready).await;
    let token = d.wait_held("warned").await;
    d.client().await.unlock("warned", token).await.unwrap();
    // The warning comes with the next renewal; the command carries on until told to stop.
    sleep(Duration::from_millis(800)).await;
    std::fs::write(&go, "").unwrap();
    let out = finish(child).await;
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: lock lost"),
        "{}",
        stderr(&out)
    );
}

/// Forwards connections to lockd until told to go silent; then it holds every connection open
/// and passes nothing, like a network partition, so the server sees no close.
struct Partition {
    addr: String,
    silent: Arc<AtomicBool>,
}

async fn partition(to: String) -> Partition {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let silent = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&silent);
    tokio::spawn(async move {
        while let Ok((a, _)) = listener.accept().await {
            let Ok(b) = TcpStream::connect(&to).await else {
                continue;
            };
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            tokio::spawn(pipe(ar, bw, Arc::clone(&flag)));
            tokio::spawn(pipe(br, aw, Arc::clone(&flag)));
        }
    });
    Partition { addr, silent }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
) {
    use tokio::io::AsyncWriteExt as _;
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrenewable_lease_stops_the_command_before_the_server_could_expire_it() {
    let d = lockd().await;
    let p = partition(d.addr.clone()).await;
    let mut watch = d.client().await;
    watch.watch(Some("part")).await.unwrap();
    let dir = scratch("partition");
    let ready = dir.join("ready");
    // The command ignores SIGTERM: only the SIGKILL before the deadline stops it.
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let child = spawn(lockctl_at(
        &p.addr,
        &[
            "run",
            "part",
            "--ttl",
            "4s",
            "--connect-timeout",
            "1s",
            "-c",
            &script,
        ],
    ));
    let pid: i32 = wait_for_file(&ready).await.trim().parse().unwrap();
    p.silent.store(true, Ordering::SeqCst);
    let give_up = Instant::now() + GUARD;
    while alive(pid) {
        assert!(Instant::now() < give_up, "the command was never stopped");
        sleep(Duration::from_millis(5)).await;
    }
    let stopped_at = now_ms();
    let out = finish(child).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("could not renew"), "{}", stderr(&out));
    // The server, which never saw the connection close, lets the lease expire only now.
    let mut expired_at = None;
    while expired_at.is_none() {
        let line = timeout(GUARD, watch.read_line()).await.unwrap().unwrap();
        let w: Vec<&str> = line.split(' ').collect();
        if w.get(1) == Some(&"expired") {
            expired_at = w.get(5).and_then(|ms| ms.parse::<u128>().ok());
        }
    }
    let expired_at = expired_at.unwrap();
    assert!(
        stopped_at < expired_at,
        "command outlived the lease: stopped at {stopped_at}, expired at {expired_at}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_lockctl_kills_the_command_and_frees_the_lock() {
    let d = lockd().await;
    let dir = scratch("sigkill");
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut child = spawn(d.lockctl(&["run", "killed", "-c", &script]));
    let pid: i32 = wait_for_file(&pidfile).await.trim().parse().unwrap();
    d.wait_held("killed").await;
    signal(&child, libc::SIGKILL);
    let _ = child.wait().await;
    let give_up = Instant::now() + GUARD;
    while alive(pid) {
        assert!(Instant::now() < give_up, "the command outlived lockctl");
        sleep(Duration::from_millis(20)).await;
    }
    d.wait_free("killed").await;
}

/// Running, and not a zombie waiting for a reaper.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_holds_the_lock_until_the_test_passes() {
    let d = lockd().await;
    let dir = scratch("until");
    let done = dir.join("done");
    let test = format!("test -e {}", done.display());
    let child = spawn(d.lockctl(&[
        "run", "async", "--until", &test, "--poll", "50ms", "--", "true",
    ]));
    d.wait_held("async").await;
    // The command has long exited; the test keeps failing, so the lock stays held.
    sleep(Duration::from_millis(300)).await;
    assert!(d.holder("async").await.is_some());
    std::fs::write(&done, "").unwrap();
    let out = finish(child).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.holder("async").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_round_trip() {
    let d = lockd().await;
    let out = output(d.lockctl(&["acquire", "deploy", "--ttl", "1m", "--id", "ci-42"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token: u64 = stdout(&out).trim().parse().unwrap();
    // A plain lease: it outlives lockctl.
    assert_eq!(d.holder("deploy").await, Some(token));
    let t = token.to_string();
    let out = output(d.lockctl(&["renew", "deploy", &t, "--ttl", "2m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = output(d.lockctl(&["release", "deploy", &t])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.holder("deploy").await, None);
    let out = output(d.lockctl(&["release", "deploy", &t])).await;
    assert_eq!(code(&out), 4);
    assert!(stderr(&out).contains("NOTHELD"), "{}", stderr(&out));
    let out = output(d.lockctl(&["renew", "deploy", &t])).await;
    assert_eq!(code(&out), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_a_table_and_json() {
    let d = lockd().await;
    let mut c = d.client().await;
    let token = c
        .lock(
            "db",
            "h\"x",
            Some(Duration::from_secs(60)),
            None,
            Tie::Plain,
        )
        .await
        .unwrap();
    let out = output(d.lockctl(&["status", "--json"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout(&out);
    let prefix = format!(r#"[{{"name":"db","held":true,"id":"h\"x","token":{token},"ttl_ms":"#);
    assert!(json.starts_with(&prefix), "{json}");
    assert!(
        json.trim_end()
            .ends_with(r#","session":false,"waiters":0}]"#),
        "{json}"
    );
    let ttl: u64 = json[prefix.len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ttl <= 60_000);

    let out = output(d.lockctl(&["status", "free-one", "--json"])).await;
    assert_eq!(stdout(&out).trim(), r#"{"name":"free-one","held":false}"#);

    let out = output(d.lockctl(&["status"])).await;
    let table = stdout(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    assert!(
        lines[1].starts_with("db ") && lines[1].contains(&token.to_string()),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_events_until_interrupted() {
    let d = lockd().await;
    let mut child = spawn(d.lockctl(&["watch", "w"]));
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut c = d.client().await;
    // The watch may not be registered yet: keep making events until two lines show up.
    let give_up = Instant::now() + GUARD;
    while seen.lines().count() < 2 {
        assert!(Instant::now() < give_up, "no events: {seen:?}");
        let token = c.lock("w", "me", None, None, Tie::Plain).await.unwrap();
        c.unlock("w", token).await.unwrap();
        let mut buf = [0u8; 1024];
        if let Ok(Ok(n)) = timeout(Duration::from_millis(200), stdout.read(&mut buf)).await {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    assert!(seen.contains(" acquired w id=me token="), "{seen}");
    signal(&child, libc::SIGINT);
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_exit_3_naming_the_address() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let out = output(lockctl_at(
        &addr,
        &["run", "x", "--connect-timeout", "300ms", "--", "true"],
    ))
    .await;
    assert_eq!(code(&out), 3);
    let err = stderr(&out);
    assert!(err.starts_with("lockctl: cannot reach lockd at "), "{err}");
    assert!(err.contains(&addr), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_and_help() {
    let out = output(lockctl_at("127.0.0.1:1", &["run", "x"])).await;
    assert_eq!(code(&out), 2);
    let out = output(lockctl_at("127.0.0.1:1", &["run", "--help"])).await;
    assert_eq!(code(&out), 0);
    let help = stdout(&out);
    for needle in [
        "Exit codes:",
        "-E, --conflict-exit-code",
        "--until",
        "128+N",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    let out = output(lockctl_at(
        "127.0.0.1:1",
        &["run", "bad name", "--", "true"],
    ))
    .await;
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("whitespace"), "{}", stderr(&out));
}
