//! A waiter's keys on several names at once, as the front-end's core decides it: a set
//! queued on every one of its names in one write (one create revision: every queue agrees
//! on its place), taking out every key of the same id's older requests in the same write; or
//! the place of the same id's older request for the very same set taken over, every key
//! rewritten; and what the write's answer makes of the request. A LOCK of one name comes
//! here too when the request it replaces is a set. Pure: `set_queue.rs` is its driver, and
//! `set_queued_tests.rs` steps it by hand.

use std::time::Instant;

use super::rpc::{Txn, TxnOp};

use crate::locks::WaiterId;

use super::keys::{names_of, Layout};
use super::mirror::WaiterRecord;
use super::queued::{keep_place, register, settle_answered, New, Place};
use super::supersede::{mark_put, waiter_put};
use super::values::WaiterValue;
use super::{guards, ClusterState, Local};

/// The place of the same id's older request for the very same set, which a LOCK takes over
/// as one name's is (every key rewritten: the create revisions, and so the place in every
/// queue, stay): how a set waiter whose front-end died or was cut off keeps its place when
/// its client sends the same LOCK through another front-end.
pub(super) struct Adopt {
    pub(super) uid: String,
    slot: String,
    rev: i64,
    queued_ms: u64,
    note: String,
}

impl Adopt {
    /// The place of the waiter `w`.
    pub(super) fn of(w: &WaiterRecord) -> Adopt {
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

/// Every key of the same id's older requests `same` (waiters of `name`), each with every
/// key of its set: what a LOCK of one name takes out when one of them is a set.
pub(super) fn old_keys(layout: &Layout, name: &str, same: &[WaiterRecord]) -> Vec<OldKey> {
    let mut olds: Vec<OldKey> = Vec::new();
    for w in same {
        for n in names_of(name, &w.value.set) {
            let key = layout.waiter(n, &w.slot);
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

/// A set's LOCK whose write is out: what its answer is read with.
pub(super) struct SetQueueing {
    pub(super) waiter: WaiterId,
    /// Its names, the one it is known by (the first), and its slot.
    pub(super) names: Vec<String>,
    pub(super) first: String,
    pub(super) slot: String,
    /// The uid of the place taken over, if one is.
    pub(super) adopted: Option<String>,
    pub(super) rev: Option<i64>,
}

/// A set's LOCK, entered and its write made ([`queue_set`]).
pub(super) struct SetQueue {
    pub(super) q: SetQueueing,
    pub(super) txn: Txn,
    /// The marks the write puts, dropped once it is made.
    pub(super) marks: Vec<String>,
    /// The requests of this front-end it replaces, out of the tables.
    pub(super) replaced: Vec<Local>,
}

/// Steps the core with a LOCK (`e`, its record without its names yet) queued on every one
/// of `names` at `now`, taking out every key of `olds` in the same write, each after its
/// mark (`ERR REPLACED` for its request, through its front-end's watch). With `adopt`, the
/// older request's keys on `names` are rewritten for this one (their place kept) rather
/// than taken out; else its keys go in a slot of its own, taken here.
pub(super) fn queue_set(
    g: &mut ClusterState,
    layout: &Layout,
    mut e: New,
    (names, olds, adopt): (&[String], &[OldKey], Option<&Adopt>),
    now: Instant,
) -> SetQueue {
    let slot = match adopt {
        Some(a) => a.slot.clone(),
        None => g
            .slots
            .take_clear_of(names.len(), olds.iter().map(|o| o.key.as_str())),
    };
    let set = if names.len() > 1 {
        names.to_vec()
    } else {
        Vec::new()
    };
    let first = names
        .first()
        .cloned()
        .unwrap_or_else(|| e.req.name.to_string());
    e.value.set.clone_from(&set);
    if let Some(old) = adopt {
        keep_place(&mut e.value, old.queued_ms, &old.note, &e.req);
    }
    let place = Place {
        key: layout.waiter(&first, &slot),
        name: first.clone(),
        slot: slot.clone(),
        set,
    };
    let (txn, marks) = keys_txn(layout, names, &slot, &e.value, olds, adopt);
    let waiter = e.waiter;
    let replaces = olds.iter().map(|o| o.uid.as_str());
    let replaced = register(g, e, place, replaces, None, now);
    SetQueue {
        q: SetQueueing {
            waiter,
            names: names.to_vec(),
            first,
            slot,
            adopted: adopt.map(|a| a.uid.clone()),
            rev: adopt.map(|a| a.rev),
        },
        txn,
        marks,
        replaced,
    }
}

/// The write of [`queue_set`]: this request's key on every one of `names` (in `slot`, with
/// `value`), and every key of `olds` out after its mark, or rewritten when it is a key of
/// the place taken over (`adopt`); and the marks it puts.
fn keys_txn(
    layout: &Layout,
    names: &[String],
    slot: &str,
    value: &WaiterValue,
    olds: &[OldKey],
    adopt: Option<&Adopt>,
) -> (Txn, Vec<String>) {
    let lease = value.lease;
    // The keys whose place this request takes over (rewritten below), if any.
    let adopted: Vec<String> = match adopt {
        Some(a) => names.iter().map(|n| layout.waiter(n, &a.slot)).collect(),
        None => Vec::new(),
    };
    let taken_over = |key: &str| adopted.iter().any(|k| k == key);
    let gone: Vec<&OldKey> = olds.iter().filter(|o| !taken_over(&o.key)).collect();
    let marks: Vec<String> = gone
        .iter()
        .map(|o| layout.superseded(&o.name, &o.uid))
        .collect();
    let mut ops = Vec::new();
    for (old, mark_key) in gone.iter().zip(&marks) {
        ops.push(mark_put(mark_key, &value.id, true, lease));
        ops.push(TxnOp::delete(old.key.clone(), None));
    }
    let keys: Vec<String> = names.iter().map(|n| layout.waiter(n, slot)).collect();
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
        None => guards::in_empty_slot(layout, each(), slot, write),
    };
    (txn, marks)
}

/// Steps the core with the answer to `q`'s write: `made` at revision `at`, or not made or
/// not answered (`None`: it leaves the tables). Whether it still waits, its write made: the
/// name it is known by is then looked at now (its write may have made it the head).
pub(super) fn set_answered(g: &mut ClusterState, q: &SetQueueing, made: Option<i64>) -> bool {
    let Some(at) = made else {
        g.unregister(q.waiter);
        return false;
    };
    for name in &q.names {
        g.wrote(name, at, false);
    }
    if let Some(local) = g.waiting.get_mut(&q.waiter) {
        local.mod_rev = at;
        local.phase.written();
        local.rev = q.rev.unwrap_or(at);
    }
    // The place is this request's now, whatever the request it took it over from did.
    if let Some(uid) = &q.adopted {
        g.left.remove(uid);
    }
    settle_answered(g, q.waiter, at)
}
