//! Confirming a grant: a plain lease that another front-end granted to a waiter of this one,
//! in the same write as a release, hangs on this front-end's etcd lease until this front-end
//! takes it off (so a dead front-end's waiter never keeps the lock longer than that lease),
//! and only then is its client told. How the confirmation's answer is read decides between
//! confirmed, taken over and lost.

use std::sync::Arc;

use super::rpc::{Txn, TxnOp};

use crate::backend::{BackendError, HandOver, WaitResult};
use crate::locks::WaitEnd;

use super::handover::{deliver, TakeBack};
use super::mirror::Granted;
use super::values::HolderValue;
use super::{guards, Cluster};

impl Cluster {
    /// Takes a plain lease that another front-end granted to a waiter of this one off this
    /// front-end's etcd lease, and then tells the waiter (see [`Granted::unconfirmed`]):
    /// from then on it outlives this front-end, as a plain lease does. A waiter that left
    /// meanwhile has its grant taken back instead; a grant that went before it was
    /// confirmed (this front-end's etcd lease ran out) is answered `ERR UNAVAILABLE`, one
    /// that a LOCK of the same id rewrote meanwhile (it took the grant over) `ERR REPLACED`.
    pub(super) async fn confirm(self: Arc<Self>, gr: Granted) {
        let holder = {
            let g = self.guard();
            g.mirror
                .name(&gr.name)
                .and_then(|ns| ns.holder_by_rev(gr.rev))
                .cloned()
        };
        let (resp, ours) = match holder {
            Some(h) => {
                let ours = h.value.encode();
                // What the watch tells this write by (`on_grant`).
                if let Some(l) = self.guard().waiting_mut(&gr.uid) {
                    l.phase.confirms_with(&ours);
                }
                let txn = Txn::new()
                    .when([guards::unchanged(&h.key, gr.mod_rev)])
                    .and_then([TxnOp::put(h.key.clone(), ours.clone(), None)])
                    .or_else([TxnOp::get(h.key.clone(), None)]);
                (self.cleanup(txn).await, ours)
            }
            None => (None, String::new()),
        };
        if let Some(r) = resp.as_ref().filter(|r| r.succeeded()) {
            self.wrote(&gr.name, r);
        }
        let outcome = confirmation(resp.as_ref(), gr.rev, ours.as_bytes());
        let rewritten = outcome == Confirmation::TakenOver;
        let confirmed = match outcome {
            Confirmation::Confirmed(rev) => Some(HandOver(rev)),
            Confirmation::TakenOver | Confirmation::Lost => None,
        };
        let back = {
            let mut g = self.guard();
            // Delivered (or taken back) already, from this write as the watch showed it.
            if g.confirmed_by_watch.remove(&gr.uid) {
                return;
            }
            match confirmed {
                Some(handover) if g.by_uid.contains_key(&gr.uid) || g.left.contains(&gr.uid) => {
                    deliver(&mut g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover)
                }
                // Nobody waits for it any more (the wait was lost with an etcd lease).
                Some(handover) => Some(TakeBack {
                    name: gr.name.clone(),
                    token: gr.token,
                    handover,
                }),
                None => {
                    g.left.remove(&gr.uid);
                    if let Some(waiter) = g.by_uid.remove(&gr.uid) {
                        if let Some(l) = g.waiting.remove(&waiter) {
                            let _ = l.tx.send(if rewritten {
                                WaitResult::Ended(WaitEnd::Replaced)
                            } else {
                                WaitResult::Failed(BackendError::Unavailable(
                                    "the grant could not be confirmed with etcd".into(),
                                ))
                            });
                        }
                    }
                    None
                }
            }
        };
        if let Some(back) = back {
            self.take_back(&back.name, back.token, back.handover).await;
        }
    }
}

/// What the answer to [`Cluster::confirm`]'s write says of the grant.
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
fn confirmation(resp: Option<&super::rpc::TxnResponse>, rev: i64, ours: &[u8]) -> Confirmation {
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
