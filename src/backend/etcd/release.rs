//! The end of a lease (UNLOCK, expiry, a closed session, a take-back) in one write that, when
//! it can, also grants the head waiter: one wake-up in the whole cluster. The driver of
//! `end.rs`, where the core decides the write and reads its answer: this file sends it, tries
//! a clean-up again while etcd is away, and logs.

use std::time::Duration;

use super::rpc::{Compare, TxnResponse};

use crate::backend::{now, BackendError, HandOver};
use crate::locks::{EventKind, TableError, Token, UserId};

use super::delivery::take_back_at;
use super::end::{self, Ended};
use super::holders::created;
use super::mirror::HolderRecord;
use super::requests::{CLEANUP_PAUSE, CLEANUP_TRIES};
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

    /// The write that ends `holder` ([`end::end_txn`]), with the marker that says `kind`.
    pub(super) fn end_txn(
        &self,
        name: &str,
        kind: EventKind,
        holder: &HolderRecord,
        guard: Compare,
    ) -> Ended {
        let marker = self.marker(kind, holder.rev);
        let me = self.me();
        let g = self.guard();
        end::end_txn(&g, &me, name, kind, holder, guard, &marker, self.wall_ms())
    }

    /// Whether [`Cluster::end_txn`]'s write ended the holder ([`end::ended`]; then logged
    /// and counted, with the grant it made, if it made one).
    pub(super) fn ended(
        &self,
        name: &str,
        token: Token,
        kind: EventKind,
        holder: &HolderRecord,
        ended: &Ended,
        resp: &TxnResponse,
    ) -> bool {
        let answer = end::ended(
            &mut self.guard(),
            &self.fe,
            name,
            holder,
            ended,
            resp,
            now(),
        );
        let Some(answer) = answer else {
            return false;
        };
        let held = Duration::from_millis(self.wall_ms().saturating_sub(holder.value.granted_ms));
        for name in super::keys::names_of(name, &holder.value.set) {
            let (id, origin) = (&holder.value.id, holder.value.origin());
            self.ended_log(name, id, token, kind, held, &origin);
        }
        if let Some((id, granted, value)) = answer.granted {
            let waited = value.waited_ms.map(Duration::from_millis);
            self.granted_log(name, &id, granted, waited, &value.origin());
        }
        if let Some(back) = answer.back {
            // Full: the watch takes it back when it shows the grant.
            let _ = self.take_backs.try_send(back);
        }
        true
    }

    /// Takes back, one after the other, the grants [`Cluster::ended`] found made for waiters
    /// of this front-end that left.
    pub(super) async fn take_back_loop(self: std::sync::Arc<Self>) {
        let queue = self.take_backs_queue.lock().ok().and_then(|mut q| q.take());
        let Some(mut queue) = queue else {
            return std::future::pending().await;
        };
        while let Some(back) = queue.recv().await {
            self.take_back(&back.name, back.token, back.handover).await;
        }
    }

    /// Takes back a grant its client never read: ended (event `revoked`, and the next waiter
    /// granted) only if its key is still as it was when it was handed over, or as a BREAK
    /// marked that version ([`take_back_at`]). A key rewritten otherwise was confirmed to a
    /// client (a LOCK of the same id through another connection or front-end, a RENEW):
    /// taking it back would leave two clients told they hold the lock.
    ///
    /// Its holder is read again while etcd is away, as a clean-up write is tried again: a
    /// grant nobody takes back sits out its ttl.
    pub async fn take_back(&self, name: &str, token: Token, handover: HandOver) -> bool {
        let mut tries = 0;
        let mut holder = loop {
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
        let mut tried = None;
        loop {
            let at = take_back_at(&holder, handover);
            if tried == Some(at) {
                tracing::info!(
                    name,
                    token,
                    "grant kept: a client was told of it since it was handed over"
                );
                return false;
            }
            let guard = guards::unchanged(&holder.key, at);
            let ended = self.end_txn(name, EventKind::Revoked, &holder, guard);
            let Some(resp) = self.cleanup(ended.txn.clone()).await else {
                return false;
            };
            if self.ended(name, token, EventKind::Revoked, &holder, &ended, &resp) {
                return true;
            }
            // Refused: the key changed since it was read. Read again: a BREAK may have marked
            // the very version handed over, which does not keep the grant. A read that asks
            // for the version already tried ends it.
            tried = Some(at);
            holder = match self.read_holder(name, holder.rev).await {
                Ok(again) => again,
                Err(_) => return false,
            };
        }
    }
}
