//! The etcd test harness (`common::etcd`) itself: that the cluster it starts is a real one
//! (healthy, one leader, a new leader when the leader dies, a member that rejoins after a
//! restart, no health without a quorum), that it cleans up after itself, and that a lockd it
//! runs comes back on the same port after kill -9. Needs etcd, not lockd's etcd backend.
//!
//! Durations are printed (`--nocapture`) for people sizing cluster tests; nothing asserts them.

use crate::common;
use crate::common::needs::{have, Need};

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use common::blocking::eventually;
use common::etcd::{EtcdCluster, LockdFrontEnd, ETCD_PATIENCE};

/// Waits until the leader by /metrics is the leader every running member's own status names:
/// the two ways of asking agree. Returns that leader. Both are asked again on every poll,
/// since leadership may move meanwhile: with 10 ms heartbeats on a busy machine, a follower
/// that misses a few calls an election, even right after the cluster started.
fn wait_status_agrees(cluster: &mut EtcdCluster) -> usize {
    let mut agreed = None;
    cluster.wait_for(
        "/metrics and every member's status to name one leader",
        |c| {
            let Some(leader) = c.leader() else {
                return false;
            };
            let Some(id) = c
                .status(leader)
                .and_then(|s| s["header"]["member_id"].as_str().map(str::to_owned))
            else {
                return false;
            };
            agreed = Some(leader);
            (0..c.len()).all(|i| {
                !c.is_running(i)
                    || c.status(i)
                        .is_some_and(|s| s["leader"].as_str() == Some(id.as_str()))
            })
        },
    );
    agreed.expect("a leader")
}

#[test]
fn a_killed_leader_is_replaced_and_rejoins_after_a_restart() {
    if !have(Need::Etcd) {
        return;
    }
    let started = Instant::now();
    let mut cluster = EtcdCluster::start(3);
    eprintln!("3-member cluster healthy in {:?}", started.elapsed());

    let urls = cluster.client_urls();
    assert_eq!(urls.len(), 3);
    for url in &urls {
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    }
    assert_eq!(cluster.endpoints(), urls.join(","));
    assert_eq!(
        cluster.lockd_args("/p/"),
        ["--etcd", &urls.join(","), "--etcd-prefix", "/p/"]
    );
    // Every member's /health said true before start() returned. Not asked again here: an
    // election under way since would make it false for a moment, and that is etcd's doing.

    let leader = wait_status_agrees(&mut cluster);

    let killed = Instant::now();
    cluster.kill(leader);
    assert_eq!(
        cluster.health(leader),
        None,
        "a killed member answers nothing"
    );
    let next = cluster.wait_leader();
    eprintln!(
        "new leader {:?} after kill -9 of the leader",
        killed.elapsed()
    );
    assert_ne!(next, leader);
    cluster.wait_healthy();
    wait_status_agrees(&mut cluster);

    let restarted = Instant::now();
    cluster.restart(leader);
    cluster.wait_member_health(leader, true);
    eprintln!("restarted member healthy in {:?}", restarted.elapsed());
    cluster.wait_healthy();
    cluster.wait_leader();
    wait_status_agrees(&mut cluster);
}

#[test]
fn without_a_quorum_members_are_unhealthy_until_it_is_back() {
    if !have(Need::Etcd) {
        return;
    }
    let mut cluster = EtcdCluster::start(3);
    cluster.wait_leader();

    cluster.kill(0);
    cluster.kill(1);
    let lost = Instant::now();
    cluster.wait_member_health(2, false);
    eprintln!(
        "survivor unhealthy {:?} after losing the quorum",
        lost.elapsed()
    );
    // A leader alone steps down once it misses its quorum (etcd's check-quorum).
    cluster.wait_for("the survivor to have no leader", |c| {
        c.is_leader(2) == Some(false) && c.leader().is_none()
    });
    let status = cluster.status(2).expect("survivor status");
    assert_eq!(status["errors"][0], "etcdserver: no leader", "{status}");

    let back = Instant::now();
    cluster.restart(0);
    cluster.wait_member_health(2, true);
    eprintln!(
        "quorum back {:?} after restarting one member",
        back.elapsed()
    );
    cluster.restart(1);
    cluster.wait_healthy();
    cluster.wait_leader();
}

