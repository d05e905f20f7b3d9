//! What a transaction touches, as group commit (`commit.rs`) must see it to keep apart the
//! requests that may not share one etcd transaction. Beyond the keys themselves (which
//! `lockd_etcd::batch` compares, in the batch's order), two rules of the layout (`keys.rs`):
//! a queue's order and a name's tokens are its keys' create revisions, so two requests of one
//! name in a batch could tie (two new waiters at one place; the mirror, which orders a queue
//! by revision, keeps one of them, and the other's grant fails its guards for good); and a
//! grant's token is its write's revision and its slot's part (`tokens.rs`), so two requests
//! that put holder keys of slots with one part (on a plain prefix: any two) never share a
//! batch.
//!
//! One pair of one name does share a batch: any request of the name, then a *join*, a LOCK's
//! new waiter key and nothing else (a plain wait: `queued.rs`). The join goes last, so it
//! is as if it came right after the other: its comparisons are on its own empty slot, which
//! the other leaves alone, and its reads of the name see what the other did. It is the
//! contended hand-over's pair (a release granting the next waiter, and the LOCK its holder
//! sends again), which would otherwise cost etcd a transaction each. Never a join first: a
//! release's "nobody waits" or "first in line" would be decided without the new waiter.

use std::collections::BTreeSet;

use super::keys::{Key, Layout};
use super::rpc::batch::{self, Footprint};
use super::rpc::Txn;
use super::tokens::Tokens;

/// What `txn` touches: its keys; for each name it touches, a key of the name's (no key of
/// lockd's starts with a zero byte, so only requests of one name meet on it): a join writes
/// the name's queue key, any other request writes the name's key and compares its queue key
/// (a join may follow it, nothing may follow a join), and writes the queue key too if it puts
/// a waiter key of the name (then no join follows it); and a key of each token part its
/// holder keys' slots give (`tokens`: one for all on a plain prefix).
pub(super) fn footprint(layout: &Layout, tokens: Tokens, txn: &Txn) -> Footprint {
    let mut footprint = Footprint::of(txn);
    let part = |key: &[u8]| match layout.parse(key) {
        Some(Key::Holder { slot, .. }) if tokens.dense() => Some(Tokens::part(&slot)),
        Some(Key::Holder { .. }) => Some(0),
        _ => None,
    };
    let parts: BTreeSet<u64> = footprint.puts().filter_map(part).collect();
    let names: BTreeSet<String> = footprint.keys().filter_map(|k| layout.name_of(k)).collect();
    let queued: BTreeSet<String> = footprint
        .puts()
        .filter_map(|k| match layout.parse(k) {
            Some(Key::Waiter { name, .. }) => Some(name),
            _ => None,
        })
        .collect();
    let queue_key = |name: &str| format!("\0queue/{name}");
    match joined(layout, txn, &footprint) {
        Some(name) => footprint = footprint.also_writes(queue_key(&name)).last(),
        None => {
            for name in names {
                footprint = footprint
                    .also_writes(format!("\0name/{name}"))
                    .also_compares(queue_key(&name));
            }
            // Its own waiter keys (a set's, a place taken over) would tie with a join's.
            for name in queued {
                footprint = footprint.also_writes(queue_key(&name));
            }
        }
    }
    for part in parts {
        footprint = footprint.also_writes(format!("\0token/{part}"));
    }
    footprint
}

/// The name `txn` joins the queue of, if it is a join ([`joined`]).
pub(super) fn join_of(layout: &Layout, txn: &Txn) -> Option<String> {
    joined(layout, txn, &Footprint::of(txn))
}

