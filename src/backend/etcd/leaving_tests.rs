//! A waiter leaving (`leaving.rs`), stepped by hand on the in-memory etcd: a `wait=` run
//! out that takes the place out; one that a grant, or a LOCK of the same id, beat to it; one
//! whose key went without either; and a connection gone, whose key is taken out unless
//! another front-end took its place over meanwhile.

use tokio::sync::oneshot;

use super::leaving::{abandoned, forget_txn, leaving, left, Left};
use super::rpc::{Txn, TxnOp};
use super::stepping::{waiter_value, Core, Stage};
use super::Phase;
use crate::backend::WaitResult;
use crate::locks::WaitEnd;

/// Client `c2` waiting on `x` through fe-a (its key in slot `a2`), entered in `core`'s
/// tables as queued: its key, its waiter id, and the receiver its answer comes on.
fn waiting(stage: &mut Stage, core: &mut Core) -> (String, u64, oneshot::Receiver<WaitResult>) {
    let value = waiter_value("fe-a-a2", "c2", "fe-a", 0);
    let key = stage.layout.waiter("x", "a2");
    let put = TxnOp::put(key.clone(), value.encode(), None);
    let resp = stage.write(&Txn::new().and_then([put]));
    let rev = resp.header().map_or(0, |h| h.revision());
    stage.sync(core);
    let rx = core.waits("x", "a2", key.clone(), rev, value, stage.now);
    (key, rev as u64, rx)
}

/// Whether etcd holds `key`.
fn in_etcd(stage: &mut Stage, key: &str) -> bool {
    let resp = stage.write(&Txn::new().and_then([TxnOp::get(key.to_owned(), None)]));
    match resp.op_responses().first() {
        Some(super::rpc::TxnOpResponse::Get(got)) => !got.kvs().is_empty(),
        _ => false,
    }
}

#[test]
fn a_wait_run_out_takes_its_place_out_and_is_told_timeout() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, waiter, mut rx) = waiting(&mut stage, &mut a);
    let leave = leaving(&mut a.g, &stage.layout, waiter).expect("its place goes");
    assert!(
        leaving(&mut a.g, &stage.layout, waiter).is_none(),
        "not sent twice"
    );
    let resp = stage.write(&leave.txn);
    assert_eq!(left(&mut a.g, waiter, &resp, 1), Left::Out);
    assert!(!in_etcd(&mut stage, &key));
    assert!(matches!(
        rx.try_recv(),
        Ok(WaitResult::Ended(WaitEnd::TimedOut))
    ));
    assert!(a.g.waiting.is_empty());
    assert!(
        a.g.left.contains("fe-a-a2"),
        "a grant shown later is taken back"
    );
}

#[test]
fn a_grant_made_first_is_the_waiters_and_its_wait_goes_on() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, waiter, mut rx) = waiting(&mut stage, &mut a);
    let leave = leaving(&mut a.g, &stage.layout, waiter).expect("its place goes");
    // Another front-end's release granted it first: holder in, waiter key out.
    let holder = waiter_value("fe-a-a2", "c2", "fe-a", 0).holder(0);
    stage.write(&Txn::new().and_then([
        TxnOp::put(stage.layout.holder("x", "a2"), holder.encode(), None),
        TxnOp::delete(key, None),
    ]));
    let resp = stage.write(&leave.txn);
    assert_eq!(left(&mut a.g, waiter, &resp, 1), Left::Granted);
    assert_eq!(
        a.g.waiting[&waiter].phase,
        Phase::Queued { failed_at: None }
    );
    assert!(
        rx.try_recv().is_err(),
        "nothing told yet: the grant's delivery tells"
    );
}

#[test]
fn a_place_taken_over_by_the_same_id_is_left_to_the_new_request() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, waiter, _rx) = waiting(&mut stage, &mut a);
    let leave = leaving(&mut a.g, &stage.layout, waiter).expect("its place goes");
    // The same LOCK again, through fe-b, rewrote the key first.
    let again = waiter_value("fe-a-a2", "c2", "fe-b", 0);
    stage.write(&Txn::new().and_then([TxnOp::put(key.clone(), again.encode(), None)]));
    let resp = stage.write(&leave.txn);
    assert_eq!(left(&mut a.g, waiter, &resp, 1), Left::TakenOver);
    assert!(in_etcd(&mut stage, &key), "the place is the new request's");
}

#[test]
fn a_key_gone_without_a_grant_is_told_its_wait_ran_out() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, waiter, mut rx) = waiting(&mut stage, &mut a);
    let leave = leaving(&mut a.g, &stage.layout, waiter).expect("its place goes");
    stage.write(&Txn::new().and_then([TxnOp::delete(key.clone(), None)]));
    stage.sync(&mut a);
    let resp = stage.write(&leave.txn);
    assert_eq!(left(&mut a.g, waiter, &resp, 1), Left::Gone);
    // Why it went (another front-end's `supersede`, a lease lost) may not be known yet; its
    // wait did run out.
    assert!(matches!(
        rx.try_recv(),
        Ok(WaitResult::Ended(WaitEnd::TimedOut))
    ));
    assert!(a.g.waiting.is_empty());

    // The same, on a try after the first: most likely that first one's delete.
    let (key, waiter, mut rx) = waiting(&mut stage, &mut a);
    let leave = leaving(&mut a.g, &stage.layout, waiter).expect("its place goes");
    stage.write(&Txn::new().and_then([TxnOp::delete(key, None)]));
    let resp = stage.write(&leave.txn);
    assert_eq!(left(&mut a.g, waiter, &resp, 2), Left::Out);
    assert!(matches!(
        rx.try_recv(),
        Ok(WaitResult::Ended(WaitEnd::TimedOut))
    ));
}

#[test]
fn a_connection_gone_takes_its_key_out_unless_it_was_taken_over() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, waiter, _rx) = waiting(&mut stage, &mut a);
    let (keys, mod_rev) = abandoned(&mut a.g, &stage.layout, waiter).expect("it waited");
    assert!(a.g.waiting.is_empty() && a.g.left.contains("fe-a-a2"));
    // Taken over meanwhile: the clean-up leaves the new request's key alone.
    let again = waiter_value("fe-a-a2", "c2", "fe-b", 0);
    stage.write(&Txn::new().and_then([TxnOp::put(key.clone(), again.encode(), None)]));
    let resp = stage.write(&forget_txn(&keys, mod_rev));
    assert!(!resp.succeeded());
    assert!(in_etcd(&mut stage, &key));
    // As written, it goes.
    let mut a = stage.core("fe-a");
    stage.sync(&mut a);
    let rev = a.g.mirror.name("x").and_then(|ns| ns.queue.values().next());
    let mod_rev = rev.map_or(0, |w| w.mod_rev);
    stage.write(&forget_txn(&keys, mod_rev));
    assert!(!in_etcd(&mut stage, &key));
}
