//! A `supersede` LOCK of one name: newest wins. The whole queue as the decision saw it is
//! taken out, each waiter after its mark (so its front-end's watch sees why it went), in
//! writes guarded on the name as decided; a queue longer than one etcd transaction carries
//! goes in several, this request's key in the last one; and the puts every queueing write
//! is made of (a waiter's key, a waiter's mark). Pure (part of the core): `queued.rs`
//! chooses these writes, `enqueue.rs` sends them.

use super::rpc::{Compare, PutOptions, Txn, TxnOp};

use super::guards;
use super::keys::Layout;
use super::marks::SupersededValue;
use super::values::WaiterValue;
use super::waits::Superseded;

/// The most operations one etcd transaction may carry (etcd's `--max-txn-ops` default): a
/// supersede of a longer queue is made in several.
const TXN_OPS: usize = 128;

/// A queueing write of one name, as it is sent: the writes ahead of the last one (a
/// `supersede` of a queue longer than one etcd transaction carries: each its operations, the
/// marks it puts and its own comparisons), the comparisons every one of them is guarded by,
/// the last write (the one with this request's key) and the marks it puts.
pub(super) struct Writes {
    pub(super) ahead: Vec<(Vec<TxnOp>, Vec<String>, Vec<Compare>)>,
    pub(super) guard: Vec<Compare>,
    pub(super) last: Txn,
    pub(super) marks: Vec<String>,
}

impl Writes {
    /// One write, nothing ahead of it.
    pub(super) fn last(txn: Txn) -> Writes {
        Writes {
            ahead: Vec::new(),
            guard: Vec::new(),
            last: txn,
            marks: Vec::new(),
        }
    }
}

/// A write ahead of the last (`ops`, with its own comparisons `checks`), guarded by `guard`
/// as every one of them is.
pub(super) fn ahead_txn(guard: &[Compare], ops: Vec<TxnOp>, checks: Vec<Compare>) -> Txn {
    let when: Vec<Compare> = guard.iter().cloned().chain(checks).collect();
    Txn::new().when(when).and_then(ops)
}

/// The writes of a `supersede` LOCK of `name_of_wait` whose key (`key`, in `slot`, with
/// `value`) goes in the last one: every waiter of `superseded` out, after its mark.
pub(super) fn supersede_writes(
    layout: &Layout,
    name_of_wait: &str,
    value: &WaiterValue,
    (slot, key): (&str, &str),
    superseded: &Superseded,
) -> Writes {
    let lease = value.lease;
    let marks: Vec<String> = superseded
        .queue
        .iter()
        .map(|(w, _)| layout.superseded(name_of_wait, &w.uid))
        .collect();
    // A supersede of a queue longer than one etcd transaction carries: the writes (and
    // their marks) that take the waiters ahead out first, before the one with this
    // request's key.
    let mut ahead: Vec<(Vec<TxnOp>, Vec<String>, Vec<Compare>)> = Vec::new();
    // Newest wins, in writes guarded on the name as decided: no holder came or
    // went, and nobody joined the queue or moved in it since. Each waiter's mark
    // goes before its delete, so its front-end's watch sees why it went.
    let seen = superseded
        .queue
        .iter()
        .map(|(w, _)| w.mod_rev)
        .max()
        .unwrap_or(0);
    let guard = vec![
        guards::marker_at(layout, name_of_wait, superseded.marker_rev),
        guards::queue_unchanged_since(layout, name_of_wait, seen),
    ];
    let by = value.id.clone();
    let mut last: (Vec<TxnOp>, Vec<String>, Vec<Compare>) =
        (vec![waiter_put(key, value)], Vec::new(), Vec::new());
    for ((w, same_id), mark) in superseded.queue.iter().zip(&marks) {
        let mut out = vec![
            mark_put(mark, &by, *same_id, lease),
            TxnOp::delete(w.key.clone(), None),
        ];
        // A set waiter leaves all its queues: its keys on its other names go too
        // (its front-end's watch ends its wait from the mark above), each only
        // if it is still the set's (created with it): the set may have left
        // since, and its slot hold another request's key there.
        let mut checks = Vec::new();
        for n in w.value.set.iter().filter(|n| n.as_str() != name_of_wait) {
            let other = layout.waiter(n, &w.slot);
            checks.push(guards::same_key(&other, w.rev));
            out.push(TxnOp::delete(other, None));
        }
        // Full: what is gathered so far goes ahead (this request's key moves on
        // to the next write, the last). etcd takes as many comparisons as
        // operations; the last write adds its slot's two.
        let compares = guard.len() + 2 + last.2.len() + checks.len();
        if last.0.len() + out.len() > TXN_OPS || compares > TXN_OPS {
            let key_op = last.0.remove(0);
            let next = (vec![key_op], Vec::new(), Vec::new());
            ahead.push(std::mem::replace(&mut last, next));
        }
        last.0.extend(out);
        last.1.push(mark.clone());
        last.2.extend(checks);
    }
    let when: Vec<Compare> = guard.iter().cloned().chain(last.2).collect();
    let write = Txn::new().when(when).and_then(last.0);
    Writes {
        ahead,
        guard,
        last: guards::in_empty_slot(layout, [name_of_wait], slot, write),
        marks: last.1,
    }
}

/// The put of a waiter's key `key` with its record: on the lease its record names, as a
/// grant to it is made on that lease (see end_txn).
pub(super) fn waiter_put(key: &str, value: &WaiterValue) -> TxnOp {
    TxnOp::put(
        key.to_owned(),
        value.encode(),
        Some(PutOptions::new().with_lease(value.lease)),
    )
}

/// The put of the mark `mark` that a waiter was taken out of the queue by a LOCK of id `by`
/// (`same_id`: its own id, so its request was replaced, not superseded), on that LOCK's
/// front-end's etcd lease `lease`.
pub(super) fn mark_put(mark: &str, by: &str, same_id: bool, lease: i64) -> TxnOp {
    let value = SupersededValue {
        by: by.to_owned(),
        same_id,
    };
    TxnOp::put(
        mark.to_owned(),
        value.encode(),
        Some(PutOptions::new().with_lease(lease)),
    )
}
