//! Once per window: `RENEW ... detach` (a session lease made plain) and `lockctl run
//! --at-least`, which keeps a job's lock after the job until the window is over.

use crate::common;

use std::time::Duration;

use common::blocking::client_process as client;
use common::lockctl::{code, lockctl_at, output, scratch, stderr, GUARD};
use common::{field, status_shape, Lockd, Raw, TestServer};
use tokio::time::{sleep, Instant};

/// `STATUS <name>` on a fresh connection.
async fn status(server: &TestServer, name: &str) -> String {
    server.raw().await.req(&format!("STATUS {name}")).await
}

/// Polls until `name` is free.
async fn wait_free(server: &TestServer, name: &str) {
    let give_up = Instant::now() + GUARD;
    loop {
        let line = status(server, name).await;
        if line == format!("OK {name} free") {
            return;
        }
        assert!(Instant::now() < give_up, "{name} never freed: {line}");
        sleep(Duration::from_millis(50)).await;
    }
}

/// A session lease, detached, then its connection closed: it is still held (plain). A
/// control session lease closed after it ends, so its close was seen too.
async fn detach_and_close(server: &TestServer) -> u64 {
    let mut a = server.raw().await;
    let t = a.lock("win a session=1s ttl=1m").await;
    let renewed = a.req(&format!("RENEW win {t} ttl=50s detach")).await;
    assert_eq!(renewed, "OK ttl_ms=50000");
    let mut c = server.raw().await;
    c.lock("ctl c session").await;
    drop(a);
    drop(c);
    wait_free(server, "ctl").await;
    // Past the grace the session lease had: a session lease would be gone by now.
    sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        status_shape(&status(server, "win").await),
        format!("OK win held id=a token={t} ttl_ms=* session=0 waiters=0")
    );
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_session_lease_outlives_its_connection() {
    let server = Lockd::new().serve().await;
    let t = detach_and_close(&server).await;
    // Only its token ends it, from any connection.
    let mut b = server.raw().await;
    assert_eq!(b.req(&format!("UNLOCK win {t}")).await, "OK");
    // Detach of a plain lease: only the ttl changes.
    let tp = b.lock("plain p ttl=1m").await;
    assert_eq!(
        b.req(&format!("RENEW plain {tp} ttl=5s detach")).await,
        "OK ttl_ms=5000"
    );
    assert_eq!(
        field(&status(&server, "plain").await, "session").as_deref(),
        Some("0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_lease_survives_a_restart_with_a_data_dir() {
    let dir = scratch("at-least-data-dir");
    let server = Lockd::new().data_dir(&dir).serve().await;
    let t = detach_and_close(&server).await;
    server.shutdown().await;
    let server = Lockd::new().data_dir(&dir).serve().await;
    let line = status(&server, "win").await;
    assert_eq!(
        status_shape(&line),
        format!("OK win held id=a token={t} ttl_ms=* session=0 waiters=0")
    );
    let left: u64 = field(&line, "ttl_ms").and_then(|v| v.parse().ok()).unwrap();
    assert!(left <= 50_000, "{line}");
    let mut b = server.raw().await;
    assert_eq!(b.req(&format!("UNLOCK win {t}")).await, "OK");
    server.shutdown().await;
}

fn lockctl(server: &TestServer, args: &[&str]) -> tokio::process::Command {
    lockctl_at(&server.addr.to_string(), args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_at_least_keeps_the_lock_after_the_job_until_its_window_ends() {
    let server = Lockd::new().serve().await;
    let out = output(lockctl(
        &server,
        &[
            "run",
            "hourly",
            "--at-least",
            "8s",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    ))
    .await;
    // The command's exit code is lockctl's; the lock is still held, as a plain lease.
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let line = status(&server, "hourly").await;
    assert_eq!(field(&line, "session").as_deref(), Some("0"), "{line}");
    assert!(field(&line, "token").is_some(), "{line}");
    // A late host finds it held and skips.
    let late = output(lockctl(&server, &["run", "-n", "hourly", "--", "true"])).await;
    assert_eq!(code(&late), 1, "{}", stderr(&late));
    // lockd ends it by its ttl.
    wait_free(&server, "hourly").await;
    let next = output(lockctl(&server, &["run", "-n", "hourly", "--", "true"])).await;
    assert_eq!(code(&next), 0, "{}", stderr(&next));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_at_least_shorter_than_the_job_releases_at_once() {
    let server = Lockd::new().serve().await;
    let out = output(lockctl(
        &server,
        &["run", "long", "--at-least", "200ms", "--", "sleep", "1"],
    ))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Released before lockctl exited.
    assert_eq!(status(&server, "long").await, "OK long free");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_at_least_over_the_max_ttl_releases_and_says_so() {
    let mut config = common::start::config();
    config.limits.max_ttl = Duration::from_secs(60);
    let server = Lockd::new().config(config).serve().await;
    let out = output(lockctl(
        &server,
        &[
            "run",
            "big",
            "--ttl",
            "10s",
            "--at-least",
            "2h",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("--at-least"), "{}", stderr(&out));
    assert_eq!(status(&server, "big").await, "OK big free");
    // And zero is a usage error.
    let out = output(lockctl(
        &server,
        &["run", "z", "--at-least", "0s", "--", "true"],
    ))
    .await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_client_sees_renew_detach_refused_for_a_lost_lease() {
    let server = Lockd::new().serve().await;
    let mut c = Raw::connect(server.addr).await;
    c.send("RENEW gone 42 detach").await;
    c.expect_prefix("ERR NOTHELD ").await;
    c.send("RENEW gone 42 detach detach").await;
    c.expect_prefix("ERR SYNTAX ").await;
    server.shutdown().await;
}

#[test]
fn the_python_and_bash_clients_keep_the_lock_for_at_least() {
    use common::blocking::{eventually, Server};
    let guard = Duration::from_secs(60);
    let lockd = Server::start();
    let addr = lockd.addr.to_string();
    let session = |name: &str| {
        let line = lockd.request(&format!("STATUS {name}"));
        lockd::proto::field(&line, "session").map(str::to_owned)
    };

    let py = client(
        "python3",
        &addr,
        "lease = lockd_client.lock('py-window', ttl=10, at_least=8)\n\
         with lease as token:\n    pass\n\
         print('kept' if lease.kept else 'released')",
    );
    let out = common::blocking::finish(py, "", guard);
    assert_eq!(out.stdout.trim(), "kept", "{}", out.stderr);
    assert_eq!(session("py-window").as_deref(), Some("0"));
    eventually(guard, "the python window ends", || {
        lockd.holder_token("py-window").is_none()
    });

    let sh = client(
        "bash",
        &addr,
        "lockd_run sh-window ttl=10s at_least=8s -- sh -c 'exit 5'; echo \"rc=$?\"",
    );
    let out = common::blocking::finish(sh, "", guard);
    assert!(out.stdout.contains("rc=5"), "{} {}", out.stdout, out.stderr);
    assert_eq!(session("sh-window").as_deref(), Some("0"));
    let late = lockd.request("LOCK sh-window late wait=0");
    assert!(late.starts_with("ERR TIMEOUT "), "{late}");
    eventually(guard, "the bash window ends", || {
        lockd.holder_token("sh-window").is_none()
    });

    // session=0 ends the lease the moment its connection closes: the renewer makes it plain
    // on that connection before it goes.
    let sh = client(
        "bash",
        &addr,
        "lockd_run sh-zero ttl=10s session=0 at_least=8s -- sh -c 'exit 6'; echo \"rc=$?\"",
    );
    let out = common::blocking::finish(sh, "", guard);
    assert!(out.stdout.contains("rc=6"), "{} {}", out.stdout, out.stderr);
    assert!(!out.stderr.contains("could not keep"), "{}", out.stderr);
    assert_eq!(session("sh-zero").as_deref(), Some("0"));
    let late = lockd.request("LOCK sh-zero late wait=0");
    assert!(late.starts_with("ERR TIMEOUT "), "{late}");
}
