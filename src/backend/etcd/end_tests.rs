//! The core's end of a lease (`end.rs`), stepped by hand against the in-memory etcd: the
//! release that grants the head waiter in its own write, through two front-ends, and what
//! happens when the mirror it decided on was behind.

use super::confirmation::{confirm_answered, confirm_write};
use super::delivery::GrantAction;
use super::end::{end_txn, ended, EndAnswer, Ended};
use super::guards;
use super::head::Me;
use super::holders::created;
use super::marks::MarkerValue;
use super::mirror::HolderRecord;
use super::reads::emptied_by_own_write;
use super::rpc::{Compare, PutOptions, Txn, TxnOp};
use super::stepping::{waiter_value, Core, Stage, BASE};
use super::values::HolderValue;
use crate::backend::WaitResult;
use crate::locks::{EventKind, Mode};
use tokio::sync::oneshot;

/// `x` held by client `c1` through fe-a (a plain lease, key in slot `a1`); the revision.
fn held(stage: &mut Stage) -> i64 {
    let mut value = waiter_value("fe-a-1", "c1", "fe-a", 0).holder(0);
    value.deadline_ms = 60_000;
    let key = stage.layout.holder("x", "a1");
    let resp = stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), None)]));
    resp.header().map_or(0, |h| h.revision())
}

/// Client `id` queued on `x` through front-end `fe` (its key in `slot`, on etcd lease
/// `lease`, 0 for none): its key and revision.
fn queued(stage: &mut Stage, fe: &str, id: &str, slot: &str, lease: i64) -> (String, i64) {
    let uid = format!("{fe}-{slot}");
    let value = waiter_value(&uid, id, fe, lease);
    let key = stage.layout.waiter("x", slot);
    let put = (lease != 0).then(|| PutOptions::new().with_lease(lease));
    let resp = stage.write(&Txn::new().and_then([TxnOp::put(key.clone(), value.encode(), put)]));
    (key, resp.header().map_or(0, |h| h.revision()))
}

fn holder_of_x(core: &Core) -> HolderRecord {
    let ns = core.g.mirror.name("x").expect("x is mirrored");
    ns.holders.values().next().expect("x is held").clone()
}

/// fe-a's end of `holder` of `x` (`kind`, guarded by `guard`), as its core builds it,
/// written to etcd and its answer handed back: the write, etcd's revision after it, and
/// what the core made of the answer.
fn end_of(
    stage: &mut Stage,
    a: &mut Core,
    holder: &HolderRecord,
    kind: EventKind,
    guard: Compare,
) -> (Ended, i64, Option<EndAnswer>) {
    let marker = MarkerValue {
        kind,
        rev: holder.rev,
        fe: a.fe.clone(),
        by_user: String::new(),
        by_peer: String::new(),
    }
    .encode();
    let me = Me {
        fe: &a.fe,
        layout: &stage.layout,
    };
    let end = end_txn(&a.g, &me, "x", kind, holder, guard, &marker, 1_000);
    let resp = stage.write(&end.txn);
    let rev = resp.header().map_or(0, |h| h.revision());
    let answer = ended(&mut a.g, &a.fe, "x", holder, &end, &resp, stage.now);
    (end, rev, answer)
}

/// [`end_of`] for fe-a's UNLOCK of `holder`: the grant its write made, with the revision.
fn unlock(
    stage: &mut Stage,
    a: &mut Core,
    holder: &HolderRecord,
) -> (Option<(String, u64, HolderValue)>, i64) {
    let (_, rev, answer) = end_of(stage, a, holder, EventKind::Released, created(holder));
    (answer.expect("the UNLOCK ended it").granted, rev)
}

