//! LOCK: a grant at once, the same grant again, or a place in the queue, as the core decides
//! it (`planning.rs`) from the mirror or a read of the name in etcd itself: this file is its
//! driver (it reads, writes, and decides again when a write found the name changed).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{now, BackendError, HandOver, LockStart};
use crate::locks::{EventKind, LockRequest};

use super::at_once::{granted_at_once, AtOnce};
use super::enqueue::{Queued, Seen};
use super::mirror::NameState;
use super::planning::{plan_lock, Asked, LockStep};
use super::Cluster;

/// How often a LOCK whose write found the name changed decides again before it answers
/// `ERR UNAVAILABLE` (the name is changing faster than it can be decided).
const STALE_TRIES: usize = 8;

impl Cluster {
    /// LOCK: granted at once if it fits and nobody waits, else queued (unless `wait=0`), each
    /// step as the core decides it ([`plan_lock`]: the mirror is trusted only where the write
    /// it leads to checks it; a plain wait's write reads the name too, see
    /// [`Cluster::enqueue`]).
    pub async fn lock(self: &Arc<Self>, mut req: LockRequest) -> Result<LockStart, BackendError> {
        // Resolved once: every record made of this request carries its own lock-delay.
        req.delay = Some(self.limits.delay(req.delay)?);
        if !req.and.is_empty() {
            return self.lock_set(req).await;
        }
        let ttl = self.limits.ttl(req.ttl)?;
        self.limits.grace(req.session())?;
        let user = self.user_name(req.user);
        // This front-end's own last write emptied the name (an UNLOCK a moment ago): try the
        // grant at once without waiting for the watch to show it; the write checks it.
        if self.emptied_by_own_write(&req.name) {
            if let Some(start) = self.grant_at_once(&req, &user, ttl, 0).await? {
                return Ok(start);
            }
        }
        // A plain wait's write checks the name as it leaves it (`enqueue`), so it need not
        // wait for the watch to show this front-end's own last write: the released client's
        // next LOCK of a busy name then goes with the next release (`footprints.rs`).
        if !matches!(self.plan_lock(&req, &user, None), LockStep::QueueUnread(_)) {
            self.own_writes_seen(&req.name).await;
        }
        let mut read: Option<NameState> = None;
        for _ in 0..STALE_TRIES {
            let step = self.plan_lock(&req, &user, read.as_ref());
            match step {
                LockStep::AtOnce { marker_rev } => {
                    if let Some(start) = self.grant_at_once(&req, &user, ttl, marker_rev).await? {
                        return Ok(start);
                    }
                }
                LockStep::Again(holder) => {
                    if let Some(start) = self.lock_again(&req, *holder, ttl).await? {
                        return Ok(start);
                    }
                }
                LockStep::QueueUnread(waits) => {
                    let queued = self.enqueue(req.clone(), user.clone(), ttl, Seen::Mirror, *waits);
                    match queued.await? {
                        Queued::Started(start) => return Ok(start),
                        Queued::Misread(ns) => {
                            read = Some(ns);
                            continue;
                        }
                        Queued::Again => {}
                    }
                }
                LockStep::Read => {}
                LockStep::QueueRead(waits) => {
                    let queued = self.enqueue(req.clone(), user.clone(), ttl, Seen::Read, *waits);
                    if let Queued::Started(start) = queued.await? {
                        return Ok(start);
                    }
                }
                LockStep::Refused(e) => return Err(e),
            }
            read = Some(self.read_name(&req.name).await?);
        }
        Err(BackendError::Unavailable(format!(
            "{}: the lock changed {STALE_TRIES} times while this LOCK was decided",
            req.name
        )))
    }

    /// What LOCK `req` does next ([`plan_lock`]), on `read` or else the mirror.
    fn plan_lock(&self, req: &LockRequest, user: &str, read: Option<&NameState>) -> LockStep {
        let asked = Asked {
            fe: &self.fe,
            limits: &self.limits,
            req,
            user,
        };
        plan_lock(&self.guard(), &asked, read)
    }

    /// The grant of a free name nobody waits for; `None` if the mirror was stale.
    async fn grant_at_once(
        self: &Arc<Self>,
        req: &LockRequest,
        user: &str,
        ttl: Duration,
        marker_rev: i64,
    ) -> Result<Option<LockStart>, BackendError> {
        let uid = self.uid();
        let value = self.holder_value(&uid, req, user, ttl);
        let lease = if req.session().is_some() {
            self.lease_id()
        } else {
            0
        };
        let slot = self.take_slot(1);
        let grant = AtOnce {
            name: req.name.to_string(),
            key: self.layout.holder(&req.name, &slot),
            uid,
            slot,
            value,
            lease,
            ttl,
        };
        let marker = self.marker(EventKind::Acquired, 0);
        let txn = grant.txn(&self.layout, marker_rev, &marker);
        // (A write whose answer was lost keeps its slot: it may have been applied.)
        let resp = match self.txn(txn).await {
            Ok(resp) => resp,
            Err(e) => {
                self.given_up(&req.name, &grant.uid);
                return Err(self.unavailable(&e));
            }
        };
        if !self.slot_written(&grant.slot, [&*req.name], &resp) {
            return Ok(None);
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        let token = granted_at_once(&mut self.guard(), grant, rev, now());
        self.granted_log(&req.name, &req.id, token, None, &req.origin);
        Ok(Some(LockStart::Granted {
            token,
            handover: HandOver(rev),
        }))
    }
}
