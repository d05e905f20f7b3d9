//! BREAK, an operator's force-release: the next waiter is granted with a higher token, one
//! token of a semaphore or every holder of a shared lock, the broken holder's RENEW, CHECK
//! and UNLOCK say who broke it, the `broken` event with `by=`, the counter, the audit line,
//! the `admin` right (and its reload), a break that a `--data-dir` restart keeps, and
//! `lockctl break` and `lockctl run` whose lease is broken.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::lockctl::{code, finish, lockctl_at, output, spawn, stderr, stdout};
use common::{Lockd, LockdProcess, Raw, GUARD};
use lockd::auth::user_line;
use serde_json::Value;
use tokio::time::Instant;

const OPS: &str = "ops-secret-0123456789abcdef-breaks";
const DEV: &str = "dev-secret-0123456789abcdef-breaks";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockd-breaks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `ERR NOTHELD <name>: lease <token> was broken by <who> at <unix-ms>`: asserts its shape
/// and returns the time.
fn assert_broken(reply: &str, name: &str, token: u64, who: &str) -> u64 {
    let want = format!("ERR NOTHELD {name}: lease {token} was broken by {who} at ");
    let at = reply
        .strip_prefix(&want)
        .unwrap_or_else(|| panic!("{reply:?} is not {want:?}<ms>"));
    at.parse().unwrap_or_else(|_| panic!("{reply:?}: no time"))
}

/// Polls until `done` accepts the reply to `line`.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_hands_an_exclusive_lock_on_with_a_higher_token_and_says_who() {
    let metrics = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let lockd = Lockd::new()
        .args(["-v", "--log-format", "json"])
        .args(["--metrics-listen", &metrics.to_string()])
        .spawn();
    let mut watch = lockd.raw().await;
    assert_eq!(watch.req("WATCH deploy").await, "OK watching deploy");
    let mut holder = lockd.raw().await;
    let t1 = holder.lock("deploy stuck ttl=1m").await;
    common::assert_event(&watch.line().await, "acquired", "deploy", "stuck", t1);
    let mut waiter = lockd.raw().await;
    waiter.send("LOCK deploy next ttl=1m").await;
    common::wait_waiters(&mut holder, "deploy", 1).await;

    let mut operator = lockd.raw().await;
    let by = operator.stream().local_addr().unwrap().to_string();
    assert_eq!(operator.req("BREAK deploy force").await, "OK broken=1");
    let t2 = common::token(&waiter.line().await);
    assert!(t2 > t1, "{t2} after {t1}");

    // The trace: `broken` with who, then the next holder's `acquired`.
    let broken = watch.line().await;
    let fixed = broken.split(" by=").next().unwrap_or_default();
    common::assert_event(fixed, "broken", "deploy", "stuck", t1);
    assert!(broken.ends_with(&format!(" by={by}")), "{broken}");
    common::assert_event(&watch.line().await, "acquired", "deploy", "next", t2);

    // The broken holder is told, by each request it may make.
    let renewed = holder.req(&format!("RENEW deploy {t1}")).await;
    let at = assert_broken(&renewed, "deploy", t1, &by);
    assert!(at > 1_600_000_000_000, "{renewed}");
    assert_broken(
        &holder.req(&format!("CHECK deploy {t1}")).await,
        "deploy",
        t1,
        &by,
    );
    assert_broken(
        &holder.req(&format!("UNLOCK deploy {t1}")).await,
        "deploy",
        t1,
        &by,
    );
    // The new holder is untouched.
    assert!(waiter
        .req(&format!("CHECK deploy {t2}"))
        .await
        .starts_with("OK ttl_ms="));

    // The counter, and the audit line.
    let (status, body) = common::http_get(metrics, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.lines().any(|l| l == "lockd_breaks_total 1"), "{body}");
    assert!(
        body.lines()
            .any(|l| l == r#"lockd_releases_total{kind="broken"} 1"#),
        "{body}"
    );
    let line = log_line(&lockd, "lock broken").await;
    assert_eq!(line["name"], "deploy", "{line}");
    assert_eq!(line["id"], "stuck", "{line}");
    assert_eq!(line["token"], t1, "{line}");
    assert_eq!(line["holder_user"], "-", "{line}");
    assert_eq!(line["by_user"], "-", "{line}");
    assert_eq!(line["by_peer"], by, "{line}");
}