#[test]
fn a_stopped_leader_hands_over_and_rejoins() {
    if !have(Need::Etcd) {
        return;
    }
    let mut cluster = EtcdCluster::start(3);
    let leader = cluster.wait_leader();
    let stopped = Instant::now();
    cluster.stop(leader);
    assert!(!cluster.is_running(leader));
    let next = cluster.wait_leader();
    eprintln!(
        "new leader {:?} after SIGTERM to the leader",
        stopped.elapsed()
    );
    assert_ne!(next, leader);
    cluster.restart(leader);
    cluster.wait_healthy();
}

#[test]
fn a_single_member_cluster_takes_extra_flags() {
    if !have(Need::Etcd) {
        return;
    }
    let mut cluster = EtcdCluster::start_with(
        1,
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "1000",
        ],
    );
    assert_eq!(cluster.wait_leader(), 0);
    // The flags reach every run of the member, restarts included.
    cluster.kill(0);
    cluster.restart(0);
    cluster.wait_healthy();
    assert_eq!(cluster.wait_leader(), 0);
}

/// Whether a process is running whose command line contains `needle` (/proc, Linux).
fn process_with_arg(needle: &str) -> bool {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .any(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
}

#[test]
fn dropping_the_cluster_kills_its_members_and_removes_its_files() {
    if !have(Need::Etcd) {
        return;
    }
    let cluster = EtcdCluster::start(3);
    let root = cluster.root().to_path_buf();
    // The cluster token is on every member's command line and names the directory.
    let token = root.file_name().unwrap().to_string_lossy().into_owned();
    assert!(cluster.data_dir(0).is_dir());
    assert!(
        process_with_arg(&token),
        "members run with the token {token}"
    );

    drop(cluster);
    assert!(!root.exists(), "{} still exists", root.display());
    assert!(!process_with_arg(&token), "an etcd of {token} still runs");
}

/// Set for the child process of [`a_killed_test_process_leaves_no_etcd_behind`].
const HELPER: &str = "LOCKD_TEST_ETCD_HELPER";

/// Not a test of its own: run as a child process by
/// [`a_killed_test_process_leaves_no_etcd_behind`], it starts a cluster, says where, and
/// waits to be killed. Does nothing when run any other way (`--ignored`).
#[test]
#[ignore = "a helper, run as a child process by a_killed_test_process_leaves_no_etcd_behind"]
fn helper_starts_a_cluster_and_waits_to_be_killed() {
    if std::env::var_os(HELPER).is_none() {
        return;
    }
    let cluster = EtcdCluster::start(3);
    println!("root={}", cluster.root().display());
    std::io::stdout().flush().expect("flush");
    // Only a guard: the parent kills this process long before.
    std::thread::sleep(ETCD_PATIENCE);
}

#[test]
fn a_killed_test_process_leaves_no_etcd_behind() {
    if !have(Need::Etcd) {
        return;
    }
    let mut helper = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "etcd_harness::helper_starts_a_cluster_and_waits_to_be_killed",
            "--ignored",
            "--nocapture",
        ])
        .env(HELPER, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run the helper test");
    let stdout = helper.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(root) = line.strip_prefix("root=") {
                let _ = tx.send(std::path::PathBuf::from(root));
            }
        }
    });
    let root = rx.recv_timeout(ETCD_PATIENCE).unwrap_or_else(|_| {
        let _ = helper.kill();
        panic!("the helper never had a cluster running")
    });
    let token = root.file_name().unwrap().to_string_lossy().into_owned();
    assert!(process_with_arg(&token), "the helper's members run");

    // SIGKILL: the helper runs no Drop; only the kernel can take its members down.
    helper.kill().expect("kill the helper");
    helper.wait().expect("reap the helper");
    eventually(
        ETCD_PATIENCE,
        "the killed helper's etcd members exit",
        || !process_with_arg(&token),
    );
    std::fs::remove_dir_all(&root).expect("remove the helper's etcd directory");
}

#[test]
fn a_front_end_comes_back_on_its_port_after_kill_9() {
    // Plain lockd (no --etcd): this checks the process handling, not cluster mode.
    let mut lockd = LockdFrontEnd::spawn(vec![]);
    let addr = lockd.addr();
    assert_eq!(lockd.process().addr, addr);
    assert_eq!(lockd.request("PING"), "OK PONG");

    let log = lockd.kill();
    assert!(!lockd.is_running());
    assert!(log.iter().any(|l| l.contains("listening")), "{log:#?}");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "nothing listens on {addr} after kill -9"
    );

    lockd.restart();
    assert_eq!(lockd.addr(), addr);
    assert_eq!(lockd.request("PING"), "OK PONG");
    lockd.stop();
    lockd.restart();
    assert_eq!(lockd.request("PING"), "OK PONG");
}
