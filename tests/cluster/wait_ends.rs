//! A wait that runs out (`wait=`) at the moment its grant is being made. etcd orders the two
//! writes, the grant and the waiter's leaving, and the waiter must be told what etcd did:
//! the grant when it came first, `ERR TIMEOUT` only when its place was taken out before any
//! grant, `ERR UNAVAILABLE` when etcd does not say which. A client told `ERR TIMEOUT` while
//! etcd holds a grant for it has a lock nobody will use or release: if its front-end dies
//! before taking it back, the lock sits out its ttl. The chaos run (`chaos.rs`) found that
//! once; this is it, made to happen every time.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::thread;
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::etcd::{EtcdCluster, LinkedFrontEnd, LockdFrontEnd};
use common::line::Line;
use common::{field, token};

const PATIENCE: Duration = Duration::from_secs(30);

/// A waits on FE1 behind `h`, which FE1's own UNLOCK ends, granting A in the same etcd write
/// (a plain lease: A is FE1's waiter). FE1 hears nothing back from etcd for a while (its
/// writes still apply), so A's wait runs out on FE1 after etcd granted A, and FE1's write
/// taking A's place out finds it gone. Once FE1 hears again, A is told OK with the grant's
/// token, and holds the lock.
#[test]
fn a_wait_that_runs_out_while_its_grant_is_made_ends_with_the_grant() {
    wait_runs_out_after_the_grant(Unlock::SameFrontEnd);
}

/// The same with the UNLOCK through FE2: its write grants A on FE1's etcd lease, and FE1
/// confirms the grant (takes it off its lease) once it hears again, then tells A.
#[test]
fn a_wait_that_runs_out_while_another_front_end_grants_it_ends_with_the_grant() {
    wait_runs_out_after_the_grant(Unlock::OtherFrontEnd);
}

/// Three etcd members; FE1 through links the test cuts, with `--etcd-request-timeout
/// request_timeout` and an etcd lease that outlasts any cut here (what FE1 is told is about
/// its waiter's leaving, never a lost lease); FE2 direct.
fn front_ends(request_timeout: &str) -> (EtcdCluster, LinkedFrontEnd, LockdFrontEnd) {
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let fe1 = LinkedFrontEnd::start(
        &etcd,
        &prefix,
        &[
            "--etcd-lease-ttl",
            "30s",
            "--etcd-request-timeout",
            request_timeout,
        ],
    );
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    (etcd, fe1, fe2)
}

/// Through which front-end `h`'s UNLOCK goes.
#[derive(Clone, Copy, PartialEq)]
enum Unlock {
    SameFrontEnd,
    OtherFrontEnd,
}

fn wait_runs_out_after_the_grant(unlock: Unlock) {
    if !have(Need::Etcd) {
        return;
    }
    // A long request timeout: the cut lasts a few seconds, and the answers FE1 waits for
    // must not run out meanwhile.
    let (_etcd, fe1, fe2) = front_ends("20s");
    let h = match unlock {
        Unlock::SameFrontEnd => token(&fe1.request("LOCK n h ttl=60s")),
        Unlock::OtherFrontEnd => token(&fe2.request("LOCK n h ttl=60s")),
    };
    let mut a = Line::connect(fe1.addr());
    let asked = Instant::now();
    let wait = Duration::from_secs(4);
    a.send(&format!("LOCK n a ttl=60s wait={}s", wait.as_secs()));
    // The view of the front-end that unlocks has A first in the queue: its UNLOCK then
    // grants A in the same write.
    eventually(PATIENCE, "A waits", || {
        [fe1.request("STATUS n"), fe2.request("STATUS n")]
            .iter()
            .all(|status| field(status, "waiters").as_deref() == Some("1"))
    });
    fe1.cut_replies();
    let mut u = match unlock {
        Unlock::SameFrontEnd => Line::connect(fe1.addr()),
        Unlock::OtherFrontEnd => Line::connect(fe2.addr()),
    };
    u.send(&format!("UNLOCK n {h}"));
    // etcd granted A (FE2 shows it): the grant came before A's wait ran out.
    eventually(PATIENCE, "etcd granted A", || {
        field(&fe2.request("STATUS n"), "id").as_deref() == Some("a")
    });
    let granted = field(&fe2.request("STATUS n"), "token");
    // A's wait runs out on FE1 while it hears nothing.
    thread::sleep((wait + Duration::from_secs(1)).saturating_sub(asked.elapsed()));
    fe1.heal();
    assert_eq!(u.line(), "OK");
    let reply = a.line();
    assert!(
        reply.starts_with("OK "),
        "A was granted in etcd before its wait ran out, yet told {reply:?}"
    );
    assert_eq!(Some(token(&reply).to_string()), granted);
    let ta = token(&reply);
    assert!(fe2
        .request(&format!("CHECK n {ta}"))
        .starts_with("OK ttl_ms="));
    // And it stays A's: nobody takes it back.
    let mut b = Line::connect(fe2.addr());
    b.send("LOCK n b ttl=60s");
    assert_eq!(
        b.line_within(Duration::from_secs(3)),
        None,
        "B granted while A holds n"
    );
    assert!(fe1
        .request(&format!("CHECK n {ta}"))
        .starts_with("OK ttl_ms="));
    assert_eq!(fe1.request(&format!("UNLOCK n {ta}")), "OK");
    assert!(token(&b.line()) > ta);
}

/// A waits on FE1 behind `h`, and FE1's links to etcd are cut before A's wait runs out: the
/// write taking A's place out gets no answer, so FE1 can't know whether a grant came first.
/// A is told `ERR UNAVAILABLE` (send the same LOCK again), not `ERR TIMEOUT`, which would say
/// it was not granted. Once the links are back, nothing is left of A: `h` still holds `n`
/// and B, queued after A, is granted when `h` lets go.
#[test]
fn a_wait_that_runs_out_while_etcd_does_not_answer_is_unavailable() {
    if !have(Need::Etcd) {
        return;
    }
    let (_etcd, fe1, fe2) = front_ends("1s");
    let h = token(&fe2.request("LOCK n h ttl=60s"));
    let mut a = Line::connect(fe1.addr());
    a.send("LOCK n a ttl=60s wait=2s");
    eventually(PATIENCE, "A waits", || {
        field(&fe1.request("STATUS n"), "waiters").as_deref() == Some("1")
    });
    fe1.cut();
    let reply = a.line();
    assert!(
        reply.starts_with("ERR UNAVAILABLE "),
        "A's leaving went unanswered, yet A was told {reply:?}"
    );
    fe1.heal();
    let mut b = Line::connect(fe2.addr());
    b.send("LOCK n b ttl=60s");
    eventually(PATIENCE, "A's place is out", || {
        let status = fe2.request("STATUS n");
        field(&status, "id").as_deref() == Some("h")
            && field(&status, "waiters").as_deref() == Some("1")
    });
    assert_eq!(fe2.request(&format!("UNLOCK n {h}")), "OK");
    let reply = b.line();
    assert!(reply.starts_with("OK "), "{reply:?}");
    assert!(token(&reply) > h);
}
