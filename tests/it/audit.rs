//! The audit trail against the real binary with an auth file: every grant, release, expiry,
//! session end, denial and failed login is one log line that says who (`user`) and from where
//! (`peer`, the client's `ip:port`: here the test's own side of each connection), read back
//! from lockd's stderr as JSON; a failed login's text line is what the fail2ban filter in
//! `contrib/fail2ban/` matches; and a lease brought back from `--data-dir` still says who
//! took it, when and from where; in cluster mode (feature `etcd`), every front-end shows and
//! logs them.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::{LockdProcess, Raw, GUARD};
use lockd::auth::user_line;
use serde_json::Value;
use tokio::time::Instant;

const ALICE: &str = "alice-secret-0123456789abcdef-audit";
const BOB: &str = "bob-secret-0123456789abcdef-audit";
const MALLORY: &str = "mallory-secret-0123456789abcdef-audit";

/// alice and mallory may lock and read everything; bob may only read.
fn users_file(dir: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("lockd-audit-{dir}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let line = |spec: &str, secret: &str| user_line(spec, secret, [7; 16]).unwrap();
    let users = [
        line("alice lock=* read=*", ALICE),
        line("bob read=*", BOB),
        line("mallory lock=* read=*", MALLORY),
    ];
    let file = dir.join("users");
    std::fs::write(&file, users.join("\n")).unwrap();
    (dir, file)
}

/// A connection logged in as `user`, and its own address (what lockd logs as `peer`).
async fn login(lockd: &LockdProcess, user: &str, secret: &str) -> (Raw, SocketAddr) {
    let mut c = lockd.raw().await;
    let me = c.stream().local_addr().unwrap();
    assert_eq!(
        c.req(&format!("AUTH {user} {secret}")).await,
        format!("OK {user}")
    );
    (c, me)
}

/// lockd's JSON log lines so far whose `message` is `message`.
fn lines_of(lockd: &LockdProcess, message: &str) -> Vec<Value> {
    lockd
        .log()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == message)
        .collect()
}

