//! A LOCK of several names at once (`and=`): one lease over all of them, decided by
//! [`rules::decide_set`] over each name's view, and carried out in one transaction per step.
//!
//! - Granted at once: one write creates every name's holder key (one create revision: one
//!   token on every name), guarded on every name as a grant at once of one name is (its
//!   marker as seen, nobody waiting), and writes every name's marker.
//! - Queued (`set_queue.rs`): one write puts a waiter key on every name's queue (one create
//!   revision: every queue agrees on its place), taking out the same id's older request
//!   (every key of it, a set or not) in the same write, each with its mark saying it was
//!   replaced, guarded on those keys being as read. Where it waits and whom it replaces
//!   are the rules' ([`rules::SetDecision::Queue`]): at the back of every queue, or in the
//!   place of the same id's waiting set of the very same names (its keys rewritten, their
//!   create revision kept: one for the whole set still).
//! - Granted from the queue by its own front-end (`queue_head.rs`, [`rules::set_ready`]),
//!   released, renewed or ended as one lease (`release.rs`, `holders.rs`): every key of the
//!   set in each write.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{now, BackendError, HandOver, LockStart};
#[cfg(doc)]
use crate::locks::rules;
use crate::locks::{EventKind, LockRequest};

use super::mirror::NameState;
use super::planning::{plan_set, Asked, SetStep};
use super::set_at_once::{granted_set_at_once, SetAtOnce};
use super::set_queue::{Adopt, OldKey};
use super::values::set_names;
use super::Cluster;

/// How often a LOCK of a set decides again (its names changed under it) before it answers
/// `ERR UNAVAILABLE`.
const STALE_TRIES: usize = 8;

impl Cluster {
    /// LOCK of a set: granted whole at once, the same set again, or queued on every name,
    /// each step as the core decides it ([`plan_set`]: as for one name, the mirror is
    /// trusted only where the write checks it; a refusal or a place in the queue is decided
    /// again on a read of every name from etcd itself).
    pub(super) async fn lock_set(
        self: &Arc<Self>,
        req: LockRequest,
    ) -> Result<LockStart, BackendError> {
        let ttl = self.limits.ttl(req.ttl)?;
        self.limits.grace(req.session())?;
        let user = self.user_name(req.user);
        let names = set_names(&req);
        for name in &names {
            self.own_writes_seen(name).await;
        }
        let mut read: Option<Vec<NameState>> = None;
        for _ in 0..STALE_TRIES {
            let step = {
                let asked = Asked {
                    fe: &self.fe,
                    limits: &self.limits,
                    req: &req,
                    user: &user,
                };
                plan_set(&self.guard(), &asked, &names, read.as_deref())
            };
            match step {
                SetStep::AtOnce(marker_revs) => {
                    let granted = self.grant_set_at_once(&req, &user, ttl, &names, &marker_revs);
                    if let Some(start) = granted.await? {
                        return Ok(start);
                    }
                }
                SetStep::Again(holder) => {
                    if let Some(start) = self.lock_again(&req, *holder, ttl).await? {
                        return Ok(start);
                    }
                }
                SetStep::Read => {}
                SetStep::Queue { replaced, taken } => {
                    // Every key of each older request, once (a set has one on each name).
                    let mut olds: Vec<OldKey> = Vec::new();
                    for (name, same) in &replaced {
                        for old in self.old_keys(name, same) {
                            if olds.iter().all(|o| o.key != old.key) {
                                olds.push(old);
                            }
                        }
                    }
                    let adopt = taken.as_deref().map(Adopt::of);
                    let (req, user) = (req.clone(), user.clone());
                    let queued = self.enqueue_keys(req, user, ttl, &names, olds, adopt);
                    if let Some(start) = queued.await? {
                        return Ok(start);
                    }
                }
                SetStep::Refused(e) => return Err(e),
            }
            read = Some(self.read_names(&names).await?);
        }
        Err(BackendError::Unavailable(format!(
            "{}: the locks changed {STALE_TRIES} times while this LOCK was decided",
            names.join(" ")
        )))
    }

    /// The grant of a free set nobody waits for, in one write ([`SetAtOnce`]); `None` if the
    /// mirror (or the read) was stale.
    async fn grant_set_at_once(
        self: &Arc<Self>,
        req: &LockRequest,
        user: &str,
        ttl: Duration,
        names: &[String],
        marker_revs: &[i64],
    ) -> Result<Option<LockStart>, BackendError> {
        let uid = self.uid();
        let value = self.holder_value(&uid, req, user, ttl);
        let lease = if req.session().is_some() {
            self.lease_id()
        } else {
            0
        };
        let grant = SetAtOnce {
            names: names.to_vec(),
            slot: self.take_slot(names.len()),
            uid,
            value,
            lease,
            ttl,
        };
        let marker = self.marker(EventKind::Acquired, 0);
        let txn = grant.txn(&self.layout, marker_revs, &marker);
        // (A write whose answer was lost keeps its slot: it may have been applied.) Its grant,
        // if it was, is taken back unless the same LOCK sent again claims it (as one name's:
        // `Cluster::given_up`; simulator seed 130753, a set's grant that sat out its ttl).
        let resp = match self.txn(txn).await {
            Ok(resp) => resp,
            Err(e) => {
                self.given_up(&names[0], &grant.uid);
                return Err(self.unavailable(&e));
            }
        };
        if !self.slot_written(&grant.slot, grant.each(), &resp) {
            return Ok(None);
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        let token = granted_set_at_once(&mut self.guard(), &self.layout, &grant, rev, now());
        for name in names {
            self.granted_log(name, &req.id, token, None, &req.origin);
        }
        Ok(Some(LockStart::Granted {
            token,
            handover: HandOver(rev),
        }))
    }
}
