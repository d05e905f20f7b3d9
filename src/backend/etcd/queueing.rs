//! What every queueing write shares, one name's (`enqueue.rs`) and a set's (`set_queue.rs`):
//! the waiter's record, its entry in this front-end's tables before the write goes out, the
//! puts of its keys and of the marks of the waiters it takes out, and whether the write was
//! made.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{self, PutOptions, Txn, TxnOp};
use tokio::sync::oneshot;

use crate::backend::{now, WaitResult};
use crate::locks::rules::{self};
use crate::locks::{LockRequest, WaitEnd, WaiterId};

use super::marks::SupersededValue;
use super::values::WaiterValue;
use super::{Cluster, Local, Phase};

/// Where a new waiter's keys are: the name it is known by (a set's first), its slot, its key
/// on that name, and every name of its set (empty for one name).
pub(super) struct Place {
    pub(super) name: String,
    pub(super) slot: String,
    pub(super) key: String,
    pub(super) set: Vec<String>,
}

/// A new waiter, entered in this front-end's tables: its id there, the other end of its
/// channel, and the requests of this front-end it replaces, taken out of the tables (they
/// are answered `ERR REPLACED` whichever way the write goes: [`tell_replaced`]).
pub(super) struct Registered {
    pub(super) waiter: WaiterId,
    pub(super) rx: oneshot::Receiver<WaitResult>,
    pub(super) replaced_here: Vec<Local>,
}

impl Cluster {
    /// The record of a new waiter `uid` of `req` (by `user`, for `ttl`, on the names `set`,
    /// empty for one name): all it asked for, so that whichever front-end releases the lock
    /// can grant it in the same write, on this front-end's etcd lease, queued now.
    pub(super) fn waiter_value(
        &self,
        uid: String,
        req: &LockRequest,
        user: String,
        ttl: Duration,
        set: Vec<String>,
    ) -> WaiterValue {
        WaiterValue {
            uid,
            id: req.id.clone(),
            user,
            mode: req.mode,
            ttl_ms: ttl.as_millis() as u64,
            session_ms: req.session().map(|g| g.as_millis() as u64),
            fe: self.fe.clone(),
            conn: req.conn,
            lease: self.lease_id(),
            queued_ms: self.wall_ms(),
            peer: req.origin.peer().map(|p| p.to_string()).unwrap_or_default(),
            note: req.note.as_deref().unwrap_or_default().to_owned(),
            set,
            delay_ms: super::values::delay_ms(req),
        }
    }

    /// Enters the waiter of `req` (`uid`, its keys at `place`, its record `value`) in this
    /// front-end's tables before its write goes out: the watch may bring its grant before
    /// the write's answer. The requests of this front-end under `replaces` (the same id's
    /// older ones) leave the tables: replaced whichever way the write goes. `also`: the uid
    /// of the request whose place it takes over, under which it is known too until the
    /// write says which key it is.
    pub(super) fn register<'a>(
        &self,
        uid: String,
        place: Place,
        req: LockRequest,
        value: WaiterValue,
        replaces: impl IntoIterator<Item = &'a str>,
        also: Option<&str>,
    ) -> Registered {
        let (tx, rx) = oneshot::channel();
        let waiter: WaiterId = self
            .next_uid
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut replaced_here = Vec::new();
        let mut g = self.guard();
        for old_uid in replaces {
            if let Some(old) = g.by_uid.remove(old_uid) {
                replaced_here.extend(g.waiting.remove(&old));
            }
        }
        if let Some(also) = also {
            g.by_uid.insert(also.to_owned(), waiter);
        }
        g.by_uid.insert(uid.clone(), waiter);
        g.waiting.insert(
            waiter,
            Local {
                name: place.name,
                uid,
                slot: place.slot,
                key: place.key,
                rev: 0,
                mod_rev: 0,
                tx,
                req,
                value,
                queued: now(),
                phase: Phase::Writing,
                set: place.set,
                timer: None,
            },
        );
        Registered {
            waiter,
            rx,
            replaced_here,
        }
    }

    /// Whether a queueing write (its answer `result`) put its keys: one that takes a place
    /// over (`adopted`), if it succeeded; one into a slot of its own (`slot`, on `names`), as
    /// [`Cluster::slot_written`] says. Made, the marks it put (`marks`) are dropped.
    pub(super) fn queue_written<'a>(
        self: &Arc<Self>,
        result: &Result<rpc::TxnResponse, rpc::Error>,
        adopted: bool,
        slot: &str,
        names: impl IntoIterator<Item = &'a str> + Clone,
        marks: Vec<String>,
    ) -> bool {
        let written = match result {
            Ok(r) if adopted => r.succeeded(),
            Ok(r) => self.slot_written(slot, names, r),
            // (Its answer lost: the slot stays taken, see `slots.rs`.)
            Err(_) => false,
        };
        if written {
            self.drop_marks(marks);
        }
        written
    }

    /// Deletes the "replaced" marks `marks` a successful write put in etcd: the watch of every
    /// front-end has them now (it delivers each revision); nobody needs them kept.
    pub(super) fn drop_marks(self: &Arc<Self>, marks: Vec<String>) {
        if marks.is_empty() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let deletes: Vec<TxnOp> = marks.into_iter().map(|m| TxnOp::delete(m, None)).collect();
            me.cleanup(Txn::new().and_then(deletes)).await;
        });
    }
}

/// A request that takes over the place of an older one of its id keeps that one's time in
/// the queue (`queued_ms`), and its note (`had`) unless it brings one of its own
/// ([`rules::note_again`]).
pub(super) fn keep_place(value: &mut WaiterValue, queued_ms: u64, had: &str, req: &LockRequest) {
    value.queued_ms = queued_ms;
    let had = Some(had).filter(|n| !n.is_empty());
    let note = rules::note_again(had, req.note.as_deref()).unwrap_or_default();
    value.note = note.to_owned();
}

/// The put of a waiter's key `key` with its record: on the lease its record names, as a
/// grant to it is made on that lease (see end_txn).
pub(super) fn waiter_put(key: &str, value: &WaiterValue) -> TxnOp {
    TxnOp::put(
        key.to_owned(),
        value.encode(),
        Some(PutOptions::new().with_lease(value.lease)),
    )
}

/// The put of the mark `mark` that a waiter was taken out of the queue by a LOCK of id `by`
/// (`same_id`: its own id, so its request was replaced, not superseded), on that LOCK's
/// front-end's etcd lease `lease`.
pub(super) fn mark_put(mark: &str, by: &str, same_id: bool, lease: i64) -> TxnOp {
    let value = SupersededValue {
        by: by.to_owned(),
        same_id,
    };
    TxnOp::put(
        mark.to_owned(),
        value.encode(),
        Some(PutOptions::new().with_lease(lease)),
    )
}

/// The requests of this front-end a queueing write replaced (`replaced`) are answered
/// `ERR REPLACED`, as on one server.
pub(super) fn tell_replaced(replaced: Vec<Local>) {
    for old in replaced {
        let _ = old.tx.send(WaitResult::Ended(WaitEnd::Replaced));
    }
}
