//! `lockctl elect` and `lockctl leader`: a primary and a standby of one service, as the
//! README shows them, and the leader as a script reads it.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::time::timeout;

use super::common::lockctl::*;

const GUARD: Duration = Duration::from_secs(30);

/// A service that writes its token and runs until `<dir>/<who>.stop` exists.
fn service(dir: &std::path::Path, who: &str) -> String {
    let d = dir.display();
    format!(
        "echo $LOCKD_TOKEN > {d}/{who}.token; while [ ! -e {d}/{who}.stop ]; do sleep 0.05; done"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_runs_the_service_and_the_standby_takes_over_when_it_ends() {
    let d = lockd().await;
    let dir = scratch("elect-handover");
    let primary = spawn(d.lockctl(&[
        "--id",
        "p",
        "elect",
        "svc",
        "--note",
        "10.0.0.1:80",
        "-c",
        &service(&dir, "p"),
    ]));
    let t1: u64 = wait_for_file(&dir.join("p.token"))
        .await
        .trim()
        .parse()
        .unwrap();

    // Who leads, as a script asks it.
    let out = output(d.lockctl(&["leader", "svc"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "p 10.0.0.1:80\n");

    let standby = spawn(d.lockctl(&[
        "--id",
        "s",
        "elect",
        "svc",
        "--note",
        "10.0.0.2:80",
        "-c",
        &service(&dir, "s"),
    ]));
    d.wait_waiters("svc", 1).await;
    assert!(!dir.join("s.token").exists(), "a standby runs nothing");

    let mut watch = spawn(d.lockctl(&["leader", "svc", "--watch"]));
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();

    assert_eq!(next(&mut lines).await, "p 10.0.0.1:80");

    // The primary's service ends: it steps down, and the standby leads with a higher token.
    std::fs::write(dir.join("p.stop"), "").unwrap();
    let out = finish(primary).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let t2: u64 = wait_for_file(&dir.join("s.token"))
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(t2 > t1, "the new term's token rises");
    let mut change = next(&mut lines).await;
    if change == "-" {
        change = next(&mut lines).await;
    }
    assert_eq!(change, "s 10.0.0.2:80");

    // The standby steps down too: nobody leads.
    std::fs::write(dir.join("s.stop"), "").unwrap();
    assert_eq!(code(&finish(standby).await), 0);
    assert_eq!(next(&mut lines).await, "-");
    let out = output(d.lockctl(&["leader", "svc"])).await;
    assert_eq!(code(&out), 1, "no leader: exit 1");
    assert_eq!(stdout(&out), "");
    let _ = watch.start_kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_followed_by_its_standby_and_a_leader_without_a_service_is_refused() {
    let d = lockd().await;
    let dir = scratch("elect-killed");
    let primary = spawn(d.lockctl(&[
        "--id",
        "p",
        "elect",
        "svc",
        "--session-grace",
        "1s",
        "-c",
        &service(&dir, "p"),
    ]));
    wait_for_file(&dir.join("p.token")).await;
    let standby = spawn(d.lockctl(&[
        "--id",
        "s",
        "elect",
        "svc",
        "--",
        "sh",
        "-c",
        &service(&dir, "s"),
    ]));
    d.wait_waiters("svc", 1).await;
    // kill -9 of the leader's lockctl: its service is killed with it, and the standby leads
    // once the session's grace is over.
    signal(&primary, libc::SIGKILL);
    wait_for_file(&dir.join("s.token")).await;
    let out = output(d.lockctl(&["leader", "svc"])).await;
    assert_eq!(
        stdout(&out),
        "s sh\n",
        "the default note: the program's name"
    );
    std::fs::write(dir.join("s.stop"), "").unwrap();
    assert_eq!(code(&finish(standby).await), 0);

    let out = output(d.lockctl(&["elect", "svc"])).await;
    assert_eq!(code(&out), 2, "no service: a usage error");
    assert!(
        stderr(&out).contains("lockctl elect NAME -- SERVICE"),
        "{}",
        stderr(&out)
    );
}

async fn next(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> String {
    let line = timeout(GUARD, lines.next_line()).await.expect("a line");
    line.unwrap().expect("lockctl leader --watch ended")
}
