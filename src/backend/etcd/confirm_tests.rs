//! How a confirmation's answer is read: above all, a write applied on a try whose answer was
//! lost is the grant confirmed, not a takeover.

use super::{confirmation, Confirmation};
use crate::backend::etcd::rpc::{txn_answer, KeyValue};

const GRANTED_AT: i64 = 40;
const OURS: &[u8] = b"the holder's value";

fn holder(value: &[u8], lease: i64, mod_revision: i64) -> KeyValue {
    KeyValue {
        key: b"h/x/u1".to_vec(),
        create_revision: GRANTED_AT,
        mod_revision,
        value: value.to_vec(),
        lease,
        ..Default::default()
    }
}

#[test]
fn the_rewrite_that_succeeded_confirms_at_its_revision() {
    let answer = txn_answer(true, 52, Vec::new());
    assert_eq!(
        confirmation(Some(&answer), GRANTED_AT, OURS),
        Confirmation::Confirmed(52)
    );
}

#[test]
fn the_grant_found_as_this_confirmation_writes_it_was_confirmed_by_an_earlier_try() {
    // The first try was applied at 47 and its answer lost; this try's guard fails on it.
    let answer = txn_answer(false, 55, vec![holder(OURS, 0, 47)]);
    assert_eq!(
        confirmation(Some(&answer), GRANTED_AT, OURS),
        Confirmation::Confirmed(47)
    );
}

#[test]
fn the_grant_rewritten_otherwise_was_taken_over() {
    // Another value: a LOCK of the same id through another front-end rewrote it.
    let answer = txn_answer(false, 55, vec![holder(b"another front-end's", 0, 47)]);
    assert_eq!(
        confirmation(Some(&answer), GRANTED_AT, OURS),
        Confirmation::TakenOver
    );
    // Still on an etcd lease: not this confirmation's write either.
    let answer = txn_answer(false, 55, vec![holder(OURS, 7, 47)]);
    assert_eq!(
        confirmation(Some(&answer), GRANTED_AT, OURS),
        Confirmation::TakenOver
    );
}

#[test]
fn a_grant_over_for_its_holder_before_it_was_confirmed_is_lost_not_taken_over() {
    // Its ttl ran out into its lock-delay (the rewrite of `expiring.rs::delaying`), or a
    // BREAK rewrote it: its client is told the grant could not be confirmed, not REPLACED.
    let over = [
        &b"id=c1 mode=x ttl=9000 deadline=1000 delay=1700 delaying=expired"[..],
        &b"id=c1 mode=x ttl=9000 deadline=1000 broken=ops"[..],
    ];
    for value in over {
        let answer = txn_answer(false, 55, vec![holder(value, 0, 47)]);
        assert_eq!(
            confirmation(Some(&answer), GRANTED_AT, OURS),
            Confirmation::Lost,
            "{}",
            String::from_utf8_lossy(value)
        );
    }
}

#[test]
fn a_grant_gone_or_unanswered_is_lost() {
    let answer = txn_answer(false, 55, Vec::new());
    assert_eq!(
        confirmation(Some(&answer), GRANTED_AT, OURS),
        Confirmation::Lost
    );
    // A key of that name created again later is another grant.
    let mut later = holder(OURS, 0, 50);
    later.create_revision = 50;
    let answer = txn_answer(false, 55, vec![later]);
    assert_eq!(
        confirmation(Some(&answer), GRANTED_AT, OURS),
        Confirmation::Lost
    );
    assert_eq!(confirmation(None, GRANTED_AT, OURS), Confirmation::Lost);
}
