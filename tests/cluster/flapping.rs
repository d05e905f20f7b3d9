//! Flapping links: 16 clients spread over three front-ends take one lock in turn and
//! increment a fenced counter for 20 seconds, while every front-end's links to etcd are cut and
//! healed every few hundred milliseconds, each on its own rhythm (both ends keep running; what
//! was sent during a cut arrives after it, late). The bound this checks is the strictest
//! there is: zero double grants, zero token regressions, no grant to a waiter after it was
//! told it left, FIFO as the queue was shown, every waiter granted or answered
//! ([`common::history`]); proto.md's cluster section states the same.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::chaos::Run;
use common::etcd::{EtcdCluster, LinkedFrontEnd, LockdFrontEnd};

const CLIENTS: usize = 16;
/// Twenty seconds: the simulator (`tests/sim`) searches cuts and heals of every front-end's
/// links over thousands of seeded runs, and replays what it finds; this run is the ground
/// truth on real etcd, real sockets and real time, not the search (it was a minute).
const FLAPPING: Duration = Duration::from_secs(20);

/// Cuts and heals one front-end's links until `stop`: cut for 300-700 ms, up for 300-1500 ms.
fn flap(fe: Arc<LinkedFrontEnd>, seed: u64, stop: Arc<AtomicBool>) -> usize {
    let mut rng = seed;
    let mut next = move |lo: u64, hi: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        Duration::from_millis(lo + (rng >> 33) % (hi - lo))
    };
    let mut cuts = 0;
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(next(300, 1500));
        fe.cut();
        cuts += 1;
        thread::sleep(next(300, 700));
        fe.heal();
    }
    cuts
}

#[test]
fn a_fenced_counter_sees_no_double_grant_while_links_flap() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let fes: Vec<Arc<LinkedFrontEnd>> = (0..3)
        .map(|_| {
            Arc::new(LinkedFrontEnd::start(
                &etcd,
                &prefix,
                &["--etcd-lease-ttl", "2s", "--etcd-request-timeout", "1s"],
            ))
        })
        .collect();
    // Watches and reads the queue over links that stay up.
    let observer = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let addrs: Vec<SocketAddr> = fes.iter().map(|f| f.addr()).collect();
    let run = Run::start(CLIENTS, addrs, observer.addr());

    let stop = Arc::new(AtomicBool::new(false));
    let flappers: Vec<_> = fes
        .iter()
        .enumerate()
        .map(|(i, fe)| {
            let (fe, stop) = (Arc::clone(fe), Arc::clone(&stop));
            thread::spawn(move || flap(fe, 17 + i as u64 * 7919, stop))
        })
        .collect();
    let began = Instant::now();
    while began.elapsed() < FLAPPING {
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let cuts: usize = flappers
        .into_iter()
        .map(|f| f.join().expect("flapper"))
        .sum();
    let during = run.sections();
    let outcome = run.finish();
    eprintln!(
        "{} critical sections, {cuts} cuts over {} front-ends",
        outcome.sections,
        fes.len()
    );
    outcome.assert_clean();
    // Every front-end runs throughout: every waiter is granted or answered.
    assert_eq!(outcome.verdict.unanswered, 0, "LOCKs never answered");
    // Progress despite the flapping (a number of hand-overs, not a speed).
    assert!(
        during >= 10,
        "only {during} critical sections in {FLAPPING:?}"
    );
}
