//! A LOCK that the mirror says must wait is queued in one write that also reads the name
//! (`src/backend/etcd/enqueue.rs`, `enqueue`), and that read, not the mirror, decides what
//! the request does. Here the mirror is wrong every time: front-end B's watch applies each
//! message late (`LOCKD_TEST_WATCH_LAG`, a seam of debug builds), while A, without lag, makes
//! the changes B has not seen yet. What a client of B is told must be what one server would
//! tell it (proto.md, "The same id again"): its own id's grant again, not a wait behind
//! itself; its own id's older wait taken over, not a second place in the queue; a free name
//! granted.
#![cfg(feature = "etcd")]

use super::basics::etcd;
use crate::common;
use crate::common::needs::{have, Need};

use std::time::Duration;

use common::blocking::eventually;
use common::etcd::LockdFrontEnd;
use common::line::Line;
use common::start::Lockd;
use common::{field, token};

/// How late B's watch applies each message: far longer than a request here takes, so B's
/// LOCK is always decided on a mirror that has not seen A's last writes.
const LAG: &str = "1500ms";

/// Longer than the few lagged watch messages a test waits for.
const PATIENCE: Duration = Duration::from_secs(30);

/// Front-end A and the lagging front-end B on one prefix, with a watcher on B.
struct Two {
    a: LockdFrontEnd,
    b: LockdFrontEnd,
    b_watch: Line,
}

impl Two {
    /// `None` in a release build (the seam is not there: B's mirror would be as current as
    /// A's, and these tests would prove nothing, though they would pass) or without etcd.
    fn start(test: &str) -> Option<Two> {
        if !cfg!(debug_assertions) || !have(Need::Etcd) {
            return None;
        }
        let prefix = format!("{}lag-{test}/", etcd().prefix());
        let a = LockdFrontEnd::start(etcd(), &prefix, &[]);
        let lagging = Lockd::new()
            .etcd(&etcd().endpoints(), &prefix)
            .envs(&[("LOCKD_TEST_WATCH_LAG".to_owned(), LAG.to_owned())]);
        let b = LockdFrontEnd::of(lagging);
        let mut b_watch = Line::connect(b.addr());
        assert_eq!(b_watch.req("WATCH n"), "OK watching n");
        Some(Two { a, b, b_watch })
    }

    /// A client of A granted `n` as `id`, and its token, once B's mirror shows the grant.
    fn held_on_a(&mut self, id: &str) -> (Line, u64) {
        let mut c = Line::connect(self.a.addr());
        let t = c.lock(&format!("n {id} ttl=30s"));
        self.b_sees_acquired(id);
        (c, t)
    }

    /// Waits until B's mirror shows `id` granted `n` (B's watcher hears it from there).
    fn b_sees_acquired(&mut self, id: &str) {
        loop {
            let event = self
                .b_watch
                .line_within(PATIENCE)
                .unwrap_or_else(|| panic!("B's watcher heard nothing of {id} within {PATIENCE:?}"));
            if event.starts_with(&format!("EVENT acquired n {id} ")) {
                return;
            }
        }
    }
}

#[test]
fn the_id_that_holds_gets_its_grant_again_though_the_mirror_shows_another_holder() {
    let Some(mut two) = Two::start("again") else {
        return;
    };
    let (mut a, t1) = two.held_on_a("other");
    // A: other releases, and j takes it. B's mirror still shows other holding.
    assert_eq!(a.req(&format!("UNLOCK n {t1}")), "OK");
    let t2 = a.lock("n j ttl=30s");
    // B: the same id again is its grant again, at once: the same token, not a wait behind
    // itself (which would end in ERR TIMEOUT).
    let mut b = Line::connect(two.b.addr());
    assert_eq!(b.req("LOCK n j ttl=30s wait=20s"), format!("OK {t2}"));
    // And there is one holder, j, with that token: a release by it frees the name.
    assert_eq!(b.req(&format!("UNLOCK n {t2}")), "OK");
    let t3 = a.lock("n k ttl=30s wait=20s");
    assert!(t3 > t2, "token {t3} after {t2}");
}

#[test]
fn the_id_that_waits_elsewhere_takes_its_place_over_though_the_mirror_shows_no_such_wait() {
    let Some(mut two) = Two::start("replace") else {
        return;
    };
    let (mut holder, t1) = two.held_on_a("h");
    // A: j waits behind h. B's mirror does not show that wait.
    let mut first = Line::connect(two.a.addr());
    first.send("LOCK n j ttl=30s wait=25s");
    // (A queued it by the time its holder's STATUS shows a waiter.)
    eventually(PATIENCE, "j waiting on A", || {
        field(&two.a.request("STATUS n"), "waiters").as_deref() == Some("1")
    });
    // B: the same id waits again; it takes the older request's place (that one is told
    // REPLACED), rather than queueing a second wait of j.
    let mut second = Line::connect(two.b.addr());
    second.send("LOCK n j ttl=30s wait=25s");
    let replaced = first
        .line_within(PATIENCE)
        .expect("the first wait's answer");
    assert!(replaced.starts_with("ERR REPLACED"), "{replaced}");
    // h releases: the second request is granted, and it alone holds the name.
    assert_eq!(holder.req(&format!("UNLOCK n {t1}")), "OK");
    let granted = second
        .line_within(PATIENCE)
        .expect("the second wait's answer");
    let t2 = token(&granted);
    assert!(t2 > t1, "token {t2} after {t1}");
    eventually(PATIENCE, "j holding alone, as A sees it", || {
        let status = two.a.request("STATUS n");
        field(&status, "token") == Some(t2.to_string())
            && field(&status, "waiters").as_deref() == Some("0")
    });
}

#[test]
fn a_free_name_is_granted_though_the_mirror_shows_it_held() {
    let Some(mut two) = Two::start("free") else {
        return;
    };
    let (mut a, t1) = two.held_on_a("h");
    // A: h releases; the name is free and nobody waits. B's mirror still shows h.
    assert_eq!(a.req(&format!("UNLOCK n {t1}")), "OK");
    let mut b = Line::connect(two.b.addr());
    b.send("LOCK n j ttl=30s wait=25s");
    let granted = b.line_within(PATIENCE).expect("the LOCK's answer");
    let t2 = token(&granted);
    assert!(t2 > t1, "token {t2} after {t1}");
}
