//! A set's queued LOCK (`set_queued.rs`), stepped by hand on the in-memory etcd: queued on
//! both its names in one write, its older request's keys out; refused when one of those keys
//! changed meanwhile; and the place of an older request for the same set taken over.

use tokio::sync::oneshot;

use super::guards::{slot_write, SlotWrite};
use super::mirror::NameState;
use super::queued::New;
use super::rpc::{Txn, TxnOp};
use super::set_queued::{old_keys, queue_set, set_answered, Adopt, OldKey, SetQueue};
use super::stepping::{waiter_value, Core, Stage};
use crate::backend::WaitResult;
use crate::locks::LockRequest;

/// A set request of `id` on `x` and `y` through front-end `fe` (uid `uid`), its keys in
/// `slot`, written to etcd.
fn set_waiting(stage: &mut Stage, fe: &str, id: &str, slot: &str) {
    let mut value = waiter_value(&format!("{fe}-{slot}"), id, fe, 0);
    value.set = names();
    let puts = names().into_iter().map(|n| {
        let key = stage.layout.waiter(&n, slot);
        TxnOp::put(key, value.encode(), None)
    });
    stage.write(&Txn::new().and_then(puts.collect::<Vec<_>>()));
}

fn names() -> Vec<String> {
    vec!["x".into(), "y".into()]
}

/// `core`'s LOCK of the set by `id` (uid `uid`, waiter `waiter`).
fn lock_set(
    stage: &Stage,
    core: &mut Core,
    (waiter, uid, id): (u64, &str, &str),
    olds: &[OldKey],
    adopt: Option<&Adopt>,
) -> (SetQueue, oneshot::Receiver<WaitResult>) {
    let (tx, rx) = oneshot::channel();
    let new = New {
        waiter,
        uid: uid.into(),
        req: LockRequest {
            name: "x".into(),
            id: id.into(),
            ..Default::default()
        },
        value: waiter_value(uid, id, &core.fe, 0),
        tx,
    };
    let names = names();
    let queued = queue_set(
        &mut core.g,
        &stage.layout,
        new,
        (&names, olds, adopt),
        stage.now,
    );
    (queued, rx)
}

/// `name` as etcd holds it now (through a core that only watches).
fn in_etcd(stage: &Stage, name: &str) -> NameState {
    let mut seer = stage.core("fe-z");
    stage.sync(&mut seer);
    seer.g.mirror.names.remove(name).unwrap_or_default()
}

fn revision(resp: &super::rpc::TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// The older request of `c3` as `core`'s mirror shows it on `x`: its keys on every name.
fn olds_of(core: &Core, stage: &Stage) -> Vec<OldKey> {
    let ns = core.g.mirror.name("x").expect("x");
    let same: Vec<_> = ns.queue.values().cloned().collect();
    old_keys(&stage.layout, "x", &same)
}

#[test]
fn a_set_is_queued_on_every_name_in_one_write_its_older_request_out() {
    let mut stage = Stage::new();
    set_waiting(&mut stage, "fe-a", "c3", "a1");
    let mut b = stage.core("fe-b");
    stage.sync(&mut b);
    let olds = olds_of(&b, &stage);
    assert_eq!(olds.len(), 2, "its keys on both names");
    let (q, _rx) = lock_set(&stage, &mut b, (5, "fe-b-5", "c3"), &olds, None);
    assert_eq!(q.marks.len(), 2);
    let resp = stage.write(&q.txn);
    assert_eq!(slot_write(&resp), SlotWrite::Done);
    let at = revision(&resp);
    assert!(set_answered(&mut b.g, &q.q, Some(at)));
    let local = &b.g.waiting[&5];
    assert_eq!((local.rev, local.mod_rev), (at, at));
    for name in names() {
        let ns = in_etcd(&stage, &name);
        let only: Vec<_> = ns.queue.values().collect();
        assert_eq!(only.len(), 1, "{name}: the older request is out");
        assert_eq!((only[0].uid.as_str(), only[0].rev), ("fe-b-5", at));
    }
}

#[test]
fn a_set_whose_older_request_moved_meanwhile_is_decided_again() {
    let mut stage = Stage::new();
    set_waiting(&mut stage, "fe-a", "c3", "a1");
    let mut b = stage.core("fe-b");
    stage.sync(&mut b);
    let olds = olds_of(&b, &stage);
    let (q, _rx) = lock_set(&stage, &mut b, (5, "fe-b-5", "c3"), &olds, None);
    // The older request's key on `y` is rewritten before the write lands.
    set_waiting(&mut stage, "fe-a", "c3", "a1");
    let resp = stage.write(&q.txn);
    assert_eq!(slot_write(&resp), SlotWrite::Refused);
    assert!(!set_answered(&mut b.g, &q.q, None));
    assert!(b.g.waiting.is_empty() && b.g.by_uid.is_empty());
    let ns = in_etcd(&stage, "y");
    let only: Vec<_> = ns.queue.values().collect();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0].uid, "fe-a-a1", "the older request is still there");
}

#[test]
fn the_place_of_an_older_request_for_the_same_set_is_taken_over() {
    let mut stage = Stage::new();
    set_waiting(&mut stage, "fe-a", "c3", "a1");
    let mut b = stage.core("fe-b");
    stage.sync(&mut b);
    let olds = olds_of(&b, &stage);
    let ns = b.g.mirror.name("x").expect("x");
    let old = ns.queue.values().next().expect("c3 waits");
    let (place, adopt) = (old.rev, Adopt::of(old));
    let (q, _rx) = lock_set(&stage, &mut b, (6, "fe-a-a1", "c3"), &olds, Some(&adopt));
    assert!(
        q.marks.is_empty(),
        "nothing taken out: every key is rewritten"
    );
    let resp = stage.write(&q.txn);
    assert!(resp.succeeded());
    assert!(set_answered(&mut b.g, &q.q, Some(revision(&resp))));
    assert_eq!(b.g.waiting[&6].rev, place, "its place kept");
    for name in names() {
        let ns = in_etcd(&stage, &name);
        let w = ns.queue.values().next().expect("waits");
        assert_eq!((w.rev, w.value.fe.as_str()), (place, "fe-b"));
    }
}
