//! flock(1)'s promise for the whole job: `lockctl run` holds the lock until the command *and
//! every process it started* have exited, stops all of them when it must, and takes all of
//! them down if it is killed itself, before the server could grant the lock to anyone else.
//! (Linux: the job's supervisor is a child subreaper.)

use crate::common;

use std::path::Path;
use std::time::Duration;

use lockd::proto::Tie;
use tokio::process::Child;
use tokio::time::{sleep, timeout};

use common::lockctl::*;

/// `sh -c '<body>'` started in the background by the command, for a `-c` script.
fn background(body: &str) -> String {
    format!("sh -c '{body}' &")
}

/// A background process that ignores SIGINT and SIGTERM, says its pid in `pid` and runs
/// until killed.
fn stubborn(pid: &Path) -> String {
    background(&format!(
        "trap \"\" INT TERM; echo $$ > {}; while :; do sleep 0.05; done",
        pid.display()
    ))
}

async fn exits(child: &mut Child) -> i32 {
    let status = timeout(GUARD, child.wait())
        .await
        .expect("lockctl hung")
        .unwrap();
    status.code().unwrap_or(-1)
}

/// The issue's own case: `lockctl run x -c 'sleep 2 &'` used to exit at once and free the lock
/// while the sleep ran on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_sleep_keeps_the_lock_until_it_ends() {
    let d = lockd().await;
    let dir = scratch("job-sleep");
    let pid_file = dir.join("sleep");
    let script = format!("sleep 2 & echo $! > {}", pid_file.display());
    let mut child = spawn(d.lockctl(&["run", "bgsleep", "-c", &script]));
    let sleep_pid = read_pid(&pid_file).await;
    d.wait_held("bgsleep").await;
    let out = output(d.lockctl(&["run", "-n", "bgsleep", "--", "true"])).await;
    assert_eq!(code(&out), 1, "a second run got the lock: {}", stderr(&out));
    assert_eq!(exits(&mut child).await, 0);
    assert!(
        !alive(sleep_pid),
        "lockctl exited while the sleep still ran"
    );
    assert_eq!(d.holder("bgsleep").await, None);
}

/// The command exits at once, its background child runs on: the lock stays held (STATUS, and
/// another run -n is refused), lockctl says so with -v, and exits 0 once the child is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_child_holds_the_lock_after_the_command_exits() {
    let d = lockd().await;
    let dir = scratch("job-bg");
    let (pid_file, go) = (dir.join("pid"), dir.join("go"));
    let script = background(&format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done",
        pid_file.display(),
        go.display()
    ));
    let mut child = spawn(d.lockctl(&["-v", "run", "bg", "-c", &script]));
    let mut err = stderr_lines(&mut child);
    let pid = read_pid(&pid_file).await;
    // The child, and maybe its `sleep` of the moment. (Renewals keep coming, each line
    // within line_with's guard: the whole wait has one of its own.)
    let line = timeout(GUARD, line_with(&mut err, "started still run"))
        .await
        .expect("no word that processes still run");
    assert!(line.contains("the command exited 0, but "), "{line}");
    assert!(line.contains("holding bg"), "{line}");
    assert!(child.try_wait().unwrap().is_none(), "lockctl exited");
    let token = d.wait_held("bg").await;
    let out = output(d.lockctl(&["run", "-n", "bg", "--", "true"])).await;
    assert_eq!(code(&out), 1, "a second run got the lock: {}", stderr(&out));
    assert_eq!(d.holder("bg").await, Some(token));
    std::fs::write(&go, "").unwrap();
    let released = format!("released bg token {token}");
    timeout(GUARD, line_with(&mut err, &released))
        .await
        .expect("never released");
    assert_eq!(exits(&mut child).await, 0);
    assert!(!alive(pid));
    assert_eq!(d.holder("bg").await, None);
}

