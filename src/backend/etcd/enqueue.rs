//! A queued LOCK of one name: its waiter key, written in one etcd transaction (taking over the
//! place of the same id's older request, or into a slot of its own, reading the name when the
//! mirror alone decided the wait), and what the write's answer makes of the request. A
//! `supersede` LOCK's writes are `supersede.rs`'s; what every queueing write shares, one
//! name's or a set's (`set_queue.rs`), is `queueing.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{self, Compare, Txn, TxnOp};
use tokio::sync::oneshot;

use crate::backend::{BackendError, LockStart, WaitResult};
use crate::locks::rules::{self};
use crate::locks::{LockRequest, WaiterId};

use super::mirror::{NameState, WaiterRecord};
use super::queueing::{keep_place, tell_replaced, waiter_put, Place};
use super::supersede::Writes;
use super::values::WaiterValue;
use super::waiters::settle_answered;
use super::waits::Waits;
use super::{guards, Cluster};

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
        let name_of_wait = req.name.clone();
        let mut value = self.waiter_value(uid.clone(), &req, user.clone(), ttl, Vec::new());
        // With `supersede`, the same id's older request is taken out with the rest, its
        // request answered REPLACED by its mark.
        let Waits {
            place: adopt,
            replaced: same,
            superseded,
        } = waits;
        // The older request is a set: this one takes over its place on this name, and its
        // keys on its other names go in the same write.
        if adopt.iter().chain(&same).any(|w| !w.value.set.is_empty()) {
            let all: Vec<WaiterRecord> = adopt.iter().chain(&same).cloned().collect();
            let olds = self.old_keys(&req.name, &all);
            let adopt = adopt.as_ref().map(super::set_queue::Adopt::of);
            let names = [req.name.to_string()];
            let queued = self
                .enqueue_keys(req, user, ttl, &names, olds, adopt)
                .await?;
            return Ok(queued.map_or(Queued::Again, Queued::Started));
        }
        // The write reads the name too (a plain new waiter decided from the mirror).
        let check = matches!(seen, Seen::Mirror) && adopt.is_none() && superseded.queue.is_empty();
        // Its key: the one whose place it takes over, or one in a slot of its own.
        let (slot, key) = match &adopt {
            Some(old) => (old.slot.clone(), old.key.clone()),
            None => {
                let ended = same.iter().chain(superseded.queue.iter().map(|(w, _)| w));
                let slot = self.take_slot_avoiding(1, ended.map(|w| w.key.as_str()));
                let key = self.layout.waiter(&req.name, &slot);
                (slot, key)
            }
        };
        if let Some(old) = &adopt {
            value.uid.clone_from(&old.uid);
            keep_place(&mut value, old.value.queued_ms, &old.value.note, &req);
        }
        let wait = req.wait;
        let place = Place {
            name: req.name.to_string(),
            slot: slot.clone(),
            key: key.clone(),
            set: Vec::new(),
        };
        // A request of this front-end with that id is replaced whichever way the write goes.
        // Under both uids until the write says which key it is: the watch may bring
        // its grant before the write's answer.
        let replaces = adopt.iter().chain(&same).map(|w| w.uid.as_str());
        let also = adopt.as_ref().map(|old| old.uid.as_str());
        let new = self.register(uid.clone(), place, req, value.clone(), replaces, also);
        let writes = match &adopt {
            Some(old) => Writes::last(take_over_txn(&value, old, &same)),
            None if !superseded.queue.is_empty() => {
                self.supersede_writes(&name_of_wait, &value, &slot, &key, &superseded)
            }
            None => {
                Writes::last(self.own_slot_txn(&name_of_wait, &value, (&slot, &key), &same, check))
            }
        };
        let adopted = adopt.is_some();
        let (result, written) = self
            .send_writes(writes, adopted, &slot, &name_of_wait)
            .await;
        tell_replaced(new.replaced_here);
        let pending = Pending {
            waiter: new.waiter,
            rx: new.rx,
            uid,
            adopt,
            name_of_wait,
            key,
            id: value.id,
            check,
            wait,
        };
        self.enqueued(pending, result, written)
    }

    /// The write of a new waiter into a slot of its own (`place`: the slot and its key):
    /// only into an empty one, and with the name's reads when it `check`s what the mirror
    /// decided (see [`Cluster::enqueue`]).
    fn own_slot_txn(
        &self,
        name_of_wait: &str,
        value: &WaiterValue,
        (slot, key): (&str, &str),
        same: &[WaiterRecord],
        check: bool,
    ) -> Txn {
        let write = Txn::new().and_then(key_ops(key, value, same));
        let reads = check
            .then(|| self.name_reads(name_of_wait))
            .into_iter()
            .flatten();
        guards::in_empty_slot_then(&self.layout, [name_of_wait], slot, write, reads)
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
            let when: Vec<Compare> = guard.iter().cloned().chain(checks).collect();
            let went = self.txn(Txn::new().when(when).and_then(ops)).await;
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

    /// What the answer to the queueing write of `p` (made: `written`) makes of its LOCK:
    /// `ERR UNAVAILABLE` (its write may have been made all the same), decided again, or
    /// waiting at its place, unless the name's read shows the mirror misled it.
    fn enqueued(
        self: &Arc<Self>,
        p: Pending,
        result: Result<rpc::TxnResponse, rpc::Error>,
        written: bool,
    ) -> Result<Queued, BackendError> {
        let Pending {
            waiter,
            rx,
            uid,
            adopt,
            name_of_wait,
            key,
            id,
            check,
            wait,
        } = p;
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                let mut g = self.guard();
                g.unregister(waiter);
                // Its write may have been made (the answer was lost, or it reaches etcd
                // after this front-end gave up on it): a grant to its key is taken back,
                // not left to sit out its ttl (simulator seed 1519).
                g.left.insert(uid.clone());
                if let Some(old) = &adopt {
                    g.left.insert(old.uid.clone());
                }
                return Err(self.unavailable(&e));
            }
        };
        if !written {
            // The place to take over went meanwhile, or the slot was not empty: decide again.
            self.guard().unregister(waiter);
            return Ok(Queued::Again);
        }
        self.wrote(&name_of_wait, &resp);
        let at = resp.header().map_or(0, |h| h.revision());
        let still = {
            let mut g = self.guard();
            let g = &mut *g;
            // Known by the uid it became only; the place is this request's now, whatever the
            // request it took it over from did (it may have left: its wait ran out).
            if let Some(old) = &adopt {
                g.by_uid.remove(&uid);
                g.left.remove(&old.uid);
            }
            if let Some(local) = g.waiting.get_mut(&waiter) {
                local.mod_rev = at;
                local.phase.written();
                if let Some(old) = adopt {
                    local.uid = old.uid;
                    local.rev = old.rev;
                } else {
                    local.rev = at;
                }
            }
            settle_answered(g, waiter, at)
        };
        if still && check {
            let mut ns = self
                .states_read(&resp.op_responses(), at, &[name_of_wait.to_string()])
                .pop()
                .unwrap_or_default();
            // The name as the mirror should have shown it: without this request.
            ns.queue.retain(|_, w| w.key != key);
            if self.misread(waiter, &ns) {
                tracing::debug!(
                    name = &*name_of_wait,
                    id = &*id,
                    "a wait decided on the mirror: etcd's read says otherwise; decided again on it"
                );
                // Left as a waiter whose connection went: its key out, a grant made to it
                // meanwhile taken back.
                self.abandon_wait(&name_of_wait, waiter, rx);
                return Ok(Queued::Misread(ns));
            }
        }
        if still {
            self.evaluate(&name_of_wait);
        }
        self.end_wait_after(waiter, wait);
        Ok(Queued::Started(LockStart::Waiting { waiter, rx }))
    }

    /// Whether `ns`, the name as the write of waiter `waiter` found it (without it), makes
    /// the wait the mirror decided wrong: anything but a plain place in the queue, or a free
    /// name nobody else waits for (see [`Cluster::enqueue`]).
    fn misread(&self, waiter: WaiterId, ns: &NameState) -> bool {
        let g = self.guard();
        let Some(local) = g.waiting.get(&waiter) else {
            return false;
        };
        let leases = g.mirror.holders() + g.fresh.len();
        let user = local.value.user.as_str();
        let decided = super::view::decide(ns, &self.fe, &local.req, user, &self.limits, leases);
        // A plain place at the back, ending nobody, as the mirror's decision was.
        let plain = match decided {
            Ok(rules::Decision::Grant) => true,
            Ok(rules::Decision::Queue {
                place,
                replaced,
                superseded,
            }) => place.is_none() && replaced.is_empty() && superseded.is_empty(),
            Err(_) | Ok(rules::Decision::Again(_)) => false,
        };
        !plain
    }
}

