//! BREAK in cluster mode: a holder on one front-end broken through another, its next RENEW
//! and CHECK through its own front-end saying who broke it, the lease kept in its place until
//! its holder lets go (or, with `force`, not), then the next waiter (on either front-end)
//! granted with a higher token, and the `broken` event on every front-end.
#![cfg(feature = "etcd")]

use super::basics::{etcd, wait_waiters};
use crate::common;
use crate::common::needs::{have, Need};

use std::time::Duration;

use common::blocking::eventually;
use common::etcd::LockdFrontEnd;
use common::line::Line;
use common::token;

const PATIENCE: Duration = Duration::from_secs(20);

fn front_ends(n: usize, tag: &str) -> Vec<LockdFrontEnd> {
    let prefix = format!("{}breaks-{tag}/", etcd().prefix());
    (0..n)
        .map(|_| LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "2s"]))
        .collect()
}

/// `ERR NOTHELD <name>: lease <token> was broken by <who> at <ms>`: returns `<who>` (here,
/// without users, the breaker's `ip:port`).
fn assert_broken(reply: &str, name: &str, token: u64) -> String {
    let want = format!("ERR NOTHELD {name}: lease {token} was broken by ");
    let rest = reply
        .strip_prefix(&want)
        .unwrap_or_else(|| panic!("{reply:?} is not {want:?}<who> at <ms>"));
    let (who, ms) = rest.split_once(" at ").expect("who and when");
    assert!(ms.parse::<u64>().is_ok(), "{reply:?}");
    assert!(who.starts_with("127.0.0.1:"), "{reply:?}");
    who.to_owned()
}

#[test]
fn a_break_through_one_front_end_ends_a_holder_of_another_and_grants_the_next() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2, "across");
    let (a, b) = (&fes[0], &fes[1]);
    let mut watch_b = Line::connect(b.addr());
    assert_eq!(watch_b.req("WATCH deploy"), "OK watching deploy");
    let mut holder = Line::connect(b.addr());
    let t1 = holder.lock("deploy stuck ttl=1m");
    let mut waiter = Line::connect(a.addr());
    waiter.send("LOCK deploy next ttl=1m");
    wait_waiters(a, "deploy", 1);
    wait_waiters(b, "deploy", 1);

    let mut op = Line::connect(a.addr());
    assert_eq!(op.req("BREAK deploy"), "OK broken=1");

    // The holder's own front-end tells it who broke it.
    let who = assert_broken(&holder.req(&format!("RENEW deploy {t1}")), "deploy", t1);
    assert_eq!(
        assert_broken(&holder.req(&format!("CHECK deploy {t1}")), "deploy", t1),
        who
    );
    // The broken lease keeps its place (its job is still being stopped) on both front-ends:
    // nobody is granted, and a BREAK sent again changes nothing.
    for fe in [a, b] {
        let status = fe.request("STATUS deploy");
        assert!(status.contains(&format!(" token={t1} ")), "{status}");
    }
    assert_eq!(op.req("BREAK deploy"), "OK broken=1");
    // Its holder lets go (through its own front-end): then the waiter on the other is granted.
    assert_eq!(holder.req(&format!("UNLOCK deploy {t1}")), "OK");
    let t2 = token(&waiter.line());
    assert!(t2 > t1, "{t2} after {t1}");
    // B's watchers see the break, with who, its end, then the grant.
    let mut saw = Vec::new();
    while saw.len() < 4 {
        saw.push(watch_b.line());
    }
    assert!(
        saw[0].starts_with(&format!("EVENT acquired deploy stuck {t1} ")),
        "{saw:?}"
    );
    assert!(
        saw[1].starts_with(&format!("EVENT broken deploy stuck {t1} "))
            && saw[1].ends_with(&format!(" by={who}")),
        "{saw:?}"
    );
    assert!(
        saw[2].starts_with(&format!("EVENT released deploy stuck {t1} ")),
        "{saw:?}"
    );
    assert!(
        saw[3].starts_with(&format!("EVENT acquired deploy next {t2} ")),
        "{saw:?}"
    );
    assert!(waiter
        .req(&format!("CHECK deploy {t2}"))
        .starts_with("OK ttl_ms="));
}

#[test]
fn one_slot_of_a_semaphore_broken_elsewhere_goes_to_the_waiter_on_the_holders_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2, "slot");
    let (a, b) = (&fes[0], &fes[1]);
    let mut p = Line::connect(b.addr());
    let mut q = Line::connect(b.addr());
    let tp = p.lock("pool p limit=2 ttl=1m");
    let tq = q.lock("pool q limit=2 ttl=1m");
    let mut w = Line::connect(b.addr());
    w.send("LOCK pool w limit=2 ttl=1m");
    wait_waiters(a, "pool", 1);
    let mut op = Line::connect(a.addr());
    assert_eq!(op.req(&format!("BREAK pool {tp} force")), "OK broken=1");
    let tw = token(&w.line());
    assert!(tw > tq, "{tw} after {tq}");
    assert!(q.req(&format!("CHECK pool {tq}")).starts_with("OK ttl_ms="));
    let who = assert_broken(&p.req(&format!("RENEW pool {tp}")), "pool", tp);
    // Nothing of that token is left to break, and the answer says why.
    assert_eq!(
        assert_broken(&op.req(&format!("BREAK pool {tp} force")), "pool", tp),
        who
    );
    // Every holder at once: the name is free after.
    assert_eq!(op.req("BREAK pool force"), "OK broken=2");
    eventually(PATIENCE, "pool free", || {
        b.request("STATUS pool").starts_with("OK pool free")
    });
}
