//! Notes and blocked-by answers in cluster mode: a note given through one front-end is what
//! every front-end shows (STATUS, detail, WATCH), and a LOCK refused through another
//! front-end says who blocks it, with the note.
#![cfg(feature = "etcd")]

use super::basics::etcd;
use crate::common;
use crate::common::needs::{have, Need};

use std::time::Duration;

use common::blocking::eventually;
use common::etcd::LockdFrontEnd;
use common::line::Line;
use common::{field, token};

const PATIENCE: Duration = Duration::from_secs(20);
const NOTE: &str = "release 1.4.2 by ci job 8812: 100% ☃";
const NOTE_ENCODED: &str = "release%201.4.2%20by%20ci%20job%208812:%20100%25%20%E2%98%83";

/// Polls `f` until it gives a value; fails after [`PATIENCE`].
fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let mut got = None;
    eventually(PATIENCE, what, || {
        got = f();
        got.is_some()
    });
    got.expect("eventually saw it")
}

fn front_ends(n: usize) -> Vec<LockdFrontEnd> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let prefix = format!(
        "{}notes{}/",
        etcd().prefix(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    (0..n)
        .map(|_| LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "1s"]))
        .collect()
}

#[test]
fn a_note_is_seen_from_every_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let mut watcher = Line::connect(fes[1].addr());
    assert_eq!(watcher.req("WATCH deploy"), "OK watching deploy");
    let mut holder = Line::connect(fes[0].addr());
    let t = token(&holder.req(&format!("LOCK deploy ci-42 ttl=5m note={NOTE}")));

    let event = watcher.line();
    assert!(
        event.starts_with(&format!("EVENT acquired deploy ci-42 {t} ")),
        "{event}"
    );
    assert!(event.ends_with(&format!(" note={NOTE_ENCODED}")), "{event}");

    // The note is the last field, after the cluster's own.
    let status = until("the other front-end sees the holder", || {
        let s = fes[1].request("STATUS deploy");
        s.contains(" held ").then_some(s)
    });
    assert!(
        status.ends_with(&format!(" note={NOTE_ENCODED}")),
        "{status}"
    );
    let mut other = Line::connect(fes[1].addr());
    let raw = other.req("STATUS deploy");
    let at = raw.find(" etcd_age_ms=").unwrap_or_else(|| panic!("{raw}"));
    assert!(
        raw[at..].ends_with(&format!(" note={NOTE_ENCODED}")),
        "{raw}"
    );
    other.send("STATUS deploy detail");
    let line = other.line();
    assert!(line.starts_with("HOLDER deploy id=ci-42 "), "{line}");
    assert!(line.ends_with(&format!(" note={NOTE_ENCODED}")), "{line}");

    // A retry without a note keeps it; a waiter's note is its own once granted.
    assert_eq!(token(&holder.req("LOCK deploy ci-42 ttl=5m")), t);
    let mut waiter = Line::connect(fes[1].addr());
    waiter.send("LOCK deploy next note=next in line");
    until("the waiter queued", || {
        let s = fes[0].request("STATUS deploy");
        (field(&s, "waiters").as_deref() == Some("1")).then_some(())
    });
    let status = fes[0].request("STATUS deploy");
    assert!(
        status.ends_with(&format!(" note={NOTE_ENCODED}")),
        "{status}"
    );
    assert_eq!(holder.req(&format!("UNLOCK deploy {t}")), "OK");
    let granted = token(&waiter.line());
    let status = until("the new holder shows", || {
        let s = fes[0].request("STATUS deploy");
        s.contains(&format!(" token={granted} ")).then_some(s)
    });
    assert!(status.ends_with(" note=next%20in%20line"), "{status}");
}

#[test]
fn a_refused_lock_says_who_blocks_it() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let mut holder = Line::connect(fes[0].addr());
    token(&holder.req(&format!("LOCK deploy ci-42 ttl=5m note={NOTE}")));
    until("the other front-end sees the holder", || {
        fes[1]
            .request("STATUS deploy")
            .contains(" held ")
            .then_some(())
    });
    let mut c = Line::connect(fes[1].addr());
    let reply = c.req("LOCK deploy other wait=0");
    let rest = reply
        .strip_prefix("ERR TIMEOUT deploy: held by ci-42 held_ms=")
        .unwrap_or_else(|| panic!("{reply}"));
    assert!(
        rest.ends_with(&format!(" waiters=0 note={NOTE_ENCODED}")),
        "{reply}"
    );
    let reply = c.req("LOCK deploy other wait=100ms");
    assert!(
        reply.starts_with(
            "ERR TIMEOUT deploy still held after waiting 100ms; held by ci-42 held_ms="
        ),
        "{reply}"
    );
    assert!(reply.ends_with(&format!(" note={NOTE_ENCODED}")), "{reply}");
}
