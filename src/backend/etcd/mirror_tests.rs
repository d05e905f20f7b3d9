//! Unit tests of `mirror.rs` and `apply.rs`: the mirror as the watch's changes make it.

use super::*;
use crate::backend::etcd::keys::Layout;
use crate::backend::etcd::stepping::{del, put};

fn holder(id: &str) -> String {
    HolderValue {
        uid: String::new(),
        id: id.into(),
        user: String::new(),
        mode: Mode::Exclusive,
        ttl_ms: 1000,
        deadline_ms: 5000,
        session_ms: None,
        fe: "a".into(),
        conn: 1,
        cut_ms: 0,
        granted_ms: 0,
        waited_ms: None,
        at_ms: 0,
        peer: String::new(),
        note: String::new(),
        set: Vec::new(),
        broken_by: None,
        broken_over: 0,
        delay_ms: 0,
        delaying: None,
    }
    .encode()
}

fn marker(kind: EventKind, rev: i64) -> String {
    MarkerValue {
        kind,
        rev,
        fe: "a".into(),
        by_user: String::new(),
        by_peer: String::new(),
    }
    .encode()
}

/// A mirror of one name with one holder of create revision `rev`, and the name's marker as
/// the end of the holder of create revision `ended.1` wrote it, if `ended`.
pub(in crate::backend::etcd) fn one_holder(
    name: &str,
    rev: i64,
    ended: Option<(EventKind, i64)>,
) -> Mirror {
    let l = Layout::new("/p/");
    let mut m = Mirror {
        tokens: Tokens::plain(1000),
        ..Mirror::default()
    };
    let mut changes = vec![put(l.holder(name, "u1"), holder("me"), rev, rev)];
    if let Some((kind, of)) = ended {
        changes.insert(0, put(l.marker(name), marker(kind, of), 2, rev));
    }
    m.apply(&l, &changes, rev, Instant::now(), 0);
    m
}

#[test]
fn grant_then_expiry_are_events_with_their_kind() {
    let l = Layout::new("/p/");
    let mut m = Mirror {
        tokens: Tokens::plain(1000),
        ..Mirror::default()
    };
    let a = m.apply(
        &l,
        &[
            put(l.marker("x"), marker(EventKind::Acquired, 0), 5, 5),
            put(l.holder("x", "u1"), holder("me"), 5, 5),
        ],
        5,
        Instant::now(),
        0,
    );
    assert_eq!(a.events.len(), 1);
    assert_eq!(
        (a.events[0].kind, a.events[0].token),
        (EventKind::Acquired, 1005)
    );
    assert_eq!(m.ends.len(), 1);
    assert_eq!(m.holders(), m.counts().0);
    // The same holder written again (a renewal) is still one holder.
    m.apply(
        &l,
        &[put(l.holder("x", "u1"), holder("me"), 5, 7)],
        7,
        Instant::now(),
        0,
    );
    assert_eq!((m.holders(), m.counts().0), (1, 1));
    let a = m.apply(
        &l,
        &[
            put(l.marker("x"), marker(EventKind::Expired, 5), 5, 9),
            del(l.holder("x", "u1"), 9),
        ],
        9,
        Instant::now(),
        0,
    );
    assert_eq!(a.events[0].kind, EventKind::Expired);
    assert!(m.ends.is_empty());
    assert_eq!((m.holders(), m.counts().0), (0, 0));
    // The marker stays until it is cleaned up; then the name is gone.
    m.apply(&l, &[del(l.marker("x"), 10)], 10, Instant::now(), 0);
    assert!(m.name("x").is_none());
}

