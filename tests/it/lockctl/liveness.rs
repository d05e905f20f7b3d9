//! A lockctl that is gone never holds a lock, and a connection that drops under a running
//! command does not cost it the lock: `acquire`'s `detach` wait and `run`'s session grace,
//! with real processes and a proxy that breaks the network between lockctl and lockd.
//!
//! These need the server's `detach` and `session=<dur>` LOCK options (issue 10).

use crate::common;

use std::time::Duration;

use lockd::client::Client;
use lockd::proto::Tie;
use tokio::time::{sleep, timeout, Instant};

use common::lockctl::*;

/// A CI job cancelled while `lockctl acquire` waits (SIGTERM, or SIGKILL) leaves the queue:
/// when the holder releases, the lock goes to the next waiter, not to the job that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_killed_while_waiting_never_gets_the_lock() {
    let d = lockd().await;
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        let mut holder = d.client().await;
        let t = holder
            .lock("ci", "holder", None, None, Tie::Plain)
            .await
            .unwrap();
        let mut cancelled = spawn(d.lockctl(&["acquire", "ci", "--ttl", "30m", "--id", "gone"]));
        d.wait_waiters("ci", 1).await;
        signal(&cancelled, sig);
        let _ = timeout(GUARD, cancelled.wait()).await.unwrap();
        // It leaves the queue at once. (Waiting for that keeps the test to what lockctl does:
        // a release at the very moment of the kill is the server's race to win.)
        d.wait_waiters("ci", 0).await;
        let next = spawn(d.lockctl(&["acquire", "ci", "--ttl", "30m", "--id", "next"]));
        d.wait_waiters("ci", 1).await;
        holder.unlock("ci", t).await.unwrap();
        // Were the lock the killed job's, `next` would wait 30 minutes.
        let out = finish(next).await;
        assert_eq!(code(&out), 0, "signal {sig}: {}", stderr(&out));
        let token: u64 = stdout(&out).trim().parse().unwrap();
        let line = d.client().await.status(Some("ci")).await.unwrap().remove(0);
        assert_eq!(lockd::proto::field(&line, "id"), Some("next"), "{line}");
        d.client().await.unlock("ci", token).await.unwrap();
    }
}

/// A connection reset under a running command (a firewall, say): lockctl reconnects and
/// renews within the session grace, the lease lives on with its token, the command runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_rides_out_a_dropped_connection_within_the_grace() {
    let d = lockd().await;
    let p = proxy(d.addr.clone()).await;
    let dir = scratch("grace-ride");
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let script = format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done",
        ready.display(),
        go.display()
    );
    let args = [
        "-v",
        "run",
        "ride",
        "--ttl",
        "30s",
        "--session-grace",
        "2s",
        "-c",
        &script,
    ];
    let mut child = spawn(lockctl_at(&p.addr, &args));
    let mut err = stderr_lines(&mut child);
    let pid: i32 = wait_for_file(&ready).await.trim().parse().unwrap();
    let token = d.wait_held("ride").await;
    p.cut();
    line_with(&mut err, "reconnected").await;
    line_with(&mut err, &format!("renewed ride token {token}")).await;
    // Well past the grace that began when the server saw the old connection close.
    sleep(Duration::from_secs(3)).await;
    assert_eq!(d.holder("ride").await, Some(token));
    assert!(alive(pid), "the command was stopped");
    std::fs::write(&go, "").unwrap();
    line_with(&mut err, &format!("released ride token {token}")).await;
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The gap closed: lockctl cannot reconnect (the server stays out of reach after a reset), so
/// the lease ends one grace after the server saw the connection close; lockctl stops the
/// command before that, though the ttl is far off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_that_cannot_reconnect_stops_the_command_before_the_grace_ends() {
    let d = lockd().await;
    let p = proxy(d.addr.clone()).await;
    let mut watch = d.client().await;
    watch.watch(Some("gap")).await.unwrap();
    let dir = scratch("grace-gap");
    let ready = dir.join("ready");
    // The command ignores SIGTERM: only the SIGKILL before the grace ends stops it.
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let args = [
        "run",
        "gap",
        "--ttl",
        "60s",
        "--session-grace",
        "2s",
        "--connect-timeout",
        "1s",
        "-c",
        &script,
    ];
    let child = spawn(lockctl_at(&p.addr, &args));
    let pid: i32 = wait_for_file(&ready).await.trim().parse().unwrap();
    p.refuse(true);
    p.cut();
    let give_up = Instant::now() + GUARD;
    while alive(pid) {
        assert!(Instant::now() < give_up, "the command was never stopped");
        sleep(Duration::from_millis(5)).await;
    }
    let stopped_at = now_ms();
    let out = finish(child).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("could not renew"), "{}", stderr(&out));
    let ended_at = lease_end(&mut watch).await;
    assert!(
        stopped_at < ended_at,
        "command outlived the lease: stopped at {stopped_at}, lease ended at {ended_at}"
    );
}

/// The unix-ms of the next event that ends a lease.
async fn lease_end(watch: &mut Client) -> u128 {
    loop {
        let line = timeout(GUARD, watch.read_line()).await.unwrap().unwrap();
        let w: Vec<&str> = line.split(' ').collect();
        if matches!(w.get(1), Some(&("expired" | "dropped" | "released"))) {
            return w[5].parse().unwrap();
        }
    }
}

/// A killed `lockctl run`: its command dies with it, and the server frees the lock when the
/// grace ends (lockctl never comes back to renew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_run_frees_the_lock_when_the_grace_ends() {
    let d = lockd().await;
    let mut watch = d.client().await;
    watch.watch(Some("kill")).await.unwrap();
    let dir = scratch("grace-kill");
    let ready = dir.join("ready");
    let script = format!("echo $$ > {}; exec sleep 60", ready.display());
    let args = [
        "run",
        "kill",
        "--ttl",
        "60s",
        "--session-grace",
        "1s",
        "-c",
        &script,
    ];
    let mut child = spawn(d.lockctl(&args));
    wait_for_file(&ready).await;
    d.wait_held("kill").await;
    signal(&child, libc::SIGKILL);
    let _ = timeout(GUARD, child.wait()).await.unwrap();
    let killed_at = now_ms();
    // Freed by the grace (1s), long before the ttl (60s).
    let ended_at = lease_end(&mut watch).await;
    assert!(ended_at < killed_at + 30_000, "{ended_at} vs {killed_at}");
    assert_eq!(d.holder("kill").await, None);
}
