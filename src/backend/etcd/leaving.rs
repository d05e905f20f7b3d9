//! A waiter of this front-end leaving its queue, as the front-end's core decides it: its
//! `wait=` ran out (the write that takes its place out, and what etcd's answer to it says:
//! out, granted first, taken over, or gone), its connection went, or this front-end was cut
//! off from etcd for longer than its etcd lease; and the write that takes keys nobody waits
//! on out. Pure: `waiters.rs` is its driver (the timer, the sends and their retries), and
//! `leaving_tests.rs` steps it by hand.

use tokio::sync::oneshot;

use super::rpc::{Txn, TxnOp, TxnOpResponse, TxnResponse};

use crate::backend::{BackendError, HandOver, WaitResult};
use crate::locks::{Token, WaitEnd, WaiterId};

use super::delivery::key_gone;
use super::keys::Layout;
use super::{guards, ClusterState, Local};

/// Every waiter key of `local`: its own, or one per name of its set (same slot).
pub(super) fn keys_of(layout: &Layout, local: &Local) -> Vec<String> {
    if local.set.is_empty() {
        return vec![local.key.clone()];
    }
    local
        .set
        .iter()
        .map(|n| layout.waiter(n, &local.slot))
        .collect()
}

/// The wait of `waiter` is timed (`end_wait_after`): its record holds `stop`, the other end
/// of its timer's stop channel, so that the timer ends when the waiter leaves otherwise.
/// Whether it still waits (else, granted or gone already, there is nothing to time).
pub(super) fn timed(g: &mut ClusterState, waiter: WaiterId, stop: oneshot::Sender<()>) -> bool {
    match g.waiting.get_mut(&waiter) {
        Some(local) => {
            local.timer = Some(stop);
            true
        }
        None => false,
    }
}

/// The write that takes the place of a waiter whose `wait=` ran out, and what the keys it
/// leaves behind are if etcd does not answer it.
pub(super) struct Leave {
    pub(super) txn: Txn,
    pub(super) keys: Vec<String>,
    pub(super) mod_rev: i64,
}

/// Steps the core with the `wait=` of `waiter` run out: its place is taken out by one write
/// ([`leave_txn`]), unless a grant of it is being confirmed (that grant came first) or its
/// leaving is out already. Meanwhile nothing else grants or ends it: the answer decides
/// ([`left`]).
pub(super) fn leaving(g: &mut ClusterState, layout: &Layout, waiter: WaiterId) -> Option<Leave> {
    let local = g.waiting.get_mut(&waiter)?;
    if !local.phase.leave() {
        return None;
    }
    let local = &*local;
    Some(Leave {
        txn: leave_txn(layout, local),
        keys: keys_of(layout, local),
        mod_rev: local.mod_rev,
    })
}

/// The write of [`leaving`]: each waiter key of `local` out unless it changed since this
/// front-end wrote it (one guarded part per key, as [`forget_txn`]), else read; and the
/// holder key a grant to it would have made, read.
fn leave_txn(layout: &Layout, local: &Local) -> Txn {
    let parts = keys_of(layout, local)
        .into_iter()
        .map(|k| TxnOp::txn(forget_one(&k, local.mod_rev).or_else([TxnOp::get(k, None)])));
    let holder = TxnOp::get(layout.holder(&local.name, &local.slot), None);
    Txn::new().and_then(parts.chain(std::iter::once(holder)).collect::<Vec<_>>())
}

/// What the write of [`leaving`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Left {
    /// It took the waiter's place out (a set's, on at least one name: then no grant of the
    /// set can come, which takes every name at once).
    Out,
    /// The place was gone, and the grant it led to is there.
    Granted,
    /// The place was rewritten: a LOCK of the same id took it over.
    TakenOver,
    /// The place was gone, without a grant.
    Gone,
}

/// Steps the core with etcd's answer `resp` to the leaving of `waiter`, on its `tries`th
/// try. etcd orders that write and any grant: a grant made first is the waiter's (`OK`, a
/// moment after its `wait=`: that grant's answer, the watch or its confirmation delivers
/// it; the same for a LOCK of its id that took its place over); `ERR TIMEOUT` only once its
/// place is out. A place gone without a grant is told why, as the watch would say. What the
/// write found.
pub(super) fn left(g: &mut ClusterState, waiter: WaiterId, resp: &TxnResponse, tries: u32) -> Left {
    let how = match left_how(resp) {
        // Gone on a try after the first: the first one's delete, most likely.
        Left::Gone if tries > 1 => Left::Out,
        how => how,
    };
    match how {
        Left::Out => {
            if let Some(l) = g.leave(waiter) {
                let _ = l.tx.send(WaitResult::Ended(WaitEnd::TimedOut));
            }
        }
        Left::Granted | Left::TakenOver => {
            if let Some(l) = g.waiting.get_mut(&waiter) {
                l.phase.stays();
            }
        }
        Left::Gone => {
            if let Some(l) = g.waiting.remove(&waiter) {
                g.by_uid.remove(&l.uid);
                // Superseded or replaced, as far as this front-end knows yet; else its wait
                // ran out, which is true whyever the key went: the watch may not show yet
                // that another front-end's `supersede` took it (simulator seed 2944, a set's
                // LOCK told its front-end's etcd lease ran out in a run with no fault).
                let why = match key_gone(g, &l) {
                    WaitResult::Failed(_) => WaitResult::Ended(WaitEnd::TimedOut),
                    known => known,
                };
                let _ = l.tx.send(why);
            }
        }
    }
    how
}

