//! What a LOCK does next (`planning.rs`), stepped by hand on the in-memory etcd: decided on
//! a mirror, a grant or a plain wait goes ahead (its write checks it); a refusal or a wait
//! that ends others is made only on a read of the name(s) in etcd.

use std::time::Duration;

use super::at_once::AtOnce;
use super::guards::{slot_write, SlotWrite};
use super::marks::MarkerValue;
use super::mirror::NameState;
use super::planning::{plan_lock, plan_set, Asked, LockStep, SetStep};
use super::stepping::{waiter_value, Core, Stage};
use crate::backend::BackendError;
use crate::locks::{EventKind, Limits, LockRequest, TableError};

fn lock(name: &str, id: &str, wait: Option<Duration>) -> LockRequest {
    LockRequest {
        name: name.into(),
        id: id.into(),
        wait,
        ..Default::default()
    }
}

/// The step `core` decides for `req`, on `read` if given, else on its mirror.
fn step(core: &Core, req: &LockRequest, read: Option<&NameState>) -> LockStep {
    let limits = Limits::default();
    let asked = Asked {
        fe: &core.fe,
        limits: &limits,
        req,
        user: "",
    };
    plan_lock(&core.g, &asked, read)
}

/// The step `core` decides for the set LOCK `req` of `names`.
fn set_step(
    core: &Core,
    req: &LockRequest,
    names: &[String],
    read: Option<&[NameState]>,
) -> SetStep {
    let limits = Limits::default();
    let asked = Asked {
        fe: &core.fe,
        limits: &limits,
        req,
        user: "",
    };
    plan_set(&core.g, &asked, names, read)
}

/// Every one of `names` as etcd has it now (what a read of them shows).
fn read(stage: &Stage, names: &[&str]) -> Vec<NameState> {
    let mut reader = stage.core("fe-r");
    stage.sync(&mut reader);
    let states = &mut reader.g.mirror.names;
    names
        .iter()
        .map(|n| states.remove(*n).unwrap_or_default())
        .collect()
}

/// Grants `name` at once to `id` through front-end `fe` (its key in `slot`), as a LOCK
/// decided on a marker at `marker_rev` would; whether the write did it.
fn grant(stage: &mut Stage, fe: &str, name: &str, id: &str, slot: &str, marker_rev: i64) -> bool {
    let uid = format!("{fe}-{slot}");
    let grant = AtOnce {
        name: name.into(),
        key: stage.layout.holder(name, slot),
        value: waiter_value(&uid, id, fe, 0).holder(0),
        uid,
        slot: slot.into(),
        lease: 0,
        ttl: Duration::from_secs(9),
    };
    let marker = MarkerValue {
        kind: EventKind::Acquired,
        rev: 0,
        fe: fe.into(),
        by_user: String::new(),
        by_peer: String::new(),
    };
    let resp = stage.write(&grant.txn(&stage.layout, marker_rev, &marker.encode()));
    slot_write(&resp) == SlotWrite::Done
}

#[test]
fn a_free_name_is_granted_at_once_and_the_next_lock_waits_without_a_read() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    stage.sync(&mut a);
    let LockStep::AtOnce { marker_rev } = step(&a, &lock("x", "c1", None), None) else {
        panic!("a free name is granted at once");
    };
    assert!(grant(&mut stage, "fe-a", "x", "c1", "a1", marker_rev));
    stage.sync(&mut a);
    match step(&a, &lock("x", "c2", None), None) {
        LockStep::QueueUnread(waits) => assert!(waits.place.is_none()),
        _ => panic!("a plain wait is queued on the mirror: its write reads the name"),
    }
    let held =
        a.g.mirror
            .name("x")
            .and_then(|ns| ns.holders.values().next());
    let rev = held.map(|h| h.rev);
    match step(&a, &lock("x", "c1", None), None) {
        LockStep::Again(holder) => assert_eq!(Some(holder.rev), rev),
        _ => panic!("the holder's own id again: the same grant"),
    }
}

#[test]
fn a_stale_mirror_grants_nothing_and_a_refusal_is_made_on_a_read() {
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    stage.sync(&mut a);
    stage.sync(&mut b);
    assert!(grant(&mut stage, "fe-a", "x", "c1", "a1", 0));
    // fe-b's mirror still shows `x` free: its grant's write finds the marker moved.
    let now = Some(Duration::ZERO);
    let LockStep::AtOnce { marker_rev } = step(&b, &lock("x", "c2", now), None) else {
        panic!("free, as fe-b's mirror shows it");
    };
    assert!(!grant(&mut stage, "fe-b", "x", "c2", "b1", marker_rev));
    // Caught up, the mirror says `wait=0` must be refused: that is made sure of on a read.
    stage.sync(&mut b);
    assert!(matches!(
        step(&b, &lock("x", "c2", now), None),
        LockStep::Read
    ));
    let x = read(&stage, &["x"]).pop();
    match step(&b, &lock("x", "c2", now), x.as_ref()) {
        LockStep::Refused(BackendError::Table(TableError::WouldBlock { .. })) => {}
        _ => panic!("held, as etcd shows it: refused"),
    }
}

#[test]
fn a_set_is_granted_at_once_when_free_and_queued_only_on_a_read() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    stage.sync(&mut a);
    let names: Vec<String> = ["x", "y"].map(String::from).to_vec();
    let set = LockRequest {
        and: vec!["y".to_string()].into(),
        ..lock("x", "c1", None)
    };
    match set_step(&a, &set, &names, None) {
        SetStep::AtOnce(marker_revs) => assert_eq!(marker_revs, [0, 0]),
        _ => panic!("every name free: granted at once"),
    }
    // `y` taken by another id: the set waits, but only a read decides that.
    assert!(grant(&mut stage, "fe-b", "y", "c9", "b1", 0));
    stage.sync(&mut a);
    assert!(matches!(set_step(&a, &set, &names, None), SetStep::Read));
    let states = read(&stage, &["x", "y"]);
    match set_step(&a, &set, &names, Some(&states)) {
        SetStep::Queue { replaced, taken } => {
            assert!(taken.is_none(), "a new place, at the back");
            assert!(replaced.iter().all(|(_, same)| same.is_empty()));
        }
        _ => panic!("held: queued on every name"),
    }
}
