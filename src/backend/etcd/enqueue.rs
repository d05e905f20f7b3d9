//! A queued LOCK of one name, driven: the core (`queued.rs`) decides where its waiter key
//! goes, the write that puts it there (taking over the place of the same id's older
//! request, or into a slot of its own, reading the name when the mirror alone decided the
//! wait) and what the write's answer makes of the request; this file sends the write (a
//! `supersede` LOCK's in several, `supersede.rs`), reads the name from its answer, logs and
//! starts the wait's timer. What every queueing write shares, one name's or a set's
//! (`set_queue.rs`), is `queueing.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use super::rpc;
use tokio::sync::oneshot;

use crate::backend::{now, BackendError, LockStart, WaitResult};
use crate::locks::LockRequest;

use super::queued::{misread, queue, queue_answered, queue_lost, New, Outcome, Queue, Queueing};
pub(super) use super::queued::{Queued, Seen};
use super::supersede::{ahead_txn, Writes};
use super::waits::Waits;
use super::Cluster;

impl Cluster {
    /// Queues a LOCK: its waiter key, on this front-end's etcd lease, and a local entry that
    /// the watch grants when it reaches the head.
    ///
    /// Where it waits and whom it ends are the lock rules' decision (`waits`, on the name as
    /// etcd had it a moment ago, or as the mirror has it for a plain wait). The place of a
    /// waiter of the same id and user is taken over: its key is rewritten for this request,
    /// on this front-end's etcd lease, so it keeps its place (its create revision), as on one
    /// server; its old request is answered `ERR REPLACED` by its front-end. That is how a
    /// client whose front-end died or was cut off keeps its place: its key stays in etcd
    /// until that front-end's etcd lease runs out. If the key went meanwhile (granted, left),
    /// [`Queued::Again`]: the LOCK is decided again (a grant made to the old request is then
    /// this one's, by the same-id rule). Any further waiter of the id goes in the same write.
    ///
    /// Decided from the mirror alone ([`Seen::Mirror`]: a plain exclusive wait, no place to
    /// take over), the write also reads the name as it leaves it, and that read says whether
    /// the mirror was right: the hand-over of a busy name then costs etcd two transactions,
    /// not three (a read first, then the write). If the read shows what the mirror missed (the
    /// id holds or waits already, or the rules refuse the wait), the request leaves the queue
    /// again as a waiter whose connection went does (a grant made to it meanwhile is taken
    /// back), and is decided again on that read ([`Queued::Misread`]). A name found free
    /// with nobody else waiting is no misread: the request waits at the head, and this
    /// front-end grants it as soon as its watch shows the key.
    pub(super) async fn enqueue(
        self: &Arc<Self>,
        req: LockRequest,
        user: String,
        ttl: Duration,
        seen: Seen,
        waits: Waits,
    ) -> Result<Queued, BackendError> {
        let uid = self.uid();
        let value = self.waiter_value(uid.clone(), &req, user.clone(), ttl, Vec::new());
        // The older request is a set: this one takes over its place on this name, and its
        // keys on its other names go in the same write.
        if let Some(all) = super::queued::older_set(&waits) {
            let olds = self.old_keys(&req.name, &all);
            let adopt = waits.place.as_ref().map(super::set_queue::Adopt::of);
            let names = [req.name.to_string()];
            let queued = self
                .enqueue_keys(req, user, ttl, &names, olds, adopt)
                .await?;
            return Ok(queued.map_or(Queued::Again, Queued::Started));
        }
        let (wait, id) = (req.wait, req.id.clone());
        let reads = self.name_reads(&req.name);
        let (tx, rx) = oneshot::channel();
        let waiter = self.next_waiter();
        let new = New {
            waiter,
            uid,
            req,
            value,
            tx,
        };
        let Queue {
            q,
            writes,
            replaced,
        } = queue(
            &mut self.guard(),
            &self.me(),
            new,
            (waits, seen),
            reads,
            now(),
        );
        let adopted = q.adopt.is_some();
        let (result, written) = self.send_writes(writes, adopted, &q.slot, &q.name).await;
        super::queueing::tell_replaced(replaced);
        self.enqueued(Pending { q, rx, id, wait }, result, written)
            .await
    }

