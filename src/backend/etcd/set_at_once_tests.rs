//! A LOCK of a set granted at once (`set_at_once.rs`), stepped by hand on the in-memory
//! etcd: the set's one write holds every name under one token, and a name taken meanwhile
//! refuses the whole set.

use std::time::Duration;

use super::at_once::AtOnce;
use super::guards::{self, slot_write, SlotWrite};
use super::marks::MarkerValue;
use super::rpc::Txn;
use super::set_at_once::{granted_set_at_once, SetAtOnce};
use super::stepping::{waiter_value, Core, Stage, BASE};
use crate::locks::EventKind;

/// `core`'s grant at once of the set `names` to `id`, its keys in `slot`.
fn set_at_once(core: &Core, id: &str, names: &[&str], slot: &str) -> SetAtOnce {
    let uid = format!("{}-{slot}", core.fe);
    SetAtOnce {
        names: names.iter().map(|n| n.to_string()).collect(),
        value: waiter_value(&uid, id, &core.fe, 0).holder(0),
        uid,
        slot: slot.into(),
        lease: 0,
        ttl: Duration::from_secs(9),
    }
}

fn marker(fe: &str) -> String {
    MarkerValue {
        kind: EventKind::Acquired,
        rev: 0,
        fe: fe.into(),
        by_user: String::new(),
        by_peer: String::new(),
    }
    .encode()
}

/// Whether etcd holds `name` with nobody but the key in `slot`.
fn held_alone_in(stage: &mut Stage, name: &str, slot: &str, rev: i64) -> bool {
    let key = stage.layout.holder(name, slot);
    let check = Txn::new().when([
        guards::same_key(&key, rev),
        guards::holds_alone(&stage.layout, name, rev),
    ]);
    stage.etcd.apply(&check).is_ok_and(|r| r.succeeded)
}

#[test]
fn a_free_set_is_held_whole_under_one_token() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    stage.sync(&mut a);
    let grant = set_at_once(&a, "c1", &["x", "y"], "a1");
    let resp = stage.write(&grant.txn(&stage.layout, &[0, 0], &marker("fe-a")));
    assert_eq!(slot_write(&resp), SlotWrite::Done);
    let rev = resp.header.as_ref().map_or(0, |h| h.revision);
    let token = granted_set_at_once(&mut a.g, &stage.layout, &grant, rev, stage.now);
    assert_eq!(token, BASE + rev as u64);
    assert!(held_alone_in(&mut stage, "x", "a1", rev));
    assert!(held_alone_in(&mut stage, "y", "a1", rev));
    // Both names written, and fresh until fe-a's watch shows them; then the mirror has them.
    assert_eq!(a.g.written.get("y"), Some(&(rev, false)));
    assert_eq!(a.g.fresh.len(), 2);
    stage.watch(&mut a);
    assert!(a.g.fresh.is_empty());
    for name in ["x", "y"] {
        let ns = a.g.mirror.name(name).expect("held");
        let holder = ns.holders.values().next().expect("one holder");
        assert_eq!((ns.holders.len(), holder.rev), (1, rev));
    }
}

#[test]
fn a_set_one_of_whose_names_was_taken_meanwhile_is_not_granted_at_all() {
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    stage.sync(&mut a);
    stage.sync(&mut b);
    // Both see `x`, `y` free; fe-b grants `y` alone first.
    let set = set_at_once(&a, "c1", &["x", "y"], "a1");
    let uid = "fe-b-b1".to_string();
    let one = AtOnce {
        name: "y".into(),
        key: stage.layout.holder("y", "b1"),
        value: waiter_value(&uid, "c2", "fe-b", 0).holder(0),
        uid,
        slot: "b1".into(),
        lease: 0,
        ttl: Duration::from_secs(9),
    };
    let first = stage.write(&one.txn(&stage.layout, 0, &marker("fe-b")));
    assert_eq!(slot_write(&first), SlotWrite::Done);
    let second = stage.write(&set.txn(&stage.layout, &[0, 0], &marker("fe-a")));
    assert_eq!(
        slot_write(&second),
        SlotWrite::Refused,
        "y's marker moved: the set decides again"
    );
    // Nothing of the set was written: `x` is free, `y` is fe-b's alone.
    stage.sync(&mut a);
    assert!(a.g.mirror.name("x").is_none_or(|ns| ns.holders.is_empty()));
    let y = a.g.mirror.name("y").expect("held");
    assert!(y.holders.values().all(|h| h.slot == "b1"));
}