/// SIGTERM to lockctl goes to the whole job; a background child that ignores it is SIGKILLed
/// after --kill-grace, and lockctl exits only once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_whole_job_and_kills_what_ignores_it() {
    let d = lockd().await;
    let dir = scratch("job-term");
    let (pid_file, ready) = (dir.join("pid"), dir.join("ready"));
    let script = format!(
        "{} until [ -s {pid} ]; do sleep 0.02; done; echo ready > {ready}; wait",
        stubborn(&pid_file),
        pid = pid_file.display(),
        ready = ready.display()
    );
    let mut child = spawn(d.lockctl(&["run", "term", "--kill-grace", "2s", "-c", &script]));
    let pid = read_pid(&pid_file).await;
    wait_for_file(&ready).await;
    signal(&child, libc::SIGTERM);
    // It ignores SIGTERM: only the SIGKILL, a grace later, can stop it.
    sleep(Duration::from_millis(300)).await;
    assert!(alive(pid), "killed before the grace was up");
    assert!(child.try_wait().unwrap().is_none(), "lockctl exited");
    // The command (the shell waiting) died of the SIGTERM: its code is lockctl's.
    assert_eq!(exits(&mut child).await, 128 + libc::SIGTERM);
    assert!(!alive(pid), "lockctl exited while the job still ran");
    assert_eq!(d.holder("term").await, None);
}

/// The lease taken away on the server: every process of the job is stopped (a background one
/// that ignores SIGTERM with SIGKILL), lockctl exits 4 after the last is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_kills_a_background_child_that_ignores_sigterm() {
    let d = lockd().await;
    let dir = scratch("job-lost");
    let pid_file = dir.join("pid");
    let args = [
        "run",
        "joblost",
        "--ttl",
        "3s",
        "--kill-grace",
        "200ms",
        "-c",
        &stubborn(&pid_file),
    ];
    let mut child = spawn(d.lockctl(&args));
    let pid = read_pid(&pid_file).await;
    let token = d.wait_held("joblost").await;
    d.client().await.unlock("joblost", token).await.unwrap();
    assert_eq!(exits(&mut child).await, 4);
    assert!(!alive(pid), "lockctl exited while the job still ran");
    let out = finish(child).await;
    assert!(
        stderr(&out).contains("lock lost: joblost"),
        "{}",
        stderr(&out)
    );
}

/// A job under `lockctl run <name>` with a grandchild and a double-forked setsid'd daemon
/// (outside the command's process group), while another client waits for the lock: what the
/// kill tests below take down.
struct TreeJob {
    lockctl: Child,
    /// The grandchild's and the daemon's.
    pids: [i32; 2],
    watch: lockd::client::Client,
    next: tokio::task::JoinHandle<Result<lockd::locks::Token, lockd::client::ClientError>>,
}

impl TreeJob {
    async fn start(d: &Server, name: &str, options: &[&str]) -> TreeJob {
        let mut watch = d.client().await;
        watch.watch(Some(name)).await.unwrap();
        let dir = scratch(&format!("job-tree-{name}"));
        let (grandchild, daemon) = (dir.join("grandchild"), dir.join("daemon"));
        let script = format!(
            "sh -c 'sleep 300 & echo $! > {g}; wait' & \
             (setsid sh -c 'echo $$ > {d}; exec sleep 300' &); wait",
            g = grandchild.display(),
            d = daemon.display()
        );
        let mut args = vec!["run", name, "--ttl", "60s"];
        args.extend(options);
        args.extend(["-c", &script]);
        let lockctl = spawn(d.lockctl(&args));
        let pids = [read_pid(&grandchild).await, read_pid(&daemon).await];
        d.wait_held(name).await;
        let mut client = d.client().await;
        let owned = name.to_owned();
        let next = tokio::spawn(async move {
            let wait = Some(Duration::from_secs(30));
            client.lock(&owned, "next", None, wait, Tie::Plain).await
        });
        d.wait_waiters(name, 1).await;
        TreeJob {
            lockctl,
            pids,
            watch,
            next,
        }
    }

