//! A queued LOCK of one name, as the front-end's core decides it: where its key goes (the
//! place of the same id's older request taken over, or a slot of its own), the write that
//! puts it there (the further waiters of its id out in the same write, or the queue a
//! `supersede` LOCK ends: `supersede.rs`), its entry in this front-end's tables while that
//! write is out, and what the write's answer makes of the request: waiting, decided again,
//! or misled by the mirror (decided again on the write's own read of the name). Pure:
//! `enqueue.rs` is its driver (`set_queue.rs` enters a set's waiter through [`register`]
//! too), and `queued_tests.rs` steps it by hand.

use std::time::Instant;

use tokio::sync::oneshot;

use super::rpc::{Txn, TxnOp};

use crate::backend::{LockStart, WaitResult};
use crate::locks::rules::{self};
use crate::locks::{Limits, LockRequest, WaiterId};

use super::delivery::key_gone;
use super::head::Me;
use super::mirror::{NameState, WaiterRecord};
use super::supersede::{supersede_writes, waiter_put, Writes};
use super::values::WaiterValue;
use super::waits::Waits;
use super::{guards, ClusterState, Local, Phase};

/// What a queued LOCK of one name was decided on.
pub(super) enum Seen {
    /// A read of the name in etcd itself, a moment ago.
    Read,
    /// The mirror alone: the write reads the name too.
    Mirror,
}

/// How a queued LOCK of one name went (`Cluster::enqueue`).
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

/// Where a new waiter's keys are: the name it is known by (a set's first), its slot, its key
/// on that name, and every name of its set (empty for one name).
pub(super) struct Place {
    pub(super) name: String,
    pub(super) slot: String,
    pub(super) key: String,
    pub(super) set: Vec<String>,
}

/// A new waiter of this front-end, to enter in its tables ([`register`]): its id there, its
/// uid, its request and record, and the end of its channel.
pub(super) struct New {
    pub(super) waiter: WaiterId,
    pub(super) uid: String,
    pub(super) req: LockRequest,
    pub(super) value: WaiterValue,
    pub(super) tx: oneshot::Sender<WaitResult>,
}

/// Enters waiter `e`, its keys at `place`, in this front-end's tables, as `Writing`, before
/// its write goes out:
/// the watch may bring its grant before the write's answer. The requests of this front-end
/// under `replaces` (the same id's older ones) leave the tables, and are returned: replaced
/// whichever way the write goes. `also`: the uid of the request whose place it takes over,
/// under which it is known too until the write says which key it is. `now`: when it queued.
pub(super) fn register<'a>(
    g: &mut ClusterState,
    e: New,
    place: Place,
    replaces: impl IntoIterator<Item = &'a str>,
    also: Option<&str>,
    now: Instant,
) -> Vec<Local> {
    let mut replaced = Vec::new();
    for old_uid in replaces {
        if let Some(old) = g.by_uid.remove(old_uid) {
            replaced.extend(g.waiting.remove(&old));
        }
    }
    if let Some(also) = also {
        g.by_uid.insert(also.to_owned(), e.waiter);
    }
    g.by_uid.insert(e.uid.clone(), e.waiter);
    g.waiting.insert(
        e.waiter,
        Local {
            name: place.name,
            uid: e.uid,
            slot: place.slot,
            key: place.key,
            rev: 0,
            mod_rev: 0,
            tx: e.tx,
            req: e.req,
            value: e.value,
            queued: now,
            phase: Phase::Writing,
            set: place.set,
            timer: None,
        },
    );
    replaced
}

/// The same id's older requests a LOCK of one name ends (`waits`), when one of them is a
/// set: then the LOCK is queued as a set's is (`set_queue.rs`), taking over its place on
/// this name, its keys on its other names out in the same write.
pub(super) fn older_set(waits: &Waits) -> Option<Vec<WaiterRecord>> {
    let mut olds = waits.place.iter().chain(&waits.replaced);
    olds.any(|w| !w.value.set.is_empty())
        .then(|| waits.place.iter().chain(&waits.replaced).cloned().collect())
}

