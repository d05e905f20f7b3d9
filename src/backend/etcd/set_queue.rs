//! A waiter's keys on several names at once: a set queued on every one of its names in one
//! write (one create revision: every queue agrees on its place), taking out every key of the
//! same id's older requests in the same write; or the place of the same id's older request
//! for the very same set taken over, every key rewritten. A LOCK of one name comes here too
//! when the request it replaces is a set.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{Txn, TxnOp};

use crate::backend::{BackendError, LockStart};
use crate::locks::LockRequest;

use super::keys::names_of;
use super::queueing::{keep_place, mark_put, tell_replaced, waiter_put, Place};
use super::values::WaiterValue;
use super::waiters::settle_answered;
use super::{guards, Cluster};

/// The place of the same id's older request for the very same set, which a LOCK takes over
/// as one name's is (every key rewritten: the create revisions, and so the place in every
/// queue, stay): how a set waiter whose front-end died or was cut off keeps its place when
/// its client sends the same LOCK through another front-end.
pub(super) struct Adopt {
    uid: String,
    slot: String,
    rev: i64,
    queued_ms: u64,
    note: String,
}

impl Adopt {
    /// The place of the waiter `w`.
    pub(super) fn of(w: &super::mirror::WaiterRecord) -> Adopt {
        Adopt {
            uid: w.uid.clone(),
            slot: w.slot.clone(),
            rev: w.rev,
            queued_ms: w.value.queued_ms,
            note: w.value.note.clone(),
        }
    }
}

/// One waiter key of the same id's older request, which a new LOCK replaces.
#[derive(Clone)]
pub(super) struct OldKey {
    name: String,
    pub(super) key: String,
    uid: String,
    mod_rev: i64,
}

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
        let slot = match &adopt {
            Some(a) => a.slot.clone(),
            None => self.take_slot_avoiding(names.len(), olds.iter().map(|o| o.key.as_str())),
        };
        let set = if names.len() > 1 {
            names.to_vec()
        } else {
            Vec::new()
        };
        let first = names
            .first()
            .cloned()
            .unwrap_or_else(|| req.name.to_string());
        let mut value = self.waiter_value(uid.clone(), &req, user, ttl, set.clone());
        if let Some(old) = &adopt {
            keep_place(&mut value, old.queued_ms, &old.note, &req);
        }
        let wait = req.wait;
        let place = Place {
            key: self.layout.waiter(&first, &slot),
            name: first.clone(),
            slot: slot.clone(),
            set,
        };
        let replaces = olds.iter().map(|o| o.uid.as_str());
        let new = self.register(uid.clone(), place, req, value.clone(), replaces, None);
        let (txn, marks) = self.keys_txn(names, &slot, &value, &olds, adopt.as_ref());
        let each = || names.iter().map(String::as_str);
        let result = self.txn(txn).await;
        let written = self.queue_written(&result, adopt.is_some(), &slot, each(), marks);
        tell_replaced(new.replaced_here);
        let resp = match result {
            Ok(resp) if written => resp,
            other => {
                self.guard().unregister(new.waiter);
                return match other {
                    Err(e) => Err(self.unavailable(&e)),
                    // One of the keys to take out changed meanwhile, or the slot was not
                    // empty: decide again.
                    Ok(_) => Ok(None),
                };
            }
        };
        for name in names {
            self.wrote(name, &resp);
        }
        let at = resp.header().map_or(0, |h| h.revision());
        let (waiter, rx) = (new.waiter, new.rx);
        let still = {
            let mut g = self.guard();
            if let Some(local) = g.waiting.get_mut(&waiter) {
                local.mod_rev = at;
                local.phase.written();
                local.rev = adopt.as_ref().map_or(at, |a| a.rev);
            }
            // The place is this request's now, whatever the request it took it over from did.
            if adopt.is_some() {
                g.left.remove(&uid);
            }
            settle_answered(&mut g, waiter, at)
        };
        if still {
            self.evaluate(&first);
        }
        self.end_wait_after(waiter, wait);
        Ok(Some(LockStart::Waiting { waiter, rx }))
    }

    /// The write of [`Cluster::enqueue_keys`]: this request's key on every one of `names` (in
    /// `slot`, with `value`), and every key of `olds` out after its mark, or rewritten when
    /// it is a key of the place taken over (`adopt`); and the marks it puts.
    fn keys_txn(
        &self,
        names: &[String],
        slot: &str,
        value: &WaiterValue,
        olds: &[OldKey],
        adopt: Option<&Adopt>,
    ) -> (Txn, Vec<String>) {
        let lease = value.lease;
        // The keys whose place this request takes over (rewritten below), if any.
        let adopted: Vec<String> = match adopt {
            Some(a) => names
                .iter()
                .map(|n| self.layout.waiter(n, &a.slot))
                .collect(),
            None => Vec::new(),
        };
        let taken_over = |key: &str| adopted.iter().any(|k| k == key);
        let gone: Vec<&OldKey> = olds.iter().filter(|o| !taken_over(&o.key)).collect();
        let marks: Vec<String> = gone
            .iter()
            .map(|o| self.layout.superseded(&o.name, &o.uid))
            .collect();
        let mut ops = Vec::new();
        for (old, mark_key) in gone.iter().zip(&marks) {
            ops.push(mark_put(mark_key, &value.id, true, lease));
            ops.push(TxnOp::delete(old.key.clone(), None));
        }
        let keys: Vec<String> = names.iter().map(|n| self.layout.waiter(n, slot)).collect();
        for key in &keys {
            ops.push(waiter_put(key, value));
        }
        // Taken out only as read; taken over only while still that request's place; and a
        // key of a slot of its own only into an empty one.
        let when: Vec<_> = olds
            .iter()
            .map(|o| match adopt {
                Some(a) if taken_over(&o.key) => guards::same_key(&o.key, a.rev),
                _ => guards::unchanged(&o.key, o.mod_rev),
            })
            .collect();
        let write = Txn::new().when(when).and_then(ops);
        let each = || names.iter().map(String::as_str);
        let txn = match adopt {
            Some(_) => write,
            None => guards::in_empty_slot(&self.layout, each(), slot, write),
        };
        (txn, marks)
    }

    /// Every key of the same id's older requests `same` (waiters of `name`), each with every
    /// key of its set: what a LOCK of one name takes out when one of them is a set.
    pub(super) fn old_keys(&self, name: &str, same: &[super::mirror::WaiterRecord]) -> Vec<OldKey> {
        let mut olds: Vec<OldKey> = Vec::new();
        for w in same {
            for n in names_of(name, &w.value.set) {
                let key = self.layout.waiter(n, &w.slot);
                if olds.iter().all(|o| o.key != key) {
                    olds.push(OldKey {
                        name: n.to_owned(),
                        key,
                        uid: w.uid.clone(),
                        mod_rev: w.mod_rev,
                    });
                }
            }
        }
        olds
    }
}