#[test]
fn a_break_is_an_event_that_says_who_broke_it_and_its_record_is_passed_over() {
    let l = Layout::new("/p/");
    let mut m = Mirror::default();
    m.apply(
        &l,
        &[
            put(l.marker("x"), marker(EventKind::Acquired, 0), 5, 5),
            put(l.holder("x", "u1"), holder("me"), 5, 5),
        ],
        5,
        Instant::now(),
        0,
    );
    let broke = MarkerValue {
        kind: EventKind::Broken,
        rev: 5,
        fe: "b".into(),
        by_user: "ops".into(),
        by_peer: "127.0.0.1:9".into(),
    };
    let a = m.apply(
        &l,
        &[
            put(l.broken("x", 5), "by=ops at=1 deadline=2".into(), 8, 8),
            put(l.marker("x"), broke.encode(), 5, 9),
            del(l.holder("x", "u1"), 9),
        ],
        9,
        Instant::now(),
        0,
    );
    assert_eq!(a.events.len(), 1);
    let e = &a.events[0];
    assert_eq!(e.kind, EventKind::Broken);
    assert_eq!(e.broken_by.user(), Some("ops"));
    assert_eq!(
        e.broken_by.peer().map(|p| p.to_string()).as_deref(),
        Some("127.0.0.1:9")
    );
}

#[test]
fn a_holder_gone_with_its_lease_is_dropped() {
    let l = Layout::new("/p/");
    let mut m = Mirror::default();
    m.apply(
        &l,
        &[put(l.holder("x", "u"), holder("s"), 3, 3)],
        3,
        Instant::now(),
        0,
    );
    let a = m.apply(&l, &[del(l.holder("x", "u"), 8)], 8, Instant::now(), 0);
    assert_eq!(a.events[0].kind, EventKind::Dropped);
}

#[test]
fn modes_admit_as_the_table_does() {
    let mut ns = NameState::default();
    assert!(ns.admits_without(Mode::Exclusive, None));
    let mut v = HolderValue::decode(holder("a").as_bytes()).expect("value");
    v.mode = Mode::Limit(2);
    ns.holders.insert(
        1,
        HolderRecord {
            key: String::new(),
            slot: "a".into(),
            uid: "a".into(),
            rev: 1,
            mod_rev: 1,
            lease: 0,
            ends_at: Instant::now(),
            keyless: false,
            value: v,
        },
    );
    assert!(ns.admits_without(Mode::Limit(2), None));
    assert!(!ns.admits_without(Mode::Exclusive, None));
    assert!(!ns.admits_without(Mode::Shared, None));
}

fn waiter(uid: &str) -> String {
    WaiterValue {
        uid: uid.into(),
        id: format!("id-{uid}"),
        user: String::new(),
        mode: Mode::Exclusive,
        ttl_ms: 1000,
        session_ms: None,
        fe: "a".into(),
        conn: 1,
        lease: 7,
        queued_ms: 0,
        peer: String::new(),
        note: String::new(),
        set: Vec::new(),
        delay_ms: 0,
    }
    .encode()
}

