//! The end of a lease (UNLOCK, expiry, a closed session, a take-back) in one write that, when
//! it can, also grants the head waiter: one wake-up in the whole cluster.

use std::time::Duration;

use super::rpc::{Compare, PutOptions, Txn, TxnOp};

use crate::backend::{BackendError, HandOver};
use crate::locks::{EventKind, TableError, Token, UserId};

use super::handover::deliver_own;
use super::holders::created;
use super::mirror::HolderRecord;
use super::requests::{CLEANUP_PAUSE, CLEANUP_TRIES};
use super::values::HolderValue;
use super::{guards, Cluster};

impl Cluster {
    /// UNLOCK.
    pub async fn unlock(&self, name: &str, token: Token, user: UserId) -> Result<(), BackendError> {
        let holder = self.find_holder(name, token).await?;
        self.owned_by(&holder, user)?;
        // One try: without etcd, the client hears UNAVAILABLE now and may try again.
        let ended = self.end_txn(name, EventKind::Released, &holder, created(&holder));
        let resp = self
            .txn(ended.txn.clone())
            .await
            .map_err(|e| self.unavailable(&e))?;
        if self.ended(name, token, EventKind::Released, &holder, &ended, &resp) {
            Ok(())
        } else {
            Err(TableError::NotHeld.into())
        }
    }

    /// Ends one holder with an event of `kind` (a clean-up: retried while etcd is away).
    pub(super) async fn end_holder(
        &self,
        name: &str,
        token: Token,
        kind: EventKind,
        holder: HolderRecord,
    ) -> bool {
        let ended = self.end_txn(name, kind, &holder, created(&holder));
        match self.cleanup(ended.txn.clone()).await {
            Some(resp) => self.ended(name, token, kind, &holder, &ended, &resp),
            None => false,
        }
    }

