//! lockctl's shared locks and semaphores against a real lockd (`-s`/`--shared`,
//! `-x`/`--exclusive`, `--limit N`), and the old `-s host:port` that now says to use
//! `--server`.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Child;
use tokio::time::Instant;

use common::dead_addr;
use common::lockctl::*;

/// A `lockctl run` whose command writes `<dir>/<label>` once it runs, then waits until
/// `<dir>/go` exists.
fn held_run(d: &Server, dir: &Path, label: &str, args: &[&str]) -> Child {
    let script = format!(
        "echo $LOCKD_TOKEN > {dir}/{label}; while [ ! -e {dir}/go ]; do sleep 0.02; done",
        dir = dir.display()
    );
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-c", &script]);
    spawn(d.lockctl(&all))
}

async fn all_succeed(children: Vec<Child>) {
    for child in children {
        let out = finish(child).await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
}

fn ran(dir: &Path, label: &str) -> bool {
    dir.join(label).exists()
}

fn go(dir: &Path) -> PathBuf {
    let go = dir.join("go");
    std::fs::write(&go, "").unwrap();
    go
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_two_lets_two_runs_hold_at_once_and_a_third_waits() {
    let d = lockd().await;
    let dir = scratch("limit");
    let first = held_run(&d, &dir, "a", &["sem", "--limit", "2"]);
    let second = held_run(&d, &dir, "b", &["sem", "--limit", "2"]);
    wait_for_file(&dir.join("a")).await;
    wait_for_file(&dir.join("b")).await;
    let third = held_run(&d, &dir, "c", &["sem", "--limit", "2"]);
    d.wait_waiters("sem", 1).await;
    assert!(!ran(&dir, "c"), "a third slot of two");
    let out = output(d.lockctl(&["status", "sem", "--json"])).await;
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["mode"], "limit:2", "{v}");
    assert_eq!(v["limit"], 2, "{v}");
    assert_eq!(v["holders"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["queue"][0]["mode"], "limit:2", "{v}");
    go(&dir);
    all_succeed(vec![first, second, third]).await;
    assert!(ran(&dir, "c"));
    assert_eq!(d.holder("sem").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_runs_hold_together_while_an_exclusive_one_waits() {
    let d = lockd().await;
    let dir = scratch("shared");
    let r1 = held_run(&d, &dir, "r1", &["rw", "-s"]);
    let r2 = held_run(&d, &dir, "r2", &["rw", "--shared"]);
    wait_for_file(&dir.join("r1")).await;
    wait_for_file(&dir.join("r2")).await;
    let writer = held_run(&d, &dir, "w", &["rw", "-x"]);
    d.wait_waiters("rw", 1).await;
    assert!(!ran(&dir, "w"), "an exclusive holder beside shared ones");

    let out = output(d.lockctl(&["status", "rw"])).await;
    let text = stdout(&out);
    assert!(
        text.starts_with("rw: held shared, 2 holders, 1 waiting"),
        "{text}"
    );
    // A holder's row ends with its mode, or its mode then its note (run's command line).
    let holders = text
        .lines()
        .filter(|l| l.ends_with(" shared") || l.contains(" shared  "))
        .count();
    assert_eq!(holders, 2, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("1 ") && l.ends_with(" exclusive")),
        "{text}"
    );

    // The readers finish; only then does the writer run.
    go(&dir);
    all_succeed(vec![r1, r2, writer]).await;
    assert!(ran(&dir, "w"));
    let tokens: Vec<u64> = ["r1", "r2", "w"]
        .iter()
        .map(|l| {
            std::fs::read_to_string(dir.join(l))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(tokens[2] > tokens[0] && tokens[2] > tokens[1], "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_takes_the_same_modes() {
    let d = lockd().await;
    let shared = |extra: &'static str| {
        let mut args = vec!["acquire", "cfg", "-n"];
        args.push(extra);
        d.lockctl(&args)
    };
    let mut tokens = Vec::new();
    for (i, flag) in ["-s", "--shared"].into_iter().enumerate() {
        let mut cmd = shared(flag);
        cmd.args(["--id", &format!("reader-{i}")]);
        let out = output(cmd).await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        tokens.push(stdout(&out).trim().to_owned());
    }
    assert_ne!(tokens[0], tokens[1]);
    // Held shared: an exclusive request finds it held.
    for flag in ["-x", "--exclusive", "-e"] {
        let out = output(shared(flag)).await;
        assert_eq!(code(&out), 1, "{flag}: {}", stderr(&out));
    }
    // A semaphore is not a shared lock: not available now (exit 1, as a held name, so that
    // cron does not take it for a usage error), with the server's reason; nothing changes.
    let out = output(d.lockctl(&["acquire", "cfg", "-n", "--limit", "3"])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "not available now: cfg: it is held shared; this LOCK asks for it as a semaphore of 3"
        ),
        "{}",
        stderr(&out)
    );
    let out = output(d.lockctl(&["run", "cfg", "-n", "--", "true"])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    for t in &tokens {
        let out = output(d.lockctl(&["release", "cfg", t])).await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_exclude_each_other_and_limits_are_checked() {
    for args in [
        &["run", "x", "-s", "-x", "--", "true"][..],
        &["run", "x", "--shared", "--limit", "2", "--", "true"],
        &["acquire", "x", "--limit", "0"],
        &["acquire", "x", "--limit", "100001"],
        // Too short to renew: it would be lost at once.
        &["run", "x", "--ttl", "10ms", "--", "true"],
    ] {
        let out = output(lockctl_at("127.0.0.1:1", args)).await;
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
    }
    let out = output(lockctl_at(
        "127.0.0.1:1",
        &["run", "x", "--ttl", "10ms", "--", "true"],
    ))
    .await;
    assert!(
        stderr(&out).contains("--ttl 10ms is too short to renew: at least 1s"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_server_flag_is_refused_at_once_with_the_line_to_use() {
    let d = lockd().await;
    let dir = scratch("old-s");
    let touch = format!("touch {}", dir.join("ran").display());
    // The server named the old way must not be reached, nor the default one.
    let dead = dead_addr();
    for (args, fixed) in [
        (
            vec!["-s", dead.as_str(), "status"],
            format!("lockctl --server {dead} status"),
        ),
        (
            vec!["run", "job", "-s", dead.as_str(), "-c", touch.as_str()],
            format!("lockctl run job --server {dead} -c '{touch}'"),
        ),
    ] {
        let started = Instant::now();
        let out = output(d.lockctl(&args)).await;
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.starts_with("lockctl: -s is --shared now"), "{err}");
        assert!(err.contains(&format!("\n  {fixed}\n")), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2), "{args:?}");
    }
    assert!(!ran(&dir, "ran"));
    assert_eq!(d.holder("job").await, None);
    // The line it suggests works.
    let out = output(lockctl_at(&dead, &["--server", &d.addr, "status"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "no locks held");
}
