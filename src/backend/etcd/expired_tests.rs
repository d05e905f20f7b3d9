//! The expiry timer's writes (`expired.rs`), stepped by hand on the in-memory etcd: a lease
//! ended at its deadline leaves nothing of its name behind; one renewed meanwhile is not
//! ended; a lease rewritten into its lock-delay, unless a RENEW came first.

use super::end::{end_txn, ended};
use super::expired::{delay_txn, delay_written, not_renewed, tidy};
use super::expiring::delaying;
use super::head::Me;
use super::holding::rewrite;
use super::holding_tests::{held, holder_of_x, read_x, value_of_x};
use super::marks::MarkerValue;
use super::mirror::HolderRecord;
use super::rpc::{Txn, TxnOp, TxnOpResponse};
use super::stepping::{Core, Stage};
use crate::locks::EventKind;

/// Whether etcd holds any key of `x` (its marker, holders or waiters).
fn anything_of_x(stage: &mut Stage) -> bool {
    let marker = TxnOp::get(stage.layout.marker("x"), None);
    let resp = stage.write(&Txn::new().and_then([marker]));
    let marker =
        matches!(resp.op_responses().first(), Some(TxnOpResponse::Get(r)) if !r.kvs().is_empty());
    marker || !read_x(stage).is_empty()
}

/// fe-a's expiry of `holder` of `x`, written and answered: the writes that tidy after it.
fn expire(stage: &mut Stage, a: &mut Core, holder: &HolderRecord) -> (bool, Vec<Txn>) {
    let marker = MarkerValue {
        kind: EventKind::Expired,
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
    let kind = EventKind::Expired;
    let end = end_txn(
        &a.g,
        &me,
        "x",
        kind,
        holder,
        not_renewed(holder),
        &marker,
        0,
    );
    let resp = stage.write(&end.txn);
    let was_ended = ended(&mut a.g, &a.fe, "x", holder, &end, &resp, stage.now).is_some();
    let tidy = tidy(&stage.layout, "x", holder, (&end, &resp), was_ended);
    (was_ended, tidy)
}

#[test]
fn a_lease_ended_at_its_deadline_leaves_nothing_of_its_name_behind() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    let holder = holder_of_x(&a);
    let (was_ended, tidy) = expire(&mut stage, &mut a, &holder);
    assert!(was_ended);
    assert_eq!(tidy.len(), 1, "its marker, now the only key of x");
    assert!(anything_of_x(&mut stage));
    for txn in &tidy {
        assert!(stage.write(txn).succeeded());
    }
    assert!(!anything_of_x(&mut stage), "x is gone from etcd");
}

#[test]
fn a_lease_renewed_meanwhile_is_not_ended() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    let holder = holder_of_x(&a);
    // A RENEW through another front-end comes first.
    let mut renewed = holder.value.clone();
    renewed.deadline_ms = 90_000;
    assert!(stage
        .write(&rewrite(&stage.layout, &holder, &renewed, 0))
        .succeeded());
    let (was_ended, tidy) = expire(&mut stage, &mut a, &holder);
    assert!(!was_ended && tidy.is_empty());
    assert_eq!(value_of_x(&mut stage).deadline_ms, 90_000);
}

#[test]
fn a_lease_goes_into_its_lock_delay_unless_a_renew_came_first() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let lease = stage.etcd.lease_grant(60, 0).id;
    held(&mut stage, lease, true);
    stage.sync(&mut a);
    let holder = holder_of_x(&a);
    let mut value = delaying(&holder, EventKind::Dropped, 5_000);
    value.delay_ms = 2_000;
    value.deadline_ms = 7_000;
    let resp = stage.write(&delay_txn(&stage.layout, &holder, &value));
    delay_written(&mut a.g, "x", &value, &resp);
    assert!(a.g.written.contains_key("x"));
    // In etcd: in its delay, on no etcd lease (it outlives its front-end).
    assert_eq!(read_x(&mut stage)[0].lease(), 0);
    assert_eq!(value_of_x(&mut stage).delaying, Some(EventKind::Dropped));
    // Decided on the record before that rewrite, a second one is refused and not recorded.
    let mut b = stage.core("fe-b");
    let resp = stage.write(&delay_txn(&stage.layout, &holder, &value));
    delay_written(&mut b.g, "x", &value, &resp);
    assert!(!resp.succeeded() && b.g.written.is_empty());
}
