//! One holder as the core knows it (`holding.rs`), stepped by hand on the in-memory etcd: a
//! grant through another front-end, read from etcd until the mirror shows it, and a rewrite
//! made on a record that changed since it was read.

use std::time::Duration;

use super::holding::{holder_read, rewrite_plain};
use super::holding::{known_holder, owned, rewrite, rewrite_in_place, wrote_lease, Asker, Known};
use super::mirror::HolderRecord;
use super::rpc::{GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use super::stepping::{waiter_value, Core, Stage, BASE};
use super::tokens::Tokens;
use super::values::HolderValue;
use crate::locks::TableError;

/// `x` held by client `c1` through fe-a, from the wall clock's 0 for 60s (on etcd lease
/// `lease`, 0 for none; a session lease with `session`), its key in slot `a1`: its revision.
pub(super) fn held(stage: &mut Stage, lease: i64, session: bool) -> i64 {
    let mut value = waiter_value("fe-a-1", "c1", "fe-a", lease).holder(0);
    value.deadline_ms = 60_000;
    value.ttl_ms = 60_000;
    value.session_ms = session.then_some(0);
    let key = stage.layout.holder("x", "a1");
    let put = (lease != 0).then(|| PutOptions::new().with_lease(lease));
    let resp = stage.write(&Txn::new().and_then([TxnOp::put(key, value.encode(), put)]));
    resp.header().map_or(0, |h| h.revision())
}

/// Every holder key of `x`, as a linearizable read of them finds them.
pub(super) fn read_x(stage: &mut Stage) -> Vec<KeyValue> {
    let get = TxnOp::get(
        stage.layout.holders("x"),
        Some(GetOptions::new().with_prefix()),
    );
    let resp = stage.write(&Txn::new().and_then([get]));
    match resp.op_responses().first() {
        Some(TxnOpResponse::Get(r)) => r.kvs().to_vec(),
        _ => panic!("a read's answer"),
    }
}

/// The record of `x` etcd holds now.
pub(super) fn value_of_x(stage: &mut Stage) -> HolderValue {
    let kvs = read_x(stage);
    let kv = kvs.first().expect("x is held");
    HolderValue::decode(kv.value()).expect("a holder's record")
}

pub(super) fn holder_of_x(core: &Core) -> HolderRecord {
    let ns = core.g.mirror.name("x").expect("x is mirrored");
    ns.holders.values().next().expect("x is held").clone()
}

#[test]
fn a_grant_through_another_front_end_is_read_from_etcd_until_the_mirror_shows_it() {
    let mut stage = Stage::new();
    let mut b = stage.core("fe-b");
    let other = stage.write(&Txn::new().and_then([TxnOp::put("/p/other", "-", None)]));
    let other = other.header().map_or(0, |h| h.revision());
    stage.sync(&mut b);
    let rev = held(&mut stage, 0, false);
    let token = BASE + rev as u64;
    // fe-b's mirror is behind the grant: it is read from etcd.
    assert!(matches!(known_holder(&b.g, "x", token), Ok(Known::Read(r)) if r == rev));
    let kvs = read_x(&mut stage);
    let read = holder_read(&b.g, "x", rev, &kvs, stage.now).expect("read");
    assert_eq!(
        (read.rev, read.mod_rev, read.uid.as_str()),
        (rev, rev, "fe-a-1")
    );
    assert_eq!(read.value.id, "c1");
    // Not seen being written: counted from the read, for the time its record has left.
    assert_eq!(read.left(stage.now), Duration::from_secs(60));
    assert_eq!(
        holder_read(&b.g, "x", rev + 1, &kvs, stage.now).err(),
        Some(TableError::NotHeld),
        "no holder of x was created there"
    );
    // Once the mirror shows it, it is the mirror's.
    stage.sync(&mut b);
    assert!(matches!(known_holder(&b.g, "x", token), Ok(Known::Here(h)) if h.rev == rev));
    // A revision the mirror has passed with no holder of x is no lease.
    let stale = known_holder(&b.g, "x", BASE + other as u64);
    assert_eq!(stale.err(), Some(TableError::NotHeld));
    assert_eq!(known_holder(&b.g, "x", 5).err(), Some(TableError::NotHeld));
}

#[test]
fn a_rewrite_made_on_a_record_that_changed_since_is_refused() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    let holder = holder_of_x(&a);
    let mut first = holder.value.clone();
    first.deadline_ms = 90_000;
    let resp = stage.write(&rewrite(&stage.layout, &holder, &first, 0));
    assert!(resp.succeeded());
    let rev = resp.header().map_or(0, |h| h.revision());
    wrote_lease(&mut a.g, "x", &first, rev);
    assert_eq!(a.g.written.get("x"), Some(&(rev, false)));
    // Both rewrites below were decided on the record before the first: etcd refuses them.
    let mut second = holder.value.clone();
    second.deadline_ms = 5_000;
    assert!(!stage
        .write(&rewrite_in_place(&stage.layout, &holder, &second))
        .succeeded());
    assert!(!stage
        .write(&rewrite_plain(&stage.layout, &holder, &second))
        .succeeded());
    assert_eq!(value_of_x(&mut stage).deadline_ms, 90_000);
    // The token stays: the key's create revision does not move.
    let kvs = read_x(&mut stage);
    assert_eq!(kvs[0].create_revision(), holder.rev);
}

