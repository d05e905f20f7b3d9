//! What a transaction touches, as group commit (`commit.rs`) must see it to keep apart the
//! requests that may not share one etcd transaction. Beyond the keys themselves (which
//! `lockd_etcd::batch` compares), two rules of the layout (`keys.rs`): a queue's order and a
//! name's tokens are its keys' create revisions, so two requests of one name in a batch
//! could tie (two new waiters at one place; the mirror, which orders a queue by revision,
//! keeps one of them, and the other's grant fails its guards for good); and tokens rise with
//! every grant across names, so two requests that put holder keys never share a batch.

use std::collections::BTreeSet;

use super::keys::{Key, Layout};
use super::rpc::batch::Footprint;
use super::rpc::Txn;

/// What `txn` touches: its keys, a key of each name it touches (no key of lockd's starts with
/// a zero byte, so only requests of one name meet on it), and one key that every request
/// putting a holder key writes.
pub(super) fn footprint(layout: &Layout, txn: &Txn) -> Footprint {
    let mut footprint = Footprint::of(txn);
    let holder = |key: &[u8]| matches!(layout.parse(key), Some(Key::Holder { .. }));
    let makes_token = footprint.puts().any(holder);
    let names: BTreeSet<String> = footprint.keys().filter_map(|k| layout.name_of(k)).collect();
    for name in names {
        footprint = footprint.also_writes(format!("\0name/{name}"));
    }
    if makes_token {
        footprint = footprint.also_writes(&b"\0token"[..]);
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
        let f = |t: &Txn| footprint(&l, t);
        // Two new waiters of one name, different keys: one place in the queue each.
        assert!(f(&queue(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "x", "fe.2"))));
        assert!(!f(&queue(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "y", "fe.2"))));
        // A name with `/` in it is one name.
        assert!(f(&queue(&l, "a/b", "fe.1")).conflicts(&f(&queue(&l, "a/b", "fe.2"))));
        assert!(!f(&queue(&l, "a/b", "fe.1")).conflicts(&f(&queue(&l, "a", "fe.2"))));
    }

    #[test]
    fn two_grants_never_share_a_batch_whatever_their_names() {
        let l = Layout::new("/p/");
        let f = |t: &Txn| footprint(&l, t);
        assert!(f(&grant(&l, "x", "fe.1")).conflicts(&f(&grant(&l, "y", "fe.2"))));
        assert!(!f(&grant(&l, "x", "fe.1")).conflicts(&f(&queue(&l, "y", "fe.2"))));
    }
}
