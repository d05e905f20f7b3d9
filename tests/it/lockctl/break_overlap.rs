//! The promise `lockctl break` keeps: a broken job never runs beside the next holder's. Job 1
//! writes a timestamp every 20ms under the lock; job 2 waits for the same lock and writes
//! its start time; an operator breaks job 1's lease. Job 1's last write must come before job
//! 2's first, every run: lockctl hears of the break at once (it watches its lock's name),
//! stops the whole job, and only its UNLOCK, once the job is gone, lets the server grant
//! job 2. Measured here, not assumed.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// Job 1's loop: a timestamp (ns) a line, every 20ms. On SIGTERM it goes on writing for
/// 300ms more before it exits, as a job that cleans up does (so a hand-over that does not
/// wait for the job shows as an overlap); `ignore_term`: it (and the `sleep` and `date` it
/// starts, which inherit the ignored signal) takes SIGKILL to stop.
fn writer(log: &Path, ignore_term: bool) -> String {
    let log = log.display();
    let write = format!("date +%s%N >> {log}; sleep 0.02");
    let trap = if ignore_term {
        "trap '' TERM".to_owned()
    } else {
        format!(
            "trap 'for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do {write}; done; exit 0' TERM"
        )
    };
    format!("{trap}; while :; do {write}; done")
}

fn stamps(path: &Path) -> Vec<u128> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Runs the measurement with job 1's extra `lockctl run` options; returns how long after job
/// 1's last write job 2 started, and how long the hand-over took from the break.
async fn measure(test: &str, job1_opts: &[&str], ignore_term: bool) -> (Duration, Duration) {
    let d = lockd().await;
    let dir = scratch(test);
    let (log, start) = (dir.join("job1.log"), dir.join("job2.start"));
    let mut args = vec!["run", "brk", "--kill-grace", "1s"];
    args.extend_from_slice(job1_opts);
    let script = writer(&log, ignore_term);
    args.extend(["-c", &script]);
    let job1 = spawn(d.lockctl(&args));
    let give_up = tokio::time::Instant::now() + GUARD;
    while stamps(&log).len() < 3 {
        assert!(tokio::time::Instant::now() < give_up, "job 1 never wrote");
        sleep(Duration::from_millis(20)).await;
    }
    let second = format!("date +%s%N > {}; sleep 0.2", start.display());
    let job2 = spawn(d.lockctl(&["run", "brk", "-c", &second]));
    d.wait_waiters("brk", 1).await;

    let broke = Instant::now();
    let out = output(d.lockctl(&["break", "brk", "-y"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out1 = finish(job1).await;
    assert_eq!(code(&out1), 4, "job 1: {}", stderr(&out1));
    let out2 = finish(job2).await;
    let handed = broke.elapsed();
    assert_eq!(code(&out2), 0, "job 2: {}", stderr(&out2));

    let last = *stamps(&log).iter().max().expect("job 1 wrote");
    let first = stamps(&start)[0];
    assert!(
        last < first,
        "job 1 wrote at {last}, after job 2 started at {first} (overlap {}ms)",
        (last - first) / 1_000_000
    );
    // Nothing of job 1 writes any more: its whole tree is gone.
    let before = stamps(&log).len();
    sleep(Duration::from_millis(100)).await;
    assert_eq!(stamps(&log).len(), before, "job 1 still writes");
    let _ = std::fs::remove_dir_all(&dir);
    let gap = Duration::from_nanos(u64::try_from(first - last).unwrap_or(u64::MAX));
    (gap, handed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_job_is_gone_before_the_next_one_starts() {
    let (gap, _) = measure("overlap-defaults", &[], false).await;
    eprintln!("defaults: job 2 started {gap:?} after job 1's last write");
}

/// The README's advice for long outages: renewals come every 20s, and the lease would last
/// 5 minutes; the hand-over still comes as soon as the job is gone, since lockctl hears of
/// the break at once (a liveness bound far from any renewal time, not a timing assertion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_job_with_a_long_lease_is_gone_before_the_next_one_starts_and_soon() {
    let opts = ["--ttl", "5m", "--session-grace", "60s"];
    let (gap, handed) = measure("overlap-long", &opts, false).await;
    eprintln!("--ttl 5m --session-grace 60s: gap {gap:?}, hand-over {handed:?}");
    assert!(
        handed < Duration::from_secs(15),
        "the hand-over waited for a renewal: {handed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_job_that_ignores_sigterm_is_killed_before_the_next_one_starts() {
    let (gap, _) = measure("overlap-term", &[], true).await;
    eprintln!("SIGTERM ignored: gap {gap:?}");
}
