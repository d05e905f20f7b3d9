//! A name as a read shows it, and how current the mirror is for it (`reads.rs`), stepped by
//! hand on the in-memory etcd: a read's answer made states, a holder in its lock-delay that
//! the read misses kept from a mirror that is behind, and a front-end's own last write
//! remembered until its watch shows it.

use std::time::Duration;

use super::marks::MarkerValue;
use super::mirror::NameState;
use super::reads::{emptied_by_own_write, name_reads, own_write_unseen, states_read, with_delays};
use super::rpc::{Txn, TxnOp, TxnOpResponse};
use super::stepping::{waiter_value, Stage, BASE};
use super::tokens::Tokens;
use super::values::HolderValue;
use crate::locks::EventKind;

/// A holder of `x` through `fe-a` in slot `a1`: a session lease with a lock-delay.
fn delayed_holder() -> HolderValue {
    let mut value = waiter_value("fe-a-a1", "c1", "fe-a", 0).holder(0);
    value.session_ms = Some(1000);
    value.delay_ms = 5000;
    value.deadline_ms = 60_000;
    value
}

/// `names` as a read of etcd shows them now, and the revision read at.
fn read(stage: &mut Stage, names: &[String]) -> (Vec<NameState>, i64) {
    let ops: Vec<TxnOp> = names
        .iter()
        .flat_map(|n| name_reads(&stage.layout, n))
        .collect();
    let resp = stage.write(&Txn::new().and_then(ops));
    let rev = resp.header.as_ref().map_or(0, |h| h.revision);
    let mut changes = Vec::new();
    for op in resp.op_responses() {
        if let TxnOpResponse::Get(got) = op {
            changes.extend(got.kvs().iter().map(|kv| super::watch::change(kv, true)));
        }
    }
    let states = states_read(
        &stage.layout,
        Tokens::plain(BASE),
        &changes,
        rev,
        names,
        (stage.now, 0),
    );
    (states, rev)
}

fn names(of: &[&str]) -> Vec<String> {
    of.iter().map(|n| n.to_string()).collect()
}

#[test]
fn a_read_shows_each_name_as_etcd_has_it() {
    let mut stage = Stage::new();
    let key = stage.layout.holder("x", "a1");
    let put = TxnOp::put(key, delayed_holder().encode(), None);
    let granted = stage.write(&Txn::new().and_then([put]));
    let at = granted.header.as_ref().map_or(0, |h| h.revision);
    let (states, rev) = read(&mut stage, &names(&["x", "y"]));
    assert_eq!(rev, at, "a read writes nothing");
    let revs: Vec<i64> = states[0].holders.keys().copied().collect();
    assert_eq!(revs, [at]);
    assert!(states[1].holders.is_empty() && states[1].queue.is_empty());
}

#[test]
fn a_holder_the_read_misses_is_kept_in_its_delay_only_while_the_mirror_is_behind() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let key = stage.layout.holder("x", "a1");
    let put = TxnOp::put(key.clone(), delayed_holder().encode(), None);
    stage.write(&Txn::new().and_then([put]));
    stage.sync(&mut a);
    // Released (its marker written): fe-a's mirror, behind the read, still shows the holder,
    // and can't tell a release from a lost etcd lease: the holder is kept in its delay.
    let marker = MarkerValue {
        kind: EventKind::Released,
        rev: 0,
        fe: "fe-b".into(),
        by_user: String::new(),
        by_peer: String::new(),
    };
    let release = [
        TxnOp::put(stage.layout.marker("x"), marker.encode(), None),
        TxnOp::delete(key, None),
    ];
    stage.write(&Txn::new().and_then(release));
    let x = names(&["x"]);
    let (mut states, rev) = read(&mut stage, &x);
    assert!(states[0].holders.is_empty(), "no read shows it");
    with_delays(&a.g.mirror, &x, &mut states, rev, stage.now);
    let kept = states[0]
        .holders
        .values()
        .next()
        .expect("kept in its delay");
    assert_eq!(kept.ends_at, stage.now + Duration::from_millis(5000));
    // Caught up, the mirror shows the release: the read is taken as it is.
    stage.sync(&mut a);
    let (mut states, rev) = read(&mut stage, &x);
    with_delays(&a.g.mirror, &x, &mut states, rev, stage.now);
    assert!(states[0].holders.is_empty());
}

#[test]
fn an_own_write_that_emptied_a_name_is_remembered_until_the_watch_shows_it() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    let key = stage.layout.holder("x", "a1");
    let put = TxnOp::put(key.clone(), delayed_holder().encode(), None);
    stage.write(&Txn::new().and_then([put]));
    stage.watch(&mut a);
    assert!(!own_write_unseen(&a.g, "x"));
    let released = stage.write(&Txn::new().and_then([TxnOp::delete(key, None)]));
    let rev = released.header.as_ref().map_or(0, |h| h.revision);
    a.g.wrote("x", rev, true);
    assert!(own_write_unseen(&a.g, "x") && emptied_by_own_write(&a.g, "x"));
    assert!(!own_write_unseen(&a.g, "y"));
    stage.watch(&mut a);
    assert!(!own_write_unseen(&a.g, "x") && !emptied_by_own_write(&a.g, "x"));
}