/// `x` held by c1 through fe-a, c2 waiting through fe-b (its key on fe-b's etcd lease), both
/// front-ends' mirrors current: the cores, fe-b's etcd lease, c2's key and its wait.
fn c2_waits_through_fe_b(
    stage: &mut Stage,
) -> (Core, Core, i64, String, oneshot::Receiver<WaitResult>) {
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    let lease_b = stage.etcd.lease_grant(60, 0).id;
    held(stage);
    let (key, queued_at) = queued(stage, "fe-b", "c2", "b1", lease_b);
    let value = waiter_value("fe-b-b1", "c2", "fe-b", lease_b);
    let rx = b.waits("x", "b1", key.clone(), queued_at, value, stage.now);
    stage.sync(&mut a);
    stage.sync(&mut b);
    (a, b, lease_b, key, rx)
}

/// c1 holds `x` through fe-a (`held`), c2 waits through fe-a too (plain: on no etcd lease).
fn c2_waits_through_fe_a(stage: &mut Stage) -> (Core, oneshot::Receiver<WaitResult>) {
    let mut a = stage.core("fe-a");
    held(stage);
    let (key, rev) = queued(stage, "fe-a", "c2", "a2", 0);
    let value = waiter_value("fe-a-a2", "c2", "fe-a", 0);
    let rx = a.waits("x", "a2", key, rev, value, stage.now);
    stage.sync(&mut a);
    (a, rx)
}

/// ARCHITECTURE.md's contended hand-over, every step a core's: c1 holds `x` through fe-a,
/// c2 waits through fe-b; fe-a's UNLOCK grants c2 in its own write, on fe-b's etcd lease;
/// fe-b's watch shows it, fe-b takes it off its lease, and only then is c2 told.
#[test]
fn a_contended_hand_over_through_two_front_ends_step_by_step() {
    let mut stage = Stage::new();
    let (mut a, mut b, lease_b, key, mut rx) = c2_waits_through_fe_b(&mut stage);
    let holder = holder_of_x(&a);
    let (granted, rev) = unlock(&mut stage, &mut a, &holder);
    let (id, token, value) = granted.expect("granted in the write");
    assert_eq!(
        (id.as_str(), token, value.fe.as_str()),
        ("c2", BASE + rev as u64, "fe-b")
    );
    // In etcd: c2 holds x on fe-b's etcd lease, its waiter key is gone.
    assert!(stage
        .etcd
        .apply(&Txn::new().when([guards::absent(&key)]))
        .is_ok_and(|r| r.succeeded));
    // fe-b's watch shows the grant of its waiter: on its etcd lease, so confirmed first.
    let watched = stage.watch(&mut b);
    let [GrantAction::Confirm(gr)] = watched.grants.as_slice() else {
        panic!("one grant, to confirm");
    };
    assert_eq!((gr.token, gr.lease), (token, lease_b));
    assert!(watched.applied.touched.contains("x"));
    // fe-b takes it off its etcd lease, and then tells c2.
    let (txn, ours) = confirm_write(&mut b.g, gr).expect("the holder is mirrored");
    let resp = stage.write(&txn);
    assert!(rx.try_recv().is_err(), "not told before it is confirmed");
    assert!(confirm_answered(&mut b.g, gr, Some(&resp), &ours, stage.now).is_none());
    match rx.try_recv() {
        Ok(WaitResult::Granted { token: t, .. }) => assert_eq!(t, token),
        other => panic!("c2 is told of its grant: {other:?}"),
    }
    // The grant outlives fe-b now: on no etcd lease.
    stage.etcd.revoke(lease_b).expect("fe-b's lease");
    let held = guards::same_key(&stage.layout.holder("x", "b1"), rev);
    assert!(stage
        .etcd
        .apply(&Txn::new().when([held]))
        .is_ok_and(|r| r.succeeded));
}

#[test]
fn a_release_delivers_its_own_waiters_grant_from_its_answer() {
    let mut stage = Stage::new();
    let (mut a, mut rx) = c2_waits_through_fe_a(&mut stage);
    let holder = holder_of_x(&a);
    let (granted, _) = unlock(&mut stage, &mut a, &holder);
    let (_, token, _) = granted.expect("granted in the write");
    // Told now, whatever the watch does (simulator seed 650274).
    match rx.try_recv() {
        Ok(WaitResult::Granted { token: t, .. }) => assert_eq!(t, token),
        other => panic!("the waiter is told of its grant: {other:?}"),
    }
}

