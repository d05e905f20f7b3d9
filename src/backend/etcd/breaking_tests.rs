//! BREAK (`breaking.rs`), stepped by hand on the in-memory etcd: a lease marked broken and
//! its holder told by whom, and a BREAK that lost a race to an UNLOCK, which leaves no record
//! of a break behind (unless another BREAK wrote its own since).

use std::time::Duration;

use super::breaking::broken_record;
use super::breaking::{break_one, broke, mark, mark_again, marked, to_break};
use super::breaking::{Break, BreakOne};
use super::delivery::take_back_at;
use super::guards;
use super::head::Me;
use super::holding::holder_read;
use super::holding::rewrite_in_place;
use super::holding_tests::{held, holder_of_x, read_x};
use super::mirror::{HolderRecord, NameState};
use super::rpc::{KeyValue, Txn, TxnOp, TxnOpResponse};
use super::stepping::{Core, Stage, BASE};
use crate::backend::HandOver;
use crate::locks::{Origin, TableError};

/// `x` as a linearizable read of it finds it now.
fn read_ns(stage: &Stage) -> NameState {
    let mut reader = stage.core("reader");
    stage.sync(&mut reader);
    reader.g.mirror.names.remove("x").unwrap_or_default()
}

fn read(stage: &mut Stage, key: &str) -> Vec<KeyValue> {
    let resp = stage.write(&Txn::new().and_then([TxnOp::get(key, None)]));
    match resp.op_responses().first() {
        Some(TxnOpResponse::Get(r)) => r.kvs().to_vec(),
        _ => panic!("a read's answer"),
    }
}

/// `x` held by `c1` through fe-a (`holding_tests::held`), and fe-a's core, its mirror caught
/// up: the stage, the core and the holder key's revision.
fn held_and_seen() -> (Stage, Core, i64) {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let rev = held(&mut stage, 0, false);
    stage.sync(&mut a);
    (stage, a, rev)
}

fn alice() -> Origin {
    Origin::new(Some("alice"), None)
}

/// `core`'s BREAK of `holder` of `x` by `by`, its record written on an etcd lease of its
/// own: the break, and the revision of the record's write.
fn recorded(stage: &mut Stage, core: &Core, holder: &HolderRecord, by: &Origin) -> (Break, i64) {
    let one = break_one(&core.g, &stage.layout, ("x", holder), (by, false), 1_000);
    let BreakOne::Write(one) = one else {
        panic!("not broken before");
    };
    let lease = stage.etcd.lease_grant(one.lease_ttl, 0).id;
    let resp = stage.write(&one.record_txn(lease));
    (*one, resp.header().map_or(0, |h| h.revision()))
}

#[test]
fn a_break_marks_a_lease_broken_and_its_holder_is_told_by_whom() {
    let (mut stage, mut a, rev) = held_and_seen();
    let me = Me {
        fe: &a.fe,
        layout: &stage.layout,
    };
    let holders = to_break(&a.g, &me, read_ns(&stage), None, stage.now).expect("held");
    let [holder] = holders.as_slice() else {
        panic!("one lease to break");
    };
    let (one, _) = recorded(&mut stage, &a, holder, &alice());
    assert!(!one.ends, "without force it is marked, not ended");
    assert_eq!(
        one.lease_ttl, 60,
        "the record outlives the lease's 59 seconds left"
    );
    let m = mark(&stage.layout, holder, &alice());
    let resp = stage.write(&m.txn);
    assert!(marked(&mut a.g, "x", &m, &resp));
    assert_eq!(broke(1), Ok(1));
    // In etcd: the lease is marked, and its holder, asking, is told who broke it.
    let token = BASE + rev as u64;
    let key = stage.layout.broken("x", token);
    let record = read(&mut stage, &key);
    let told = broken_record(&record, 2_000).expect("broken");
    assert_eq!((told.by.as_str(), told.at_ms), ("alice", 1_000));
    assert!(
        broken_record(&record, 60_000).is_none(),
        "past the lease's deadline the record says nothing"
    );
    let kvs = read_x(&mut stage);
    let marked = holder_read(&a.g, "x", rev, &kvs, stage.now).expect("still in its place");
    assert!(marked.value.broken_by.is_some() && !mark_again(&marked));
    // A BREAK sent again finds it marked: it counts, and writes nothing.
    let again = break_one(&a.g, &stage.layout, ("x", &marked), (&alice(), false), 0);
    assert!(matches!(again, BreakOne::Done));
}

