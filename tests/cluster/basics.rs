//! Cluster mode (`lockd --etcd`): the protocol through several front-ends on one real
//! 3-member etcd cluster on loopback. Each test has its own key prefix, so they share the
//! etcd cluster and not their locks. Failures of processes are in failover.rs.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::sync::OnceLock;
use std::time::Duration;

use common::blocking::eventually;
use common::etcd::{EtcdCluster, LockdFrontEnd};
use common::line::Line;
use common::{field, token};

const PATIENCE: Duration = Duration::from_secs(20);

/// One etcd cluster for this file's tests. Its members end when the thread that started
/// them does (the harness asks the kernel for that, so no member outlives a killed test
/// run): they are started on a thread that lives as long as the test process.
pub(crate) fn etcd() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(EtcdCluster::start(3));
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the etcd cluster started")
    })
}

/// `n` front-ends sharing a prefix of their own.
pub(crate) fn front_ends(n: usize) -> Vec<LockdFrontEnd> {
    let prefix = format!("{}{}/", etcd().prefix(), unique());
    (0..n)
        .map(|_| LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "1s"]))
        .collect()
}

pub(crate) fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Waits until `fe`'s STATUS of `name` shows it held with `token` (its mirror caught up).
pub(crate) fn wait_held(fe: &LockdFrontEnd, name: &str, token: u64) {
    eventually(PATIENCE, &format!("{name} held with {token}"), || {
        let status = fe.request(&format!("STATUS {name}"));
        field(&status, "token").as_deref() == Some(&token.to_string())
    });
}

/// Waits until `fe`'s STATUS of `name` shows `waiters` waiters (its mirror caught up).
pub(crate) fn wait_waiters(fe: &LockdFrontEnd, name: &str, waiters: usize) {
    eventually(PATIENCE, &format!("{waiters} waiters on {name}"), || {
        let status = fe.request(&format!("STATUS {name}"));
        field(&status, "waiters").as_deref() == Some(&waiters.to_string())
    });
}

#[test]
fn waiters_on_different_front_ends_are_granted_in_queue_order() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(3);
    let mut holder = Line::connect(fes[0].addr());
    let mut last = holder.lock("job h");
    // Queued in this order, through front-ends 1, 0, 2, 1: each is in the queue (as every
    // front-end sees it) before the next one asks.
    let order = [1, 0, 2, 1];
    let mut waiters = Vec::new();
    for (i, fe) in order.iter().enumerate() {
        let mut w = Line::connect(fes[*fe].addr());
        w.send(&format!("LOCK job w{i}"));
        for fe in &fes {
            wait_waiters(fe, "job", i + 1);
        }
        waiters.push(w);
    }
    assert_eq!(holder.req(&format!("UNLOCK job {last}")), "OK");
    for i in 0..waiters.len() {
        let granted = token(&waiters[i].line());
        assert!(granted > last, "tokens grow in grant order");
        // The next in line is still waiting: one wake-up per release, in queue order.
        if let Some(next) = waiters.get_mut(i + 1) {
            assert_eq!(next.line_within(Duration::from_millis(200)), None);
        }
        last = granted;
        assert_eq!(waiters[i].req(&format!("UNLOCK job {granted}")), "OK");
    }
}

#[test]
fn a_release_wakes_only_the_head_waiter() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let mut holder = Line::connect(fes[0].addr());
    let t = holder.lock("one h");
    let mut first = Line::connect(fes[1].addr());
    first.send("LOCK one first");
    wait_waiters(&fes[0], "one", 1);
    let mut second = Line::connect(fes[0].addr());
    second.send("LOCK one second");
    wait_waiters(&fes[1], "one", 2);
    assert_eq!(holder.req(&format!("UNLOCK one {t}")), "OK");
    let granted = token(&first.line());
    assert!(granted > t);
    // The second waiter stays queued while the first holds it.
    assert_eq!(second.line_within(Duration::from_millis(500)), None);
    assert_eq!(first.req(&format!("UNLOCK one {granted}")), "OK");
    assert!(token(&second.line()) > granted);
}

#[test]
fn tokens_grow_in_grant_order_across_names_and_front_ends() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(3);
    let mut last = 0;
    for i in 0..30 {
        let mut c = Line::connect(fes[i % 3].addr());
        let t = c.lock(&format!("n{} c{i}", i % 4));
        assert!(t > last, "token {t} after {last}");
        last = t;
        assert_eq!(c.req(&format!("UNLOCK n{} {t}", i % 4)), "OK");
    }
}

