//! Unit tests of `values.rs` and `marks.rs`: every value reads back as written, an older
//! lockd's records included.

use super::*;
use crate::backend::etcd::keys::{names_of, Key, Layout};
use crate::backend::etcd::marks::{MarkerValue, SupersededValue};

#[test]
fn values_round_trip() {
    let h = HolderValue {
        uid: "fe1.42".into(),
        id: "host:1 x".into(),
        user: "ci".into(),
        mode: Mode::Limit(3),
        ttl_ms: 30_000,
        deadline_ms: 99,
        session_ms: Some(500),
        fe: "fe=1".into(),
        conn: 4,
        cut_ms: 0,
        granted_ms: 7,
        waited_ms: Some(3),
        at_ms: 9,
        peer: "10.0.0.7:41234".into(),
        note: String::new(),
        set: Vec::new(),
        broken_by: None,
        broken_over: 0,
        delay_ms: 0,
        delaying: None,
    };
    assert_eq!(HolderValue::decode(h.encode().as_bytes()), Some(h));
    let w = WaiterValue {
        uid: "fe=1.43".into(),
        id: "w".into(),
        user: String::new(),
        mode: Mode::Shared,
        ttl_ms: 30_000,
        session_ms: Some(0),
        fe: "f".into(),
        conn: 3,
        lease: 77,
        queued_ms: 1,
        peer: "[::1]:5".into(),
        note: String::new(),
        set: Vec::new(),
        delay_ms: 0,
    };
    assert_eq!(w.holder(5).uid, w.uid, "its grant is known by its uid");
    assert_eq!(WaiterValue::decode(w.encode().as_bytes()), Some(w));
    let m = MarkerValue {
        kind: EventKind::Expired,
        rev: 12,
        fe: "f".into(),
        by_user: String::new(),
        by_peer: String::new(),
    };
    assert_eq!(MarkerValue::decode(m.encode().as_bytes()), Some(m));
    let m = MarkerValue {
        kind: EventKind::Broken,
        rev: 12,
        fe: "f".into(),
        by_user: "ops".into(),
        by_peer: "127.0.0.1:9".into(),
    };
    assert_eq!(MarkerValue::decode(m.encode().as_bytes()), Some(m));
    assert_eq!(HolderValue::decode(b"garbage"), None);
}

/// A holder value written before records said who took them (no `peer`) still reads, and
/// says nobody is known; one that says reads back its user and address.
#[test]
fn values_without_who_took_them_still_decode() {
    let old = b"id=a user= mode=x ttl=1000 deadline=5000 fe=f conn=1 cut=0 granted=7 at=9";
    let h = HolderValue::decode(old).expect("an older value");
    assert_eq!((h.peer.as_str(), h.granted_ms), ("", 7));
    assert_eq!(h.uid, "", "an older record has no uid: its slot is its uid");
    assert_eq!(h.origin(), crate::locks::Origin::default());
    let w = WaiterValue::decode(b"id=w user=ci mode=s ttl=30000 fe=f conn=3 lease=7 queued=1")
        .expect("an older waiter");
    assert_eq!(
        (w.peer.as_str(), w.holder(5).origin().user()),
        ("", Some("ci"))
    );
    let new = HolderValue {
        user: "ci".into(),
        peer: "10.0.0.7:41234".into(),
        ..h
    };
    let back = HolderValue::decode(new.encode().as_bytes()).expect("a new value");
    assert_eq!(back.origin().user(), Some("ci"));
    assert_eq!(back.origin().peer(), "10.0.0.7:41234".parse().ok());
}

#[test]
fn superseded_marks_round_trip() {
    let l = Layout::new("/lockd");
    let k = l.superseded("a/b c", "fe1.9");
    assert_eq!(
        l.parse(k.as_bytes()),
        Some(Key::Superseded {
            name: "a/b c".into(),
            uid: "fe1.9".into()
        })
    );
    // Not a waiter or holder key of any name.
    assert!(!k.starts_with(&l.waiters("a/b c")));
    let v = SupersededValue {
        by: "ci 42".into(),
        same_id: true,
    };
    assert_eq!(SupersededValue::decode(v.encode().as_bytes()), Some(v));
}

/// A set's names, whatever they hold (commas, `%`, `=`, `/`), read back in the request's
/// order, on a holder and on the waiter and holder it becomes; a record without `set=` is
/// a lease of one name.
#[test]
fn a_sets_names_round_trip_whatever_they_hold() {
    let names: Vec<String> = ["db,migrate", "100%", "a=b/c", "ünï"]
        .iter()
        .map(|n| (*n).to_owned())
        .collect();
    let w = WaiterValue::decode(b"id=w user=ci mode=x ttl=30000 fe=f conn=3 lease=7 queued=1")
        .expect("a waiter");
    assert!(w.set.is_empty());
    let w = WaiterValue {
        set: names.clone(),
        ..w
    };
    let back = WaiterValue::decode(w.encode().as_bytes()).expect("a set's waiter");
    assert_eq!(back.set, names);
    let h = back.holder(5);
    assert_eq!(h.set, names);
    let back = HolderValue::decode(h.encode().as_bytes()).expect("a set's holder");
    assert_eq!(back.set, names);
    assert_eq!(
        names_of("x", &back.set),
        ["db,migrate", "100%", "a=b/c", "ünï"]
    );
    assert_eq!(names_of("x", &[]), ["x"]);
    // A set word that can't be read makes the record unreadable, not a lease of fewer names.
    let bad = b"id=a mode=x ttl=1000 deadline=5000 set=a%2C%ZZ";
    assert_eq!(HolderValue::decode(bad), None);
}
