//! RENEW, CHECK and the same LOCK again (`renewal.rs`), stepped by hand on the in-memory
//! etcd: a session lease renewed through another front-end, a RENEW that lost a race to
//! another, and a LOCK again that claims a grant given up on.

use std::time::Duration;

use super::head::Me;
use super::holding::{holder_read, Asker};
use super::holding_tests::{held, holder_of_x, read_x, value_of_x};
use super::renewal::{again_answered, lock_again, renewal, renewed, time_left, Renew};
use super::stepping::{Stage, BASE};
use crate::backend::{HandOver, LockStart};
use crate::locks::{LockRequest, Origin, TableError, Tie};

fn renew(lease: i64, ttl: Option<Duration>) -> Renew<'static> {
    Renew {
        ttl,
        conn: 7,
        asker: Asker::Anyone,
        detach: false,
        lease,
    }
}

fn me<'a>(stage: &'a Stage, fe: &'a str) -> Me<'a> {
    Me {
        fe,
        layout: &stage.layout,
    }
}

#[test]
fn a_session_lease_renewed_through_another_front_end_is_bound_there() {
    let mut stage = Stage::new();
    let (lease_a, lease_b) = (
        stage.etcd.lease_grant(60, 0).id,
        stage.etcd.lease_grant(60, 0).id,
    );
    let mut b = stage.core("fe-b");
    held(&mut stage, lease_a, true);
    stage.sync(&mut b);
    let holder = holder_of_x(&b);
    let ask = renew(lease_b, Some(Duration::from_secs(20)));
    let r = renewal(&me(&stage, &b.fe), &holder, &ask, stage.now, 2_000).expect("renewable");
    let resp = stage.write(&r.txn);
    let done = renewed(&mut b.g, "x", &r, &resp).expect("renewed");
    assert_eq!((done.left, done.bound), (Duration::from_secs(20), true));
    // In etcd: its key on fe-b's etcd lease, its record fe-b's connection's, a new deadline.
    let kvs = read_x(&mut stage);
    assert_eq!(kvs[0].lease(), lease_b);
    let value = value_of_x(&mut stage);
    assert_eq!((value.fe.as_str(), value.conn), ("fe-b", 7));
    assert_eq!(value.deadline_ms, 22_000);
    assert!(b.g.written.contains_key("x"));
    // Detached, it hangs on no front-end's etcd lease and is bound to no connection.
    let holder = holder_read(&b.g, "x", holder.rev, &kvs, stage.now).expect("read");
    let ask = Renew {
        detach: true,
        ..renew(lease_b, None)
    };
    let r = renewal(&me(&stage, &b.fe), &holder, &ask, stage.now, 3_000).expect("renewable");
    assert!(!r.bound);
    let resp = stage.write(&r.txn);
    assert!(renewed(&mut b.g, "x", &r, &resp).is_some());
    assert_eq!(read_x(&mut stage)[0].lease(), 0);
    assert_eq!(value_of_x(&mut stage).session_ms, None);
}

#[test]
fn a_renew_that_lost_a_race_is_read_again_and_made_then() {
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    stage.sync(&mut b);
    let first = renewal(
        &me(&stage, &a.fe),
        &holder_of_x(&a),
        &renew(0, None),
        stage.now,
        1_000,
    );
    let first = first.expect("renewable");
    let stale = renewal(
        &me(&stage, &b.fe),
        &holder_of_x(&b),
        &renew(0, None),
        stage.now,
        2_000,
    );
    let stale = stale.expect("renewable");
    let resp = stage.write(&first.txn);
    assert!(renewed(&mut a.g, "x", &first, &resp).is_some());
    let resp = stage.write(&stale.txn);
    assert!(
        renewed(&mut b.g, "x", &stale, &resp).is_none(),
        "changed since fe-b read it"
    );
    assert_eq!(value_of_x(&mut stage).at_ms, 1_000);
    // Read again, it is renewed then.
    let kvs = read_x(&mut stage);
    let again = holder_read(&b.g, "x", holder_of_x(&b).rev, &kvs, stage.now).expect("read");
    let r = renewal(
        &me(&stage, &b.fe),
        &again,
        &renew(0, None),
        stage.now,
        2_000,
    );
    let resp = stage.write(&r.expect("renewable").txn);
    assert!(resp.succeeded());
    assert_eq!(value_of_x(&mut stage).at_ms, 2_000);
}