    /// Every process of the job is dead before the waiting client is granted the lock.
    async fn gone_before_the_next_grant(&mut self) {
        let dead_at = wait_dead(&self.pids).await;
        let granted_at = event_at(&mut self.watch, "acquired", Some("next")).await;
        assert!(
            dead_at < granted_at,
            "the job outlived the lock: all dead at {dead_at}, next granted at {granted_at}"
        );
        timeout(GUARD, &mut self.next)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

/// lockctl killed with SIGKILL (the OOM killer): its supervisor kills the whole job at once,
/// a grandchild and a double-forked setsid'd daemon included, before the session grace ends
/// and the server grants the lock to the next in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_lockctl_takes_the_whole_job_down_before_the_next_grant() {
    let d = lockd().await;
    let mut job = TreeJob::start(&d, "killed", &["--session-grace", "2s"]).await;
    signal(&job.lockctl, libc::SIGKILL);
    let _ = timeout(GUARD, job.lockctl.wait()).await.unwrap();
    job.gone_before_the_next_grant().await;
}

/// The supervisor of lockctl's job, by its name among lockctl's children.
fn supervisor_of(lockctl: u32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        let ppid: u32 = rest.split(' ').nth(1)?.parse().ok()?;
        (ppid == lockctl && name == "lockctl-job").then_some(pid)
    })
}

/// The job's supervisor itself killed with SIGKILL (lockctl lives on): what the job left
/// running outside the command's group (a setsid'd daemon) comes to lockctl, its subreaper,
/// which kills it before it releases the lock: the next holder is granted only after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_leaves_lockctl_to_kill_the_job_before_the_release() {
    let d = lockd().await;
    let mut job = TreeJob::start(&d, "orphans", &[]).await;
    let lockctl = job.lockctl.id().expect("lockctl runs");
    let supervisor = supervisor_of(lockctl).expect("lockctl's job has a supervisor");
    // SAFETY: plain kill of the test's own grandchild.
    unsafe {
        libc::kill(supervisor, libc::SIGKILL);
    }
    job.gone_before_the_next_grant().await;
    assert_eq!(
        exits(&mut job.lockctl).await,
        2,
        "lockctl says the supervisor died"
    );
}

/// The lease lost to a network cut (lockctl cannot renew, the server ends the lease one grace
/// after it saw the connection close): every process of the job, in the command's group or
/// not, is dead before the next holder is granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_to_a_cut_stops_the_whole_tree_before_the_next_grant() {
    let d = lockd().await;
    let p = proxy(d.addr.clone()).await;
    let mut watch = d.client().await;
    watch.watch(Some("cut")).await.unwrap();
    let dir = scratch("job-cut");
    let (leader, stubborn_pid, daemon) = (dir.join("leader"), dir.join("bg"), dir.join("daemon"));
    let script = format!(
        "trap '' TERM; echo $$ > {leader}; {bg} \
         (setsid sh -c 'trap \"\" TERM; echo $$ > {d}; while :; do sleep 0.05; done' &); wait",
        leader = leader.display(),
        bg = stubborn(&stubborn_pid),
        d = daemon.display()
    );
    let args = [
        "run",
        "cut",
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
    let pids = [
        read_pid(&leader).await,
        read_pid(&stubborn_pid).await,
        read_pid(&daemon).await,
    ];
    d.wait_held("cut").await;
    let mut next = d.client().await;
    let waiting = tokio::spawn(async move {
        let wait = Some(Duration::from_secs(30));
        next.lock("cut", "next", None, wait, Tie::Plain).await
    });
    d.wait_waiters("cut", 1).await;
    p.refuse(true);
    p.cut();
    let dead_at = wait_dead(&pids).await;
    let out = finish(child).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let granted_at = event_at(&mut watch, "acquired", Some("next")).await;
    assert!(
        dead_at < granted_at,
        "the job outlived the lease: all dead at {dead_at}, next granted at {granted_at}"
    );
    timeout(GUARD, waiting).await.unwrap().unwrap().unwrap();
}

