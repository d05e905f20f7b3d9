//! Authentication and rights (`--auth-file`) over real sockets: AUTH before anything else,
//! wrong secrets slowed down and cut off, each right and each refusal, STATUS and WATCH
//! showing only what a user may read, leases that only their own user may renew or release
//! (a token read from STATUS is not enough, nor naming the holder's id), SIGHUP reloads of
//! the real binary, and secrets that never reach the log.

use crate::common;

mod durable;
mod web;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{field, token, Lockd, Raw, TestServer, GUARD};
use lockd::auth::{user_line, Gate, Users};

const ALICE: &str = "alice-secret-0123456789abcdef";
const BOB: &str = "bob-secret-0123456789abcdef";
const CAROL: &str = "carol-secret-0123456789abcdef";
const MALLORY: &str = "mallory-secret-0123456789abcdef";

/// alice may lock build* and deploy and read everything; bob may only read deploy; carol may
/// lock everything and read nothing; mallory may lock and read everything.
fn users_file() -> String {
    let line = |spec: &str, secret: &str| user_line(spec, secret, [3; 16]).unwrap();
    [
        "# test users".to_string(),
        line("alice lock=build*,deploy read=*", ALICE),
        line("bob read=deploy", BOB),
        line("carol lock=*", CAROL),
        line("mallory lock=* read=*", MALLORY),
    ]
    .join("\n")
}

/// A request and the start of its reply.
trait Ask {
    async fn expect_prefix_after(&mut self, line: &str, prefix: &str) -> String;
}

impl Ask for Raw {
    async fn expect_prefix_after(&mut self, line: &str, prefix: &str) -> String {
        self.send(line).await;
        self.expect_prefix(prefix).await
    }
}

async fn server() -> TestServer {
    let users = Users::parse(&users_file(), None).unwrap();
    Lockd::new()
        .config(lockd::server::Config {
            auth: Some(Gate::new(users)),
            ..common::config()
        })
        .serve()
        .await
}

/// A connection authenticated as `user`.
async fn login(addr: std::net::SocketAddr, user: &str, secret: &str) -> Raw {
    let mut c = Raw::connect(addr).await;
    assert_eq!(
        c.req(&format!("AUTH {user} {secret}")).await,
        format!("OK {user}")
    );
    c
}

#[tokio::test]
async fn only_ping_help_quit_and_auth_before_auth() {
    let s = server().await;
    let mut c = s.raw().await;
    for line in [
        "LOCK build me",
        "UNLOCK build 1",
        "RENEW build 1",
        "CHECK build 1",
        "STATUS",
        "STATUS build",
        "STATUS build detail",
        "WATCH",
        "WATCH build",
    ] {
        c.expect_prefix_after(line, "ERR NOAUTH ").await;
    }
    assert_eq!(c.req("PING").await, "OK PONG");
    c.expect_prefix_after("HELP", "OK commands:").await;
    // Nothing changed: the refused LOCK took nothing.
    assert_eq!(c.req(&format!("AUTH alice {ALICE}")).await, "OK alice");
    assert_eq!(c.req("STATUS build").await, "OK build free");
    // One user per connection.
    c.expect_prefix_after(
        &format!("AUTH alice {ALICE}"),
        "ERR DENIED already authenticated",
    )
    .await;
    assert_eq!(c.req("QUIT").await, "OK bye");
}

#[tokio::test]
async fn a_wrong_auth_is_slowed_and_the_third_closes_the_connection() {
    let s = server().await;
    let mut c = s.raw().await;
    for (user, secret) in [("alice", BOB), ("nobody", ALICE)] {
        let started = Instant::now();
        let reply = c.req(&format!("AUTH {user} {secret}")).await;
        assert_eq!(reply, "ERR DENIED bad user or secret");
        assert!(started.elapsed() >= lockd::AUTH_FAILURE_DELAY);
    }
    c.expect_prefix_after(
        "AUTH alice wrong-wrong-wrong-wrong",
        "ERR DENIED bad user or secret;",
    )
    .await;
    c.expect_eof().await;
    // Another connection starts afresh.
    login(s.addr, "alice", ALICE).await;
}

