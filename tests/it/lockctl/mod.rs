//! lockctl against a real lockd: the server runs in-process on 127.0.0.1:0, lockctl as a child
//! process, exactly as a user runs it.

use crate::common;

mod auth;
#[cfg(target_os = "linux")]
mod break_overlap;
#[cfg(target_os = "linux")]
mod elect;
mod failover;
#[cfg(target_os = "linux")]
mod job;
mod liveness;
mod mcp;
mod modes;
mod multi;
mod restart;
mod retry;
mod status;
mod tls;
mod tty;

use std::time::Duration;

use lockd::proto::Tie;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpListener;
use tokio::process::Child;
use tokio::time::{sleep, timeout, Instant};

use common::dead_addr;
use common::lockctl::*;

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
    // Ready only once `sleep` runs: a SIGTERM before it starts would leave it outside the
    // group that lockctl signals, holding stdout open.
    let script = format!(
        "trap 'echo term > {got}; exit 3' TERM; sleep 60 & echo ready > {ready}; wait",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrenewable_lease_stops_the_command_before_the_server_could_expire_it() {
    let d = lockd().await;
    let p = proxy(d.addr.clone()).await;
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
    p.go_silent();
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
    // The server frees the lock when the session grace has passed: a short one keeps the
    // test short.
    let mut child = spawn(d.lockctl(&["run", "killed", "--session-grace", "500ms", "-c", &script]));
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
    assert!(
        stderr(&out).contains("not held with this token: released already, its lease ran out"),
        "{}",
        stderr(&out)
    );
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
            .ends_with(r#","session":false,"waiters":0,"holder_count":1,"mode":"exclusive"}]"#),
        "{json}"
    );
    let ttl: u64 = json[prefix.len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ttl <= 60_000);

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
    let addr = dead_addr();
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
        "--until-timeout",
        "--session-grace",
        "124",
        "128+N",
        "lockctl-run(1)",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    // acquire's usage says that it waits, and how not to.
    let out = output(lockctl_at("127.0.0.1:1", &["acquire", "--help"])).await;
    let help = stdout(&out);
    let usage = help
        .split("\n\n")
        .find(|p| p.starts_with("Usage:"))
        .unwrap();
    for needle in ["waits for the lock", "-w <WAIT>", "-n "] {
        assert!(usage.contains(needle), "{needle} missing from:\n{usage}");
    }
    // No command at all, and options that need one they do not have.
    let out = output(lockctl_at("127.0.0.1:1", &["-v"])).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let out = output(lockctl_at(
        "127.0.0.1:1",
        &["run", "x", "--until-timeout", "1s", "--", "true"],
    ))
    .await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let out = output(lockctl_at(
        "127.0.0.1:1",
        &[
            "run",
            "x",
            "--ttl",
            "2s",
            "--session-grace",
            "3s",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--session-grace"), "{}", stderr(&out));
    let out = output(lockctl_at(
        "127.0.0.1:1",
        &["run", "bad name", "--", "true"],
    ))
    .await;
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("whitespace"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_cannot_be_one_is_a_usage_error_at_once() {
    let cases: [(&str, &[&str], &str); 7] = [
        ("127.0.0.1", &["status"], "no port"),
        ("localhost:notaport", &["status"], "is not a port"),
        ("localhost:0", &["release", "x", "1"], "is not a port"),
        (":5001", &["status"], "is not a host name"),
        ("::1:5001", &["status"], "in brackets"),
        (
            "http://localhost:5001",
            &["acquire", "x"],
            "is not a host name",
        ),
        ("127.0.0.1", &["run", "x", "--", "true"], "no port"),
    ];
    for (addr, args, says) in cases {
        // Both ways of giving the address: --server and LOCKD_ADDR.
        let with_flag: Vec<&str> = ["--server", addr].iter().chain(args).copied().collect();
        for cmd in [
            lockctl_at("127.0.0.1:1", &with_flag),
            lockctl_at(addr, args),
        ] {
            let started = Instant::now();
            let out = output(cmd).await;
            assert_eq!(code(&out), 2, "{addr} {args:?}: {}", stderr(&out));
            assert!(stderr(&out).contains(says), "{addr}: {}", stderr(&out));
            // Not after a connect timeout's worth of retries (the shortest is 2s).
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{addr} {args:?}"
            );
        }
    }
    // A good one in brackets is taken (and then not reached: nothing listens on port 1).
    let out = output(lockctl_at(
        "[::1]:1",
        &["status", "--connect-timeout", "100ms"],
    ))
    .await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_commands_fail_fast_when_the_server_is_down() {
    let addr = dead_addr();
    let commands: [&[&str]; 5] = [
        &["status"],
        &["status", "x", "--json"],
        &["release", "x", "1"],
        &["renew", "x", "1"],
        &["acquire", "x", "-n"],
    ];
    let started = Instant::now();
    let children: Vec<_> = commands
        .iter()
        .map(|args| spawn(lockctl_at(&addr, args)))
        .collect();
    for (child, args) in children.into_iter().zip(commands) {
        let out = finish(child).await;
        assert_eq!(code(&out), 3, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&addr) && err.contains("tried for 2s"),
            "{args:?}: {err}"
        );
    }
    // run's patience (10s) would have kept them well past this.
    assert!(started.elapsed() < Duration::from_secs(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_a_server_that_comes_up_late() {
    let addr = dead_addr();
    let child = spawn(lockctl_at(&addr, &["run", "late", "--", "true"]));
    // Longer than the one-shot commands try: run is patient (10s).
    sleep(Duration::from_secs(3)).await;
    let d = lockd_on(TcpListener::bind(&addr).await.unwrap());
    let out = finish(child).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.holder("late").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_without_double_dash_is_pointed_to_it() {
    let dir = scratch("dashdash");
    let ran = dir.join("ran");
    let ran = ran.to_str().unwrap();
    let out = output(lockctl_at("127.0.0.1:1", &["run", "x", "touch", ran])).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("lockctl run x -- touch {ran}")),
        "{err}"
    );
    assert!(!std::path::Path::new(ran).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_verbose_says_who_it_waits_behind_its_token_each_renewal_and_the_release() {
    let d = lockd().await;
    let mut first = d.client().await;
    let t1 = first
        .lock("v", "first", None, None, Tie::Plain)
        .await
        .unwrap();
    let dir = scratch("verbose");
    let go = dir.join("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", go.display());
    let mut child = spawn(d.lockctl(&["-v", "run", "v", "--ttl", "3s", "-c", &script]));
    let mut err = stderr_lines(&mut child);
    let waiting = line_with(&mut err, "waiting for v").await;
    assert!(
        waiting.contains(&format!("held by first (token {t1})")),
        "{waiting}"
    );
    first.unlock("v", t1).await.unwrap();
    let acquired = line_with(&mut err, "acquired v token ").await;
    let token = token_after(&acquired).to_string();
    assert_eq!(d.holder("v").await, Some(token.parse().unwrap()));
    // Renewed every third of the ttl: two in a row show it keeps at it.
    for _ in 0..2 {
        line_with(&mut err, &format!("renewed v token {token}: ")).await;
    }
    std::fs::write(&go, "").unwrap();
    line_with(&mut err, &format!("released v token {token}")).await;
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_verbose() {
    let d = lockd().await;
    let mut first = d.client().await;
    let t1 = first
        .lock("av", "first", None, None, Tie::Plain)
        .await
        .unwrap();
    let mut child = spawn(d.lockctl(&["-v", "acquire", "av", "--ttl", "1m"]));
    let mut err = stderr_lines(&mut child);
    let waiting = line_with(&mut err, "waiting for av").await;
    assert!(waiting.contains("held by first"), "{waiting}");
    first.unlock("av", t1).await.unwrap();
    let acquired = line_with(&mut err, "acquired av token ").await;
    let out = finish(child).await;
    assert_eq!(code(&out), 0);
    let token = stdout(&out).trim().to_owned();
    assert!(acquired.contains(&token), "{acquired}");
    let out = output(d.lockctl(&["-v", "renew", "av", &token])).await;
    assert!(
        stderr(&out).contains(&format!("renewed av token {token}")),
        "{}",
        stderr(&out)
    );
    let out = output(d.lockctl(&["-v", "release", "av", &token])).await;
    assert!(
        stderr(&out).contains(&format!("released av token {token}")),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_timeout_releases_the_lock_and_exits_124() {
    let d = lockd().await;
    // A test that keeps failing.
    let out = output(d.lockctl(&[
        "run",
        "u",
        "--until",
        "false",
        "--poll",
        "50ms",
        "--until-timeout",
        "300ms",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(stderr(&out).contains("--until-timeout"), "{}", stderr(&out));
    assert_eq!(d.holder("u").await, None);
    // A test that hangs is stopped.
    let out = output(d.lockctl(&[
        "run",
        "u",
        "--until",
        "sleep 60",
        "--until-timeout",
        "300ms",
        "--kill-grace",
        "100ms",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert_eq!(d.holder("u").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_prints_one_object_per_event() {
    let d = lockd().await;
    let mut child = spawn(d.lockctl(&["watch", "--json"]));
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut c = d.client().await;
    let name = r#"j"s\on"#;
    let give_up = Instant::now() + GUARD;
    while !seen.contains(r#""event":"released""#) {
        assert!(Instant::now() < give_up, "no events: {seen:?}");
        let token = c.lock(name, "me", None, None, Tie::Plain).await.unwrap();
        c.unlock(name, token).await.unwrap();
        let mut buf = [0u8; 4096];
        if let Ok(Ok(n)) = timeout(Duration::from_millis(200), stdout.read(&mut buf)).await {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    let released = seen
        .lines()
        .find(|l| l.contains(r#""event":"released""#))
        .unwrap();
    let prefix = r#"{"event":"released","name":"j\"s\\on","id":"me","token":"#;
    assert!(released.starts_with(prefix), "{released}");
    let token = released[prefix.len()..].split(',').next().unwrap();
    assert!(token.parse::<u64>().is_ok(), "{released}");
    assert!(released.ends_with(r#"Z"}"#), "{released}");
    assert!(
        seen.lines().all(|l| l.starts_with('{') && l.ends_with('}')),
        "{seen}"
    );
    signal(&child, libc::SIGINT);
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}