/// Many jobs queue for one lock, each starting background children that outlive the command:
/// no two jobs' lifetimes (from the command's start to the exit of its last process) overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_jobs_with_background_children_never_overlap() {
    const JOBS: usize = 24;
    let d = lockd().await;
    let dir = scratch("job-stress");
    let children: Vec<Child> = (0..JOBS)
        .map(|i| {
            let (start, end) = (dir.join(format!("{i}.start")), dir.join(format!("{i}.end")));
            let last = |pause: &str| {
                background(&format!(
                    "trap \"date +%s%N >> {}\" EXIT; sleep {pause}; :",
                    end.display()
                ))
            };
            // The command returns at once; its children end 50 and 150 ms later, one of
            // them a grandchild whose parent is gone by then.
            let script = format!(
                "date +%s%N > {}; {} (sh -c 'sleep 0.15; date +%s%N >> {}' &)",
                start.display(),
                last("0.05"),
                end.display()
            );
            spawn(d.lockctl(&["run", "stress", "-w", "60s", "-c", &script]))
        })
        .collect();
    for child in children {
        let out = finish(child).await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let mut spans: Vec<(u128, u128, usize)> = (0..JOBS)
        .map(|i| {
            let read = |name: String| std::fs::read_to_string(dir.join(name)).unwrap();
            let start = read(format!("{i}.start")).trim().parse().unwrap();
            let ends = read(format!("{i}.end"));
            let ends: Vec<u128> = ends.lines().map(|l| l.parse().unwrap()).collect();
            assert_eq!(ends.len(), 2, "job {i}: {ends:?}");
            (start, ends.into_iter().max().unwrap(), i)
        })
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        assert!(
            end < start,
            "job {a} still ran at {end} when job {b} started at {start}"
        );
    }
    assert_eq!(d.holder("stress").await, None);
}

/// The descriptors lockctl was given reach the command as before (the supervisor's own
/// control socket takes a number that was free): `lockctl run ... 3>file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_given_to_lockctl_reaches_the_command() {
    use std::os::fd::AsRawFd as _;

    let d = lockd().await;
    let dir = scratch("job-fd3");
    let path = dir.join("fd3");
    let file = std::fs::File::create(&path).unwrap();
    let fd = file.as_raw_fd();
    let mut cmd = d.lockctl(&["run", "fd3", "-c", "echo through >&3"]);
    // SAFETY: dup2 and fcntl are async-signal-safe; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "through\n");
}

/// A job that keeps forking while it is stopped (each child ignores SIGTERM and sleeps): the
/// SIGKILL sweep is repeated until none is left, so no child forked during the kill survives,
/// and lockctl exits only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_forks_while_it_is_killed_leaves_no_process_behind() {
    let d = lockd().await;
    let dir = scratch("job-forks");
    let pids = dir.join("pids");
    let script = format!(
        "trap '' TERM; while :; do sh -c 'trap \"\" TERM; echo $$ >> {pids}; exec sleep 300' & \
         sleep 0.01; done",
        pids = pids.display()
    );
    let mut child = spawn(d.lockctl(&["run", "forks", "--kill-grace", "300ms", "-c", &script]));
    let give_up = tokio::time::Instant::now() + GUARD;
    while std::fs::read_to_string(&pids).map_or(0, |t| t.lines().count()) < 5 {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the job never forked"
        );
        sleep(Duration::from_millis(20)).await;
    }
    signal(&child, libc::SIGTERM);
    assert_eq!(exits(&mut child).await, 128 + libc::SIGKILL);
    let text = std::fs::read_to_string(&pids).unwrap();
    let left: Vec<i32> = text
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&p| alive(p))
        .collect();
    assert!(
        left.is_empty(),
        "still alive after lockctl exited: {left:?}"
    );
    assert_eq!(d.holder("forks").await, None);
}