#[test]
fn a_broken_lease_or_another_users_is_not_renewed_and_checks_as_not_held() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    let mut holder = holder_of_x(&a);
    let ask = Renew {
        asker: Asker::User("bob"),
        ..renew(0, None)
    };
    let refused = renewal(&me(&stage, &a.fe), &holder, &ask, stage.now, 0).err();
    assert_eq!(refused, Some(TableError::NotOwner));
    // CHECK: the least of its record on this wall clock and the mirror's own count.
    let left = time_left(&a.g, "x", &holder, stage.now, 50_000);
    assert_eq!(left, Ok(Duration::from_secs(10)));
    let left = time_left(&a.g, "x", &holder, stage.now + Duration::from_secs(55), 0);
    assert_eq!(left, Ok(Duration::from_secs(5)));
    let over = time_left(&a.g, "x", &holder, stage.now, 60_000);
    assert_eq!(over, Err(TableError::NotHeld));
    holder.value.broken_by = Some(Origin::default());
    let refused = renewal(&me(&stage, &a.fe), &holder, &renew(0, None), stage.now, 0).err();
    assert_eq!(refused, Some(TableError::NotHeld));
    let left = time_left(&a.g, "x", &holder, stage.now, 0);
    assert_eq!(left, Err(TableError::NotHeld));
}

fn again_request(conn: u64) -> LockRequest {
    LockRequest {
        name: "x".into(),
        id: "c1".into(),
        conn,
        tie: Tie::Plain,
        ..Default::default()
    }
}

#[test]
fn a_lock_again_claims_a_grant_given_up_on_and_gives_it_up_if_it_fails() {
    let mut stage = Stage::new();
    let (mut a, mut b) = (stage.core("fe-a"), stage.core("fe-b"));
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    stage.sync(&mut b);
    let holder = holder_of_x(&a);
    // fe-a gave up on c1's earlier request, whose grant this is.
    a.g.left.insert(holder.uid.clone());
    let req = again_request(3);
    let ttl = Duration::from_secs(30);
    let again = lock_again(&mut a.g, &me(&stage, &a.fe), (&req, 0), &holder, ttl, 1_000);
    assert!(again.claimed && !a.g.left.contains(&holder.uid));
    // fe-b renews it first: the LOCK again's rewrite fails, and the grant is given up on.
    let r = renewal(
        &me(&stage, &b.fe),
        &holder_of_x(&b),
        &renew(0, None),
        stage.now,
        0,
    );
    stage.write(&r.expect("renewable").txn);
    let resp = stage.write(&again.txn);
    assert!(again_answered(&mut a.g, "x", &holder, &again, Some(&resp)).is_none());
    assert!(a.g.left.contains(&holder.uid));
    // Decided again on what etcd holds, it is granted: the same token, a new lease.
    let kvs = read_x(&mut stage);
    let holder = holder_read(&a.g, "x", holder.rev, &kvs, stage.now).expect("read");
    let again = lock_again(&mut a.g, &me(&stage, &a.fe), (&req, 0), &holder, ttl, 1_000);
    let resp = stage.write(&again.txn);
    let rev = resp.header().map_or(0, |h| h.revision());
    let start = again_answered(&mut a.g, "x", &holder, &again, Some(&resp));
    let Some(LockStart::Granted { token, handover }) = start else {
        panic!("granted");
    };
    assert_eq!((token, handover), (BASE + holder.rev as u64, HandOver(rev)));
    assert!(!a.g.left.contains(&holder.uid));
    let value = value_of_x(&mut stage);
    assert_eq!((value.deadline_ms, value.conn), (31_000, 3));
}

#[test]
fn a_lock_again_with_no_answer_gives_its_claim_up() {
    let mut stage = Stage::new();
    let mut a = stage.core("fe-a");
    held(&mut stage, 0, false);
    stage.sync(&mut a);
    let holder = holder_of_x(&a);
    a.g.left.insert(holder.uid.clone());
    let req = again_request(3);
    let ttl = Duration::from_secs(30);
    let again = lock_again(&mut a.g, &me(&stage, &a.fe), (&req, 0), &holder, ttl, 1_000);
    assert!(again_answered(&mut a.g, "x", &holder, &again, None).is_none());
    assert!(a.g.left.contains(&holder.uid));
}
