//! Unit tests of `mirror.rs`.

use super::*;

fn put(key: String, value: String, create: i64, modr: i64) -> KeyChange {
    KeyChange {
        put: true,
        key: key.into_bytes(),
        value: value.into_bytes(),
        create_rev: create,
        mod_rev: modr,
        lease: 0,
    }
}

fn del(key: String, rev: i64) -> KeyChange {
    KeyChange {
        put: false,
        key: key.into_bytes(),
        value: Vec::new(),
        create_rev: 0,
        mod_rev: rev,
        lease: 0,
    }
}

fn holder(id: &str) -> String {
    HolderValue {
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

#[test]
fn grant_then_expiry_are_events_with_their_kind() {
    let l = Layout::new("/p/");
    let mut m = Mirror {
        base: 1000,
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
    );
    assert_eq!(a.events.len(), 1);
    assert_eq!(
        (a.events[0].kind, a.events[0].token),
        (EventKind::Acquired, 1005)
    );
    assert_eq!(m.ends.len(), 1);
    let a = m.apply(
        &l,
        &[
            put(l.marker("x"), marker(EventKind::Expired, 5), 5, 9),
            del(l.holder("x", "u1"), 9),
        ],
        9,
        Instant::now(),
    );
    assert_eq!(a.events[0].kind, EventKind::Expired);
    assert!(m.ends.is_empty());
    // The marker stays until it is cleaned up; then the name is gone.
    m.apply(&l, &[del(l.marker("x"), 10)], 10, Instant::now());
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
    );
    let a = m.apply(&l, &[del(l.holder("x", "u"), 8)], 8, Instant::now());
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
            uid: "a".into(),
            rev: 1,
            mod_rev: 1,
            lease: 0,
            ends_at: Instant::now(),
            value: v,
        },
    );
    assert!(ns.admits_without(Mode::Limit(2), None));
    assert!(!ns.admits_without(Mode::Exclusive, None));
    assert!(!ns.admits_without(Mode::Shared, None));
}
