//! The end of a lease, as the front-end's core decides it: the one write that ends a holder
//! (UNLOCK, expiry, BREAK, a take-back) and, when it can, grants the head waiter in the same
//! write (one wake-up in the whole cluster), and what that write's answer means. Pure: the
//! state, the marker to write and the wall clock come in, the transaction and the outcome go
//! out; `release.rs` is its driver (it sends, retries, logs), and `end_tests.rs` steps it
//! by hand.

use std::time::Instant;

use super::rpc::{Compare, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use crate::backend::HandOver;
use crate::locks::{EventKind, Mode, Token};

use super::delivery::{deliver_own, TakeBack};
use super::head::Me;
use super::keys::{names_of, Layout};
use super::mirror::{HolderRecord, Mirror, WaiterRecord};
use super::values::HolderValue;
use super::{guards, ClusterState};

/// The write that ends a holder, and the head waiter it grants if its first branch succeeds.
pub(super) struct Ended {
    pub txn: Txn,
    /// The head waiter the same write grants, if it fits: its id, its slot and its record.
    pub head: Option<(String, String, HolderValue)>,
    /// Why it ends.
    pub kind: EventKind,
}

/// What an end's answer says, when the write ended the holder.
pub(super) struct EndAnswer {
    /// The grant the same write made: the head waiter's id, its token and its record.
    pub granted: Option<(String, Token, HolderValue)>,
    /// That grant, to take back now: its waiter, of this front-end, left (`deliver_own`).
    pub back: Option<TakeBack>,
}

/// The write that ends `holder` of `name` (`kind`: why, which `marker` says in the same
/// transaction; `guard`: that it is still the holder to end). When it is the last holder and
/// nobody waits, an UNLOCK removes the marker too, so a name used once leaves nothing behind.
/// When the head waiter fits once it is gone, the same write grants it (one etcd write per
/// hand-over, not two), if the mirror is current; if not, that branch fails and the plain end
/// is made instead. `wall_ms`: this front-end's wall clock, which a grant's deadline is in.
///
/// A grant to another front-end's waiter hangs on that front-end's etcd lease (the one its
/// waiter key hangs on), whatever kind of lease it is: if that front-end is dead, the grant
/// goes when its etcd lease runs out, as its waiter would have, and the next waiter is
/// granted. A plain lease's front-end takes it off its etcd lease before it tells its client
/// (see `Cluster::confirm`). etcd checks a put's lease only on the branch taken, and a lease
/// that ran out took the waiter key with it, which this branch compares: a dead lease never
/// fails the write, it only fails the branch.
#[allow(clippy::too_many_arguments)]
pub(super) fn end_txn(
    g: &ClusterState,
    me: &Me<'_>,
    name: &str,
    kind: EventKind,
    holder: &HolderRecord,
    guard: Compare,
    marker: &str,
    wall_ms: u64,
) -> Ended {
    if !holder.value.set.is_empty() {
        return end_set_txn(me.layout, kind, holder, guard, marker);
    }
    let layout = me.layout;
    let marker_key = layout.marker(name);
    let end = |marker_op: TxnOp| vec![marker_op, TxnOp::delete(holder.key.clone(), None)];
    let with_marker = end(TxnOp::put(marker_key.clone(), marker.to_owned(), None));
    let plain = if kind == EventKind::Released {
        let alone = std::iter::once(guard.clone())
            .chain(guards::release_empties(
                layout,
                name,
                (holder.rev, holder.value.mode),
            ))
            .collect::<Vec<_>>();
        let otherwise = Txn::new()
            .when([guard.clone()])
            .and_then(with_marker.clone());
        Txn::new()
            .when(alone)
            .and_then(end(TxnOp::delete(marker_key.clone(), None)))
            .or_else([TxnOp::txn(otherwise)])
    } else {
        Txn::new()
            .when([guard.clone()])
            .and_then(with_marker.clone())
    };
    let Some((head, marker_rev, lease)) = head_after(&g.mirror, me.fe, name, holder) else {
        return Ended {
            txn: plain,
            head: None,
            kind,
        };
    };
    let mut value = head.value.holder(wall_ms);
    // (An older lockd's waiter record has no uid: its slot is its uid.)
    value.uid.clone_from(&head.uid);
    let lease = lease.map(|l| PutOptions::new().with_lease(l));
    let head_holder = layout.holder(name, &head.slot);
    // The holder key first: a watch that sees the waiter key go sees its slot in use.
    let ops = vec![
        TxnOp::put(marker_key, marker.to_owned(), None),
        TxnOp::put(head_holder, value.encode(), lease),
        TxnOp::delete(head.key.clone(), None),
        TxnOp::delete(holder.key.clone(), None),
    ];
    let txn = Txn::new()
        .when(
            // Still the holder it ends, and the head waiter's grant.
            std::iter::once(guard)
                .chain(guards::head_grant(
                    layout,
                    name,
                    marker_rev,
                    (&head.key, head.rev, head.mod_rev),
                ))
                .collect::<Vec<_>>(),
        )
        .and_then(ops)
        .or_else([TxnOp::txn(plain)]);
    Ended {
        txn,
        head: Some((head.value.id.clone(), head.slot.clone(), value)),
        kind,
    }
}

/// [`end_txn`] for a set: every name's key goes, and every name's marker says why, in one
/// write (one event per name), guarded by `guard` and by each key being still this grant's.
/// No waiter is granted in it: the head waiters' front-ends grant them (a set waiter needs
/// every one of its names, which only its front-end looks at). An UNLOCK that leaves a name
/// with no holder and no waiter removes its marker instead.
///
/// Each name's marker is one small transaction nested in the write, first, in the set's
/// order (see [`ended`]): etcd counts a nested transaction's operations against what the
/// outer one leaves of its 128, so the write stays within them for `--max-names` names.
fn end_set_txn(
    layout: &Layout,
    kind: EventKind,
    holder: &HolderRecord,
    guard: Compare,
    marker: &str,
) -> Ended {
    let names = &holder.value.set;
    let keys: Vec<String> = lease_keys(layout, holder);
    let mut when = vec![guard];
    when.extend(keys.iter().map(|k| guards::same_key(k, holder.rev)));
    let put_marker = |n: &str| TxnOp::put(layout.marker(n), marker.to_owned(), None);
    let marker_op = |n: &str| {
        if kind != EventKind::Released {
            return TxnOp::txn(Txn::new().and_then([put_marker(n)]));
        }
        let emptied = Txn::new()
            .when(guards::release_empties(
                layout,
                n,
                (holder.rev, holder.value.mode),
            ))
            .and_then([TxnOp::delete(layout.marker(n), None)])
            .or_else([put_marker(n)]);
        TxnOp::txn(emptied)
    };
    let ops: Vec<TxnOp> = names
        .iter()
        .map(|n| marker_op(n))
        .chain(keys.iter().map(|k| TxnOp::delete(k.clone(), None)))
        .collect();
    Ended {
        txn: Txn::new().when(when).and_then(ops),
        head: None,
        kind,
    }
}

/// The keys of the lease `holder` is one of: its own, or one per name of its set.
pub(super) fn lease_keys(layout: &Layout, holder: &HolderRecord) -> Vec<String> {
    if holder.value.set.is_empty() {
        return vec![holder.key.clone()];
    }
    holder
        .value
        .set
        .iter()
        .map(|n| layout.holder(n, &holder.slot))
        .collect()
}

/// The head waiter of `name`, if it fits once `holder` is gone: with the marker's revision
/// the grant depends on, and the etcd lease the grant hangs on (none for a plain lease of
/// this front-end's (`fe`'s) own waiter).
fn head_after(
    mirror: &Mirror,
    fe: &str,
    name: &str,
    holder: &HolderRecord,
) -> Option<(WaiterRecord, i64, Option<i64>)> {
    let ns = mirror.name(name)?;
    let head = ns.queue.values().next()?;
    // A mirror behind may still show, as the head waiter, the very waiter whose grant is now
    // being released (its holder key takes the waiter's slot): etcd refuses a write that puts
    // and deletes one key.
    if head.slot == holder.slot {
        return None;
    }
    // A set waiter needs all its names: its own front-end grants it, in one write over all
    // of them (`head.rs`).
    if !head.value.set.is_empty() {
        return None;
    }
    let ours = head.value.fe == fe;
    let lease = (head.value.session_ms.is_some() || !ours).then_some(head.value.lease);
    // A waiter record without its lease (written by an older lockd): its own front-end
    // grants it.
    if lease == Some(0) {
        return None;
    }
    ns.admits_without(head.value.mode, Some(holder.rev))
        .then(|| (head.clone(), ns.marker_rev, lease))
}

/// Steps the core with the answer `resp` to [`end_txn`]'s write `ended` of `holder` of
/// `name`: `None` if it did not end the holder; else what it wrote is remembered, and a grant
/// it made to a waiter of this front-end (`fe`) is delivered from the answer (`deliver_own`).
pub(super) fn ended(
    g: &mut ClusterState,
    fe: &str,
    name: &str,
    holder: &HolderRecord,
    ended: &Ended,
    resp: &TxnResponse,
    now: Instant,
) -> Option<EndAnswer> {
    let kind = ended.kind;
    let depth = success_depth(resp)?;
    let plain = usize::from(ended.head.is_some());
    let rev = resp.header().map_or(0, |h| h.revision());
    // Every name of a set ended with it.
    for (i, name) in names_of(name, &holder.value.set).into_iter().enumerate() {
        // A release's plain write empties the name when its outer transaction succeeds; a
        // set's, each name whose own nested marker write took its first branch.
        let emptied = if holder.value.set.is_empty() {
            depth == plain
        } else {
            matches!(resp.op_responses().get(i), Some(TxnOpResponse::Txn(t)) if t.succeeded())
        };
        g.wrote(
            name,
            rev,
            kind == EventKind::Released && emptied && alone_as_known(g, name, holder, rev),
        );
    }
    let mut back = None;
    let granted = match (depth, &ended.head) {
        (0, Some((id, slot, value))) => {
            let token = g.mirror.token(rev, slot);
            if value.fe == fe {
                let handover = HandOver(rev);
                back = deliver_own(g, &value.uid, name, token, value.ttl_ms, handover, now);
            }
            Some((id.clone(), token, value.clone()))
        }
        _ => None,
    };
    Some(EndAnswer { granted, back })
}

/// Whether this front-end knew of no holder of `name` but `holder`, whose release is the
/// write at revision `rev`. A shared or semaphore release that found the name empty in etcd
/// while the mirror shows others says their keys went unseen: with their front-end's etcd
/// lease, maybe, and then a lock-delay may keep the name held, which only the watch's news
/// of that key's end starts. The name is then not taken as emptied by this write (no grant at
/// once before the watch caught up; simulator, a semaphore's session lease with a delay whose
/// front-end died). The same if the mirror is behind the write: a holder may have come and
/// gone with its etcd lease without the mirror ever showing it (simulator seed 211709). An
/// exclusive holder held alone by what it is: nobody came or went while it held.
fn alone_as_known(g: &ClusterState, name: &str, holder: &HolderRecord, rev: i64) -> bool {
    let nothing_unseen = holder.value.mode == Mode::Exclusive || g.mirror.rev + 1 >= rev;
    nothing_unseen
        && g.mirror
            .name(name)
            .is_none_or(|ns| ns.holders.keys().all(|rev| *rev == holder.rev))
}

/// Which branch of a transaction with nested ones succeeded: 0 the outer one, 1 the one
/// nested in its else, and so on; `None`: none did.
fn success_depth(resp: &TxnResponse) -> Option<usize> {
    if resp.succeeded() {
        return Some(0);
    }
    resp.op_responses().iter().find_map(|op| match op {
        TxnOpResponse::Txn(t) => success_depth(t).map(|d| d + 1),
        _ => None,
    })
}