#[tokio::test]
async fn each_right_allows_its_commands_and_nothing_else() {
    let s = server().await;
    let mut alice = login(s.addr, "alice", ALICE).await;
    let mut bob = login(s.addr, "bob", BOB).await;
    let mut carol = login(s.addr, "carol", CAROL).await;

    // lock: LOCK, RENEW, UNLOCK on the names the patterns cover.
    let t = alice.lock("build-1 a").await;
    alice
        .expect_prefix_after(&format!("RENEW build-1 {t}"), "OK ttl_ms=")
        .await;
    assert_eq!(alice.req(&format!("UNLOCK build-1 {t}")).await, "OK");
    let deploy = alice.lock("deploy a").await;
    alice
        .expect_prefix_after(
            "LOCK deploy2 a",
            "ERR DENIED deploy2: user alice has no lock right",
        )
        .await;
    alice
        .expect_prefix_after("LOCK other a", "ERR DENIED other:")
        .await;

    // read: CHECK, STATUS, STATUS detail, WATCH on the names the patterns cover.
    bob.expect_prefix_after(&format!("CHECK deploy {deploy}"), "OK ttl_ms=")
        .await;
    bob.expect_prefix_after("STATUS deploy", "OK deploy held id=a")
        .await;
    bob.expect_prefix_after("STATUS deploy detail", "HOLDER deploy id=a")
        .await;
    bob.expect_prefix("OK deploy held").await;
    for line in [
        "STATUS build-1",
        "STATUS build-1 detail",
        "CHECK build-1 5",
        "WATCH build-1",
    ] {
        bob.expect_prefix_after(line, "ERR DENIED build-1: user bob has no read right")
            .await;
    }
    // read does not give lock.
    for line in [
        "LOCK deploy b wait=0".to_string(),
        format!("RENEW deploy {deploy}"),
        format!("UNLOCK deploy {deploy}"),
    ] {
        bob.expect_prefix_after(&line, "ERR DENIED deploy: user bob has no lock right")
            .await;
    }

    // lock does not give read.
    let c = carol.lock("anything c").await;
    carol
        .expect_prefix_after(
            &format!("CHECK anything {c}"),
            "ERR DENIED anything: user carol has no read right",
        )
        .await;
    carol
        .expect_prefix_after("STATUS anything", "ERR DENIED")
        .await;
    carol
        .expect_prefix_after("WATCH anything", "ERR DENIED")
        .await;
    // Without a name, STATUS shows what carol may read: nothing.
    assert_eq!(carol.req("STATUS").await, "OK 0");
    assert_eq!(carol.req(&format!("UNLOCK anything {c}")).await, "OK");

    // The refusals changed nothing.
    assert_eq!(
        alice.req(&format!("UNLOCK deploy {deploy}")).await,
        "OK",
        "bob's refused UNLOCK left alice's lease alone"
    );
}

#[tokio::test]
async fn status_and_watch_without_a_name_show_only_readable_names() {
    let s = server().await;
    let mut alice = login(s.addr, "alice", ALICE).await;
    let mut bob = login(s.addr, "bob", BOB).await;
    for name in ["build-1", "build-2", "deploy"] {
        alice.lock(&format!("{name} a")).await;
    }
    assert_eq!(alice.req("STATUS").await.split(' ').nth(1), Some("build-1"));
    alice.expect_prefix("INFO build-2").await;
    alice.expect_prefix("INFO deploy").await;
    alice.expect("OK 3").await;
    bob.expect_prefix_after("STATUS", "INFO deploy held id=a")
        .await;
    bob.expect("OK 1").await;

    let mut watcher = login(s.addr, "bob", BOB).await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");
    // Events of names bob can't read are not sent; the first he sees is deploy's.
    let t = alice.lock("build-3 a").await;
    assert_eq!(alice.req(&format!("UNLOCK build-3 {t}")).await, "OK");
    let deploy = field(&alice.req("STATUS deploy").await, "token").unwrap();
    assert_eq!(alice.req(&format!("UNLOCK deploy {deploy}")).await, "OK");
    common::assert_event(
        &watcher.line().await,
        "released",
        "deploy",
        "a",
        deploy.parse().unwrap(),
    );
}

/// A server, and a connection each for alice and for mallory, who may lock everything.
async fn alice_and_mallory() -> (TestServer, Raw, Raw) {
    let s = server().await;
    let alice = login(s.addr, "alice", ALICE).await;
    let mallory = login(s.addr, "mallory", MALLORY).await;
    (s, alice, mallory)
}

#[tokio::test]
async fn a_token_read_from_status_does_not_release_or_renew_another_users_lease() {
    let (_s, mut alice, mut mallory) = alice_and_mallory().await;
    let t = alice.lock("deploy alice-1 ttl=1m").await;
    let seen = mallory.req("STATUS deploy").await;
    assert_eq!(field(&seen, "token"), Some(t.to_string()));
    for line in [
        format!("UNLOCK deploy {t}"),
        format!("RENEW deploy {t} ttl=24h"),
    ] {
        mallory
            .expect_prefix_after(
                &line,
                "ERR DENIED deploy: that lease belongs to another user",
            )
            .await;
    }
    // CHECK is a read: it may look.
    mallory
        .expect_prefix_after(&format!("CHECK deploy {t}"), "OK ttl_ms=")
        .await;
    let status = alice.req("STATUS deploy").await;
    assert_eq!(field(&status, "token"), Some(t.to_string()));
    assert!(field(&status, "ttl_ms").unwrap().parse::<u64>().unwrap() <= 60_000);
    assert_eq!(alice.req(&format!("UNLOCK deploy {t}")).await, "OK");
}

