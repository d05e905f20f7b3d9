//! lockctl with several server addresses (`--server a,b` or `LOCKD_ADDR=a,b`), the front-ends
//! of one lockd cluster: a dead address is passed over for the next, every address is named
//! when none answers, and `lockctl run` reconnects to the next address after losing its
//! connection, renews its token there, and its command runs to the end.
//!
//! Two in-process servers share no state, so the test where a front-end dies runs lockd
//! processes on one data directory: the one that took the lock is killed, and a new one on
//! the same data directory, at the second address, knows the token, as a cluster's other
//! front-end would.

use crate::common;

use std::time::Duration;

use lockd::proto::Tie;
use tokio::io::AsyncReadExt as _;
use tokio::time::{timeout, Instant};

use common::dead_addr;
use common::durable::{DurableLockd, TempDir};
use common::free_port;
use common::lockctl::*;

/// Every command reaches the second address when the first is down, with the list given
/// either way; `run` hands the whole list on to its command, so a lockctl inside it fails
/// over too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_first_address_is_passed_over_for_the_next() {
    let d = lockd().await;
    let dead = dead_addr();
    let list = format!("{dead},{}", d.addr);

    let out = output(lockctl_at(&list, &["-v", "acquire", "fo", "--ttl", "1m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("cannot reach lockd at {dead}: ")),
        "says which address failed: {err}"
    );
    assert!(err.contains(&format!("; trying {}", d.addr)), "{err}");
    assert!(
        err.contains(&format!("connected to lockd at {}", d.addr)),
        "says which address it connected to: {err}"
    );
    let token = stdout(&out).trim().to_owned();
    assert_eq!(d.holder("fo").await, Some(token.parse().unwrap()));

    // The same list as --server (LOCKD_ADDR names a server that is down).
    let flag = |args: &[&str]| {
        let mut all = vec!["--server", list.as_str()];
        all.extend_from_slice(args);
        lockctl_at(&dead, &all)
    };
    let out = output(flag(&["renew", "fo", &token, "--ttl", "2m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = output(flag(&["status", "fo"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains(&token), "{}", stdout(&out));
    let out = output(lockctl_at(&list, &["release", "fo", &token])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.holder("fo").await, None);

    // run: the command sees the whole list, and a lockctl it starts gets through too.
    let script = r#"echo "$LOCKD_ADDR"; "$LOCKCTL" status "$LOCKD_NAME" --json"#;
    let out = output(lockctl_at(&list, &["run", "fo", "-c", script])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(list.as_str()), "{text}");
    assert!(
        lines.next().is_some_and(|l| l.contains(r#""held":true"#)),
        "{text}"
    );
    assert_eq!(d.holder("fo").await, None);

    // watch: its events come from the second address.
    let mut child = spawn(lockctl_at(&list, &["watch", "fo"]));
    let mut events = child.stdout.take().unwrap();
    let mut c = d.client().await;
    let mut seen = String::new();
    let give_up = Instant::now() + GUARD;
    while !seen.contains(" acquired fo id=me ") {
        assert!(Instant::now() < give_up, "no events: {seen:?}");
        let t = c.lock("fo", "me", None, None, Tie::Plain).await.unwrap();
        c.unlock("fo", t).await.unwrap();
        let mut buf = [0u8; 1024];
        if let Ok(Ok(n)) = timeout(Duration::from_millis(200), events.read(&mut buf)).await {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    signal(&child, libc::SIGINT);
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// No address answers: exit code 3, one line naming every address with its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_dead_is_exit_3_naming_each() {
    let dead = [dead_addr(), dead_addr(), dead_addr()];
    let list = dead.join(",");
    let dir = scratch("failover-dead");
    let ran = dir.join("ran");
    let touch = format!("touch {}", ran.display());
    for args in [
        vec!["run", "x", "--connect-timeout", "300ms", "-c", &touch],
        vec!["status"],
        vec!["release", "x", "1"],
    ] {
        let out = output(lockctl_at(&list, &args)).await;
        assert_eq!(code(&out), 3, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.starts_with("lockctl: cannot reach lockd at "), "{err}");
        for addr in &dead {
            assert!(
                err.contains(&format!("{addr}: ")),
                "{addr} not named: {err}"
            );
        }
        assert!(err.contains("(tried for "), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert!(!ran.exists(), "the command ran");
}

/// A connection lost under a running command: lockctl reconnects to the next address at once
/// (not to the one it lost, which may be the one that is down), renews there, and the command
/// runs to its end. Both addresses lead to the same server here: the first through a proxy
/// that cuts its connections and then takes new ones only to close them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reconnects_to_the_next_address_and_renews_there() {
    let d = lockd().await;
    let p = proxy(d.addr.clone()).await;
    let list = format!("{},{}", p.addr, d.addr);
    let dir = scratch("failover-next");
    let go = dir.join("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", go.display());
    let mut child = spawn(lockctl_at(
        &list,
        &["-v", "run", "next", "--ttl", "30s", "-c", &script],
    ));
    let mut err = stderr_lines(&mut child);
    line_with(&mut err, &format!("connected to lockd at {}", p.addr)).await;
    let acquired = line_with(&mut err, "acquired next token ").await;
    let token = token_after(&acquired);

    p.refuse(true);
    p.cut();
    // From the loss to the next renewal: straight to the second address, nothing failed.
    line_with(&mut err, "ended").await;
    let mut between = Vec::new();
    loop {
        let line = timeout(GUARD, err.next_line())
            .await
            .expect("lockctl went quiet")
            .unwrap()
            .unwrap_or_else(|| panic!("stderr ended: {between:?}"));
        if line.contains(&format!("renewed next token {token}")) {
            break;
        }
        between.push(line);
    }
    assert!(
        between
            .iter()
            .any(|l| l.contains(&format!("reconnected to lockd at {}", d.addr))),
        "{between:?}"
    );
    assert!(
        !between
            .iter()
            .any(|l| l.contains("failed") || l.contains("cannot reach")),
        "{between:?}"
    );
    assert_eq!(d.holder("next").await, Some(token));

    std::fs::write(&go, "").unwrap();
    line_with(&mut err, &format!("released next token {token}")).await;
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(d.holder("next").await, None);
}

/// The front-end that granted the lock dies (SIGKILL) while the command runs, and another
/// front-end that knows the token comes up at the second address: `lockctl run --server A,B`
/// reconnects to B, renews there, the command completes with exit code 0, and the lock is
/// free afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fails_over_to_another_front_end_that_knows_its_token() {
    let dir = TempDir::new("lockctl-failover");
    let port_a = free_port();
    let port_b = loop {
        let p = free_port();
        if p != port_a {
            break p;
        }
    };
    let a = DurableLockd::start(&dir, port_a).await;
    let b_addr = format!("127.0.0.1:{port_b}");
    let list = format!("{},{b_addr}", a.addr);
    let (started, go) = (dir.0.join("started"), dir.0.join("go"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        started.display(),
        go.display()
    );
    // A lease long enough that its end is never what the test waits on: the window lockctl
    // must renew within is the session grace, 20s.
    let mut child = spawn(lockctl_at(
        &list,
        &[
            "-v",
            "run",
            "nightly",
            "--ttl",
            "30s",
            "--session-grace",
            "20s",
            "-c",
            &script,
        ],
    ));
    let mut err = stderr_lines(&mut child);
    let acquired = line_with(&mut err, "acquired nightly token ").await;
    let token = token_after(&acquired).to_string();
    // Once the command runs, lockctl has its OK, so the grant is on disk.
    wait_for_file_to_exist(&started).await;

    a.crash();
    let b = DurableLockd::start(&dir, port_b).await;
    line_with(&mut err, &format!("reconnected to lockd at {b_addr}")).await;
    line_with(&mut err, &format!("renewed nightly token {token}")).await;
    let mut c = b.client().await;
    let line = c.status(Some("nightly")).await.unwrap().remove(0);
    assert_eq!(
        lockd::proto::field(&line, "token"),
        Some(token.as_str()),
        "{line}"
    );

    std::fs::write(&go, "").unwrap();
    let rest = finish_lines(&mut err).await;
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0), "{rest}");
    assert!(!rest.contains("lost"), "{rest}");
    assert_eq!(
        c.status(Some("nightly")).await.unwrap(),
        vec!["nightly free".to_string()]
    );
    b.stop();
}

async fn wait_for_file_to_exist(path: &std::path::Path) {
    let give_up = Instant::now() + GUARD;
    while !path.exists() {
        assert!(Instant::now() < give_up, "{} never made", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The rest of stderr, to its end.
async fn finish_lines(err: &mut StderrLines) -> String {
    let mut text = String::new();
    while let Ok(Ok(Some(line))) = timeout(GUARD, err.next_line()).await {
        text.push_str(&line);
        text.push('\n');
    }
    text
}
