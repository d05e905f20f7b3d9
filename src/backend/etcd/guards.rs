//! The comparisons that guard every write, each built once from a named part that says what
//! it protects, as etcd's own `concurrency/mutex.go` builds its lock from named compares. A
//! decision made on a stale mirror fails one of them and is made again: they, not the
//! mirror, are what keeps a second holder out.

use super::rpc::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::keys::Layout;
use crate::locks::Mode;

/// The marker of `name` is at `marker_rev` (0: there is none). Every grant and every end
/// writes the marker, so no holder came or went since the decision was made.
pub(super) fn marker_at(layout: &Layout, name: &str, marker_rev: i64) -> Compare {
    Compare::mod_revision(layout.marker(name), CompareOp::Equal, marker_rev)
}

/// Nobody waits for `name`: a grant at once overtakes no one.
pub(super) fn nobody_waits(layout: &Layout, name: &str) -> Compare {
    Compare::version(layout.waiters(name), CompareOp::Equal, 0).with_prefix()
}

/// Nobody holds `name`.
pub(super) fn nobody_holds(layout: &Layout, name: &str) -> Compare {
    Compare::version(layout.holders(name), CompareOp::Equal, 0).with_prefix()
}

/// Every holder key of `name` is the one created at `rev`: that holder holds it alone.
pub(super) fn holds_alone(layout: &Layout, name: &str, rev: i64) -> Compare {
    Compare::create_revision(layout.holders(name), CompareOp::Equal, rev).with_prefix()
}

/// No waiter key of `name` is older than `rev`: the waiter created at `rev` is first in line.
pub(super) fn first_in_line(layout: &Layout, name: &str, rev: i64) -> Compare {
    Compare::create_revision(layout.waiters(name), CompareOp::Greater, rev - 1).with_prefix()
}

/// `key` is the key created at `rev`: it did not end (and perhaps begin again) meanwhile. A
/// renewal or a takeover keeps it (they rewrite, never re-create).
pub(super) fn same_key(key: &str, rev: i64) -> Compare {
    Compare::create_revision(key.to_owned(), CompareOp::Equal, rev)
}

/// `key` is as written at `mod_rev`: not renewed, taken over, confirmed or ended since.
pub(super) fn unchanged(key: &str, mod_rev: i64) -> Compare {
    Compare::mod_revision(key.to_owned(), CompareOp::Equal, mod_rev)
}

/// No waiter key of `name` was written after revision `rev`: the queue is the one a
/// decision saw at `rev` (or a part of it), nobody joined or moved since.
pub(super) fn queue_unchanged_since(layout: &Layout, name: &str, rev: i64) -> Compare {
    Compare::mod_revision(layout.waiters(name), CompareOp::Less, rev + 1).with_prefix()
}

/// `key` does not exist (yet).
pub(super) fn absent(key: &str) -> Compare {
    Compare::version(key.to_owned(), CompareOp::Equal, 0)
}

/// The grant of a lock at once: "the marker is as I saw it, and nobody waits".
pub(super) fn grant_at_once(layout: &Layout, name: &str, marker_rev: i64) -> [Compare; 2] {
    [
        marker_at(layout, name, marker_rev),
        nobody_waits(layout, name),
    ]
}

/// The grant of `name` to the waiter whose key is `key` (created at `rev`, written at
/// `mod_rev`): "the marker is as I saw it, my key is there and still as I saw it (no other
/// front-end took its place over), and nobody is ahead of me". Its holder key, in the
/// waiter's slot, is not there: the waiter key went in only with its slot empty
/// ([`slot_empty`]), and a holder key comes into a slot only with a grant at once (which
/// nobody waits for) or with the grant that takes the slot's waiter key out.
pub(super) fn head_grant(
    layout: &Layout,
    name: &str,
    marker_rev: i64,
    (key, rev, mod_rev): (&str, i64, i64),
) -> [Compare; 4] {
    [
        marker_at(layout, name, marker_rev),
        same_key(key, rev),
        unchanged(key, mod_rev),
        first_in_line(layout, name, rev),
    ]
}

/// No waiter or holder key of `name` is in `slot`: a new request's keys go into an empty
/// slot only (`slots.rs`), whatever this front-end thinks of it.
pub(super) fn slot_empty(layout: &Layout, name: &str, slot: &str) -> [Compare; 2] {
    [
        absent(&layout.waiter(name, slot)),
        absent(&layout.holder(name, slot)),
    ]
}

/// The write `write` of a new request's keys in `slot` on `names`, made only if the slot is
/// empty on every one of them: the slot's comparisons outside, the write's own inside, so
/// the answer says which failed ([`slot_write`]).
pub(super) fn in_empty_slot<'a>(
    layout: &Layout,
    names: impl IntoIterator<Item = &'a str>,
    slot: &str,
    write: Txn,
) -> Txn {
    in_empty_slot_then(layout, names, slot, write, [])
}

/// [`in_empty_slot`], with `then` after the write in the same transaction (reads that see
/// the name as the write left it), made only if the slot was empty.
pub(super) fn in_empty_slot_then<'a>(
    layout: &Layout,
    names: impl IntoIterator<Item = &'a str>,
    slot: &str,
    write: Txn,
    then: impl IntoIterator<Item = TxnOp>,
) -> Txn {
    let empty: Vec<Compare> = names
        .into_iter()
        .flat_map(|n| slot_empty(layout, n, slot))
        .collect();
    let ops: Vec<TxnOp> = std::iter::once(TxnOp::txn(write)).chain(then).collect();
    Txn::new().when(empty).and_then(ops)
}

/// What the answer to an [`in_empty_slot`] write says.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SlotWrite {
    /// Made.
    Done,
    /// The slot was empty, and the write's own comparisons failed.
    Refused,
    /// A key was in the slot: nothing was written.
    Taken,
}

pub(super) fn slot_write(resp: &TxnResponse) -> SlotWrite {
    if !resp.succeeded() {
        return SlotWrite::Taken;
    }
    match resp.op_responses().first() {
        Some(TxnOpResponse::Txn(inner)) if inner.succeeded() => SlotWrite::Done,
        _ => SlotWrite::Refused,
    }
}

/// The release of a holder of `name` (created at `rev`) leaves it empty: it holds alone, and
/// nobody waits. An exclusive holder holds alone by what it is, so the comparison over the
/// name's holder range is made only for shared and semaphore holders: etcd checks a range
/// comparison against every key the range held since its last compaction, and every grant's
/// holder key is new, so on a busy name it grew slower with every grant.
pub(super) fn release_empties(
    layout: &Layout,
    name: &str,
    (rev, mode): (i64, Mode),
) -> Vec<Compare> {
    let alone = (mode != Mode::Exclusive).then(|| holds_alone(layout, name, rev));
    alone
        .into_iter()
        .chain([nobody_waits(layout, name)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_shared_or_semaphore_release_compares_the_holder_range() {
        let layout = Layout::new("/p/");
        let holders = layout.holders("x");
        let on_holders = |c: &Vec<Compare>| c.iter().any(|c| c.key() == holders.as_bytes());
        let exclusive = release_empties(&layout, "x", (7, Mode::Exclusive));
        assert_eq!(exclusive.len(), 1);
        assert!(!on_holders(&exclusive));
        for mode in [Mode::Shared, Mode::Limit(3)] {
            let shared = release_empties(&layout, "x", (7, mode));
            assert_eq!(shared.len(), 2);
            assert!(on_holders(&shared), "{mode:?}");
        }
    }
}
