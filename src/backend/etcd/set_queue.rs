//! A waiter's keys on several names at once, driven: the core (`set_queued.rs`) decides the
//! write (a set queued on every one of its names in one write, taking out every key of the
//! same id's older requests, or the place of the same id's older request for the very same
//! set taken over) and what its answer makes of the request; this file sends it and starts
//! the wait. A LOCK of one name comes here too when the request it replaces is a set.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::{now, BackendError, LockStart};
use crate::locks::LockRequest;

use super::queued::New;
use super::queueing::tell_replaced;
use super::set_queued::{queue_set, set_answered, SetQueue};
// (What `enqueue.rs` and `sets.rs` decide with.)
pub(super) use super::set_queued::{Adopt, OldKey};
use super::Cluster;

impl Cluster {
    /// Queues a LOCK on every one of `names` in one write (one waiter key per name, one
    /// create revision), taking out every key of the same id's older requests (`olds`) in
    /// the same write, each after its mark (`ERR REPLACED` for its request, through its
    /// front-end's watch). `None`: one of those keys changed meanwhile; decide again.
    ///
    /// With `adopt`, the older request's keys on `names` are rewritten for this one (their
    /// place kept) rather than taken out. A LOCK of one name comes here too when the request
    /// it replaces is a set: it takes over the set's place on its name, and the set's keys
    /// on its other names go.
    pub(super) async fn enqueue_keys(
        self: &Arc<Self>,
        req: LockRequest,
        user: String,
        ttl: Duration,
        names: &[String],
        olds: Vec<OldKey>,
        adopt: Option<Adopt>,
    ) -> Result<Option<LockStart>, BackendError> {
        let uid = adopt.as_ref().map_or_else(|| self.uid(), |a| a.uid.clone());
        let value = self.waiter_value(uid.clone(), &req, user, ttl, Vec::new());
        let wait = req.wait;
        let (tx, rx) = oneshot::channel();
        let new = New {
            waiter: self.next_waiter(),
            uid,
            req,
            value,
            tx,
        };
        let SetQueue {
            q,
            txn,
            marks,
            replaced,
        } = queue_set(
            &mut self.guard(),
            &self.layout,
            new,
            (names, &olds, adopt.as_ref()),
            now(),
        );
        let each = || names.iter().map(String::as_str);
        let result = self.txn(txn).await;
        let written = self.queue_written(&result, adopt.is_some(), &q.slot, each(), marks);
        tell_replaced(replaced);
        let made = match &result {
            Ok(resp) if written => Some(resp.header().map_or(0, |h| h.revision())),
            _ => None,
        };
        let still = set_answered(&mut self.guard(), &q, made);
        let Some(_) = made else {
            return match result {
                Err(e) => Err(self.unavailable(&e)),
                // One of the keys to take out changed meanwhile, or the slot was not empty:
                // decide again.
                Ok(_) => Ok(None),
            };
        };
        if still {
            self.evaluate(&q.first);
        }
        self.end_wait_after(q.waiter, wait);
        Ok(Some(LockStart::Waiting {
            waiter: q.waiter,
            rx,
        }))
    }

    /// Every key of the same id's older requests `same` (waiters of `name`), each with every
    /// key of its set ([`super::set_queued::old_keys`]).
    pub(super) fn old_keys(&self, name: &str, same: &[super::mirror::WaiterRecord]) -> Vec<OldKey> {
        super::set_queued::old_keys(&self.layout, name, same)
    }
}
