//! Whom a front-end takes for a holder of its own (`state.rs::holds_here`): the question
//! that decides whether a LOCK's new waiter key waits `--etcd-join-wait` for a release to
//! ride with (`requests.rs::txn`). A wrong yes costs a waiter that wait for nothing; a wrong
//! no costs the contended hand-over its second transaction.

use super::rpc::{Txn, TxnOp};
use super::stepping::{waiter_value, Core, Stage};

/// A stage where `x` is held by client `c1` through fe-a (its key in slot `s1`), and the
/// core of front-end `fe`, its mirror caught up with that.
fn held_by_fe_a(fe: &str) -> (Stage, Core) {
    let mut stage = Stage::new();
    let mut value = waiter_value("fe-a-s1", "c1", "fe-a", 0).holder(0);
    value.deadline_ms = 60_000;
    let key = stage.layout.holder("x", "s1");
    stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), None)]));
    let mut core = stage.core(fe);
    stage.sync(&mut core);
    (stage, core)
}

#[test]
fn a_holder_through_this_front_end_is_held_here_and_only_here() {
    let (_, a) = held_by_fe_a("fe-a");
    let (_, b) = held_by_fe_a("fe-b");
    assert!(a.g.holds_here("x", "fe-a"), "fe-a's own client holds x");
    assert!(!b.g.holds_here("x", "fe-b"), "fe-b has no holder of x");
    assert!(!a.g.holds_here("y", "fe-a"), "nobody holds y");
}

#[test]
fn a_name_nobody_holds_is_not_held_here() {
    let stage = Stage::new();
    let a = stage.core("fe-a");
    assert!(!a.g.holds_here("x", "fe-a"));
}

#[test]
fn a_grant_made_here_counts_before_the_watch_shows_it() {
    // fe-b's mirror shows the holder; fe-a's has not caught up, but fe-a made the grant
    // itself (at once), so it is among its fresh grants.
    let (stage, b) = held_by_fe_a("fe-b");
    let record =
        b.g.mirror
            .name("x")
            .expect("x is mirrored")
            .holders
            .values()
            .next();
    let record = record.expect("x is held").clone();
    let mut a = stage.core("fe-a");
    assert!(!a.g.holds_here("x", "fe-a"), "fe-a knows of no holder yet");
    a.g.fresh.insert(("x".into(), record.rev), record);
    assert!(a.g.holds_here("x", "fe-a"), "fe-a's own fresh grant");
    assert!(
        !a.g.holds_here("y", "fe-a"),
        "a fresh grant of x says nothing of y"
    );
}

#[test]
fn a_holder_whose_key_went_with_its_front_end_is_not_held_here() {
    // A keyless holder (its front-end's etcd lease ran out, its lock-delay runs) will send
    // no UNLOCK through anyone: nothing to wait for.
    let (_, mut a) = held_by_fe_a("fe-a");
    let ns = a.g.mirror.names.get_mut("x").expect("x is mirrored");
    for holder in ns.holders.values_mut() {
        holder.keyless = true;
    }
    assert!(!a.g.holds_here("x", "fe-a"));
}