#[tokio::test]
async fn naming_another_users_id_is_just_another_client() {
    let (s, mut alice, mut mallory) = alice_and_mallory().await;
    let t = alice.lock("deploy alice-1 session").await;
    // Not the holder's retry (no same token), not a CONFLICT: it waits like anyone else.
    mallory
        .expect_prefix_after(
            "LOCK deploy alice-1 wait=0",
            "ERR TIMEOUT deploy: held by alice-1",
        )
        .await;
    mallory.send("LOCK deploy alice-1").await;
    let mut watch = login(s.addr, "alice", ALICE).await;
    common::wait_waiters(&mut watch, "deploy", 1).await;
    // Alice's own retry still is hers, and does not replace mallory's wait.
    assert_eq!(alice.lock("deploy alice-1 session").await, t);
    assert_eq!(alice.req(&format!("UNLOCK deploy {t}")).await, "OK");
    let granted = token(&mallory.line().await);
    assert!(granted > t);
    alice
        .expect_prefix_after(&format!("UNLOCK deploy {granted}"), "ERR DENIED")
        .await;
}

#[tokio::test]
async fn auth_on_a_server_without_users_is_refused_and_changes_nothing() {
    let s = Lockd::new().config(common::config()).serve().await;
    let mut c = s.raw().await;
    c.expect_prefix_after(
        &format!("AUTH alice {ALICE}"),
        "ERR DENIED authentication is off",
    )
    .await;
    c.lock("x me").await;
}

// ---- The real binary ----

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockd-auth-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A scratch directory with [`users_file`] in it, and that file's path.
fn users_in(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let file = dir.join("users");
    std::fs::write(&file, users_file()).unwrap();
    (dir, file)
}

fn hangup(lockd: &common::LockdProcess) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe {
        libc::kill(lockd.pid() as libc::pid_t, libc::SIGHUP);
    }
}