#[test]
fn a_release_decided_on_a_mirror_behind_makes_the_plain_end() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let lease_b = stage.etcd.lease_grant(60, 0).id;
    held(&mut stage);
    queued(&mut stage, "fe-b", "c2", "b1", lease_b);
    stage.sync(&mut a);
    // c2's LOCK again, through fe-b, rewrites its key after fe-a's mirror saw it.
    let (key, _) = queued(&mut stage, "fe-b", "c2", "b1", lease_b);
    let holder = holder_of_x(&a);
    let (end, _, answer) = end_of(
        &mut stage,
        &mut a,
        &holder,
        EventKind::Released,
        created(&holder),
    );
    assert!(end.head.is_some(), "decided as if c2's key were as seen");
    assert!(
        answer.is_some_and(|a| a.granted.is_none()),
        "ended, nobody granted"
    );
    // c1's key is gone, c2's still waits: its front-end grants it.
    let gone = guards::absent(&holder.key);
    let waits = guards::same_key(&key, holder.rev + 1);
    let check = stage.etcd.apply(&Txn::new().when([gone, waits]));
    assert!(check.is_ok_and(|r| r.succeeded));
}

/// Two slots of a semaphore of two on `x`: c1's plain lease through fe-a (slot `a1`) and
/// c2's session lease with a lock-delay through fe-b (slot `b1`, on etcd lease `lease_b`).
fn two_slots(stage: &mut Stage, lease_b: i64) {
    slots(stage, lease_b, 2);
}

/// The first `n` of [`two_slots`]'s slots.
fn slots(stage: &mut Stage, lease_b: i64, n: usize) {
    let both = [("a1", "c1", "fe-a", 0), ("b1", "c2", "fe-b", lease_b)];
    for (slot, id, fe, lease) in both.into_iter().take(n) {
        let mut value = waiter_value(&format!("{fe}-{slot}"), id, fe, lease).holder(0);
        value.mode = Mode::Limit(2);
        value.deadline_ms = 60_000;
        if lease != 0 {
            value.session_ms = Some(0);
            value.delay_ms = 5_000;
        }
        let put = (lease != 0).then(|| PutOptions::new().with_lease(lease));
        let key = stage.layout.holder("x", slot);
        stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), put)]));
    }
}

#[test]
fn a_release_that_finds_others_gone_unseen_does_not_empty_the_name() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let lease_b = stage.etcd.lease_grant(60, 0).id;
    two_slots(&mut stage, lease_b);
    stage.sync(&mut a);
    // fe-b dies: c2's key goes with its etcd lease, and fe-a has not seen it yet.
    stage.etcd.revoke(lease_b).expect("fe-b's lease");
    release_beside_an_unseen_end(&mut stage, &mut a);
}

/// fe-a releases c1's lease on `x` (its first holder) while c2's key went with fe-b's etcd
/// lease unseen: etcd had `x` empty, but c2's lease may be in its lock-delay, so the name is
/// not taken as emptied (no grant at once until the watch shows how c2's key went), and once
/// the watch shows it, c2's lease is kept for its delay.
fn release_beside_an_unseen_end(stage: &mut Stage, a: &mut Core) {
    let c1 = holder_of_x(a);
    let (_, _, answer) = end_of(stage, a, &c1, EventKind::Released, created(&c1));
    assert!(answer.is_some(), "c1's lease ended");
    assert!(!emptied_by_own_write(&a.g, "x"));
    stage.sync(a);
    let ns = a.g.mirror.name("x").expect("x is mirrored");
    assert!(
        ns.holders.values().any(|h| h.keyless),
        "c2's lease kept for its delay"
    );
}