/// Steps the core with the leaving of `waiter` unanswered (`why`: what the client is told).
/// Whether a grant came first is not known: as any LOCK whose answer was lost, the client
/// may send it again (its grant, if there is one, is then its own; else this front-end
/// takes it back once it shows). Its keys are then taken out as any clean-up is.
pub(super) fn leave_unanswered(g: &mut ClusterState, waiter: WaiterId, why: BackendError) {
    if let Some(l) = g.leave(waiter) {
        let _ = l.tx.send(WaitResult::Failed(why));
    }
}

/// Reads the answer to [`leave_txn`]: one part per key, then the holder read.
fn left_how(resp: &TxnResponse) -> Left {
    let ops = resp.op_responses();
    let Some((holder, parts)) = ops.split_last() else {
        return Left::Gone;
    };
    let parts: Vec<_> = parts
        .iter()
        .filter_map(|op| match op {
            TxnOpResponse::Txn(t) => Some(t),
            _ => None,
        })
        .collect();
    if parts.iter().any(|t| t.succeeded()) {
        return Left::Out;
    }
    let found = |op: &TxnOpResponse| matches!(op, TxnOpResponse::Get(got) if !got.kvs().is_empty());
    if found(holder) {
        Left::Granted
    } else if parts.iter().any(|t| t.op_responses().iter().any(found)) {
        Left::TakenOver
    } else {
        Left::Gone
    }
}

/// A waiting connection went away: the grant it never read on `rx`, if any, is given back
/// (its token and hand-over). The channel is closed first, so that none comes after.
pub(super) fn unread_grant(rx: &mut oneshot::Receiver<WaitResult>) -> Option<(Token, HandOver)> {
    rx.close();
    match rx.try_recv() {
        Ok(WaitResult::Granted {
            token, handover, ..
        }) => Some((token, handover)),
        _ => None,
    }
}

/// Steps the core with `waiter` gone (its connection went): out of the tables, remembered
/// as gone in case its grant is being made right now. Its keys, to take out unless they
/// changed since its write at the revision given.
pub(super) fn abandoned(
    g: &mut ClusterState,
    layout: &Layout,
    waiter: WaiterId,
) -> Option<(Vec<String>, i64)> {
    let local = g.leave(waiter)?;
    Some((keys_of(layout, &local), local.mod_rev))
}

/// Steps the core with this front-end cut off from every etcd quorum for longer than its
/// etcd lease: its waiters with nothing of theirs out leave, as a waiter whose connection
/// went does (a grant made for it meanwhile is taken back); their driver tells them
/// `ERR UNAVAILABLE`. Waiters whose own write, grant, confirmation or leaving is still out
/// are left to the answer of that request.
pub(super) fn cut_off(g: &mut ClusterState) -> Vec<Local> {
    let quiet: Vec<WaiterId> = g
        .waiting
        .iter()
        .filter(|(_, l)| l.phase.settled())
        .map(|(w, _)| *w)
        .collect();
    quiet.into_iter().filter_map(|w| g.leave(w)).collect()
}

/// The clean-up of waiter keys `keys` was answered (or given up): the first of them is no
/// longer being forgotten (`head.rs::orphans`).
pub(super) fn forgotten(g: &mut ClusterState, keys: &[String]) {
    if let Some(first) = keys.first() {
        g.forgetting.remove(first);
    }
}

/// The write that takes a waiter's keys out (each unless it changed since this front-end
/// wrote it at `mod_rev`): one transaction, each key its own guarded part, so that a key
/// taken over stays and the others still go.
pub(super) fn forget_txn(keys: &[String], mod_rev: i64) -> Txn {
    if let [key] = keys {
        return forget_one(key, mod_rev);
    }
    let parts: Vec<TxnOp> = keys
        .iter()
        .map(|k| TxnOp::txn(forget_one(k, mod_rev)))
        .collect();
    Txn::new().and_then(parts)
}

/// One waiter key out, unless it changed since this front-end wrote it at `mod_rev`.
fn forget_one(key: &str, mod_rev: i64) -> Txn {
    Txn::new()
        .when([guards::unchanged(key, mod_rev)])
        .and_then([TxnOp::delete(key.to_owned(), None)])
}