/// The write that takes the place of `old` over: its key rewritten for this request. The
/// further waiters of the id go only as seen: a slot whose key went since may hold another
/// request's key by now.
fn take_over_txn(value: &WaiterValue, old: &WaiterRecord, same: &[WaiterRecord]) -> Txn {
    Txn::new()
        .when(
            std::iter::once(guards::same_key(&old.key, old.rev))
                .chain(same.iter().map(|w| guards::same_key(&w.key, w.rev)))
                .collect::<Vec<_>>(),
        )
        .and_then(key_ops(&old.key, value, same))
}

/// This request's key put under `key`, and the further waiters of its id (`same`) out.
fn key_ops(key: &str, value: &WaiterValue, same: &[WaiterRecord]) -> Vec<TxnOp> {
    let others = || same.iter().map(|w| TxnOp::delete(w.key.clone(), None));
    std::iter::once(waiter_put(key, value))
        .chain(others())
        .collect::<Vec<_>>()
}

/// A LOCK of one name whose queueing write is out: what [`Cluster::enqueued`] reads its
/// answer with.
struct Pending {
    /// Its entry in this front-end's tables, and the other end of its channel.
    waiter: WaiterId,
    rx: oneshot::Receiver<WaitResult>,
    /// The uid it was entered under, and the older request whose place it takes over.
    uid: String,
    adopt: Option<WaiterRecord>,
    name_of_wait: Arc<str>,
    key: String,
    id: String,
    /// Whether the write read the name too (see [`Cluster::enqueue`]).
    check: bool,
    wait: Option<Duration>,
}

/// What a LOCK given to [`Cluster::enqueue`] was decided on.
pub(super) enum Seen {
    /// A read of the name in etcd itself, a moment ago.
    Read,
    /// The mirror alone: the write reads the name too.
    Mirror,
}

/// How [`Cluster::enqueue`] went.
pub(super) enum Queued {
    /// Waiting (or answered already).
    Started(LockStart),
    /// The write found the name changed (the place to take over gone, the slot not
    /// empty): decide again on a read.
    Again,
    /// The mirror missed something that changes the decision, as the write's read shows:
    /// decide again on that read (the request has left the queue).
    Misread(NameState),
}
