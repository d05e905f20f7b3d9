//! The core's timer (`expiring.rs`), stepped by hand on the in-memory etcd: who ends a lease
//! whose time ran out, and how.

use std::time::Duration;

use super::expiring::{expiry, Ending};
use super::mirror::FRONT_END_VALUE;
use super::rpc::{Txn, TxnOp};
use super::stepping::{waiter_value, Core, Stage, BASE};
use crate::locks::EventKind;

/// Front-end `fe` alive: its key in etcd, as a started front-end writes it.
fn alive(stage: &mut Stage, fe: &str) {
    let key = stage.layout.front_end(fe);
    stage.write(&Txn::new().and_then([TxnOp::put(key, FRONT_END_VALUE.to_owned(), None)]));
}

/// `x` held through `fe` for 1s from the wall clock's 0, with a lock-delay of `delay_ms`;
/// its token.
fn held(stage: &mut Stage, fe: &str, delay_ms: u64) -> u64 {
    let mut value = waiter_value(&format!("{fe}-1"), "c1", fe, 0).holder(0);
    value.deadline_ms = 1_000;
    value.delay_ms = delay_ms;
    let key = stage.layout.holder("x", "s1");
    let resp = stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), None)]));
    BASE + resp.header().map_or(0, |h| h.revision()) as u64
}

fn fire(stage: &Stage, core: &mut Core, after: Duration) -> super::expiring::Expiry {
    expiry(
        &mut core.g,
        &core.fe.clone(),
        stage.now + after,
        1_000 + after.as_millis() as u64,
    )
}

#[test]
fn a_lease_ends_at_its_deadline_through_its_own_front_end_once() {
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    alive(&mut stage, "fe-a");
    alive(&mut stage, "fe-b");
    let token = held(&mut stage, "fe-a", 0);
    stage.sync(&mut a);
    stage.sync(&mut b);
    let early = fire(&stage, &mut a, Duration::from_millis(500));
    assert!(
        early.due.is_empty() && early.next.is_some(),
        "not yet: the next is known"
    );
    let due = fire(&stage, &mut a, Duration::from_secs(2)).due;
    let [(name, _, _, Ending::End(EventKind::Expired, t))] = due.as_slice() else {
        panic!("fe-a ends it, as expired");
    };
    assert_eq!((name.as_str(), *t), ("x", token));
    assert!(
        fire(&stage, &mut a, Duration::from_secs(3)).due.is_empty(),
        "once"
    );
    assert!(
        fire(&stage, &mut b, Duration::from_secs(2)).due.is_empty(),
        "not fe-b's"
    );
}

#[test]
fn a_dead_front_ends_lease_is_ended_by_the_live_front_end_with_the_smallest_id() {
    let mut stage = Stage::new();
    let (mut b, mut c) = (stage.core("fe-b"), stage.core("fe-c"));
    alive(&mut stage, "fe-b");
    alive(&mut stage, "fe-c");
    held(&mut stage, "fe-a", 0);
    stage.sync(&mut b);
    stage.sync(&mut c);
    assert_eq!(fire(&stage, &mut b, Duration::from_secs(2)).due.len(), 1);
    assert!(fire(&stage, &mut c, Duration::from_secs(2)).due.is_empty());
}

#[test]
fn a_lease_with_a_lock_delay_keeps_its_place_over_for_its_holder() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    alive(&mut stage, "fe-a");
    held(&mut stage, "fe-a", 5_000);
    stage.sync(&mut a);
    let due = fire(&stage, &mut a, Duration::from_secs(2)).due;
    let [(_, _, _, Ending::Delay(value))] = due.as_slice() else {
        panic!("into its lock-delay");
    };
    assert_eq!(value.delaying, Some(EventKind::Expired));
    assert_eq!((value.at_ms, value.deadline_ms), (3_000, 8_000));
    assert!(value.lingering(), "over for its holder");
}

#[test]
fn a_lease_is_ended_even_where_no_front_end_s_key_is_shown() {
    // Every front-end's key went unseen (each put on an etcd lease that then lapsed): each
    // still counts itself alive, so a lease of its own, or of a front-end that looks dead, is
    // ended (by a guarded write: two front-ends trying it end it once).
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    held(&mut stage, "fe-a", 0);
    stage.sync(&mut a);
    stage.sync(&mut b);
    let due = fire(&stage, &mut a, Duration::from_secs(2)).due;
    assert_eq!(due.len(), 1, "fe-a ends its own lease");
    let mut gone = stage.core("fe-c");
    held(&mut stage, "fe-gone", 0);
    stage.sync(&mut gone);
    let due = fire(&stage, &mut gone, Duration::from_secs(2)).due;
    assert!(
        !due.is_empty(),
        "fe-c ends a lease of a front-end that looks dead"
    );
}