/// Polls until `done` accepts the reply to `line` on `c`; fails after the guard.
async fn until(c: &mut Raw, line: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + GUARD;
    loop {
        let reply = c.req(line).await;
        if done(&reply) {
            return reply;
        }
        assert!(Instant::now() < deadline, "{line}: still {reply:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sighup_reloads_the_file_closes_removed_users_and_keeps_the_old_on_a_bad_one() {
    let (dir, file) = users_in("reload");
    let lockd = Lockd::new()
        .args(["--auth-file", file.to_str().unwrap(), "-v"])
        .spawn();
    let mut alice = login(lockd.addr, "alice", ALICE).await;
    let mut bob = login(lockd.addr, "bob", BOB).await;
    let mut mallory_waits = login(lockd.addr, "mallory", MALLORY).await;
    let t = alice.lock("deploy a").await;
    mallory_waits.send("LOCK deploy m").await;
    common::wait_waiters(&mut alice, "deploy", 1).await;
    let mut bob_watches = login(lockd.addr, "bob", BOB).await;
    assert_eq!(bob_watches.req("WATCH").await, "OK watching *");

    // bob and mallory go; alice may no longer lock deploy; dave arrives.
    let dave = "dave-secret-0123456789abcdef";
    let kept = [
        user_line("alice lock=build* read=*", ALICE, [4; 16]).unwrap(),
        user_line("dave lock=deploy", dave, [5; 16]).unwrap(),
    ];
    std::fs::write(&file, kept.join("\n")).unwrap();
    hangup(&lockd);
    for c in [&mut bob, &mut mallory_waits, &mut bob_watches] {
        let (lines, _) = c.read_to_end().await;
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("ERR DENIED user "), "{lines:?}");
        assert!(lines[0].ends_with(" was removed from the auth file; closing"));
    }
    let refused = format!("RENEW deploy {t}");
    until(&mut alice, &refused, |r| {
        r.starts_with("ERR DENIED deploy: user alice has no lock right")
    })
    .await;
    login(lockd.addr, "dave", dave).await;
    let mut gone = lockd.raw().await;
    gone.expect_prefix_after(&format!("AUTH bob {BOB}"), "ERR DENIED bad user or secret")
        .await;

    // A file that does not parse: logged, and the users loaded before stay in force.
    std::fs::write(
        &file,
        format!("{}\nuser eve plain-secret-in-the-hash-field", kept[0]),
    )
    .unwrap();
    hangup(&lockd);
    let deadline = Instant::now() + GUARD;
    while !lockd
        .log()
        .iter()
        .any(|l| l.contains("auth file not reloaded"))
    {
        assert!(
            Instant::now() < deadline,
            "no reload error logged: {:?}",
            lockd.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    login(lockd.addr, "dave", dave).await;
    let log = lockd.stop();
    let error = log
        .iter()
        .find(|l| l.contains("auth file not reloaded"))
        .unwrap();
    assert!(error.contains("line 2"), "{error}");
    assert!(!log
        .iter()
        .any(|l| l.contains("plain-secret-in-the-hash-field")));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn secrets_never_reach_the_log() {
    let (dir, file) = users_in("log");
    let lockd = Lockd::new()
        .args(["--auth-file", file.to_str().unwrap(), "-vv"])
        .spawn();
    let wrong = "wrong-secret-that-must-not-be-logged";
    let mut c = lockd.raw().await;
    c.expect_prefix_after(&format!("AUTH alice {wrong}"), "ERR DENIED")
        .await;
    c.expect_prefix_after(
        &format!("AUTH alice {wrong} extra"),
        "ERR SYNTAX usage: AUTH",
    )
    .await;
    assert_eq!(c.req(&format!("AUTH alice {ALICE}")).await, "OK alice");
    c.lock("build-1 a").await;
    let log = lockd.stop();
    assert!(
        log.iter().any(|l| l.contains("authentication failed")),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l.contains("authenticated")), "{log:?}");
    for secret in [wrong, ALICE] {
        assert!(
            !log.iter().any(|l| l.contains(secret)),
            "{secret} in {log:?}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn compat_with_an_auth_file_refuses_to_start_unless_told() {
    let (dir, file) = users_in("compat");
    let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .args(["--listen", "127.0.0.1:0", "--compat", "--auth-file"])
        .arg(&file)
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--compat-no-auth"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn auth_hash_new_prints_a_line_that_works_and_the_secret_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .args(["--auth-hash-new", "erin lock=ci-* read=*"])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let secret = stderr.trim().rsplit(' ').next().unwrap().to_string();
    assert_eq!(secret.len(), 64, "{stderr}");
    assert!(!line.contains(&secret));
    assert!(line.starts_with("user erin sha256:"));
    let users = Users::parse(&line, None).unwrap();
    let s = Lockd::new()
        .config(lockd::server::Config {
            auth: Some(Gate::new(users)),
            ..common::config()
        })
        .serve()
        .await;
    let mut c = login(s.addr, "erin", &secret).await;
    c.lock("ci-7 e").await;

    // --auth-secret-out: the secret alone in a new file only its owner reads, nothing on
    // stderr; an existing file is refused, and so is a right typed wrong, by its word.
    let dir = std::env::temp_dir().join(format!("lockd-secret-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("erin.secret");
    let new = |spec: &str| {
        Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--auth-hash-new", spec, "--auth-secret-out"])
            .arg(&file)
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = new("erin lock=ci-*");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written.trim().len(), 64, "{written}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .starts_with("user erin sha256:"));
    let again = new("erin lock=ci-*");
    assert_eq!(again.status.code(), Some(2), "{again:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), written);
    std::fs::remove_file(&file).unwrap();
    let wrong = new("erin lock=ci-* lok=x");
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains("word 3 of the user and rights given"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // --auth-hash reads the secret from standard input, and refuses a short one.
    let hash = |secret: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--auth-hash", "frank"])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(secret.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = hash(&format!("{ALICE}\n"));
    assert!(out.status.success());
    let users = Users::parse(&String::from_utf8(out.stdout).unwrap(), None).unwrap();
    assert!(users.authenticate("frank", ALICE).is_some());
    let out = hash("short\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"));
}

/// `systemctl reload` sends SIGHUP: without an auth file there is nothing to reload, and lockd
/// must go on serving (SIGHUP's default action would end it).
#[tokio::test]
async fn sighup_without_an_auth_file_changes_nothing() {
    let lockd = common::Lockd::new().args(["-v"]).spawn();
    let mut c = lockd.raw().await;
    let t = token(&c.req("LOCK kept me ttl=1m").await);
    hangup(&lockd);
    until(&mut c, "PING", |r| r == "OK PONG").await;
    // The log says so, and the lock is still held.
    let deadline = Instant::now() + GUARD;
    while !lockd.log().iter().any(|l| l.contains("nothing to reload")) {
        assert!(Instant::now() < deadline, "no log line for the SIGHUP");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = c.req("STATUS kept").await;
    assert!(status.contains(&format!("token={t}")), "{status}");
}
