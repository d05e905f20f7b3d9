//! contrib/verify: several workers take turns on one lock of a real lockd, and the checker
//! finds their logs clean; hand-made logs with an overlap, a token regression or bad lines
//! make it fail with the documented exit codes.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use common::blocking::Server;

const GUARD: Duration = Duration::from_secs(120);

/// A scratch directory of this test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "lockd-contrib-verify-{}-{test}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tool(name: &str) -> Command {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("contrib/verify")
        .join(name);
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits for `child` (failing if it outlives GUARD); its status, stdout and stderr.
fn finish(child: Child) -> (ExitStatus, String, String) {
    let out = common::blocking::finish(child, "", GUARD);
    (out.status, out.stdout, out.stderr)
}

fn check(logs: &[&Path]) -> (Option<i32>, String, String) {
    let child = tool("lockd-verify-check")
        .args(logs)
        .spawn()
        .expect("python3 must be installed (CI installs it)");
    let (status, out, err) = finish(child);
    (status.code(), out, err)
}

#[test]
fn concurrent_workers_leave_clean_logs() {
    let lockd = Server::start();
    let scratch = Scratch::new("workers");
    let logs: Vec<PathBuf> = (0..4)
        .map(|i| scratch.0.join(format!("worker{i}.log")))
        .collect();
    let workers: Vec<Child> = logs
        .iter()
        .enumerate()
        .map(|(i, log)| {
            tool("lockd-verify-worker")
                .arg("--server")
                .arg(lockd.addr.to_string())
                .args(["--name", "verify", "--count", "15", "--hold", "0.005"])
                .args(["--id", &format!("worker-{i}")])
                .arg("--log")
                .arg(log)
                .spawn()
                .expect("python3 must be installed (CI installs it)")
        })
        .collect();
    for worker in workers {
        let (status, out, err) = finish(worker);
        assert!(status.success(), "worker failed: {out}\n{err}");
    }
    let paths: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let (code, out, err) = check(&paths);
    assert_eq!(code, Some(0), "checker: {out}\n{err}");
    assert!(
        out.contains("checked 60 intervals from 4 logs: 0 overlaps, 0 token regressions"),
        "{out}"
    );
}

#[test]
fn an_overlap_across_logs_fails_with_1() {
    let scratch = Scratch::new("overlap");
    let a = scratch.file("a.log", "# machine a\n10 1000 2000\n12 5000 6000\n");
    let b = scratch.file("b.log", "11 1999 3000\n");
    let (code, out, _) = check(&[&a, &b]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("overlap"), "{out}");
    assert!(out.contains("1 overlaps, 0 token regressions"), "{out}");
}

#[test]
fn a_token_regression_fails_with_1() {
    let scratch = Scratch::new("regression");
    let a = scratch.file("a.log", "10 1000 2000\n12 3000 4000\n");
    let b = scratch.file("b.log", "\n11 5000 6000\n");
    let (code, out, _) = check(&[&a, &b]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("token regression"), "{out}");
    assert!(out.contains("0 overlaps, 1 token regressions"), "{out}");
}

#[test]
fn touching_intervals_and_growing_tokens_are_clean() {
    let scratch = Scratch::new("clean");
    let a = scratch.file("a.log", "10 1000 2000\n12 3000 4000\n");
    let b = scratch.file("b.log", "11 2000 3000\n");
    let (code, out, _) = check(&[&a, &b]);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn bad_input_fails_with_2() {
    let scratch = Scratch::new("bad");
    for text in ["10 1000\n", "10 2000 1000\n", "x 1 2\n", "0 1 2\n"] {
        let log = scratch.file("bad.log", text);
        let (code, out, err) = check(&[&log]);
        assert_eq!(code, Some(2), "{text:?}: {out}\n{err}");
        assert!(err.contains("bad.log:1"), "{err}");
    }
    let missing = scratch.0.join("missing.log");
    assert_eq!(check(&[&missing]).0, Some(2));
}

#[test]
fn leases_that_expire_during_the_work_are_caught() {
    // Leases far shorter than the work: the server hands the lock to the next worker while
    // the first still works, and the checker must see it. (Each worker works 2 s in all, so
    // their runs overlap in time however the processes are scheduled.)
    let lockd = Server::start();
    let scratch = Scratch::new("expiring");
    let logs: Vec<PathBuf> = (0..2)
        .map(|i| scratch.0.join(format!("worker{i}.log")))
        .collect();
    let workers: Vec<Child> = logs
        .iter()
        .enumerate()
        .map(|(i, log)| {
            tool("lockd-verify-worker")
                .arg("--server")
                .arg(lockd.addr.to_string())
                .args(["--name", "short", "--count", "5", "--hold", "0.4"])
                .args(["--ttl", "50ms", "--plain", "--id", &format!("worker-{i}")])
                .arg("--log")
                .arg(log)
                .spawn()
                .expect("python3 must be installed (CI installs it)")
        })
        .collect();
    for worker in workers {
        let (status, out, err) = finish(worker);
        // 1: some UNLOCK found its lease gone, as it must here.
        assert_eq!(status.code(), Some(1), "worker: {out}\n{err}");
    }
    let paths: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let (code, out, err) = check(&paths);
    assert_eq!(code, Some(1), "checker: {out}\n{err}");
    assert!(out.contains("overlap"), "{out}");
}
