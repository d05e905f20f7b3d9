//! The core taking in watch batches (`watched.rs`), stepped by hand against the in-memory
//! etcd: how a waiter of this front-end learns from the watch that its wait ended.

use super::marks::SupersededValue;
use super::rpc::{Txn, TxnOp};
use super::stepping::{waiter_value, Core, Stage};
use crate::backend::WaitResult;
use crate::locks::WaitEnd;

/// Client `c1` waits on `x` through fe-a (key in slot `a1`); its key and the receiver of its
/// answer.
fn waiting(
    stage: &mut Stage,
    a: &mut Core,
) -> (String, tokio::sync::oneshot::Receiver<WaitResult>) {
    let value = waiter_value("fe-a-a1", "c1", "fe-a", 0);
    let key = stage.layout.waiter("x", "a1");
    let put = TxnOp::put(key.clone(), value.encode(), None);
    let resp = stage.write(&Txn::new().and_then([put]));
    let rev = resp.header().map_or(0, |h| h.revision());
    let rx = a.waits("x", "a1", key.clone(), rev, value, stage.now);
    stage.watch(a);
    (key, rx)
}

#[test]
fn a_waiter_whose_queue_a_supersede_lock_took_is_told_by_whom() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, mut rx) = waiting(&mut stage, &mut a);
    // fe-b's `supersede` LOCK: the mark first, then the key's delete, in one write.
    let mark = SupersededValue {
        by: "c9".into(),
        same_id: false,
    };
    let mark = TxnOp::put(stage.layout.superseded("x", "fe-a-a1"), mark.encode(), None);
    stage.write(&Txn::new().and_then([mark, TxnOp::delete(key, None)]));
    let watched = stage.watch(&mut a);
    assert!(watched.grants.is_empty());
    match rx.try_recv() {
        Ok(WaitResult::Ended(WaitEnd::Superseded { by })) => assert_eq!(&*by, "c9"),
        other => panic!("SUPERSEDED by c9: {other:?}"),
    }
    assert!(a.g.waiting.is_empty() && a.g.by_uid.is_empty());
}

#[test]
fn a_waiter_whose_place_another_front_end_took_over_is_replaced() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, mut rx) = waiting(&mut stage, &mut a);
    // The same LOCK again through fe-b rewrites the key as fe-b's, under the uid it takes
    // over (its place kept).
    let value = waiter_value("fe-a-a1", "c1", "fe-b", 0);
    stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), None)]));
    stage.watch(&mut a);
    assert!(matches!(
        rx.try_recv(),
        Ok(WaitResult::Ended(WaitEnd::Replaced))
    ));
    assert!(a.g.waiting.is_empty());
}

#[test]
fn a_waiter_whose_key_went_with_its_front_ends_etcd_lease_hears_the_wait_was_lost() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let (key, mut rx) = waiting(&mut stage, &mut a);
    stage.write(&Txn::new().and_then([TxnOp::delete(key, None)]));
    stage.watch(&mut a);
    assert!(matches!(rx.try_recv(), Ok(WaitResult::Failed(_))));
}