#[test]
fn a_release_with_the_mirror_behind_it_does_not_empty_the_name() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let lease_b = stage.etcd.lease_grant(60, 0).id;
    slots(&mut stage, lease_b, 1);
    stage.sync(&mut a);
    // Unseen by fe-a: c2 is granted its slot through fe-b, and goes with fe-b's etcd lease.
    slots(&mut stage, lease_b, 2);
    stage.etcd.revoke(lease_b).expect("fe-b's lease");
    // The mirror never showed c2 (simulator seed 211709).
    release_beside_an_unseen_end(&mut stage, &mut a);
}

#[test]
fn a_take_back_of_a_grant_rewritten_since_ends_nothing() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    held(&mut stage);
    stage.sync(&mut a);
    let holder = holder_of_x(&a);
    // Handed over at its create revision; a RENEW rewrote it since (its client was told).
    let renewed = TxnOp::put(holder.key.clone(), "renewed".to_owned(), None);
    stage.write(&Txn::new().and_then([renewed]));
    let guard = guards::unchanged(&holder.key, holder.rev);
    let (_, _, answer) = end_of(&mut stage, &mut a, &holder, EventKind::Revoked, guard);
    assert!(answer.is_none(), "kept: a client was told of it");
}

/// A waiter of fe-a leaves (its connection went) as fe-a's UNLOCK grants it in its own
/// write: the answer takes the grant back at once, not only once the watch shows it (which
/// may be seconds behind; had the front-end died meanwhile, the grant sat out its ttl:
/// simulator seed 345844).
#[test]
fn a_release_takes_back_at_once_its_grant_to_a_waiter_of_its_own_that_left() {
    let mut stage = Stage::new();
    let (mut a, _rx) = c2_waits_through_fe_a(&mut stage);
    let holder = holder_of_x(&a);
    let waiter = *a.g.by_uid.get("fe-a-a2").expect("c2 waits");
    a.g.leave(waiter);
    let (_, rev, answer) = end_of(
        &mut stage,
        &mut a,
        &holder,
        EventKind::Released,
        created(&holder),
    );
    let answer = answer.expect("the UNLOCK ended it");
    let (_, token, _) = answer.granted.expect("granted in the write");
    let back = answer.back.expect("taken back from the answer");
    assert_eq!(
        (back.name.as_str(), back.token, back.handover.0),
        ("x", token, rev)
    );
}

/// c2, waiting through fe-b, leaves while fe-b confirms the grant fe-a's UNLOCK made it; the
/// confirmation's answer is lost. fe-b's watch shows the confirmation's own write, and fe-b
/// takes the grant back then: the answer may come only after the request timeout, or never
/// if fe-b dies first (the grant, off any etcd lease, then sat out its ttl: simulator seed
/// 194622).
#[test]
fn a_grant_confirmed_for_a_waiter_that_left_is_taken_back_when_the_watch_shows_it() {
    let mut stage = Stage::new();
    let (mut a, mut b, _, _, _rx) = c2_waits_through_fe_b(&mut stage);
    let holder = holder_of_x(&a);
    let (granted, _) = unlock(&mut stage, &mut a, &holder);
    let (_, token, _) = granted.expect("granted in the write");
    let watched = stage.watch(&mut b);
    let [GrantAction::Confirm(gr)] = watched.grants.as_slice() else {
        panic!("one grant, to confirm");
    };
    let (txn, _ours) = confirm_write(&mut b.g, gr).expect("the holder is mirrored");
    // c2's connection goes; the confirmation is applied, its answer lost.
    let waiter = *b.g.by_uid.get("fe-b-b1").expect("c2 waits");
    b.g.leave(waiter);
    let confirmed_at = stage.write(&txn).header().map_or(0, |h| h.revision());
    let watched = stage.watch(&mut b);
    match watched.grants.as_slice() {
        [GrantAction::TakeBack(back)] => {
            assert_eq!((back.token, back.handover.0), (token, confirmed_at));
        }
        _ => panic!("the grant is taken back as the watch shows the confirmation"),
    }
}
