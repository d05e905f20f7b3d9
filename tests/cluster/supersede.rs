//! Cluster mode: newest-wins queues (`supersede`) across front-ends. The superseding LOCK's
//! one transaction takes every waiter's key out of the queue, and each waiter's own front-end
//! answers it `ERR SUPERSEDED` (not `ERR UNAVAILABLE`, not silence).
#![cfg(feature = "etcd")]

use super::basics::{etcd, wait_held, wait_waiters};
use crate::common;
use crate::common::needs::{have, Need};

use std::time::Duration;

use common::blocking::eventually;
use common::etcd::LockdFrontEnd;
use common::line::Line;
use common::{field, token};

const PATIENCE: Duration = Duration::from_secs(20);

/// `n` front-ends sharing a prefix of their own.
fn front_ends(n: usize, extra: &[&str]) -> Vec<LockdFrontEnd> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let prefix = format!(
        "{}supersede{}/",
        etcd().prefix(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    (0..n)
        .map(|_| LockdFrontEnd::start(etcd(), &prefix, extra))
        .collect()
}

#[test]
fn waiters_on_two_front_ends_are_superseded_from_a_third() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(3, &["--etcd-lease-ttl", "5s"]);
    let mut holder = Line::connect(fes[0].addr());
    let th = holder.lock("deploy h");
    let mut a = Line::connect(fes[0].addr());
    a.send("LOCK deploy a");
    for fe in &fes {
        wait_waiters(fe, "deploy", 1);
    }
    let mut b = Line::connect(fes[1].addr());
    b.send("LOCK deploy b wait=1m");
    for fe in &fes {
        wait_waiters(fe, "deploy", 2);
    }
    // wait=0 finds it held: nothing changes.
    let mut c = Line::connect(fes[2].addr());
    assert!(c
        .req("LOCK deploy c wait=0 supersede")
        .starts_with("ERR TIMEOUT "));
    wait_waiters(&fes[2], "deploy", 2);

    c.send("LOCK deploy c supersede");
    assert_eq!(
        a.line(),
        "ERR SUPERSEDED deploy: a newer LOCK by c took the queue"
    );
    assert_eq!(
        b.line(),
        "ERR SUPERSEDED deploy: a newer LOCK by c took the queue"
    );
    for fe in &fes {
        wait_waiters(fe, "deploy", 1);
    }
    // The holder kept it; the superseded connections stay open.
    let status = fes[1].request("STATUS deploy");
    assert_eq!(field(&status, "token"), Some(th.to_string()), "{status}");
    assert_eq!(field(&status, "id").as_deref(), Some("h"), "{status}");
    assert_eq!(a.req("PING"), "OK PONG");
    assert_eq!(b.req("PING"), "OK PONG");

    assert_eq!(holder.req(&format!("UNLOCK deploy {th}")), "OK");
    let tc = token(&c.line());
    assert!(tc > th, "{tc} after {th}");
    // c's grant was answered through fes[2]: fes[0] shows it once its watch has seen it.
    wait_held(&fes[0], "deploy", tc);
    let status = fes[0].request("STATUS deploy");
    assert_eq!(field(&status, "id").as_deref(), Some("c"), "{status}");
    assert_eq!(c.req(&format!("UNLOCK deploy {tc}")), "OK");
}

#[test]
fn the_same_id_waiting_elsewhere_is_replaced_by_its_supersede() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2, &["--etcd-lease-ttl", "5s"]);
    let mut holder = Line::connect(fes[0].addr());
    let th = holder.lock("s h");
    let mut old = Line::connect(fes[0].addr());
    old.send("LOCK s me");
    wait_waiters(&fes[1], "s", 1);
    let mut other = Line::connect(fes[0].addr());
    other.send("LOCK s other");
    wait_waiters(&fes[1], "s", 2);
    let mut new = Line::connect(fes[1].addr());
    new.send("LOCK s me supersede");
    assert!(old.line().starts_with("ERR REPLACED "));
    assert_eq!(
        other.line(),
        "ERR SUPERSEDED s: a newer LOCK by me took the queue"
    );
    assert_eq!(holder.req(&format!("UNLOCK s {th}")), "OK");
    assert!(token(&new.line()) > th);
}