    /// The write that ends `holder`: the marker says why, in the same transaction. When it
    /// is the last holder and nobody waits, an UNLOCK removes the marker too, so a name used
    /// once leaves nothing behind. When the head waiter fits once it is gone, the same write
    /// grants it (one etcd write per hand-over, not two), if the mirror is current; if not,
    /// that branch fails and the plain end is made instead.
    ///
    /// A grant to another front-end's waiter hangs on that front-end's etcd lease (the one
    /// its waiter key hangs on), whatever kind of lease it is: if that front-end is dead,
    /// the grant goes when its etcd lease runs out, as its waiter would have, and the next
    /// waiter is granted. A plain lease's front-end takes it off its etcd lease before it
    /// tells its client (see `Cluster::confirm`). etcd checks a put's lease only on the
    /// branch taken, and a lease that ran out took the waiter key with it, which this
    /// branch compares: a dead lease never fails the write, it only fails the branch.
    pub(super) fn end_txn(
        &self,
        name: &str,
        kind: EventKind,
        holder: &HolderRecord,
        guard: Compare,
    ) -> Ended {
        if !holder.value.set.is_empty() {
            return self.end_set_txn(kind, holder, guard);
        }
        let marker = self.layout.marker(name);
        let end = |marker_op: TxnOp| vec![marker_op, TxnOp::delete(holder.key.clone(), None)];
        let with_marker = end(TxnOp::put(
            marker.clone(),
            self.marker(kind, holder.rev),
            None,
        ));
        let plain = if kind == EventKind::Released {
            let alone = std::iter::once(guard.clone())
                .chain(guards::release_empties(
                    &self.layout,
                    name,
                    (holder.rev, holder.value.mode),
                ))
                .collect::<Vec<_>>();
            let otherwise = Txn::new()
                .when([guard.clone()])
                .and_then(with_marker.clone());
            Txn::new()
                .when(alone)
                .and_then(end(TxnOp::delete(marker.clone(), None)))
                .or_else([TxnOp::txn(otherwise)])
        } else {
            Txn::new()
                .when([guard.clone()])
                .and_then(with_marker.clone())
        };
        let Some((head, marker_rev, lease)) = self.head_after(name, holder) else {
            return Ended {
                txn: plain,
                head: None,
            };
        };
        let mut value = head.value.holder(self.wall_ms());
        // (An older lockd's waiter record has no uid: its slot is its uid.)
        value.uid.clone_from(&head.uid);
        let lease = lease.map(|l| PutOptions::new().with_lease(l));
        let head_holder = self.layout.holder(name, &head.slot);
        // The holder key first: a watch that sees the waiter key go sees its slot in use.
        let mut ops = vec![
            TxnOp::put(marker.clone(), self.marker(kind, holder.rev), None),
            TxnOp::put(head_holder, value.encode(), lease),
            TxnOp::delete(head.key.clone(), None),
        ];
        ops.push(TxnOp::delete(holder.key.clone(), None));
        let txn = Txn::new()
            .when(
                // Still the holder it ends, and the head waiter's grant.
                std::iter::once(guard)
                    .chain(guards::head_grant(
                        &self.layout,
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
            head: Some((head.value.id.clone(), value)),
        }
    }

    /// [`Cluster::end_txn`] for a set: every name's key goes, and every name's marker says
    /// why, in one write (one event per name), guarded by `guard` and by each key being
    /// still this grant's. No waiter is granted in it: the head waiters' front-ends grant
    /// them (a set waiter needs every one of its names, which only its front-end looks at).
    /// An UNLOCK that leaves a name with no holder and no waiter removes its marker instead.
    ///
    /// Each name's marker is one small transaction nested in the write, first, in the set's
    /// order (see [`Cluster::ended`]): etcd counts a nested transaction's operations against
    /// what the outer one leaves of its 128, so the write stays within them for
    /// `--max-names` names.
    fn end_set_txn(&self, kind: EventKind, holder: &HolderRecord, guard: Compare) -> Ended {
        let names = &holder.value.set;
        let keys: Vec<String> = self.lease_keys(holder);
        let mut when = vec![guard];
        when.extend(keys.iter().map(|k| guards::same_key(k, holder.rev)));
        let put_marker =
            |n: &str| TxnOp::put(self.layout.marker(n), self.marker(kind, holder.rev), None);
        let marker_op = |n: &str| {
            if kind != EventKind::Released {
                return TxnOp::txn(Txn::new().and_then([put_marker(n)]));
            }
            let emptied = Txn::new()
                .when(guards::release_empties(
                    &self.layout,
                    n,
                    (holder.rev, holder.value.mode),
                ))
                .and_then([TxnOp::delete(self.layout.marker(n), None)])
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
        }
    }

    /// The head waiter of `name`, if it fits once `holder` is gone: with the marker's
    /// revision the grant depends on, and the etcd lease the grant hangs on (none for a
    /// plain lease of this front-end's own waiter).
    fn head_after(
        &self,
        name: &str,
        holder: &HolderRecord,
    ) -> Option<(super::mirror::WaiterRecord, i64, Option<i64>)> {
        let g = self.guard();
        let ns = g.mirror.name(name)?;
        let head = ns.queue.values().next()?;
        // A mirror behind may still show, as the head waiter, the very waiter whose grant is
        // now being released (its holder key takes the waiter's slot): etcd refuses a write
        // that puts and deletes one key.
        if head.slot == holder.slot {
            return None;
        }
        // A set waiter needs all its names: its own front-end grants it, in one write over
        // all of them (`queue_head.rs`).
        if !head.value.set.is_empty() {
            return None;
        }
        let ours = head.value.fe == self.fe;
        let lease = (head.value.session_ms.is_some() || !ours).then_some(head.value.lease);
        // A waiter record without its lease (written by an older lockd): its own front-end
        // grants it.
        if lease == Some(0) {
            return None;
        }
        ns.admits_without(head.value.mode, Some(holder.rev))
            .then(|| (head.clone(), ns.marker_rev, lease))
    }

    /// Whether [`Cluster::end_txn`]'s write ended the holder (then logged and counted, with
    /// the grant it made, if it made one).
    pub(super) fn ended(
        &self,
        name: &str,
        token: Token,
        kind: EventKind,
        holder: &HolderRecord,
        ended: &Ended,
        resp: &super::rpc::TxnResponse,
    ) -> bool {
        let Some(depth) = success_depth(resp) else {
            return false;
        };
        let plain = usize::from(ended.head.is_some());
        let held = Duration::from_millis(self.wall_ms().saturating_sub(holder.value.granted_ms));
        // Every name of a set ended with it.
        for (i, name) in super::keys::names_of(name, &holder.value.set)
            .into_iter()
            .enumerate()
        {
            // A release's plain write empties the name when its outer transaction succeeds;
            // a set's, each name whose own nested marker write took its first branch.
            let emptied = if holder.value.set.is_empty() {
                depth == plain
            } else {
                matches!(resp.op_responses().get(i),
                    Some(super::rpc::TxnOpResponse::Txn(t)) if t.succeeded())
            };
            self.wrote_as(name, resp, kind == EventKind::Released && emptied);
            self.ended_log(
                name,
                &holder.value.id,
                token,
                kind,
                held,
                &holder.value.origin(),
            );
        }
        if let (0, Some((id, value))) = (depth, &ended.head) {
            let rev = resp.header().map_or(0, |h| h.revision());
            let granted = {
                let mut g = self.guard();
                let granted = g.mirror.token(rev);
                if value.fe == self.fe {
                    let handover = HandOver(rev);
                    deliver_own(&mut g, &value.uid, name, granted, value.ttl_ms, handover);
                }
                granted
            };
            let waited = value.waited_ms.map(Duration::from_millis);
            self.granted_log(name, id, granted, waited, &value.origin());
        }
        true
    }

    /// Takes back a grant its client never read: ended (event `revoked`, and the next waiter
    /// granted) only if its key is still as it was when it was handed over. A key rewritten
    /// since was confirmed to a client (a LOCK of the same id through another connection or
    /// front-end, a RENEW): taking it back would leave two clients told they hold the lock.
    ///
    /// Its holder is read again while etcd is away, as a clean-up write is tried again: a
    /// grant nobody takes back sits out its ttl.
    pub async fn take_back(&self, name: &str, token: Token, handover: HandOver) -> bool {
        let mut tries = 0;
        let holder = loop {
            match self.find_holder(name, token).await {
                Ok(holder) => break holder,
                Err(BackendError::Unavailable(why)) if tries + 1 < CLEANUP_TRIES => {
                    tries += 1;
                    self.unhealthy(&why);
                    tokio::time::sleep(CLEANUP_PAUSE).await;
                }
                Err(BackendError::Unavailable(why)) => {
                    tracing::warn!(name, token, why, "grant not taken back: etcd away");
                    return false;
                }
                Err(_) => return false,
            }
        };
        let guard = guards::unchanged(&holder.key, handover.0);
        let ended = self.end_txn(name, EventKind::Revoked, &holder, guard);
        let Some(resp) = self.cleanup(ended.txn.clone()).await else {
            return false;
        };
        let taken = self.ended(name, token, EventKind::Revoked, &holder, &ended, &resp);
        if !taken {
            tracing::info!(
                name,
                token,
                "grant kept: a client was told of it since it was handed over"
            );
        }
        taken
    }
}

/// The write that ends a holder, and the head waiter it grants if its first branch succeeds.
pub(super) struct Ended {
    pub txn: Txn,
    pub head: Option<(String, HolderValue)>,
}

/// Which branch of a transaction with nested ones succeeded: 0 the outer one, 1 the one
/// nested in its else, and so on; `None`: none did.
fn success_depth(resp: &super::rpc::TxnResponse) -> Option<usize> {
    if resp.succeeded() {
        return Some(0);
    }
    resp.op_responses().iter().find_map(|op| match op {
        super::rpc::TxnOpResponse::Txn(t) => success_depth(t).map(|d| d + 1),
        _ => None,
    })
}