#[test]
fn a_break_that_lost_a_race_to_an_unlock_leaves_no_record_behind() {
    let (mut stage, mut a, rev) = held_and_seen();
    let holder = holder_of_x(&a);
    let (first, written) = recorded(&mut stage, &a, &holder, &alice());
    // c1's UNLOCK comes first: the mark finds the key gone, and nothing is broken.
    stage.write(&Txn::new().and_then([TxnOp::delete(holder.key.clone(), None)]));
    let m = mark(&stage.layout, &holder, &alice());
    let resp = stage.write(&m.txn);
    assert!(!marked(&mut a.g, "x", &m, &resp));
    let kvs = read_x(&mut stage);
    assert!(holder_read(&a.g, "x", rev, &kvs, stage.now).is_err());
    assert_eq!(broke(0), Err(TableError::NotHeld));
    // Another BREAK wrote its own record since: that one stays.
    let bob = Origin::new(Some("bob"), None);
    let (second, written_since) = recorded(&mut stage, &a, &holder, &bob);
    for txn in first.unrecord(written) {
        stage.write(&txn);
    }
    let token = BASE + rev as u64;
    let key = stage.layout.broken("x", token);
    assert_eq!(read(&mut stage, &key).len(), 1, "bob's record stays");
    for txn in second.unrecord(written_since) {
        stage.write(&txn);
    }
    assert!(
        read(&mut stage, &key).is_empty(),
        "no record of a break is left"
    );
}

#[test]
fn a_break_of_a_token_not_held_or_of_a_lease_whose_time_is_up_ends_nothing() {
    let (stage, a, rev) = held_and_seen();
    let me = Me {
        fe: &a.fe,
        layout: &stage.layout,
    };
    let other = Some(BASE + rev as u64 + 1);
    let refused = to_break(&a.g, &me, read_ns(&stage), other, stage.now).err();
    assert_eq!(refused, Some(TableError::NotHeld));
    let later = stage.now + Duration::from_secs(61);
    let refused = to_break(&a.g, &me, read_ns(&stage), None, later).err();
    assert_eq!(refused, Some(TableError::NotHeld));
    let mine = Some(BASE + rev as u64);
    let holders = to_break(&a.g, &me, read_ns(&stage), mine, stage.now).expect("held");
    assert_eq!(holders.len(), 1);
}

/// Whether a take-back of `x`'s holder handed over at `handover`, guarded as
/// [`take_back_at`] says on `a`'s mirror now, ends it in etcd.
fn taken_back(stage: &mut Stage, a: &mut Core, handover: i64) -> bool {
    stage.sync(a);
    let holder = holder_of_x(a);
    let at = take_back_at(&holder, HandOver(handover));
    let txn = Txn::new()
        .when([guards::unchanged(&holder.key, at)])
        .and_then([TxnOp::delete(holder.key.clone(), None)]);
    stage.write(&txn).succeeded()
}

#[test]
fn a_grant_broken_before_its_take_back_is_still_taken_back() {
    // Simulator seed 140536: a grant to a waiter that had left, marked broken before its
    // front-end's take-back, was kept as if a client had been told of it since, and sat out
    // its ttl and lock-delay. Nobody is told of a broken lease.
    let (mut stage, mut a, handed) = held_and_seen();
    let m = mark(&stage.layout, &holder_of_x(&a), &alice());
    assert!(stage.write(&m.txn).succeeded());
    assert!(taken_back(&mut stage, &mut a, handed));
}

#[test]
fn a_grant_renewed_then_broken_is_kept() {
    // A RENEW after the hand-over: a client was told of it, and its job may run; the BREAK
    // after that does not make it one to take back (it waits for its release or deadline).
    let (mut stage, mut a, handed) = held_and_seen();
    let holder = holder_of_x(&a);
    let mut renewed = holder.value.clone();
    renewed.deadline_ms += 10_000;
    assert!(stage
        .write(&rewrite_in_place(&stage.layout, &holder, &renewed))
        .succeeded());
    stage.sync(&mut a);
    let m = mark(&stage.layout, &holder_of_x(&a), &alice());
    assert!(stage.write(&m.txn).succeeded());
    assert!(!taken_back(&mut stage, &mut a, handed));
}

#[test]
fn a_broken_lease_says_which_version_it_marked_through_etcd() {
    let (mut stage, a, _) = held_and_seen();
    let holder = holder_of_x(&a);
    let m = mark(&stage.layout, &holder, &alice());
    stage.write(&m.txn);
    let mut b = stage.core("fe-b");
    stage.sync(&mut b);
    assert_eq!(holder_of_x(&b).value.broken_over, holder.mod_rev);
}