/// The name `txn` (of footprint `footprint`) joins the queue of, if it is a join: it creates
/// waiter keys of one name only, and touches no key of another.
fn joined(layout: &Layout, txn: &Txn, footprint: &Footprint) -> Option<String> {
    let mut puts = footprint.puts().map(|k| layout.parse(k));
    let Some(Some(Key::Waiter { name, .. })) = puts.next() else {
        return None;
    };
    let one_name = footprint
        .keys()
        .all(|k| layout.name_of(k).is_some_and(|n| n == name));
    let waiters_only = puts.all(|k| matches!(k, Some(Key::Waiter { name: n, .. }) if n == name));
    (one_name && waiters_only && batch::creates_only(txn)).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::super::rpc::TxnOp;
    use super::super::{guards, reads};
    use super::*;

    fn queue(layout: &Layout, name: &str, slot: &str) -> Txn {
        let key = layout.waiter(name, slot);
        let write = Txn::new().and_then([TxnOp::put(key, "v", None)]);
        guards::in_empty_slot_then(layout, [name], slot, write, reads::name_reads(layout, name))
    }

    /// A release of `name` granting the waiter in `slot` (as `release.rs` writes it).
    fn hand_over(layout: &Layout, name: &str, slot: &str) -> Txn {
        let waiter = layout.waiter(name, slot);
        Txn::new()
            .when(guards::head_grant(layout, name, 5, (&waiter, 3, 3)))
            .and_then([
                TxnOp::delete(layout.holder(name, "fe.9"), None),
                TxnOp::put(layout.marker(name), "m", None),
                TxnOp::delete(waiter, None),
                TxnOp::put(layout.holder(name, slot), "v", None),
            ])
    }

    fn grant(layout: &Layout, name: &str, slot: &str) -> Txn {
        Txn::new().and_then([
            TxnOp::put(layout.marker(name), "m", None),
            TxnOp::put(layout.holder(name, slot), "v", None),
        ])
    }

    #[test]
    fn two_requests_of_one_name_never_share_a_batch_but_a_join_after_another() {
        let l = Layout::new("/p/");
        let f = |t: &Txn| footprint(&l, Tokens::default(), t);
        // Two new waiters of one name, different keys: one place in the queue each.
        assert!(f(&queue(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "x", "fe.2"))));
        assert!(!f(&queue(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "y", "fe.2"))));
        // A name with `/` in it is one name.
        assert!(f(&queue(&l, "a/b", "fe.1")).conflicts(&f(&queue(&l, "a/b", "fe.2"))));
        assert!(!f(&queue(&l, "a/b", "fe.1")).conflicts(&f(&queue(&l, "a", "fe.2"))));
        // A join goes last, after a release of its name: never before it.
        let (join, release) = (f(&queue(&l, "x", "fe.1")), f(&hand_over(&l, "x", "fe.2")));
        assert!(join.is_last() && !release.is_last());
        assert!(join.may_follow(&release));
        assert!(!release.may_follow(&join));
        // Two other requests of one name: neither after the other.
        let other = f(&hand_over(&l, "x", "fe.3"));
        assert!(other.conflicts(&release));
        // Nor a join whose slot the release writes in.
        assert!(!f(&queue(&l, "x", "fe.2")).may_follow(&release));
        // Nor a join after another request that puts a waiter key of its name (a set's:
        // simulator seed 560 of the first try): two new waiters would tie.
        let set_write = Txn::new().and_then([
            TxnOp::put(l.waiter("x", "fe.4"), "v", None),
            TxnOp::put(l.waiter("y", "fe.4"), "v", None),
        ]);
        let set = f(&guards::in_empty_slot(&l, ["x", "y"], "fe.4", set_write));
        assert!(!set.is_last());
        assert!(!join.may_follow(&set) && !set.may_follow(&join));
    }

    #[test]
    fn a_join_is_a_new_waiter_key_and_nothing_else() {
        let l = Layout::new("/p/");
        let f = |t: &Txn| footprint(&l, Tokens::default(), t);
        assert!(f(&queue(&l, "x", "fe.1")).is_last());
        // A write that takes a place over (no "absent" guard), deletes a key of its id, or
        // puts a holder key is no join.
        let key = l.waiter("x", "fe.1");
        let takeover = Txn::new()
            .when([guards::same_key(&key, 3)])
            .and_then([TxnOp::put(key.clone(), "v", None)]);
        assert!(!f(&takeover).is_last());
        let write = Txn::new().and_then([
            TxnOp::put(key.clone(), "v", None),
            TxnOp::delete(l.waiter("x", "fe.7"), None),
        ]);
        assert!(!f(&guards::in_empty_slot(&l, ["x"], "fe.1", write)).is_last());
        assert!(!f(&grant(&l, "x", "fe.1")).is_last());
        // A put guarded as absent only on the branch that does not run is no join either.
        let unguarded = Txn::new()
            .when([guards::absent(&key)])
            .or_else([TxnOp::put(key, "v", None)]);
        assert!(!f(&unguarded).is_last());
    }

    #[test]
    fn on_a_plain_prefix_two_grants_never_share_a_batch_whatever_their_names() {
        let l = Layout::new("/p/");
        let f = |t: &Txn| footprint(&l, Tokens::default(), t);
        assert!(f(&grant(&l, "x", "fe.1")).conflicts(&f(&grant(&l, "y", "fe.2"))));
        assert!(!f(&grant(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "y", "fe.2"))));
    }

    #[test]
    fn on_a_dense_prefix_grants_share_a_batch_unless_their_slots_share_a_token_part() {
        let l = Layout::new("/p/");
        let dense = Tokens::parse(Tokens::fresh_value(1000).as_bytes(), 1).expect("dense");
        let f = |t: &Txn| footprint(&l, dense, t);
        assert!(!f(&grant(&l, "x", "a.1")).conflicts(&f(&grant(&l, "y", "a.2"))));
        // Slot 1 of two front-ends, and slots 1 and 129 of one: one token each write.
        assert!(f(&grant(&l, "x", "a.1")).conflicts(&f(&grant(&l, "y", "b.1"))));
        assert!(f(&grant(&l, "x", "a.1")).conflicts(&f(&grant(&l, "y", "a.129"))));
        // Still one request of a name in a batch.
        assert!(f(&grant(&l, "x", "a.1")).conflicts(&f(&grant(&l, "x", "a.2"))));
    }
}
