//! LOCK: a grant at once, the same grant again, or a place in the queue, as the lock rules
//! decide it from the mirror (a decision that would refuse is made again on a read of the name
//! in etcd itself; a plain wait's write reads the name too, and that read decides).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{now, BackendError, HandOver, LockStart};
use crate::locks::rules::Decision;
use crate::locks::{EventKind, LockRequest, Mode, TableError};

use super::at_once::{granted_at_once, AtOnce};
use super::enqueue::{Queued, Seen};
use super::mirror::{HolderRecord, NameState};
use super::view::decide;
use super::waits::Waits;
use super::Cluster;

/// How often a LOCK whose write found the name changed decides again before it answers
/// `ERR UNAVAILABLE` (the name is changing faster than it can be decided).
const STALE_TRIES: usize = 8;

impl Cluster {
    /// LOCK: granted at once if it fits and nobody waits, else queued (unless `wait=0`).
    ///
    /// The mirror is trusted only where the write it leads to checks it (a grant at once, the
    /// same id again, a plain wait whose write reads the name too: see
    /// [`Cluster::enqueue`]). Any other answer it suggests (held, a wait that takes a place
    /// over, conflict) is made from a read of the name in etcd itself, since a mirror a few
    /// milliseconds behind would refuse a free name or queue a retry of the holder's own id
    /// behind itself.
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
        self.own_writes_seen(&req.name).await;
        let mut read: Option<NameState> = None;
        for _ in 0..STALE_TRIES {
            let plan = {
                let g = self.guard();
                // With this front-end's own grants the watch has not shown yet.
                let leases = g.mirror.holders() + g.fresh.len();
                let free = NameState::default();
                let ns = read.as_ref().or_else(|| g.mirror.name(&req.name));
                self.plan(ns.unwrap_or(&free), &req, &user, leases)
            };
            match plan {
                Ok(Plan::Fresh { marker_rev }) => {
                    if let Some(start) = self.grant_at_once(&req, &user, ttl, marker_rev).await? {
                        return Ok(start);
                    }
                }
                // The same id again: its write checks the holder is as the mirror saw it.
                Ok(Plan::Again(holder)) => {
                    if let Some(start) = self.lock_again(&req, *holder, ttl).await? {
                        return Ok(start);
                    }
                }
                // A plain wait, from the mirror: its write reads the name too, and says
                // whether the mirror was right (see `enqueue`).
                Ok(Plan::Blocked(waits)) if read.is_none() && waits_unread(&req, &waits) => {
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
                // From the mirror: make sure with etcd itself.
                _ if read.is_none() => {}
                Ok(Plan::Blocked(waits)) => {
                    let queued = self.enqueue(req.clone(), user.clone(), ttl, Seen::Read, *waits);
                    if let Queued::Started(start) = queued.await? {
                        return Ok(start);
                    }
                }
                Err(e) => return Err(e),
            }
            read = Some(self.read_name(&req.name).await?);
        }
        Err(BackendError::Unavailable(format!(
            "{}: the lock changed {STALE_TRIES} times while this LOCK was decided",
            req.name
        )))
    }

    /// What a LOCK on `ns` should do, as the lock rules decide it from this front-end.
    /// `leases`: the holders of every name (the mirror's count).
    fn plan(
        &self,
        ns: &NameState,
        req: &LockRequest,
        user: &str,
        leases: usize,
    ) -> Result<Plan, BackendError> {
        match decide(ns, &self.fe, req, user, &self.limits, leases)? {
            Decision::Grant => Ok(Plan::Fresh {
                marker_rev: ns.marker_rev,
            }),
            Decision::Again(rev) => match ns.holder_by_rev(rev) {
                Some(h) => Ok(Plan::Again(Box::new(h.clone()))),
                None => Err(TableError::NotHeld.into()),
            },
            Decision::Queue {
                place,
                replaced,
                superseded,
            } => {
                let waits = Waits::of(ns, req.supersede, place, &replaced, &superseded);
                Ok(Plan::Blocked(Box::new(waits)))
            }
        }
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

/// What a LOCK does, decided from the mirror.
enum Plan {
    /// The id already holds it: same token, new lease.
    Again(Box<HolderRecord>),
    /// Free and nobody waits: grant at once if the marker is still at this revision.
    Fresh { marker_rev: i64 },
    /// Held, or others wait: queue, where the rules said, ending whom they said.
    Blocked(Box<Waits>),
}

/// Whether a LOCK the mirror says must wait (`waits`) is queued without a read of the name
/// first (its write reads it: see [`Cluster::enqueue`]): an exclusive request of one name,
/// no `supersede`, that ends nobody (a place to take over is decided on a read, as before).
fn waits_unread(req: &LockRequest, waits: &Waits) -> bool {
    req.mode == Mode::Exclusive
        && !req.supersede
        && waits.place.is_none()
        && waits.replaced.is_empty()
}
