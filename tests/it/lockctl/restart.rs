//! `lockctl run` rides through a restart of a lockd that keeps its state (`--data-dir`): the
//! command keeps running, lockctl reconnects and renews with its token, and the lock is
//! released at the end.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::durable::{DurableLockd, TempDir, PATIENCE};
use common::free_port;

const LOCKCTL: &str = env!("CARGO_BIN_EXE_lockctl");

/// Waits until `name` is held and returns its STATUS line.
async fn held(lockd: &DurableLockd, name: &str) -> String {
    let start = Instant::now();
    loop {
        if let Ok(mut c) = lockd::client::Client::connect(&lockd.addr).await {
            if let Ok(lines) = c.status(Some(name)).await {
                if let Some(line) = lines.into_iter().find(|l| l.contains(" held ")) {
                    return line;
                }
            }
        }
        assert!(start.elapsed() < PATIENCE, "{name} never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Clone, Copy)]
enum Restart {
    /// SIGKILL: the server gets no chance to do anything.
    Crash,
    /// SIGTERM: a graceful shutdown (an upgrade), which closes every connection itself.
    Graceful,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_run_keeps_its_command_across_a_crash() {
    rides_through(Restart::Crash, "lockctl-crash").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_run_keeps_its_command_across_a_graceful_restart() {
    rides_through(Restart::Graceful, "lockctl-graceful").await;
}

async fn rides_through(restart: Restart, test: &str) {
    let dir = TempDir::new(test);
    let port = free_port();
    let lockd = DurableLockd::start(&dir, port).await;
    let (started, done) = (dir.0.join("started"), dir.0.join("done"));
    // The command runs well past the restart and past several lease lengths.
    let child = Command::new(LOCKCTL)
        .args([
            "--server",
            &lockd.addr,
            "run",
            "nightly",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "touch {}; sleep 4; touch {}",
            started.display(),
            done.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    // Once the command runs, lockctl has its OK, so the grant is on disk. (The table shows
    // the holder a moment earlier: a crash then may lose the grant, and lockctl asks again.)
    let begun = Instant::now();
    while !started.exists() {
        assert!(begun.elapsed() < PATIENCE, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = held(&lockd, "nightly").await;

    // The server goes, and a new lockd on the same data dir and port comes a moment later.
    match restart {
        Restart::Crash => lockd.crash(),
        Restart::Graceful => {
            let status = lockd.stop();
            assert!(status.success(), "{status}");
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lockd = DurableLockd::start(&dir, port).await;
    let after = held(&lockd, "nightly").await;
    assert_eq!(
        harness_field(&before, "token"),
        harness_field(&after, "token"),
        "the restored lease keeps its token"
    );

    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("lockctl output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "lockctl: {stderr}");
    assert!(done.exists(), "the command was stopped: {stderr}");
    assert!(!stderr.contains("lost"), "{stderr}");

    // Released at the end, on the new server.
    let mut c = lockd.client().await;
    assert_eq!(
        c.status(Some("nightly")).await.expect("status"),
        vec!["nightly free".to_string()]
    );
    lockd.stop();
}

fn harness_field<'a>(line: &'a str, key: &str) -> &'a str {
    lockd::proto::field(line, key).unwrap_or_default()
}

/// A `lockctl run` waiting without `-w` waits through a restart of lockd however long it
/// takes (here longer than its --connect-timeout), as it would wait through a long queue,
/// and runs its command once it gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lockctl_run_waits_through_a_long_restart() {
    let dir = TempDir::new("lockctl-waits-restart");
    let port = free_port();
    let lockd = DurableLockd::start(&dir, port).await;
    let mut holder = lockd.client().await;
    holder
        .lock(
            "queue",
            "holder",
            Some(Duration::from_secs(60)),
            None,
            lockd::proto::Tie::Plain,
        )
        .await
        .expect("lock");
    let ran = dir.0.join("ran");
    let child = Command::new(LOCKCTL)
        .args([
            "--server",
            &lockd.addr,
            "--connect-timeout",
            "1s",
            "run",
            "queue",
            "--",
        ])
        .args(["sh", "-c", &format!("touch {}", ran.display())])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    let mut admin = lockd.client().await;
    let begun = Instant::now();
    while !admin
        .status(Some("queue"))
        .await
        .expect("status")
        .iter()
        .any(|l| l.contains("waiters=1"))
    {
        assert!(begun.elapsed() < PATIENCE, "lockctl never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((holder, admin));
    // Down for three times lockctl's --connect-timeout; the holder's plain lease comes back
    // with the data directory, so it is released by hand after the restart.
    lockd.crash();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lockd = DurableLockd::start(&dir, port).await;
    let mut c = lockd.client().await;
    let line = held(&lockd, "queue").await;
    let token: u64 = harness_field(&line, "token").parse().expect("token");
    c.unlock("queue", token).await.expect("unlock");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("lockctl output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "lockctl: {stderr}");
    assert!(ran.exists(), "the command never ran: {stderr}");
    lockd.stop();
}
