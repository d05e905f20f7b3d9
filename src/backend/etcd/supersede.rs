//! A `supersede` LOCK of one name: newest wins. The whole queue as the decision saw it is
//! taken out, each waiter after its mark (so its front-end's watch sees why it went), in
//! writes guarded on the name as decided; a queue longer than one etcd transaction carries
//! goes in several, this request's key in the last one.

use super::rpc::{Compare, Txn, TxnOp};

use super::queueing::{mark_put, waiter_put};
use super::values::WaiterValue;
use super::waits::Superseded;
use super::{guards, Cluster};

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

impl Cluster {
    /// The writes of a `supersede` LOCK of `name_of_wait` whose key (`key`, in `slot`, with
    /// `value`) goes in the last one: every waiter of `superseded` out, after its mark.
    pub(super) fn supersede_writes(
        &self,
        name_of_wait: &str,
        value: &WaiterValue,
        slot: &str,
        key: &str,
        superseded: &Superseded,
    ) -> Writes {
        let lease = value.lease;
        let marks: Vec<String> = superseded
            .queue
            .iter()
            .map(|(w, _)| self.layout.superseded(name_of_wait, &w.uid))
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
            guards::marker_at(&self.layout, name_of_wait, superseded.marker_rev),
            guards::queue_unchanged_since(&self.layout, name_of_wait, seen),
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
                let other = self.layout.waiter(n, &w.slot);
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
            last: guards::in_empty_slot(&self.layout, [name_of_wait], slot, write),
            marks: last.1,
        }
    }
}
