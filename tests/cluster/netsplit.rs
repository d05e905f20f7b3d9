//! Cluster mode when etcd itself is split: the etcd leader is cut off from the other two
//! members while all three keep running (packet filters, [`common::netsplit`]; needs root,
//! which CI has: without it the test says so and passes, except under CI, where it fails).
//!
//! The bound: no front-end gets a grant from the minority side (a front-end that reaches
//! only the old leader answers `ERR UNAVAILABLE`, never `OK`); service goes on through the
//! majority; after the heal both sides serve again and tokens keep growing.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::time::Duration;

use common::blocking::eventually;
use common::etcd::{EtcdCluster, LockdFrontEnd};
use common::line::Line;
use common::netsplit::{self, NetSplit};
use common::token;

const PATIENCE: Duration = Duration::from_secs(30);

/// Unix users for the members: above the ones Debian hands out, one block per test process.
fn first_uid() -> u32 {
    61_000 + (std::process::id() % 1000) * 4
}

fn front_end_on(etcd: &EtcdCluster, members: &[usize], prefix: &str) -> LockdFrontEnd {
    let urls: Vec<String> = members.iter().map(|&i| etcd.client_url(i)).collect();
    LockdFrontEnd::spawn(vec![
        "--etcd".into(),
        urls.join(","),
        "--etcd-prefix".into(),
        prefix.into(),
        "--etcd-request-timeout".into(),
        "1s".into(),
    ])
}

#[test]
fn the_minority_side_of_a_split_etcd_grants_nothing() {
    if !have(Need::Etcd) {
        return;
    }
    if let Err(why) = netsplit::available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the partition tests: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let mut etcd = EtcdCluster::start_as_users(3, first_uid());
    let split = NetSplit::new(&etcd).unwrap_or_else(|e| panic!("{e}"));
    let prefix = etcd.prefix();
    let leader = etcd.wait_leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let minority = front_end_on(&etcd, &[leader], &prefix);
    let majority = front_end_on(&etcd, &others, &prefix);
    let before = token(&minority.request("LOCK warm me"));
    assert_eq!(majority.request(&format!("UNLOCK warm {before}")), "OK");
    // A waiter on the minority side, behind a holder on the majority side.
    let held = token(&majority.request("LOCK q holder ttl=60s"));
    let mut waiter = Line::connect(minority.addr());
    waiter.send("LOCK q minority-waiter ttl=30s wait=20s");
    eventually(PATIENCE, "the waiter queued", || {
        common::field(&majority.request("STATUS q"), "waiters").as_deref() == Some("1")
    });

    split.isolate(leader);
    // The majority elects a leader of its own and serves.
    eventually(PATIENCE, "the majority serves", || {
        majority.request("LOCK m a ttl=60s").starts_with("OK ")
    });
    // The release on the majority side hands q to the minority's waiter in etcd, but its
    // front-end cannot confirm it: nobody is told they hold it until the split heals.
    assert_eq!(majority.request(&format!("UNLOCK q {held}")), "OK");
    for i in 0..20 {
        let reply = minority.request(&format!("LOCK x{i} me wait=0"));
        assert!(
            reply.starts_with("ERR UNAVAILABLE"),
            "the minority side answered {reply}"
        );
    }
    assert_eq!(
        waiter.line_within(Duration::from_secs(1)),
        None,
        "the minority's waiter was told something while cut off"
    );

    split.heal();
    etcd.wait_healthy();
    // The minority's waiter was granted in etcd by the release; once its front-end is back
    // it is told (or, if its wait ran out while its front-end could not ask etcd whether it
    // was granted, it is told so, and the grant is taken back).
    let reply = waiter.line();
    assert!(
        reply.starts_with("OK ") || reply.starts_with("ERR UNAVAILABLE"),
        "{reply}"
    );
    eventually(PATIENCE, "the old leader's side serves again", || {
        minority.request("LOCK after me").starts_with("OK ")
    });
    let after = token(&majority.request("LOCK after2 me"));
    assert!(after > before, "tokens went on growing");
}
