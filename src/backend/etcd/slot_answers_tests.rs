//! A write's answer and its slot (`slot_answers.rs`), stepped by hand on the in-memory etcd:
//! a refused grant gives its slot back for the next request; one that found a key in its slot
//! leaves it taken, and the next request takes another.

use std::time::Duration;

use super::at_once::AtOnce;
use super::guards::SlotWrite;
use super::marks::MarkerValue;
use super::rpc::{Txn, TxnOp, TxnResponse};
use super::slot_answers::slot_answered;
use super::stepping::{waiter_value, Core, Stage};
use crate::locks::EventKind;

/// `core`'s grant at once of `x` to `id` in a slot it takes, decided on a marker at
/// `marker_rev`, written; its slot and the answer.
fn grant(stage: &mut Stage, core: &mut Core, id: &str, marker_rev: i64) -> (String, TxnResponse) {
    let slot = core.g.slots.take(1);
    let uid = format!("{}-{id}", core.fe);
    let grant = AtOnce {
        name: "x".into(),
        key: stage.layout.holder("x", &slot),
        value: waiter_value(&uid, id, &core.fe, 0).holder(0),
        uid,
        slot: slot.clone(),
        lease: 0,
        ttl: Duration::from_secs(9),
    };
    let marker = MarkerValue {
        kind: EventKind::Acquired,
        rev: 0,
        fe: core.fe.clone(),
        by_user: String::new(),
        by_peer: String::new(),
    };
    let resp = stage.write(&grant.txn(&stage.layout, marker_rev, &marker.encode()));
    (slot, resp)
}

#[test]
fn a_refused_write_gives_its_slot_back_and_a_made_one_keeps_it() {
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    let (_, first) = grant(&mut stage, &mut b, "c1", 0);
    assert_eq!(
        slot_answered(&mut b.g, "fe-b.1", ["x"], &first),
        SlotWrite::Done
    );
    // fe-a decided on a mirror that showed `x` free: the marker moved.
    let (slot, resp) = grant(&mut stage, &mut a, "c2", 0);
    assert_eq!(
        slot_answered(&mut a.g, &slot, ["x"], &resp),
        SlotWrite::Refused
    );
    assert_eq!(
        a.g.slots.take(1),
        slot,
        "free again: the next request takes it"
    );
    assert_ne!(b.g.slots.take(1), "fe-b.1", "taken by its key");
}

#[test]
fn a_write_that_found_a_key_in_its_slot_leaves_it_taken() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    // A key in fe-a's first slot that fe-a does not know of (a front-end of the same id
    // before a restart, say).
    let stray = TxnOp::put(stage.layout.waiter("x", "fe-a.1"), "?", None);
    stage.write(&Txn::new().and_then([stray]));
    let (slot, resp) = grant(&mut stage, &mut a, "c1", 0);
    assert_eq!(slot, "fe-a.1");
    assert_eq!(
        slot_answered(&mut a.g, &slot, ["x"], &resp),
        SlotWrite::Taken
    );
    assert_ne!(a.g.slots.take(1), slot, "the next request takes another");
}