    /// Sends a queueing write of one name: the writes ahead first, then the last one, with
    /// this request's key. Its answer, and whether it was made.
    async fn send_writes(
        self: &Arc<Self>,
        writes: Writes,
        adopted: bool,
        slot: &str,
        name_of_wait: &str,
    ) -> (Result<rpc::TxnResponse, rpc::Error>, bool) {
        let Writes {
            ahead,
            guard,
            last: txn,
            marks,
        } = writes;
        // A write ahead whose guard fails decides again, as the last one's would (the waiters
        // it already took out stay out: their clients were told).
        let mut result = None;
        for (ops, marks, checks) in ahead {
            let went = self.txn(ahead_txn(&guard, ops, checks)).await;
            if !went.as_ref().is_ok_and(|r| r.succeeded()) {
                result = Some(went);
                break;
            }
            self.drop_marks(marks);
        }
        // Whether the write that creates its key was made (one not sent frees its slot).
        match result {
            Some(failed) => {
                if !adopted {
                    self.give_back(slot, [name_of_wait]);
                }
                (failed, false)
            }
            None => {
                let result = self.txn(txn).await;
                let written = self.queue_written(&result, adopted, slot, [name_of_wait], marks);
                (result, written)
            }
        }
    }

    /// Carries out what the answer to the queueing write of `p` (made: `written`) makes of
    /// its LOCK, as the core reads it ([`queue_answered`]): `ERR UNAVAILABLE` (its write may
    /// have been made all the same), decided again, or waiting at its place, unless the
    /// name's read shows the mirror misled it ([`misread`]).
    async fn enqueued(
        self: &Arc<Self>,
        p: Pending,
        result: Result<rpc::TxnResponse, rpc::Error>,
        written: bool,
    ) -> Result<Queued, BackendError> {
        let Pending { q, rx, id, wait } = p;
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                queue_lost(&mut self.guard(), &q);
                return Err(self.unavailable(&e));
            }
        };
        let at = resp.header().map_or(0, |h| h.revision());
        let made = written.then_some(at);
        let outcome = queue_answered(&mut self.guard(), &q, made);
        match outcome {
            Outcome::Again => return Ok(Queued::Again),
            Outcome::Waiting { evaluate } => {
                if evaluate {
                    self.evaluate(&q.name);
                }
            }
            Outcome::Check => {
                let names = [q.name.clone()];
                let ns = self.states_read(&resp.op_responses(), at, &names).pop();
                let ns = ns.unwrap_or_default();
                let misread = misread(&self.guard(), &self.me(), &self.limits, &q, ns);
                if let Some(ns) = misread {
                    tracing::debug!(
                        name = &*q.name,
                        id = &*id,
                        "a wait decided on the mirror: etcd's read says otherwise; decided again on it"
                    );
                    // Left as a waiter whose connection went (a grant made to it meanwhile
                    // taken back), its key out first.
                    if !self.leave_misread(&q.name, q.waiter, rx).await {
                        return Err(BackendError::Unavailable(
                            "etcd did not answer the withdrawal of this LOCK's first place in \
                             the queue"
                                .into(),
                        ));
                    }
                    return Ok(Queued::Misread(ns));
                }
                self.evaluate(&q.name);
            }
        }
        self.end_wait_after(q.waiter, wait);
        Ok(Queued::Started(LockStart::Waiting {
            waiter: q.waiter,
            rx,
        }))
    }
}

/// A LOCK of one name whose queueing write is out: what [`Cluster::enqueued`] reads its
/// answer with.
struct Pending {
    q: Queueing,
    /// The other end of its channel.
    rx: oneshot::Receiver<WaitResult>,
    id: String,
    wait: Option<Duration>,
}
