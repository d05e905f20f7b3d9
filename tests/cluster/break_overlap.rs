//! Cluster mode: a broken job never runs beside the next holder's, through two front-ends.
//! Job 1 holds the lock through front-end A and writes a timestamp every 20ms (and goes on
//! for 300ms after SIGTERM, as a job that cleans up does); job 2 waits through front-end B;
//! the BREAK comes through B. Job 1's last write must come before job 2's first: the break
//! reaches job 1's lockctl through A's watch, and the lease keeps its place in etcd until that
//! lockctl's UNLOCK, once the job is gone.
#![cfg(feature = "etcd")]

use super::basics::etcd;
use crate::common;
use crate::common::needs::{have, Need};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::etcd::LockdFrontEnd;

const PATIENCE: Duration = Duration::from_secs(30);

fn lockctl(server: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    cmd.args(["--server", server])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockd-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn stamps(path: &Path) -> Vec<u128> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Waits for `child` within the patience; kills it if it does not end.
fn finish(mut child: Child) -> Output {
    let give_up = Instant::now() + PATIENCE;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > give_up {
            let _ = child.kill();
            panic!("lockctl did not end within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn a_job_broken_through_another_front_end_is_gone_before_the_next_one_starts() {
    if !have(Need::Etcd) {
        return;
    }
    let prefix = format!("{}break-overlap/", etcd().prefix());
    let fes: Vec<LockdFrontEnd> = (0..2)
        .map(|_| LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "5s"]))
        .collect();
    let (a, b) = (fes[0].addr().to_string(), fes[1].addr().to_string());
    let dir = scratch("cluster-break-overlap");
    let (log, start) = (dir.join("job1.log"), dir.join("job2.start"));
    let write = format!("date +%s%N >> {}; sleep 0.02", log.display());
    let script = format!(
        "trap 'for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do {write}; done; exit 0' TERM; \
         while :; do {write}; done"
    );
    let job1 = lockctl(&a, &["run", "cbrk", "--kill-grace", "1s", "-c", &script])
        .spawn()
        .expect("lockctl");
    let give_up = Instant::now() + PATIENCE;
    while stamps(&log).len() < 3 {
        assert!(Instant::now() < give_up, "job 1 never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = format!("date +%s%N > {}; sleep 0.2", start.display());
    let job2 = lockctl(&b, &["run", "cbrk", "-c", &second])
        .spawn()
        .expect("lockctl");
    super::basics::wait_waiters(&fes[1], "cbrk", 1);

    let out = lockctl(&b, &["break", "cbrk", "-y"])
        .output()
        .expect("lockctl break");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out1 = finish(job1);
    assert_eq!(
        out1.status.code(),
        Some(4),
        "job 1: {}",
        String::from_utf8_lossy(&out1.stderr)
    );
    let out2 = finish(job2);
    assert_eq!(
        out2.status.code(),
        Some(0),
        "job 2: {}",
        String::from_utf8_lossy(&out2.stderr)
    );
    let last = *stamps(&log).iter().max().expect("job 1 wrote");
    let first = stamps(&start)[0];
    assert!(
        last < first,
        "job 1 wrote at {last}, after job 2 started at {first} (overlap {}ms)",
        (last - first) / 1_000_000
    );
    eprintln!(
        "cluster: job 2 started {}ms after job 1's last write",
        (first - last) / 1_000_000
    );
    let _ = std::fs::remove_dir_all(&dir);
}