/// A queued LOCK of one name whose write is out: what its answer is read with.
pub(super) struct Queueing {
    /// Its entry in this front-end's tables, and the uid it was entered under.
    pub(super) waiter: WaiterId,
    pub(super) uid: String,
    /// The same id's older request whose place it takes over, if any.
    pub(super) adopt: Option<WaiterRecord>,
    pub(super) name: String,
    pub(super) slot: String,
    pub(super) key: String,
    /// Whether the write reads the name too (a plain wait decided from the mirror).
    pub(super) check: bool,
}

/// A queued LOCK of one name, entered and its write made ([`queue`]).
pub(super) struct Queue {
    pub(super) q: Queueing,
    pub(super) writes: Writes,
    /// The requests of this front-end it replaces, out of the tables: told `ERR REPLACED`
    /// whichever way the write goes.
    pub(super) replaced: Vec<Local>,
}

/// Steps the core with a LOCK of one name the lock rules queued (`waits`, decided on
/// `seen`), as `e`, at `now`. Its key goes in the
/// place of the same id's older request, rewritten for it, so it keeps that place (its
/// create revision), as on one server; or else in a slot of its own. A plain wait decided
/// from the mirror alone also reads the name as its write leaves it (`reads`: the name's
/// reads), which says whether the mirror was right ([`misread`]).
pub(super) fn queue(
    g: &mut ClusterState,
    me: &Me<'_>,
    mut e: New,
    (waits, seen): (Waits, Seen),
    reads: [TxnOp; 3],
    now: Instant,
) -> Queue {
    let Waits {
        place: adopt,
        replaced: same,
        superseded,
    } = waits;
    let check = matches!(seen, Seen::Mirror) && adopt.is_none() && superseded.queue.is_empty();
    let name = e.req.name.to_string();
    let (slot, key) = match &adopt {
        Some(old) => (old.slot.clone(), old.key.clone()),
        None => {
            // Not one this write deletes a key in (simulator seed 201).
            let ended = same.iter().chain(superseded.queue.iter().map(|(w, _)| w));
            let slot = g.slots.take_clear_of(1, ended.map(|w| w.key.as_str()));
            let key = me.layout.waiter(&name, &slot);
            (slot, key)
        }
    };
    if let Some(old) = &adopt {
        e.value.uid.clone_from(&old.uid);
        keep_place(&mut e.value, old.value.queued_ms, &old.value.note, &e.req);
    }
    let place = Place {
        name: name.clone(),
        slot: slot.clone(),
        key: key.clone(),
        set: Vec::new(),
    };
    let writes = match &adopt {
        Some(old) => Writes::last(take_over_txn(&e.value, old, &same)),
        None if !superseded.queue.is_empty() => {
            supersede_writes(me.layout, &name, &e.value, (&slot, &key), &superseded)
        }
        None => {
            let write = Txn::new().and_then(key_ops(&key, &e.value, &same));
            let reads = check.then_some(reads).into_iter().flatten();
            let txn = guards::in_empty_slot_then(me.layout, [name.as_str()], &slot, write, reads);
            Writes::last(txn)
        }
    };
    let (waiter, uid) = (e.waiter, e.uid.clone());
    // A request of this front-end with that id is replaced whichever way the write goes.
    // Under both uids until the write says which key it is: the watch may bring its grant
    // before the write's answer.
    let replaces = adopt.iter().chain(&same).map(|w| w.uid.as_str());
    let also = adopt.as_ref().map(|old| old.uid.as_str());
    let replaced = register(g, e, place, replaces, also, now);
    Queue {
        q: Queueing {
            waiter,
            uid,
            adopt,
            name,
            slot,
            key,
            check,
        },
        writes,
        replaced,
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

/// The write of `q` was not answered (its outcome is not known): it leaves the tables, and
/// as its write may have been made (the answer was lost, or it reaches etcd after this
/// front-end gave up on it), a grant to its key is taken back, not left to sit out its ttl
/// (simulator seed 1519). The client is told `ERR UNAVAILABLE`.
pub(super) fn queue_lost(g: &mut ClusterState, q: &Queueing) {
    g.unregister(q.waiter);
    g.left.insert(q.uid.clone());
    if let Some(old) = &q.adopt {
        g.left.insert(old.uid.clone());
    }
}

/// What the answer to a queued LOCK's write makes of it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Its key was not written (the place to take over went meanwhile, or the slot was not
    /// empty): decided again.
    Again,
    /// Waiting at its place (or answered already); `evaluate`: the name's head is looked at
    /// now (it still waits: its write may have made it the head).
    Waiting { evaluate: bool },
    /// Still waiting, if the name as its write read it agrees with the mirror ([`misread`]).
    Check,
}

/// Steps the core with the answer to `q`'s write: `made` at revision `at`, or not made
/// (`None`).
pub(super) fn queue_answered(g: &mut ClusterState, q: &Queueing, made: Option<i64>) -> Outcome {
    let Some(at) = made else {
        g.unregister(q.waiter);
        return Outcome::Again;
    };
    g.wrote(&q.name, at, false);
    // Known by the uid it became only; the place is this request's now, whatever the
    // request it took it over from did (it may have left: its wait ran out).
    if let Some(old) = &q.adopt {
        g.by_uid.remove(&q.uid);
        g.left.remove(&old.uid);
    }
    if let Some(local) = g.waiting.get_mut(&q.waiter) {
        local.mod_rev = at;
        local.phase.written();
        if let Some(old) = &q.adopt {
            local.uid.clone_from(&old.uid);
            local.rev = old.rev;
        } else {
            local.rev = at;
        }
    }
    let still = settle_answered(g, q.waiter, at);
    match (still, q.check) {
        (true, true) => Outcome::Check,
        (still, _) => Outcome::Waiting { evaluate: still },
    }
}

/// Whether `ns`, the name as the write of `q` read it (with `q`'s own key), makes the wait
/// the mirror decided wrong: anything but a plain place at the back, ending nobody, or a
/// free name nobody else waits for. Then the name as the mirror should have shown it
/// (without `q`), on which the LOCK is decided again: it leaves the queue as a waiter whose
/// connection went does (a grant made to it meanwhile is taken back).
pub(super) fn misread(
    g: &ClusterState,
    me: &Me<'_>,
    limits: &Limits,
    q: &Queueing,
    mut ns: NameState,
) -> Option<NameState> {
    ns.queue.retain(|_, w| w.key != q.key);
    let local = g.waiting.get(&q.waiter)?;
    let leases = g.mirror.holders() + g.fresh.len();
    let user = local.value.user.as_str();
    let decided = super::view::decide(&ns, me.fe, &local.req, user, limits, leases);
    let plain = match decided {
        Ok(rules::Decision::Grant) => true,
        Ok(rules::Decision::Queue {
            place,
            replaced,
            superseded,
        }) => place.is_none() && replaced.is_empty() && superseded.is_empty(),
        Err(_) | Ok(rules::Decision::Again(_)) => false,
    };
    (!plain).then_some(ns)
}

/// A waiter's own write was answered at revision `at`. The watch leaves a waiter alone until
/// then, so if the mirror is past `at` and its key is no longer there as written, it is told
/// now. Whether it still waits.
pub(super) fn settle_answered(g: &mut ClusterState, waiter: WaiterId, at: i64) -> bool {
    let Some(local) = g.waiting.get(&waiter) else {
        return false;
    };
    // Granted already, by another front-end's release: its grant is being confirmed.
    if !local.phase.settled() {
        return false;
    }
    let there = g
        .mirror
        .name(&local.name)
        .is_some_and(|ns| ns.queue.get(&local.rev).is_some_and(|w| w.mod_rev == at));
    if g.mirror.rev < at || there {
        return true;
    }
    if let Some(l) = g.waiting.remove(&waiter) {
        g.by_uid.remove(&l.uid);
        let why = key_gone(g, &l);
        let _ = l.tx.send(why);
    }
    false
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
