//! What a transaction touches, as group commit (`commit.rs`) must see it to keep apart the
//! requests that may not share one etcd transaction. Beyond the keys themselves (which
//! `lockd_etcd::batch` compares), two rules of the layout (`keys.rs`): a queue's order and a
//! name's tokens are its keys' create revisions, so two requests of one name in a batch
//! could tie (two new waiters at one place; the mirror, which orders a queue by revision,
//! keeps one of them, and the other's grant fails its guards for good); and a grant's token
//! is its write's revision and its slot's part (`tokens.rs`), so two requests that put
//! holder keys of slots with one part (on a plain prefix: any two) never share a batch.

use std::collections::BTreeSet;

use super::keys::{Key, Layout};
use super::rpc::batch::Footprint;
use super::rpc::Txn;
use super::tokens::Tokens;

/// What `txn` touches: its keys, a key of each name it touches (no key of lockd's starts with
/// a zero byte, so only requests of one name meet on it), and a key of each token part its
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
    for name in names {
        footprint = footprint.also_writes(format!("\0name/{name}"));
    }
    for part in parts {
        footprint = footprint.also_writes(format!("\0token/{part}"));
    }
    footprint
}

#[cfg(test)]
mod tests {
    use super::super::rpc::{Compare, CompareOp, TxnOp};
    use super::*;

    fn queue(layout: &Layout, name: &str, slot: &str) -> Txn {
        let key = layout.waiter(name, slot);
        Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, "v", None)])
    }

    fn grant(layout: &Layout, name: &str, slot: &str) -> Txn {
        Txn::new().and_then([
            TxnOp::put(layout.marker(name), "m", None),
            TxnOp::put(layout.holder(name, slot), "v", None),
        ])
    }

    #[test]
    fn two_requests_of_one_name_never_share_a_batch() {
        let l = Layout::new("/p/");
        let f = |t: &Txn| footprint(&l, Tokens::default(), t);
        // Two new waiters of one name, different keys: one place in the queue each.
        assert!(f(&queue(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "x", "fe.2"))));
        assert!(!f(&queue(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "y", "fe.2"))));
        // A name with `/` in it is one name.
        assert!(f(&queue(&l, "a/b", "fe.1")).conflicts(&f(&queue(&l, "a/b", "fe.2"))));
        assert!(!f(&queue(&l, "a/b", "fe.1")).conflicts(&f(&queue(&l, "a", "fe.2"))));
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
