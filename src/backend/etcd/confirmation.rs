//! The confirmation of a grant, as the front-end's core decides it: a plain lease that
//! another front-end granted to a waiter of this one, in the same write as a release, hangs on
//! this front-end's etcd lease until this front-end takes it off (so a dead front-end's
//! waiter never keeps the lock longer than that lease), and only then is its client told. The
//! write that takes it off, and how its answer is read: confirmed, taken over or lost. Pure;
//! `confirm.rs` is its driver.

use std::time::Instant;

use super::rpc::{Txn, TxnOp, TxnResponse};

use crate::backend::{BackendError, HandOver, WaitResult};
use crate::locks::WaitEnd;

use super::delivery::{deliver, TakeBack};
use super::mirror::Granted;
use super::values::HolderValue;
use super::{guards, ClusterState};

/// The write that takes grant `gr` off this front-end's etcd lease (its holder as shown,
/// rewritten with no lease, if unchanged since the hand-over; else a read of it), and the
/// value it writes; `None` if the mirror no longer shows the holder.
pub(super) fn confirm_write(g: &mut ClusterState, gr: &Granted) -> Option<(Txn, String)> {
    let h = g.mirror.name(&gr.name)?.holder_by_rev(gr.rev)?.clone();
    let ours = h.value.encode();
    // What the watch tells this write by (`on_grant`).
    if let Some(l) = g.waiting_mut(&gr.uid) {
        l.phase.confirms_with(&ours);
    }
    let txn = Txn::new()
        .when([guards::unchanged(&h.key, gr.mod_rev)])
        .and_then([TxnOp::put(h.key.clone(), ours.clone(), None)])
        .or_else([TxnOp::get(h.key.clone(), None)]);
    Some((txn, ours))
}

/// Steps the core with the answer to [`confirm_write`]'s write of `ours` for grant `gr`
/// (`None`: none came, however often it was sent, or there was nothing to write): the waiter
/// is told, or the grant is to be taken back (returned). A waiter that left meanwhile has its
/// grant taken back; a grant that went before it was confirmed (this front-end's etcd lease
/// ran out) is answered `ERR UNAVAILABLE`, one that a LOCK of the same id rewrote meanwhile
/// (it took the grant over) `ERR REPLACED`.
pub(super) fn confirm_answered(
    g: &mut ClusterState,
    gr: &Granted,
    resp: Option<&TxnResponse>,
    ours: &str,
    now: Instant,
) -> Option<TakeBack> {
    if let Some(r) = resp.filter(|r| r.succeeded()) {
        g.wrote(&gr.name, r.header().map_or(0, |h| h.revision()), false);
    }
    let outcome = confirmation(resp, gr.rev, ours.as_bytes());
    let rewritten = outcome == Confirmation::TakenOver;
    let confirmed = match outcome {
        Confirmation::Confirmed(rev) => Some(HandOver(rev)),
        Confirmation::TakenOver | Confirmation::Lost => None,
    };
    g.left_confirming.remove(&gr.uid);
    // Delivered (or taken back) already, from this write as the watch showed it.
    if g.confirmed_by_watch.remove(&gr.uid) {
        return None;
    }
    match confirmed {
        Some(handover) if g.by_uid.contains_key(&gr.uid) || g.left.contains(&gr.uid) => {
            deliver(g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover, now)
        }
        // Nobody waits for it any more (the wait was lost with an etcd lease).
        Some(handover) => Some(TakeBack {
            name: gr.name.clone(),
            token: gr.token,
            handover,
        }),
        None => {
            g.left.remove(&gr.uid);
            let waiter = g.by_uid.remove(&gr.uid);
            if let Some(l) = waiter.and_then(|w| g.waiting.remove(&w)) {
                let _ = l.tx.send(if rewritten {
                    WaitResult::Ended(WaitEnd::Replaced)
                } else {
                    WaitResult::Failed(BackendError::Unavailable(
                        "the grant could not be confirmed with etcd".into(),
                    ))
                });
            }
            None
        }
    }
}

/// What the answer to [`confirm_write`]'s write says of the grant.
#[derive(Debug, PartialEq)]
enum Confirmation {
    /// It hangs on no etcd lease any more, since the write at this revision.
    Confirmed(i64),
    /// A LOCK of the same id rewrote it first: that request took the grant over.
    TakenOver,
    /// It is gone (the front-end's etcd lease ran out), or etcd never answered.
    Lost,
}

/// Reads the answer to a confirmation: the rewrite of the holder created at `rev` with
/// `ours` and no etcd lease, else a read of it. The write is tried again when an answer is
/// lost, and the lost one may have been applied: then the read finds the holder exactly as
/// this confirmation writes it, which is confirmed, not taken over (taken for a takeover, the
/// client was told `ERR REPLACED` while the grant sat out its ttl).
fn confirmation(resp: Option<&TxnResponse>, rev: i64, ours: &[u8]) -> Confirmation {
    use super::rpc::TxnOpResponse;
    let Some(resp) = resp else {
        return Confirmation::Lost;
    };
    if resp.succeeded() {
        return Confirmation::Confirmed(resp.header().map_or(0, |h| h.revision()));
    }
    let found = resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(got) => got.kvs().iter().find(|kv| kv.create_revision() == rev),
        _ => None,
    });
    match found {
        Some(kv) if kv.lease() == 0 && kv.value() == ours => {
            Confirmation::Confirmed(kv.mod_revision())
        }
        // Over for its holder before it could be told (its ttl ran out into its lock-delay,
        // or it was broken): not taken over by anyone, and nothing to deliver.
        Some(kv) if HolderValue::decode(kv.value()).is_some_and(|v| v.lingering()) => {
            Confirmation::Lost
        }
        Some(_) => Confirmation::TakenOver,
        None => Confirmation::Lost,
    }
}

#[cfg(test)]
#[path = "confirm_tests.rs"]
mod tests;
