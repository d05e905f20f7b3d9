//! A LOCK granted at once (`at_once.rs`), stepped by hand on the in-memory etcd: two
//! front-ends that both see `x` free, and only one holder.

use std::time::Duration;

use super::at_once::{granted_at_once, AtOnce};
use super::guards::{slot_write, SlotWrite};
use super::marks::MarkerValue;
use super::stepping::{waiter_value, Core, Stage, BASE};
use crate::locks::EventKind;

/// `core`'s grant at once of `x` to `id`, its key in `slot`, decided on a mirror that showed
/// the marker at `marker_rev`.
fn at_once(stage: &Stage, core: &Core, id: &str, slot: &str) -> AtOnce {
    let uid = format!("{}-{slot}", core.fe);
    AtOnce {
        name: "x".into(),
        key: stage.layout.holder("x", slot),
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

#[test]
fn two_front_ends_that_see_a_free_name_grant_it_once() {
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    stage.sync(&mut a);
    stage.sync(&mut b);
    // Both decide from a mirror that shows `x` free (no marker: revision 0).
    let (ga, gb) = (
        at_once(&stage, &a, "c1", "a1"),
        at_once(&stage, &b, "c2", "b1"),
    );
    let first = stage.write(&ga.txn(&stage.layout, 0, &marker("fe-a")));
    let second = stage.write(&gb.txn(&stage.layout, 0, &marker("fe-b")));
    assert_eq!(
        slot_write(&first),
        SlotWrite::Done,
        "the first write grants"
    );
    assert_eq!(
        slot_write(&second),
        SlotWrite::Refused,
        "the second finds the marker moved, and decides again"
    );
    let rev = first.header.as_ref().map_or(0, |h| h.revision);
    let token = granted_at_once(&mut a.g, ga, rev, stage.now);
    assert_eq!(token, BASE + rev as u64);
    // Kept as fresh until fe-a's watch shows it; then the mirror has it.
    assert_eq!(a.g.fresh.len(), 1);
    stage.watch(&mut a);
    assert!(a.g.fresh.is_empty());
    let ns = a.g.mirror.name("x").expect("held");
    assert_eq!(ns.holders.len(), 1);
}