/// RENEW ... detach in cluster mode: the holder key no longer hangs on its front-end's etcd
/// lease, so the lease outlives its connection and its front-end.
#[test]
fn a_detached_lease_outlives_its_connection_and_its_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let mut fes = front_ends(2, &["--etcd-lease-ttl", "2s"]);
    let mut a = Line::connect(fes[0].addr());
    let t = a.lock("w a session ttl=1m");
    assert_eq!(
        a.req(&format!("RENEW w {t} ttl=40s detach")),
        "OK ttl_ms=40000"
    );
    // Controls: a session lease closed with it, and one left open on the same front-end.
    let mut c = Line::connect(fes[0].addr());
    let ctl = c.lock("ctl c session");
    let mut s = Line::connect(fes[0].addr());
    let other = s.lock("other s session=30s ttl=1m");
    // fes[1] shows what its watch has seen: until it has seen these, "free" there says nothing.
    for (name, token) in [("w", t), ("ctl", ctl), ("other", other)] {
        wait_held(&fes[1], name, token);
    }
    drop(a);
    drop(c);
    eventually(
        PATIENCE,
        "the control lease ends with its connection",
        || fes[1].request("STATUS ctl") == "OK ctl free",
    );
    let status = fes[1].request("STATUS w");
    assert_eq!(field(&status, "token"), Some(t.to_string()), "{status}");
    assert_eq!(field(&status, "session").as_deref(), Some("0"), "{status}");

    // The front-end dies: its etcd lease ends, and the session lease on it with it.
    fes[0].kill();
    eventually(
        PATIENCE,
        "the session lease ends with its front-end",
        || fes[1].request("STATUS other") == "OK other free",
    );
    let status = fes[1].request("STATUS w");
    assert_eq!(field(&status, "token"), Some(t.to_string()), "{status}");
    let mut b = Line::connect(fes[1].addr());
    assert_eq!(b.req(&format!("UNLOCK w {t}")), "OK");
    drop(s);
}

fn lockctl(servers: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--server", servers])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("lockctl")
}

/// `lockctl run --at-least` through a cluster: the job's lock is kept (a plain lease) after
/// lockctl exits, a late `-n` finds it held, and it ends by its ttl. `--supersede` exits 6.
#[test]
fn lockctl_at_least_and_supersede_through_a_cluster() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2, &["--etcd-lease-ttl", "2s"]);
    let servers = format!("{},{}", fes[0].addr(), fes[1].addr());
    let out = lockctl(
        &servers,
        &["run", "hourly", "--at-least", "8s", "--", "true"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // fes[1] shows what its watch has seen: the lease turned plain a moment ago, maybe
    // through the other front-end (proto.md: STATUS in a cluster may be milliseconds behind).
    eventually(
        PATIENCE,
        "the kept lease is plain on every front-end",
        || {
            fes.iter().all(|fe| {
                let status = fe.request("STATUS hourly");
                field(&status, "session").as_deref() == Some("0")
            })
        },
    );
    let late = lockctl(&servers, &["run", "-n", "hourly", "--", "true"]);
    assert_eq!(late.status.code(), Some(1));
    eventually(PATIENCE, "the window ends", || {
        fes.iter()
            .all(|fe| fe.request("STATUS hourly") == "OK hourly free")
    });

    let mut holder = Line::connect(fes[0].addr());
    let th = holder.lock("deploy h");
    let waiting = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--server", &servers, "run", "deploy", "--", "true"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lockctl");
    wait_waiters(&fes[1], "deploy", 1);
    let mut newer = Line::connect(fes[1].addr());
    newer.send("LOCK deploy newer supersede");
    let out = waiting.wait_with_output().expect("lockctl ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert_eq!(holder.req(&format!("UNLOCK deploy {th}")), "OK");
    assert!(token(&newer.line()) > th);
}

/// A queue longer than one etcd transaction carries (etcd takes 128 operations in one; each
/// superseded waiter takes two) is superseded all the same: every waiter is told, and the
/// newest LOCK is granted next.
#[test]
fn a_queue_longer_than_one_etcd_transaction_is_superseded() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2, &[]);
    let mut holder = Line::connect(fes[0].addr());
    let th = holder.lock("long h ttl=1m");
    let mut waiting: Vec<Line> = (0..150)
        .map(|i| {
            let mut w = Line::connect(fes[0].addr());
            w.send(&format!("LOCK long w{i}"));
            w
        })
        .collect();
    wait_waiters(&fes[1], "long", waiting.len());
    let mut newest = Line::connect(fes[1].addr());
    newest.send("LOCK long newest supersede");
    for w in &mut waiting {
        assert_eq!(
            w.line(),
            "ERR SUPERSEDED long: a newer LOCK by newest took the queue"
        );
    }
    wait_waiters(&fes[0], "long", 1);
    assert_eq!(holder.req(&format!("UNLOCK long {th}")), "OK");
    assert!(token(&newest.line()) > th);
}