/// The first JSON log line with `message`, polled for up to the guard.
async fn log_line(lockd: &LockdProcess, message: &str) -> Value {
    let give_up = Instant::now() + GUARD;
    loop {
        let found = lockd
            .log()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["message"] == message);
        if let Some(line) = found {
            return line;
        }
        assert!(
            Instant::now() < give_up,
            "no {message:?}: {:#?}",
            lockd.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_of_a_semaphore_or_every_holder_of_a_shared_lock() {
    let lockd = Lockd::new().spawn();
    let mut p = lockd.raw().await;
    let mut q = lockd.raw().await;
    let mut w = lockd.raw().await;
    let tp = p.lock("pool p limit=2").await;
    let tq = q.lock("pool q limit=2").await;
    w.send("LOCK pool w limit=2").await;
    common::wait_waiters(&mut p, "pool", 1).await;
    let mut op = lockd.raw().await;
    assert_eq!(
        op.req(&format!("BREAK pool {tp} force")).await,
        "OK broken=1"
    );
    let tw = common::token(&w.line().await);
    assert!(tw > tq, "{tw} after {tq}");
    assert!(q
        .req(&format!("CHECK pool {tq}"))
        .await
        .starts_with("OK ttl_ms="));
    assert!(p
        .req(&format!("RENEW pool {tp}"))
        .await
        .starts_with("ERR NOTHELD pool: lease"));
    // That token again: it is not a live lease any more, and the answer says why.
    let who = op.stream().local_addr().unwrap().to_string();
    assert_broken(
        &op.req(&format!("BREAK pool {tp} force")).await,
        "pool",
        tp,
        &who,
    );

    // Every holder of a shared lock, at once; the name is free after.
    let mut s1 = lockd.raw().await;
    let mut s2 = lockd.raw().await;
    let t1 = s1.lock("docs a shared").await;
    let t2 = s2.lock("docs b shared").await;
    assert_eq!(op.req("BREAK docs force").await, "OK broken=2");
    assert_eq!(op.req("STATUS docs").await, "OK docs free");
    assert_broken(&s1.req(&format!("RENEW docs {t1}")).await, "docs", t1, &who);
    assert_broken(&s2.req(&format!("CHECK docs {t2}")).await, "docs", t2, &who);
    // A new holder's token is above every broken one.
    let t3 = s1.lock("docs c").await;
    assert!(t3 > t2, "{t3} after {t2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_to_break_and_bad_breaks() {
    let lockd = Lockd::new().spawn();
    let mut c = lockd.raw().await;
    assert_eq!(
        c.req("BREAK nobody force").await,
        "ERR NOTHELD nobody: nothing holds it"
    );
    let t = c.lock("held me").await;
    let wrong = c.req(&format!("BREAK held {}", t + 100)).await;
    assert!(wrong.starts_with("ERR NOTHELD held: "), "{wrong}");
    // The right name matters too: a token of another name is not this one's.
    let other = c.req(&format!("BREAK elsewhere {t} force")).await;
    assert!(other.starts_with("ERR NOTHELD elsewhere: "), "{other}");
    assert_eq!(
        c.req("BREAK").await,
        "ERR SYNTAX usage: BREAK <name> [<token>] [force]"
    );
    assert_eq!(
        c.req("BREAK a 1 2").await,
        "ERR SYNTAX usage: BREAK <name> [<token>] [force]"
    );
    let bad = c.req("BREAK a x").await;
    assert!(bad.starts_with("ERR BADARG "), "{bad}");
    let zero = c.req("BREAK a 0").await;
    assert!(zero.starts_with("ERR BADARG "), "{zero}");
    // Still held: none of these broke anything.
    assert!(c
        .req(&format!("CHECK held {t}"))
        .await
        .starts_with("OK ttl_ms="));
}

fn users(dir: &std::path::Path, dev_admin: bool) -> PathBuf {
    let line = |spec: &str, secret: &str| user_line(spec, secret, [3; 16]).unwrap();
    let dev = if dev_admin {
        "dev lock=* read=* admin=*"
    } else {
        "dev lock=* read=*"
    };
    let file = dir.join("users");
    std::fs::write(
        &file,
        [line("ops admin=deploy*", OPS), line(dev, DEV)].join("\n"),
    )
    .unwrap();
    file
}

async fn login(lockd: &LockdProcess, user: &str, secret: &str) -> Raw {
    let mut c = lockd.raw().await;
    assert_eq!(
        c.req(&format!("AUTH {user} {secret}")).await,
        format!("OK {user}")
    );
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_needs_the_admin_right_which_is_neither_lock_nor_read_and_reloads() {
    let dir = scratch("auth");
    let file = users(&dir, false);
    let lockd = Lockd::new()
        .args(["--auth-file", file.to_str().unwrap()])
        .args(["-v", "--log-format", "json"])
        .spawn();
    let mut dev = login(&lockd, "dev", DEV).await;
    let t = dev.lock("deploy-web dev-job ttl=1m").await;
    assert_eq!(
        dev.req("BREAK deploy-web force").await,
        "ERR DENIED deploy-web: user dev has no admin right on it"
    );
    let mut ops = login(&lockd, "ops", OPS).await;
    // admin is not lock or read, nor admin on names outside its patterns.
    assert_eq!(
        ops.req("LOCK deploy-web ops").await,
        "ERR DENIED deploy-web: user ops has no lock right on it"
    );
    assert_eq!(
        ops.req("STATUS deploy-web").await,
        "ERR DENIED deploy-web: user ops has no read right on it"
    );
    assert_eq!(
        ops.req("BREAK build force").await,
        "ERR DENIED build: user ops has no admin right on it"
    );
    assert_eq!(ops.req("BREAK deploy-web force").await, "OK broken=1");
    // With users, who broke it is the user; the audit line names both users.
    let line = log_line(&lockd, "lock broken").await;
    assert_eq!(line["holder_user"], "dev", "{line}");
    assert_eq!(line["by_user"], "ops", "{line}");
    assert_eq!(line["token"], t, "{line}");
    assert_broken(
        &dev.req(&format!("RENEW deploy-web {t}")).await,
        "deploy-web",
        t,
        "ops",
    );

    // A reload gives dev the right.
    let t = dev.lock("build dev-job ttl=1m").await;
    std::fs::write(&file, std::fs::read_to_string(users(&dir, true)).unwrap()).unwrap();
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe {
        libc::kill(lockd.pid() as libc::pid_t, libc::SIGHUP);
    }
    let reply = until(&mut dev, &format!("BREAK build {t} force"), |r| {
        !r.starts_with("ERR DENIED")
    })
    .await;
    assert_eq!(reply, "OK broken=1");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_is_durable_the_lease_stays_gone_and_its_renew_says_broken() {
    let dir = scratch("durable");
    let data = dir.join("data");
    let lockd = Lockd::new().data_dir(&data).spawn();
    let mut holder = lockd.raw().await;
    let t = holder.lock("nightly stuck ttl=5m").await;
    let mut op = lockd.raw().await;
    let who = op.stream().local_addr().unwrap().to_string();
    assert_eq!(op.req("BREAK nightly force").await, "OK broken=1");
    drop((holder, op));
    lockd.stop();

    let lockd = Lockd::new().data_dir(&data).spawn();
    let mut c = lockd.raw().await;
    assert_eq!(c.req("STATUS nightly").await, "OK nightly free");
    assert_broken(
        &c.req(&format!("RENEW nightly {t}")).await,
        "nightly",
        t,
        &who,
    );
    assert_broken(
        &c.req(&format!("CHECK nightly {t}")).await,
        "nightly",
        t,
        &who,
    );
    let next = c.lock("nightly again").await;
    assert!(next > t, "{next} after {t}");
    lockd.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without `force` the broken lease keeps its place, across a kill -9 and restart too, until
/// its holder lets go: the waiter is granted only then, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_waits_for_its_holder_to_let_go_and_a_restart_keeps_it_broken() {
    let dir = scratch("waits");
    let data = dir.join("data");
    let lockd = Lockd::new().data_dir(&data).spawn();
    let mut holder = lockd.raw().await;
    let t = holder.lock("nightly stuck ttl=5m").await;
    let mut waiter = lockd.raw().await;
    waiter.send("LOCK nightly next ttl=1m").await;
    common::wait_waiters(&mut holder, "nightly", 1).await;
    let mut op = lockd.raw().await;
    let who = op.stream().local_addr().unwrap().to_string();
    assert_eq!(op.req("BREAK nightly").await, "OK broken=1");
    assert_broken(
        &holder.req(&format!("RENEW nightly {t}")).await,
        "nightly",
        t,
        &who,
    );
    // Still in its place: the waiter waits, STATUS shows the broken lease, and lockctl says
    // it is letting go.
    let status = op.req("STATUS nightly").await;
    assert!(status.contains(&format!(" token={t} ")), "{status}");
    let out = output(lockctl_at(&lockd.addr.to_string(), &["status", "nightly"])).await;
    assert!(
        stdout(&out).contains("letting go (broken or lock-delay)"),
        "{}",
        stdout(&out)
    );
    assert_eq!(op.req("BREAK nightly").await, "OK broken=1");
    drop((holder, op, waiter));
    lockd.kill();

    let lockd = Lockd::new().data_dir(&data).spawn();
    let mut c = lockd.raw().await;
    let status = c.req("STATUS nightly").await;
    assert!(status.contains(&format!(" token={t} ")), "{status}");
    assert_broken(
        &c.req(&format!("CHECK nightly {t}")).await,
        "nightly",
        t,
        &who,
    );
    let mut next = lockd.raw().await;
    next.send("LOCK nightly next ttl=1m").await;
    common::wait_waiters(&mut c, "nightly", 1).await;
    // Its holder's UNLOCK lets go; the waiter is granted, with a higher token.
    assert_eq!(c.req(&format!("UNLOCK nightly {t}")).await, "OK");
    let granted = common::token(&next.line().await);
    assert!(granted > t, "{granted} after {t}");
    lockd.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_break_asks_unless_y_and_says_what_it_did() {
    let lockd = Lockd::new().spawn();
    let addr = lockd.addr.to_string();
    let mut holder = lockd.raw().await;
    let t = holder.lock("release-train stuck ttl=1m").await;

    // Not at a terminal (stdin is /dev/null here) and no -y: refused, nothing broken.
    let out = output(lockctl_at(&addr, &["break", "release-train"])).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("give -y"), "{}", stderr(&out));
    assert!(holder
        .req(&format!("CHECK release-train {t}"))
        .await
        .starts_with("OK ttl_ms="));

    let token = t.to_string();
    let out = output(lockctl_at(
        &addr,
        &["break", "release-train", "--token", &token, "-y", "--force"],
    ))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Confirmed in one line, -y or not.
    assert!(
        stderr(&out).contains("lockctl: broke release-train (1 lease ended; handed on now)"),
        "{}",
        stderr(&out)
    );
    assert!(holder
        .req(&format!("RENEW release-train {t}"))
        .await
        .starts_with("ERR NOTHELD release-train: lease"));

    // Nothing left to break: exit 4.
    let out = output(lockctl_at(&addr, &["break", "release-train", "-y"])).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("NOTHELD"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_run_whose_lease_is_broken_stops_its_command_and_says_by_whom() {
    let lockd = Lockd::new().spawn();
    let addr = lockd.addr.to_string();
    let dir = scratch("run");
    let marker = dir.join("still-running");
    let script = format!(
        "while :; do touch {}; sleep 0.1; done",
        marker.to_str().unwrap()
    );
    let child = spawn(lockctl_at(
        &addr,
        &["run", "deploy-prod", "--ttl", "3s", "-c", &script],
    ));
    let mut op = lockd.raw().await;
    until(&mut op, "STATUS deploy-prod", |r| r.contains(" held ")).await;
    let who = op.stream().local_addr().unwrap().to_string();
    assert_eq!(op.req("BREAK deploy-prod").await, "OK broken=1");
    let out = tokio::time::timeout(GUARD, finish(child))
        .await
        .expect("lockctl run did not stop");
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("was broken by {who} at ")), "{err}");
    // The command is stopped: it touches its file no more.
    let _ = std::fs::remove_file(&marker);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "the command still runs");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_leases_are_remembered_until_their_deadline_and_at_most_max_locks() {
    let lockd = Lockd::new().args(["--max-locks", "2"]).spawn();
    let mut c = lockd.raw().await;
    let who = c.stream().local_addr().unwrap().to_string();
    let plain =
        |name: &str| format!("ERR NOTHELD {name}: token is not the current holder's live lease");
    // Three breaks, two remembered: the oldest is forgotten first.
    let a = c.lock("a me ttl=1m").await;
    assert_eq!(c.req("BREAK a force").await, "OK broken=1");
    let b = c.lock("b me ttl=1m").await;
    assert_eq!(c.req("BREAK b force").await, "OK broken=1");
    let d = c.lock("d me ttl=1m").await;
    assert_eq!(c.req("BREAK d force").await, "OK broken=1");
    assert_eq!(c.req(&format!("RENEW a {a}")).await, plain("a"));
    assert_broken(&c.req(&format!("RENEW b {b}")).await, "b", b, &who);
    assert_broken(&c.req(&format!("RENEW d {d}")).await, "d", d, &who);
    // A token of another name is not that name's broken lease.
    assert_eq!(c.req(&format!("CHECK b {d}")).await, plain("b"));

    // Past the deadline the lease had, the plain answer it would have had anyway.
    let e = c.lock("e me ttl=1s").await;
    assert_eq!(c.req("BREAK e force").await, "OK broken=1");
    let reply = until(&mut c, &format!("CHECK e {e}"), |r| {
        !r.contains("was broken")
    })
    .await;
    assert_eq!(reply, plain("e"));
}

/// `lockctl <args>` in a pseudo-terminal (through `script(1)`): what is written to the
/// child's stdin is typed at that terminal.
fn at_terminal(addr: &str, args: &str) -> std::process::Child {
    let lockctl = env!("CARGO_BIN_EXE_lockctl");
    let line = format!("exec {lockctl} --server {addr} {args}");
    std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script(1) must be installed (util-linux; CI installs bsdutils)")
}

#[test]
fn lockctl_break_at_a_terminal_shows_the_holder_and_breaks_only_on_yes() {
    use common::needs::{have, Need};
    if !have(Need::Script) {
        return;
    }
    let lockd = common::blocking::Server::start();
    let addr = lockd.addr.to_string();
    let held = lockd.request("LOCK tty-deploy stuck-job ttl=1m");
    let token = common::token(&held);
    let question = format!("break tty-deploy held by stuck-job (token {token})? [y/N]");

    let out = common::blocking::finish(at_terminal(&addr, "break tty-deploy"), "n\n", GUARD);
    assert_eq!(out.code(), Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&question), "{}", out.stdout);
    assert_eq!(lockd.holder_token("tty-deploy"), Some(token));

    let out =
        common::blocking::finish(at_terminal(&addr, "break tty-deploy --force"), "y\n", GUARD);
    assert_eq!(out.code(), Some(0), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains(&question), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("broke tty-deploy (1 lease ended; handed on now)"),
        "{}",
        out.stdout
    );
    assert_eq!(lockd.holder_token("tty-deploy"), None);

    // --token names that lease's holder, not the first one.
    lockd.request("LOCK tty-docs first shared ttl=1m");
    let second = common::token(&lockd.request("LOCK tty-docs second shared ttl=1m"));
    let args = format!("break tty-docs --token {second} --force");
    let out = common::blocking::finish(at_terminal(&addr, &args), "y\n", GUARD);
    assert_eq!(out.code(), Some(0), "{}{}", out.stdout, out.stderr);
    let question = format!("break tty-docs held by second (token {second})? [y/N]");
    assert!(out.stdout.contains(&question), "{}", out.stdout);
    assert_eq!(lockd.holders("tty-docs"), 1);
}
