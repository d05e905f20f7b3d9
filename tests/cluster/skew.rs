//! Cluster mode when one front-end's clock is off by seconds (libfaketime moves that
//! process's wall clock only; its monotonic clock, and every other process, keep true time).
//!
//! A lease's ttl is counted by whoever ends it, and whoever wrote it may be another
//! front-end: these tests put the skewed clock on each side of that. The bound they check is
//! the one proto.md states: a lease never ends before its ttl, whatever the front-ends'
//! wall clocks say (here: not within a second of it, with a clock 5 s off).
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::path::Path;
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::etcd::{EtcdCluster, LockdFrontEnd};
use common::line::Line;
use common::{field, token};

const PATIENCE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(8);
/// How much of the ttl a test allows to go missing (the grant's delivery, the watch, the
/// machine being slow): far less than the 5 s skew.
const SLACK: Duration = Duration::from_secs(1);

/// Debian's libfaketime (package faketime), which `.ci/run` installs.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A front-end whose wall clock is off by `offset` (as libfaketime writes it: `+5s`, `-5s`).
fn skewed(etcd: &EtcdCluster, prefix: &str, offset: &str) -> Option<LockdFrontEnd> {
    if !Path::new(LIBFAKETIME).exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the clock-skew tests: install faketime"
        );
        eprintln!("skipped: needs libfaketime; apt-get install faketime");
        return None;
    }
    let mut args = etcd.lockd_args(prefix);
    args.extend(["--etcd-lease-ttl".to_string(), "2s".to_string()]);
    let env = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", offset),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    Some(LockdFrontEnd::spawn_with_env(args, env.collect()))
}

fn waiters(fe: &LockdFrontEnd, name: &str) -> usize {
    field(&fe.request(&format!("STATUS {name}")), "waiters")
        .and_then(|w| w.parse().ok())
        .unwrap_or(0)
}

/// `next` was queued behind a lease that began at `began` with ttl [`TTL`]: it must not be
/// granted before that ttl is (nearly) over.
fn granted_after_ttl(next: &mut Line, began: Instant, what: &str) {
    let reply = next.line();
    let after = began.elapsed();
    assert!(reply.starts_with("OK "), "{what}: {reply}");
    assert!(
        after + SLACK >= TTL,
        "{what}: the lease ended {after:?} after it began, before its ttl of {TTL:?}"
    );
}

/// The front-end that ends the lease runs 5 s ahead: the lease was written by another
/// front-end (its release granted this front-end's waiter), on the other's clock.
#[test]
fn a_front_end_ahead_never_ends_a_lease_early() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let Some(ahead) = skewed(&etcd, &prefix, "+5s") else {
        return;
    };
    let fe = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let h = token(&fe.request("LOCK x h ttl=60s"));
    let mut a = Line::connect(ahead.addr());
    a.send(&format!("LOCK x a ttl={}s", TTL.as_secs()));
    eventually(PATIENCE, "A waits", || waiters(&fe, "x") == 1);
    let mut next = Line::connect(fe.addr());
    next.send("LOCK x next ttl=30s");
    eventually(PATIENCE, "the next one waits", || waiters(&fe, "x") == 2);
    assert_eq!(fe.request(&format!("UNLOCK x {h}")), "OK");
    let ta = token(&a.line());
    let began = Instant::now();
    assert!(ta > h);
    // Nobody renews: the lease runs out on the front-end ahead, which owns it.
    granted_after_ttl(&mut next, began, "ended by the front-end ahead");
}

/// The front-end that writes the lease (a RENEW through it) runs 5 s behind; the front-end
/// that ends it keeps true time.
#[test]
fn a_front_end_behind_never_makes_a_lease_end_early() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let Some(behind) = skewed(&etcd, &prefix, "-5s") else {
        return;
    };
    let fe = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let t = token(&fe.request("LOCK y holder ttl=60s"));
    let mut next = Line::connect(fe.addr());
    next.send("LOCK y next ttl=30s");
    eventually(PATIENCE, "the next one waits", || waiters(&fe, "y") == 1);
    let renewed = behind.request(&format!("RENEW y {t} ttl={}s", TTL.as_secs()));
    let began = Instant::now();
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    granted_after_ttl(&mut next, began, "renewed through the front-end behind");
}
