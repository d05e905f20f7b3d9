//! A queued LOCK of one name (`queued.rs`), stepped by hand on the in-memory etcd: a plain
//! wait decided from the mirror, written and waiting; a take-over of a place that went
//! meanwhile, decided again; and a wait whose write's read shows what the mirror missed.

use tokio::sync::oneshot;

use super::guards::{slot_write, SlotWrite};
use super::head::Me;
use super::mirror::NameState;
use super::queued::{misread, queue, queue_answered, New, Outcome, Queue, Seen};
use super::rpc::{GetOptions, Txn, TxnOp, TxnResponse};
use super::stepping::{waiter_value, Core, Stage};
use super::waits::Waits;
use super::Phase;
use crate::backend::WaitResult;
use crate::locks::{Limits, LockRequest};

/// `x` held by client `c1` through fe-a (a plain lease, its key in slot `a1`).
fn held(stage: &mut Stage) {
    let mut value = waiter_value("fe-a-1", "c1", "fe-a", 0).holder(0);
    value.deadline_ms = 60_000;
    let key = stage.layout.holder("x", "a1");
    stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), None)]));
}

/// Client `id` waiting on `x` through front-end `fe`, its key in `slot`.
fn waiting(stage: &mut Stage, fe: &str, id: &str, slot: &str) {
    let value = waiter_value(&format!("{fe}-{slot}"), id, fe, 0);
    let key = stage.layout.waiter("x", slot);
    stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), None)]));
}

/// `core`'s LOCK of `x` by `id` (as uid `uid`, waiter `waiter`), queued where `waits` says.
fn lock(
    stage: &Stage,
    core: &mut Core,
    (waiter, uid, id): (u64, &str, &str),
    waits: Waits,
    seen: Seen,
) -> (Queue, oneshot::Receiver<WaitResult>) {
    let me = Me {
        fe: &core.fe,
        layout: &stage.layout,
    };
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
    let reads = name_reads(stage);
    let queued = queue(&mut core.g, &me, new, (waits, seen), reads, stage.now);
    (queued, rx)
}

/// The reads of `x` a plain wait's write carries.
fn name_reads(stage: &Stage) -> [TxnOp; 3] {
    let prefix = || Some(GetOptions::new().with_prefix());
    [
        TxnOp::get(stage.layout.marker("x"), None),
        TxnOp::get(stage.layout.holders("x"), prefix()),
        TxnOp::get(stage.layout.waiters("x"), prefix()),
    ]
}

/// Where the rules put a plain LOCK of `x` on `core`'s mirror.
fn plain_wait(core: &Core) -> Waits {
    let free = NameState::default();
    let ns = core.g.mirror.name("x").unwrap_or(&free);
    Waits::of(ns, false, None, &[], &[])
}

fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// `x` as etcd holds it now (through a core that only watches).
fn x_in_etcd(stage: &Stage) -> NameState {
    let mut seer = stage.core("fe-z");
    stage.sync(&mut seer);
    seer.g.mirror.names.remove("x").unwrap_or_default()
}

#[test]
fn a_plain_wait_from_the_mirror_is_written_and_waits_at_the_back() {
    let mut stage = Stage::new();
    held(&mut stage);
    let mut b = stage.core("fe-b");
    stage.sync(&mut b);
    let waits = plain_wait(&b);
    let (Queue { q, writes, .. }, _rx) =
        lock(&stage, &mut b, (7, "fe-b-7", "c2"), waits, Seen::Mirror);
    assert!(
        q.check,
        "decided on the mirror alone: the write reads the name too"
    );
    assert_eq!(b.g.waiting[&7].phase, Phase::Writing);
    assert!(writes.ahead.is_empty());
    let resp = stage.write(&writes.last);
    assert_eq!(slot_write(&resp), SlotWrite::Done);
    let at = revision(&resp);
    assert_eq!(queue_answered(&mut b.g, &q, Some(at)), Outcome::Check);
    // The read agrees with the mirror: held by c1, nobody else waits.
    let me = Me {
        fe: &b.fe,
        layout: &stage.layout,
    };
    let limits = Limits::default();
    assert!(misread(&b.g, &me, &limits, &q, x_in_etcd(&stage)).is_none());
    let local = &b.g.waiting[&7];
    assert_eq!(local.phase, Phase::Queued { failed_at: None });
    assert_eq!((local.rev, local.mod_rev), (at, at));
    let ns = x_in_etcd(&stage);
    assert_eq!(ns.holders.len(), 1);
    let w = ns.queue.values().next().expect("c2 waits in etcd");
    assert_eq!(
        (w.value.id.as_str(), w.key.as_str()),
        ("c2", q.key.as_str())
    );
}

#[test]
fn a_place_taken_over_that_went_meanwhile_is_decided_again() {
    let mut stage = Stage::new();
    held(&mut stage);
    waiting(&mut stage, "fe-a", "c2", "a2");
    let mut b = stage.core("fe-b");
    stage.sync(&mut b);
    // c2 again, through fe-b: it takes over its older request's place.
    let ns = b.g.mirror.name("x").expect("x");
    let rev = *ns.queue.keys().next().expect("c2 waits");
    let waits = Waits::of(ns, false, Some(rev), &[rev], &[]);
    let (Queue { q, writes, .. }, _rx) =
        lock(&stage, &mut b, (8, "fe-b-8", "c2"), waits, Seen::Read);
    assert!(!q.check);
    assert_eq!(q.key, stage.layout.waiter("x", "a2"));
    assert!(
        b.g.by_uid.contains_key("fe-a-a2"),
        "known by the old uid too meanwhile"
    );
    // The old request leaves before the write lands.
    let gone = Txn::new().and_then([TxnOp::delete(q.key.clone(), None)]);
    stage.write(&gone);
    let resp = stage.write(&writes.last);
    assert!(!resp.succeeded());
    assert_eq!(queue_answered(&mut b.g, &q, None), Outcome::Again);
    assert!(b.g.waiting.is_empty() && b.g.by_uid.is_empty());
    assert!(x_in_etcd(&stage).queue.is_empty(), "nothing written");
}

#[test]
fn a_wait_whose_read_shows_the_id_waiting_already_is_decided_again_on_it() {
    let mut stage = Stage::new();
    held(&mut stage);
    let mut b = stage.core("fe-b");
    stage.sync(&mut b);
    // c2 queued through fe-a a moment ago: fe-b's mirror does not show it yet.
    waiting(&mut stage, "fe-a", "c2", "a2");
    let waits = plain_wait(&b);
    let (Queue { q, writes, .. }, _rx) =
        lock(&stage, &mut b, (9, "fe-b-9", "c2"), waits, Seen::Mirror);
    let resp = stage.write(&writes.last);
    assert_eq!(slot_write(&resp), SlotWrite::Done);
    assert_eq!(
        queue_answered(&mut b.g, &q, Some(revision(&resp))),
        Outcome::Check
    );
    let me = Me {
        fe: &b.fe,
        layout: &stage.layout,
    };
    let limits = Limits::default();
    let read = misread(&b.g, &me, &limits, &q, x_in_etcd(&stage)).expect("a misread");
    // Decided again on the name without this request: c2's older wait in it.
    assert_eq!(read.queue.len(), 1);
    let older = read.queue.values().next().expect("c2 waits");
    assert_eq!(older.key, stage.layout.waiter("x", "a2"));
}
