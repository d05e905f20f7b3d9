//! etcd membership changes under load: 12 clients take one lock in turn through three
//! front-ends and increment a fenced counter while the etcd cluster's members are replaced,
//! as an operator moving etcd to new machines does it: the leader is removed
//! (`etcdctl member remove`) and a new member added (`member add`, then started to join),
//! then a follower the same way. The front-ends were started with the first three members'
//! URLs and are never told of the new ones. The history checker's bound is the strictest
//! there is, as in the chaos and flapping runs: no double grant, no token regression, no
//! grant to a waiter after it was told it left, FIFO, every waiter granted or answered.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use common::chaos::Run;
use common::etcd::{EtcdCluster, LockdFrontEnd};

const CLIENTS: usize = 12;
/// Load before, between and after the changes.
const SETTLE: Duration = Duration::from_secs(3);

/// Member `i` (`what`) removed, then a new member added in its place; load goes on after.
fn replace(etcd: &mut EtcdCluster, run: &Run, i: usize, what: &str) {
    run.mark(format!("etcd m{i}, {what}, removed"));
    etcd.remove_member(i);
    etcd.wait_leader();
    let added = etcd.add_member();
    run.mark(format!("etcd m{added} added"));
    thread::sleep(SETTLE);
}

#[test]
fn a_fenced_counter_sees_no_double_grant_while_etcd_members_are_replaced() {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let flags = ["--etcd-lease-ttl", "2s", "--etcd-request-timeout", "1s"];
    let fes: Vec<LockdFrontEnd> = (0..3)
        .map(|_| LockdFrontEnd::start(&etcd, &prefix, &flags))
        .collect();
    let observer = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let addrs: Vec<SocketAddr> = fes.iter().map(LockdFrontEnd::addr).collect();
    let run = Run::start(CLIENTS, addrs, observer.addr());
    thread::sleep(SETTLE);
    let before = run.sections();

    let leader = etcd.wait_leader();
    replace(&mut etcd, &run, leader, "the leader");
    // One of the first three: the front-ends' lists then have one live member left.
    let follower = (0..3)
        .find(|&i| etcd.is_running(i) && etcd.is_leader(i) == Some(false))
        .expect("a follower among the first members");
    replace(&mut etcd, &run, follower, "a follower");

    let during = run.sections() - before;
    let outcome = run.finish();
    eprintln!(
        "{} critical sections, {during} of them while members were replaced",
        outcome.sections
    );
    outcome.assert_clean();
    assert_eq!(outcome.verdict.unanswered, 0, "LOCKs never answered");
    // The lock kept moving through the changes (a number of hand-overs, not a speed).
    assert!(
        during >= 20,
        "only {during} critical sections during the changes"
    );
    // Every front-end still serves, through the one first member left and the new ones.
    for fe in &fes {
        let status = fe.request("STATUS");
        assert!(status.starts_with("OK "), "{status}");
    }
}