/// The JSON log lines with `message` that `pick` accepts, once there are `n` of them (polled
/// up to the guard; a few more moments then, so that a duplicate would show too).
async fn wait_lines(
    lockd: &LockdProcess,
    message: &str,
    n: usize,
    pick: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let give_up = Instant::now() + GUARD;
    loop {
        let found: Vec<Value> = lines_of(lockd, message).into_iter().filter(&pick).collect();
        if found.len() >= n {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return lines_of(lockd, message).into_iter().filter(pick).collect();
        }
        assert!(
            Instant::now() < give_up,
            "never {n} {message:?} lines: {:#?}",
            lockd.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The one line about `token` with `message`: asserts it has this `user` and `peer`.
async fn one_line(
    lockd: &LockdProcess,
    message: &str,
    token: u64,
    user: &str,
    peer: SocketAddr,
) -> Value {
    let lines = wait_lines(lockd, message, 1, |v| v["token"] == token).await;
    assert_eq!(
        lines.len(),
        1,
        "one {message:?} line for {token}: {lines:#?}"
    );
    let line = lines.into_iter().next().unwrap();
    assert_eq!(line["user"], user, "{line}");
    assert_eq!(line["peer"], peer.to_string(), "{line}");
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_ends_denials_and_failed_logins_say_who_and_from_where() {
    let (dir, file) = users_file("trail");
    let lockd = common::Lockd::new()
        .args(["--auth-file", file.to_str().unwrap()])
        .args(["-v", "--log-format", "json"])
        .spawn();

    // A grant at once and its release; a waiter granted when it is released.
    let (mut alice, alice_at) = login(&lockd, "alice", ALICE).await;
    let (mut mallory, mallory_at) = login(&lockd, "mallory", MALLORY).await;
    let t1 = alice.lock("deploy-prod job-7 ttl=1m").await;
    mallory.send("LOCK deploy-prod m").await;
    common::wait_waiters(&mut alice, "deploy-prod", 1).await;

    // Denials: a right bob lacks, and another user's lease (mallory knows its token).
    let (mut bob, bob_at) = login(&lockd, "bob", BOB).await;
    let denied = bob.req("LOCK deploy-prod b").await;
    assert!(denied.starts_with("ERR DENIED"), "{denied}");
    let (mut mallory2, mallory2_at) = login(&lockd, "mallory", MALLORY).await;
    let denied = mallory2.req(&format!("UNLOCK deploy-prod {t1}")).await;
    assert!(denied.starts_with("ERR DENIED"), "{denied}");

    assert_eq!(alice.req(&format!("UNLOCK deploy-prod {t1}")).await, "OK");
    let t2 = common::token(&mallory.line().await);

    let granted = one_line(&lockd, "granted", t1, "alice", alice_at).await;
    assert_eq!(
        (&granted["name"], &granted["id"], &granted["waited_ms"]),
        (
            &Value::from("deploy-prod"),
            &Value::from("job-7"),
            &Value::from(0)
        )
    );
    let released = one_line(&lockd, "released", t1, "alice", alice_at).await;
    assert!(released["held_ms"].is_u64(), "{released}");
    let handed = one_line(&lockd, "granted", t2, "mallory", mallory_at).await;
    assert!(handed["waited_ms"].is_u64(), "{handed}");

    let denials = wait_lines(&lockd, "denied", 2, |_| true).await;
    assert_eq!(denials.len(), 2, "{denials:#?}");
    assert_eq!(denials[0]["user"], "bob", "{denials:#?}");
    assert_eq!(denials[0]["peer"], bob_at.to_string(), "{denials:#?}");
    assert_eq!(denials[0]["name"], "deploy-prod", "{denials:#?}");
    assert_eq!(denials[1]["user"], "mallory", "{denials:#?}");
    assert_eq!(denials[1]["peer"], mallory2_at.to_string(), "{denials:#?}");
    assert_eq!(denials[1]["token"], t1, "{denials:#?}");

    // A plain lease outlives its connection: its expiry still names who took it.
    let (mut short, short_at) = login(&lockd, "alice", ALICE).await;
    let t3 = short.lock("cron short ttl=300ms").await;
    drop(short);
    let expired = one_line(&lockd, "lease expired", t3, "alice", short_at).await;
    assert_eq!(expired["name"], "cron", "{expired}");
    one_line(&lockd, "granted", t3, "alice", short_at).await;

    // A session lease ends with its connection.
    let (mut session, session_at) = login(&lockd, "mallory", MALLORY).await;
    let t4 = session.lock("sess s session").await;
    drop(session);
    one_line(
        &lockd,
        "session closed, released",
        t4,
        "mallory",
        session_at,
    )
    .await;

    // A wrong secret, then a request before AUTH.
    let mut guess = lockd.raw().await;
    let guess_at = guess.stream().local_addr().unwrap();
    let wrong = guess.req("AUTH alice not-the-secret-0123456789").await;
    assert!(wrong.starts_with("ERR DENIED"), "{wrong}");
    let failed = wait_lines(&lockd, "authentication failed", 1, |_| true).await;
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["peer"], guess_at.to_string(), "{failed:#?}");
    assert_eq!(failed[0]["ip"], guess_at.ip().to_string(), "{failed:#?}");
    assert_eq!(failed[0]["user"], "alice", "{failed:#?}");
    assert_eq!(failed[0]["failures"], 1, "{failed:#?}");
    let mut anonymous = lockd.raw().await;
    let anonymous_at = anonymous.stream().local_addr().unwrap();
    let refused = anonymous.req("LOCK x y").await;
    assert!(refused.starts_with("ERR NOAUTH"), "{refused}");
    let before_auth = wait_lines(&lockd, "refused before AUTH", 1, |_| true).await;
    assert_eq!(before_auth.len(), 1, "{before_auth:#?}");
    assert_eq!(before_auth[0]["peer"], anonymous_at.to_string());
    // The wrong AUTH is an `authentication failed` line only, not a denial too.
    assert_eq!(lines_of(&lockd, "denied").len(), 2, "{:#?}", lockd.log());

    // The secrets stay out of it all.
    let log = lockd.stop();
    for secret in [ALICE, BOB, MALLORY, "not-the-secret-0123456789"] {
        assert!(!log.iter().any(|l| l.contains(secret)), "{secret} logged");
    }
    drop((bob, mallory2));
    let _ = std::fs::remove_dir_all(dir);
}

/// The sample filter's two patterns, with fail2ban's `<HOST>` taken as the address.
fn fail2ban_patterns() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/fail2ban/lockd.conf");
    let conf = std::fs::read_to_string(path).unwrap();
    let patterns: Vec<String> = conf
        .lines()
        .map(str::trim)
        .map(|l| l.strip_prefix("failregex =").unwrap_or(l).trim())
        .filter(|l| l.contains("<HOST>"))
        .map(str::to_owned)
        .collect();
    assert_eq!(patterns.len(), 2, "{conf}");
    patterns
}

/// Whether `line` matches `pattern` of the sample filter, which is written with only
/// `^.*`, `\b`, `<HOST>`, `\S+` and literal text, so the test needs no regex engine: the
/// literal around `<HOST>` must be in the line with the address in its place.
fn matches_filter(pattern: &str, line: &str, ip: &str) -> bool {
    let literal = pattern
        .trim_start_matches("^.*")
        .trim_start_matches("\\b")
        .replace("\\S+", "");
    let (before, after) = literal.split_once("<HOST>").unwrap();
    line.contains(&format!("{before}{ip}{after}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_login_is_one_line_the_fail2ban_filter_matches_in_both_formats() {
    let (dir, file) = users_file("fail2ban");
    let patterns = fail2ban_patterns();
    for format in ["text", "json"] {
        let lockd = common::Lockd::new()
            .args(["--auth-file", file.to_str().unwrap()])
            .args(["--log-format", format])
            .spawn();
        let mut c = lockd.raw().await;
        let ip = c.stream().local_addr().unwrap().ip().to_string();
        // A name that looks like an address can't pose as the client's: it comes after.
        let wrong = c.req("AUTH ip=10.9.9.9 not-the-secret-0123456789").await;
        assert!(wrong.starts_with("ERR DENIED"), "{wrong}");
        let give_up = Instant::now() + GUARD;
        let line = loop {
            let log = lockd.log();
            if let Some(l) = log.iter().find(|l| l.contains("authentication failed")) {
                break l.clone();
            }
            assert!(Instant::now() < give_up, "no failed login logged: {log:#?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // Logged at the default level, once.
        let log = lockd.stop();
        let failed = log.iter().filter(|l| l.contains("authentication failed"));
        assert_eq!(failed.count(), 1, "{format}: {log:#?}");
        assert!(
            patterns.iter().any(|p| matches_filter(p, &line, &ip)),
            "{format}: {line} matches none of {patterns:?}"
        );
        assert!(
            !patterns
                .iter()
                .any(|p| matches_filter(p, &line, "10.9.9.9")),
            "{format}: the name posed as the address: {line}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The HOLDER line of `name`'s detail.
async fn holder_line(c: &mut Raw, name: &str) -> String {
    c.send(&format!("STATUS {name} detail")).await;
    let holder = c.line().await;
    let status = c.line().await;
    assert!(holder.starts_with("HOLDER "), "{holder} / {status}");
    assert!(status.starts_with(&format!("OK {name} held")), "{status}");
    holder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_restored_from_the_data_dir_still_says_who_took_it_when_and_from_where() {
    let (dir, file) = users_file("restart");
    let data = dir.join("data");
    let port = common::free_port();
    let start = || {
        common::Lockd::new()
            .listen(format!("127.0.0.1:{port}"))
            .data_dir(&data)
            .args(["--auth-file", file.to_str().unwrap()])
            .spawn()
    };
    let lockd = start();
    let (mut alice, alice_at) = login(&lockd, "alice", ALICE).await;
    let t = alice.lock("deploy-prod job-7 ttl=5m").await;
    let before = holder_line(&mut alice, "deploy-prod").await;
    assert!(before.contains(&format!(" token={t} ")), "{before}");
    assert!(before.contains(" user=alice "), "{before}");
    assert!(before.ends_with(&format!(" peer={alice_at}")), "{before}");
    let granted = common::field(&before, "granted").expect("granted=");
    drop(alice);
    lockd.stop();

    let lockd = start();
    let (mut alice, _) = login(&lockd, "alice", ALICE).await;
    let after = holder_line(&mut alice, "deploy-prod").await;
    assert!(after.contains(" user=alice "), "{after}");
    assert_eq!(common::field(&after, "granted"), Some(granted), "{after}");
    assert!(after.ends_with(&format!(" peer={alice_at}")), "{after}");
    assert_eq!(alice.req(&format!("UNLOCK deploy-prod {t}")).await, "OK");
    lockd.stop();
    let _ = std::fs::remove_dir_all(dir);
}

/// The JSON lines with `message` about `token` in the logs of all of `front_ends`.
#[cfg(feature = "etcd")]
fn lines_about(front_ends: &[&LockdProcess], message: &str, token: u64) -> Vec<Value> {
    let of = |fe: &&LockdProcess| lines_of(fe, message);
    let lines = front_ends.iter().flat_map(of);
    lines.filter(|v| v["token"] == token).collect()
}

/// In cluster mode the holder's record in etcd carries its user and address: a grant made on
/// one front-end shows them in every front-end's STATUS, and a waiter granted by another
/// front-end's release is logged once, with its own user and address.
#[cfg(feature = "etcd")]
#[test]
fn in_cluster_mode_every_front_end_says_who_took_a_lease() {
    if !crate::common::needs::have(crate::common::needs::Need::Etcd) {
        return;
    }
    use common::etcd::{EtcdCluster, LockdFrontEnd};
    let (dir, file) = users_file("cluster");
    // The harness's etcd and front-ends block: they start and stop outside the runtime.
    let etcd = EtcdCluster::start(1);
    let front_end = || {
        let lockd = common::Lockd::new()
            .etcd(&etcd.endpoints(), &etcd.prefix())
            .args(["--auth-file", file.to_str().unwrap()])
            .args(["-v", "--log-format", "json"]);
        LockdFrontEnd::of(lockd)
    };
    let (fe1, fe2) = (front_end(), front_end());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(cluster_trail(fe1.process(), fe2.process()));
    drop((fe1, fe2, etcd));
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "etcd")]
async fn cluster_trail(p1: &LockdProcess, p2: &LockdProcess) {
    let (mut alice, alice_at) = login(p1, "alice", ALICE).await;
    let (mut mallory, mallory_at) = login(p2, "mallory", MALLORY).await;
    let t1 = alice.lock("deploy-prod job-7 ttl=1m").await;
    for p in [p1, p2] {
        let (mut bob, _) = login(p, "bob", BOB).await;
        let give_up = Instant::now() + GUARD;
        let line = loop {
            bob.send("STATUS deploy-prod detail").await;
            let first = bob.line().await;
            if first.starts_with("HOLDER ") {
                bob.line().await;
                break first;
            }
            assert!(Instant::now() < give_up, "never held: {first}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(line.contains(&format!(" token={t1} ")), "{line}");
        assert!(line.contains(" user=alice granted="), "{line}");
        assert!(line.ends_with(&format!(" peer={alice_at}")), "{line}");
    }
    mallory.send("LOCK deploy-prod m").await;
    common::wait_waiters(&mut alice, "deploy-prod", 1).await;
    assert_eq!(alice.req(&format!("UNLOCK deploy-prod {t1}")).await, "OK");
    let t2 = common::token(&mallory.line().await);

    let give_up = Instant::now() + GUARD;
    while lines_about(&[p1, p2], "granted", t2).is_empty()
        || lines_about(&[p1, p2], "released", t1).is_empty()
    {
        assert!(Instant::now() < give_up, "{:#?} {:#?}", p1.log(), p2.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (message, token, user, peer) in [
        ("granted", t1, "alice", alice_at),
        ("released", t1, "alice", alice_at),
        ("granted", t2, "mallory", mallory_at),
    ] {
        let lines = lines_about(&[p1, p2], message, token);
        assert_eq!(
            lines.len(),
            1,
            "one {message:?} line for {token}: {lines:#?}"
        );
        assert_eq!(lines[0]["user"], user, "{lines:#?}");
        assert_eq!(lines[0]["peer"], peer.to_string(), "{lines:#?}");
    }
    drop((alice, mallory));
}