#[test]
fn only_its_owner_acts_on_a_live_lease() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    let holder = holder_of_x(&a);
    // Taken by no user.
    assert_eq!(owned(&holder, &Asker::Anyone, stage.now), Ok(()));
    assert_eq!(owned(&holder, &Asker::Nobody, stage.now), Ok(()));
    assert_eq!(
        owned(&holder, &Asker::User("bob"), stage.now),
        Err(TableError::NotOwner)
    );
    let later = stage.now + Duration::from_secs(61);
    assert_eq!(
        owned(&holder, &Asker::Anyone, later),
        Err(TableError::NotHeld),
        "its time is up"
    );
}

#[test]
fn on_a_dense_prefix_two_grants_of_one_write_have_two_tokens_each_naming_its_own_holder() {
    let mut stage = Stage::new();
    let mut b = stage.core("fe-b");
    let base = Tokens::fresh_value(BASE);
    let resp = stage.write(&Txn::new().and_then([TxnOp::put(stage.layout.base(), base, None)]));
    let tokens = Tokens::parse(
        Tokens::fresh_value(BASE).as_bytes(),
        resp.header().map_or(0, |h| h.revision()),
    );
    b.g.mirror.tokens = tokens.expect("dense");
    let holder = |client: &str, fe: &str| waiter_value(&format!("{fe}-1"), client, fe, 0).holder(0);
    let grants = Txn::new().and_then([
        TxnOp::put(
            stage.layout.holder("x", "fe-a.1"),
            holder("c1", "fe-a").encode(),
            None,
        ),
        TxnOp::put(
            stage.layout.holder("y", "fe-b.2"),
            holder("c2", "fe-b").encode(),
            None,
        ),
    ]);
    let rev = stage.write(&grants).header().map_or(0, |h| h.revision());
    stage.sync(&mut b);
    let (x, y) = (
        b.g.mirror.token(rev, "fe-a.1"),
        b.g.mirror.token(rev, "fe-b.2"),
    );
    assert_ne!(x, y);
    assert!(matches!(known_holder(&b.g, "x", x), Ok(Known::Here(h)) if h.value.id == "c1"));
    assert!(matches!(known_holder(&b.g, "y", y), Ok(Known::Here(h)) if h.value.id == "c2"));
    // The other grant's token, on the wrong name: no lease of this one's.
    assert_eq!(known_holder(&b.g, "x", y).err(), Some(TableError::NotHeld));
    assert_eq!(known_holder(&b.g, "y", x).err(), Some(TableError::NotHeld));
}
