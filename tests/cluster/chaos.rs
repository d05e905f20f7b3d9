//! Chaos: 18 clients spread over three front-ends take one lock in turn and increment a
//! fenced counter, while front-ends are killed with SIGKILL and restarted and etcd members
//! are killed and restarted (one at a time, so etcd keeps its quorum). Every critical section
//! must see a token above the last one the counter saw, no two sections may overlap, and the
//! history checker must find nothing wrong in the whole run ([`common::history`]). The same
//! chaos runs a second time over two locks that requests take alone or together, as a set
//! (`and=`): a set's grant is one etcd write over both names, so this is where a set could
//! be granted beside a holder of one of its names.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use common::chaos::Run;
use common::etcd::{EtcdCluster, LockdFrontEnd};

const CLIENTS: usize = 18;
/// Fewer for the sets' run: names are free often enough for grants at once to race.
const SET_CLIENTS: usize = 6;
const CHAOS: Duration = Duration::from_secs(20);

#[test]
fn a_fenced_counter_sees_no_double_grant_while_processes_die() {
    chaos(Run::start, CLIENTS);
}

#[test]
fn sets_and_single_names_see_no_double_grant_while_processes_die() {
    chaos(Run::start_sets, SET_CLIENTS);
}

/// Starts a cluster, the run `start` makes on it, and [`CHAOS`] of kills and restarts; then
/// judges the run.
fn chaos(start: fn(usize, Vec<SocketAddr>, SocketAddr) -> Run, clients: usize) {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut fes: Vec<LockdFrontEnd> = (0..3)
        .map(|_| LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "1s"]))
        .collect();
    // Watches and reads the queue; never killed, so it sees the whole run.
    let observer = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let addrs: Vec<SocketAddr> = fes.iter().map(LockdFrontEnd::addr).collect();
    let run = start(clients, addrs.clone(), observer.addr());

    let began = Instant::now();
    let mut round = 0usize;
    let mut kills = Vec::new();
    while began.elapsed() < CHAOS {
        thread::sleep(Duration::from_millis(700));
        if round.is_multiple_of(2) {
            let f = (round / 2) % fes.len();
            fes[f].kill();
            run.mark(format!("front-end {f} ({}) killed", addrs[f]));
            kills.push(format!("front-end {f}"));
            thread::sleep(Duration::from_millis(500));
            fes[f].restart();
            run.mark(format!("front-end {f} restarted"));
        } else {
            let m = (round / 2) % 3;
            etcd.kill(m);
            run.mark(format!("etcd member {m} killed"));
            kills.push(format!("etcd member {m}"));
            thread::sleep(Duration::from_millis(800));
            etcd.restart(m);
            etcd.wait_healthy();
            run.mark(format!("etcd member {m} restarted and healthy"));
        }
        round += 1;
    }
    let during = run.sections();
    let outcome = run.finish();
    outcome.assert_clean();
    // Progress despite the chaos (a number of hand-overs, not a speed).
    assert!(
        during >= 50,
        "only {during} critical sections in {CHAOS:?} of {kills:?}"
    );
    eprintln!(
        "{} critical sections, {} kills: {kills:?}",
        outcome.sections,
        kills.len()
    );
}