#[test]
fn a_plain_lease_is_renewed_checked_and_released_through_another_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let t = token(&fes[0].request("LOCK plain me ttl=30s"));
    // Right after the grant: the other front-end reads etcd when its mirror has not caught up.
    let renewed = fes[1].request(&format!("RENEW plain {t} ttl=60s"));
    assert!(renewed.starts_with("OK "), "{renewed}");
    let left: u64 = field(&fes[1].request(&format!("CHECK plain {t}")), "ttl_ms")
        .and_then(|s| s.parse().ok())
        .expect("CHECK answers the time left");
    assert!(left > 30_000, "renewed to 60s: {left}ms left");
    assert_eq!(
        fes[1].request(&format!("UNLOCK plain {}", t + 1)),
        format!("ERR NOTHELD plain: token is not the current holder's live lease")
    );
    assert_eq!(fes[1].request(&format!("UNLOCK plain {t}")), "OK");
    assert!(fes[0]
        .request(&format!("CHECK plain {t}"))
        .starts_with("ERR NOTHELD"));
    eventually(PATIENCE, "both front-ends see it free", || {
        fes.iter()
            .all(|fe| fe.request("STATUS plain") == "OK plain free")
    });
}

#[test]
fn status_and_watch_through_any_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let mut watch = Line::connect(fes[1].addr());
    assert_eq!(watch.req("WATCH"), "OK watching *");
    let t = token(&fes[0].request("LOCK seen me ttl=300ms"));
    let acquired = watch.line();
    assert!(
        acquired.starts_with(&format!("EVENT acquired seen me {t} ")),
        "{acquired}"
    );
    let expired = watch.line();
    assert!(
        expired.starts_with(&format!("EVENT expired seen me {t} ")),
        "{expired}"
    );
    let t2 = token(&fes[1].request("LOCK seen you"));
    eventually(PATIENCE, "STATUS through the other front-end", || {
        field(&fes[0].request("STATUS seen"), "token") == Some(t2.to_string())
    });
    assert_eq!(fes[0].request(&format!("UNLOCK seen {t2}")), "OK");
    let acquired = watch.line();
    assert!(
        acquired.starts_with(&format!("EVENT acquired seen you {t2} ")),
        "{acquired}"
    );
    let released = watch.line();
    assert!(
        released.starts_with(&format!("EVENT released seen you {t2} ")),
        "{released}"
    );
}

#[test]
fn wait_zero_and_timeouts_answer_as_on_one_server() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let t = token(&fes[0].request("LOCK busy a"));
    let refused = fes[1].request("LOCK busy b wait=0");
    assert!(refused.starts_with("ERR TIMEOUT"), "{refused}");
    let timed_out = fes[1].request("LOCK busy b wait=200ms");
    assert!(timed_out.starts_with("ERR TIMEOUT"), "{timed_out}");
    // The same id again: the same token.
    assert_eq!(fes[1].request("LOCK busy a"), format!("OK {t}"));
    let wrong = fes[1].request("LOCK busy c shared wait=0");
    assert!(
        wrong.starts_with("ERR TIMEOUT") || wrong.starts_with("ERR CONFLICT"),
        "{wrong}"
    );
    // The waiter that timed out left the queue: a release frees the name.
    assert_eq!(fes[0].request(&format!("UNLOCK busy {t}")), "OK");
    eventually(PATIENCE, "free", || {
        fes[1].request("STATUS busy") == "OK busy free"
    });
}

#[test]
fn a_semaphore_spans_front_ends() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let mut a = Line::connect(fes[0].addr());
    let mut b = Line::connect(fes[1].addr());
    let ta = a.lock("lic a limit=2");
    let tb = b.lock("lic b limit=2");
    assert!(tb > ta);
    let mut c = Line::connect(fes[0].addr());
    c.send("LOCK lic c limit=2");
    wait_waiters(&fes[1], "lic", 1);
    let conflict = fes[1].request("LOCK lic d limit=3 wait=0");
    assert!(conflict.starts_with("ERR CONFLICT"), "{conflict}");
    assert_eq!(b.req(&format!("UNLOCK lic {tb}")), "OK");
    assert!(token(&c.line()) > tb);
}

#[test]
fn a_session_lease_ends_with_its_connection_and_its_grace_rides_a_move() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let mut s = Line::connect(fes[0].addr());
    let t = s.lock("sess me session");
    // Seen by the other front-end first: its "free" below must be the session's end.
    eventually(PATIENCE, "the session lease seen everywhere", || {
        field(&fes[1].request("STATUS sess"), "token") == Some(t.to_string())
    });
    drop(s);
    eventually(
        PATIENCE,
        "the session lease ends with its connection",
        || fes[1].request("STATUS sess") == "OK sess free",
    );
    // With a grace: the holder reconnects through the other front-end and renews in time.
    let mut s = Line::connect(fes[0].addr());
    let t2 = s.lock("sess me session=5s");
    assert!(t2 > t);
    // Seen held by fes[0] first: its STATUS below must be the lease as it is, not a view
    // from before the grant.
    wait_held(&fes[0], "sess", t2);
    drop(s);
    let mut moved = Line::connect(fes[1].addr());
    let renewed = moved.req(&format!("RENEW sess {t2}"));
    assert!(renewed.starts_with("OK "), "{renewed}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        field(&fes[0].request("STATUS sess"), "token"),
        Some(t2.to_string())
    );
    drop(moved);
    eventually(PATIENCE, "its grace after the second close", || {
        fes[0].request("STATUS sess") == "OK sess free"
    });
}

