//! Every lock read again after the watch fell behind (`resynced.rs`), stepped by hand on the
//! in-memory etcd: a grant made meanwhile to a waiter of this front-end is told to watchers
//! and delivered; a waiter whose key went meanwhile is told its wait was lost.

use super::head::Me;
use super::mirror::KeyChange;
use super::resynced::{reread, resynced};
use super::rpc::{GetOptions, Txn, TxnOp, TxnOpResponse};
use super::stepping::{waiter_value, Core, Stage, BASE};
use crate::backend::{BackendError, WaitResult};
use crate::locks::EventKind;

/// The whole prefix as a read shows it now, and the revision read at.
fn read_all(stage: &mut Stage) -> (Vec<KeyChange>, i64) {
    let all = TxnOp::get(
        stage.layout.prefix().to_owned(),
        Some(GetOptions::new().with_prefix()),
    );
    let resp = stage.write(&Txn::new().and_then([all]));
    let rev = resp.header.as_ref().map_or(0, |h| h.revision);
    let mut changes = Vec::new();
    for op in resp.op_responses() {
        if let TxnOpResponse::Get(got) = op {
            changes.extend(got.kvs().iter().map(|kv| super::watch::change(kv, true)));
        }
    }
    (changes, rev)
}

/// `x` held by another front-end's client in slot `h1`, and fe-a's client `c1` waiting
/// behind it (slot `a1`), as fe-a's mirror shows; the receiver of c1's answer.
fn held_with_a_waiter(
    stage: &mut Stage,
    a: &mut Core,
) -> tokio::sync::oneshot::Receiver<WaitResult> {
    let holder = waiter_value("fe-b-1", "other", "fe-b", 0).holder(0);
    let put = TxnOp::put(stage.layout.holder("x", "h1"), holder.encode(), None);
    stage.write(&Txn::new().and_then([put]));
    let key = stage.layout.waiter("x", "a1");
    let value = waiter_value("fe-a-1", "c1", "fe-a", 0);
    let put = TxnOp::put(key.clone(), value.encode(), None);
    let queued = stage.write(&Txn::new().and_then([put]));
    let rev = queued.header.as_ref().map_or(0, |h| h.revision);
    let rx = a.waits("x", "a1", key, rev, value, stage.now);
    stage.sync(a);
    rx
}

#[test]
fn a_grant_made_while_the_watch_was_behind_is_told_and_delivered() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let mut rx = held_with_a_waiter(&mut stage, &mut a);
    // fe-b releases `x` and grants it to c1 in the same write; fe-a's watch misses it.
    let granted = waiter_value("fe-a-1", "c1", "fe-a", 0).holder(0);
    let handover = Txn::new().and_then([
        TxnOp::delete(stage.layout.holder("x", "h1"), None),
        TxnOp::delete(stage.layout.waiter("x", "a1"), None),
        TxnOp::put(stage.layout.holder("x", "a1"), granted.encode(), None),
    ]);
    let resp = stage.write(&handover);
    let rev = resp.header.as_ref().map_or(0, |h| h.revision);
    let (changes, read_at) = read_all(&mut stage);
    let me = Me {
        fe: &a.fe,
        layout: &stage.layout,
    };
    let again = reread(&mut a.g, &me, &changes, read_at, (stage.now, 0));
    let told: Vec<(EventKind, u64)> = again.events.iter().map(|e| (e.kind, e.token)).collect();
    assert!(
        told.contains(&(EventKind::Acquired, BASE + rev as u64)),
        "{told:?}"
    );
    assert!(
        told.len() == 2,
        "the old holder's end, then the grant: {told:?}"
    );
    let after = resynced(&mut a.g, &me, &again.old, read_at, stage.now);
    assert!(after.touched.iter().any(|n| n == "x"));
    match rx.try_recv() {
        Ok(WaitResult::Granted { token, .. }) => assert_eq!(token, BASE + rev as u64),
        _ => panic!("c1 is told of its grant"),
    }
    assert!(a.g.waiting.is_empty());
}

#[test]
fn a_wait_whose_key_went_while_the_watch_was_behind_is_told_it_was_lost() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let mut rx = held_with_a_waiter(&mut stage, &mut a);
    // c1's key goes (with fe-a's old etcd lease, say); no grant was made.
    let gone = TxnOp::delete(stage.layout.waiter("x", "a1"), None);
    stage.write(&Txn::new().and_then([gone]));
    let (changes, read_at) = read_all(&mut stage);
    let me = Me {
        fe: &a.fe,
        layout: &stage.layout,
    };
    let again = reread(&mut a.g, &me, &changes, read_at, (stage.now, 0));
    assert!(again.events.is_empty(), "nothing a watcher sees changed");
    let after = resynced(&mut a.g, &me, &again.old, read_at, stage.now);
    assert!(after.grants.is_empty());
    match rx.try_recv() {
        Ok(WaitResult::Failed(BackendError::Unavailable(_))) => {}
        _ => panic!("c1 is told its wait was lost"),
    }
    assert!(a.g.waiting.is_empty() && a.g.by_uid.is_empty());
}