/// A waiter granted in one write (its holder key, same slot, put before its waiter key's
/// delete) keeps its slot in use; the slot is reported free only once its holder goes, and
/// each incarnation of the slot is known by the uid its value names.
#[test]
fn a_slot_is_gone_only_when_its_last_key_on_the_name_goes() {
    let l = Layout::new("/p/");
    let mut m = Mirror::default();
    let a = m.apply(
        &l,
        &[put(l.waiter("x", "fe.1"), waiter("fe-5"), 3, 3)],
        3,
        Instant::now(),
        0,
    );
    assert!(a.slots_gone.is_empty());
    let ns = m.name("x").expect("a waiter");
    assert_eq!(ns.queue[&3].uid, "fe-5");
    assert_eq!(ns.queue[&3].slot, "fe.1");
    let granted = HolderValue {
        uid: "fe-5".into(),
        ..HolderValue::decode(holder("id-fe-5").as_bytes()).expect("value")
    };
    let a = m.apply(
        &l,
        &[
            put(l.marker("x"), marker(EventKind::Acquired, 0), 4, 4),
            put(l.holder("x", "fe.1"), granted.encode(), 4, 4),
            del(l.waiter("x", "fe.1"), 4),
        ],
        4,
        Instant::now(),
        0,
    );
    assert!(a.slots_gone.is_empty(), "its holder key is in the slot");
    assert_eq!(a.waiters_gone, vec![("x".to_owned(), "fe-5".to_owned())]);
    assert_eq!(a.granted[0].uid, "fe-5");
    let a = m.apply(
        &l,
        &[
            put(l.marker("x"), marker(EventKind::Released, 4), 4, 6),
            del(l.holder("x", "fe.1"), 6),
        ],
        6,
        Instant::now(),
        0,
    );
    assert_eq!(a.slots_gone, vec![("x".to_owned(), "fe.1".to_owned())]);
    // The slot again, for another request: a new record, with its own uid.
    m.apply(
        &l,
        &[put(l.waiter("x", "fe.1"), waiter("fe-9"), 7, 7)],
        7,
        Instant::now(),
        0,
    );
    let ns = m.name("x").expect("a waiter");
    assert_eq!(ns.queue.len(), 1);
    assert_eq!(ns.queue[&7].uid, "fe-9");
    let a = m.apply(&l, &[del(l.waiter("x", "fe.1"), 8)], 8, Instant::now(), 0);
    assert_eq!(a.slots_gone, vec![("x".to_owned(), "fe.1".to_owned())]);
    assert_eq!(a.waiters_gone, vec![("x".to_owned(), "fe-9".to_owned())]);
    // An older lockd's record has no uid: its slot is its uid.
    m.apply(
        &l,
        &[put(l.holder("y", "old.3"), holder("o"), 9, 9)],
        9,
        Instant::now(),
        0,
    );
    assert_eq!(m.name("y").expect("a holder").holders[&9].uid, "old.3");
}

/// A session lease with a lock-delay, as its front-end writes it.
fn session_holder(id: &str, delay_ms: u64) -> String {
    let mut v = HolderValue::decode(holder(id).as_bytes()).expect("a holder");
    v.session_ms = Some(0);
    v.delay_ms = delay_ms;
    v.encode()
}

#[test]
fn a_session_lease_gone_with_its_front_ends_etcd_lease_is_kept_for_its_lock_delay() {
    let l = Layout::new("/p/");
    let mut m = Mirror::default();
    let at = Instant::now();
    m.apply(
        &l,
        &[put(l.holder("x", "u1"), session_holder("me", 3000), 5, 5)],
        5,
        at,
        0,
    );
    // Deleted alone: etcd ended the front-end's lease.
    let gone = m.apply(&l, &[del(l.holder("x", "u1"), 6)], 6, at, 0);
    assert!(
        gone.events.is_empty(),
        "its end is told when its delay is over"
    );
    let kept = m
        .name("x")
        .and_then(|ns| ns.holder_by_rev(5))
        .expect("kept");
    assert!(kept.keyless);
    assert_eq!(kept.value.delaying, Some(EventKind::Dropped));
    assert!(kept.value.lingering());
    assert_eq!(kept.left(at), Duration::from_secs(3));
    assert!(
        !m.name("x").unwrap().uses_slot("u1"),
        "its key's slot is free"
    );
}

#[test]
fn a_released_lease_and_one_without_a_delay_are_not_kept() {
    let l = Layout::new("/p/");
    let mut m = Mirror::default();
    let at = Instant::now();
    m.apply(
        &l,
        &[
            put(l.marker("x"), marker(EventKind::Acquired, 5), 5, 5),
            put(l.holder("x", "u1"), session_holder("me", 3000), 5, 5),
            put(l.holder("y", "u2"), session_holder("me", 0), 6, 6),
        ],
        6,
        at,
        0,
    );
    // An UNLOCK that emptied the name deletes its marker in the same write.
    let released = m.apply(
        &l,
        &[
            del(l.marker("x"), 7),
            del(l.holder("x", "u1"), 7),
            del(l.holder("y", "u2"), 8),
        ],
        8,
        at,
        0,
    );
    assert_eq!(released.events.len(), 2);
    assert_eq!(released.events[0].kind, EventKind::Released);
    assert_eq!(released.events[1].kind, EventKind::Dropped);
    assert!(m.name("x").is_none() && m.name("y").is_none());
}