#[test]
fn a_lock_right_after_an_unlock_finds_the_name_free() {
    if !have(Need::Etcd) {
        return;
    }
    // A front-end's view of etcd is a watch a moment behind its own writes: a LOCK must not
    // be decided on the holder its client just released.
    let fes = front_ends(2);
    let mut c = Line::connect(fes[0].addr());
    for i in 0..300 {
        let id = if i % 2 == 0 { "same" } else { "other" };
        let reply = c.req(&format!("LOCK again {id} ttl=30s wait=0"));
        let t = token(&reply);
        assert_eq!(c.req(&format!("UNLOCK again {t}")), "OK", "cycle {i}");
    }
}

#[test]
fn cluster_tokens_continue_above_an_embedded_servers() {
    if !have(Need::Etcd) {
        return;
    }
    // A deployment moving from one lockd to a cluster: the fenced resources saw the embedded
    // server's tokens, and must take the cluster's.
    let embedded = common::Lockd::new().spawn();
    let mut last = 0;
    let mut c = Line::connect(embedded.addr);
    for i in 0..50 {
        last = c.lock(&format!("moved{i} me"));
    }
    drop(c);
    embedded.stop();
    let fes = front_ends(1);
    let first = token(&fes[0].request("LOCK moved0 me"));
    assert!(first > last, "cluster token {first} after embedded {last}");
}

#[test]
fn waiters_released_at_once_after_their_grant_hand_over_cleanly() {
    if !have(Need::Etcd) {
        return;
    }
    // Holders that release the moment they are granted, on two front-ends: the release
    // often reaches a front-end whose view still shows the releaser waiting.
    let fes = front_ends(2);
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let addr = fes[i % 2].addr();
            std::thread::spawn(move || {
                let mut c = Line::connect(addr);
                for _ in 0..60 {
                    let t = token(&again_while_unavailable(
                        &mut c,
                        &format!("LOCK rapid c{i}"),
                    ));
                    let released = again_while_unavailable(&mut c, &format!("UNLOCK rapid {t}"));
                    // NOTHELD only after an UNAVAILABLE whose write was made after all.
                    assert!(
                        released == "OK" || released.starts_with("ERR NOTHELD"),
                        "{released}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client");
    }
}

/// `line` sent again as long as it is answered `ERR UNAVAILABLE` (an etcd election on a
/// loaded machine: proto.md says to send the same request again), a bounded number of times;
/// the first other answer.
fn again_while_unavailable(c: &mut Line, line: &str) -> String {
    for _ in 0..20 {
        let reply = c.req(line);
        if !reply.starts_with("ERR UNAVAILABLE") {
            return reply;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{line}: UNAVAILABLE 20 times in a row");
}

/// A LOCK that takes over its id's place in the queue (through another front-end, as a
/// client whose front-end died does) while the lock is released on that front-end: the
/// release can land between the takeover's write and its answer. The waiter must still be
/// granted. Before the fix, a grant tried in that gap used the key the request was about to
/// give up, failed, and was not tried again until the name changed: the lock stayed free
/// with its waiters queued (found by the bash client's failover test, which hung in CI).
#[test]
fn a_place_taken_over_as_the_lock_is_released_is_still_granted() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    for i in 0..80 {
        let name = format!("takeover{i}");
        let mut holder = Line::connect(fes[1].addr());
        let t = holder.lock(&format!("{name} h"));
        let mut old = Line::connect(fes[0].addr());
        old.send(&format!("LOCK {name} x"));
        wait_waiters(&fes[1], &name, 1);
        let mut again = Line::connect(fes[1].addr());
        // Both at once, on the same front-end: the takeover and the release race.
        again.send(&format!("LOCK {name} x"));
        holder.send(&format!("UNLOCK {name} {t}"));
        assert_eq!(holder.line(), "OK");
        let mut granted = again.line();
        if granted.starts_with("ERR UNAVAILABLE") {
            // An etcd election on a loaded machine: the same LOCK again, as proto.md says.
            granted = again_while_unavailable(&mut again, &format!("LOCK {name} x"));
        }
        assert!(
            granted.starts_with("OK "),
            "round {i}: the LOCK that took the place over got {granted:?}"
        );
        assert!(token(&granted) > t);
        // The request it replaced hears so (or, if the grant came first, that very grant:
        // the same id's grant is both requests').
        let replaced = old.line();
        assert!(
            replaced.starts_with("ERR REPLACED") || replaced == granted,
            "round {i}: the replaced LOCK got {replaced:?}"
        );
        assert_eq!(
            again.req(&format!("UNLOCK {name} {}", token(&granted))),
            "OK"
        );
    }
}
