//! What every queueing write's driver shares, one name's (`enqueue.rs`) and a set's
//! (`set_queue.rs`): the waiter's record and its id, whether the write was made, the marks
//! it put dropped, and the requests it replaced told. Their entry in this front-end's
//! tables, and the puts of their keys and marks, are the core's (`queued.rs`,
//! `supersede.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{self, Txn, TxnOp};

use crate::backend::WaitResult;
use crate::locks::{LockRequest, WaitEnd, WaiterId};

use super::values::WaiterValue;
use super::{Cluster, Local};

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

    /// A new waiter's id in this front-end's tables, never used before.
    pub(super) fn next_waiter(&self) -> WaiterId {
        self.next_uid
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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

/// The requests of this front-end a queueing write replaced (`replaced`) are answered
/// `ERR REPLACED`, as on one server.
pub(super) fn tell_replaced(replaced: Vec<Local>) {
    for old in replaced {
        let _ = old.tx.send(WaitResult::Ended(WaitEnd::Replaced));
    }
}
