//! A batch of the watch, as the front-end's core takes it in: the mirror moves, and what the
//! changes mean for this front-end's waiters is decided (a grant delivered, confirmed or taken
//! back; a place taken over; a key gone without a grant). Pure: the driver (`watch.rs`
//! `on_watch`) sends the writes and carries out the grants' actions it returns, publishes the
//! events, and looks at the names touched.

use std::time::Instant;

use crate::locks::{EventKind, WaitEnd};

use super::apply::Applied;
use super::delivery::{key_gone, on_grant, taken_over, GrantAction};
use super::head::{orphans, Me};
use super::keys::Key;
use super::marks::SupersededValue;
use super::mirror::KeyChange;
use super::ClusterState;

/// What a watch batch leads to, for the driver.
pub(super) struct Watched {
    /// The mirror's change: its events (to publish), the names it touched (to look at their
    /// heads again), and the rest of what it saw.
    pub(super) applied: Applied,
    /// Grants to waiters of this front-end: what to do with each.
    pub(super) grants: Vec<GrantAction>,
    /// Keys of ours no request waits for, to take out ([`orphans`]).
    pub(super) forget: Vec<(Vec<String>, i64)>,
}

/// Steps the core with the watch's `changes`, everything up to revision `rev`, seen at
/// `now` on the monotonic clock and `wall_ms` on the wall clock.
pub(super) fn watched(
    g: &mut ClusterState,
    me: &Me<'_>,
    changes: &[KeyChange],
    rev: i64,
    (now, wall_ms): (Instant, u64),
) -> Watched {
    let applied = g.mirror.apply(me.layout, changes, rev, now, wall_ms);
    let forget = orphans(g, me, &applied.waiters_new);
    for (_, slot) in &applied.slots_gone {
        g.slots.gone(slot);
    }
    for event in &applied.events {
        if event.kind != EventKind::Acquired {
            g.bound.ended(event.token);
        }
    }
    let seen = g.mirror.rev;
    g.written.retain(|_, (at, _)| *at > seen);
    g.fresh.retain(|(_, rev), _| *rev > seen);
    let mut grants = Vec::new();
    // Grants of our waiters (a holder key takes its waiter's uid), made by this front-end or
    // by another one's release. A waiter that left meanwhile never learns of it: the grant is
    // taken back.
    for gr in &applied.granted {
        if gr.fe == me.fe {
            grants.push(on_grant(g, gr, now));
        }
    }
    // A grant of ours being confirmed, taken off its etcd lease: the confirmation's own
    // write, maybe, shown before its answer (`on_grant` delivers it then).
    for gr in &applied.off_lease {
        let confirming = g
            .waiting_mut(&gr.uid)
            .is_some_and(|l| l.phase.confirming().is_some())
            || g.left_confirming.contains_key(&gr.uid);
        if gr.fe == me.fe && confirming {
            grants.push(on_grant(g, gr, now));
        }
    }
    // Waiters of ours whose place a LOCK of the same id through another front-end took over.
    for (_, uid, fe) in &applied.adopted {
        if fe != me.fe {
            taken_over(g, uid);
        }
    }
    superseded_marks(g, me, changes);
    keys_gone(g, &applied.waiters_gone);
    Watched {
        applied,
        grants,
        forget,
    }
}

/// Marks of waiters of ours that a `supersede` LOCK took the queue from (written before
/// their keys' deletes, in the same transaction): how their waits end, once the keys go.
fn superseded_marks(g: &mut ClusterState, me: &Me<'_>, changes: &[KeyChange]) {
    for c in changes.iter().filter(|c| c.put) {
        if let Some(Key::Superseded { name, uid }) = me.layout.parse(&c.key) {
            let mark = SupersededValue::decode(&c.value);
            if let (Some(mark), true) = (mark, g.waits_on(&uid, &name)) {
                let why = if mark.same_id {
                    WaitEnd::Replaced
                } else {
                    WaitEnd::Superseded { by: mark.by.into() }
                };
                g.superseded.insert(uid, why);
            }
        }
    }
}

/// Waiters of ours whose key (`name`, `uid` each) went without its grant: replaced,
/// superseded, or lost with its etcd lease.
fn keys_gone(g: &mut ClusterState, gone: &[(String, String)]) {
    for (name, uid) in gone {
        g.left.remove(uid);
        // (A key of the uid on a name it no longer waits on: the rest of a set whose place
        // on one name a LOCK of that name took over.)
        if !g.waits_on(uid, name) {
            continue;
        }
        let Some(waiter) = g.by_uid.get(uid).copied() else {
            continue;
        };
        // (Its own write not answered yet, or the one taking it out: the answer decides.)
        if g.waiting.get(&waiter).is_some_and(|l| !l.phase.settled()) {
            continue;
        }
        if let Some(l) = g.waiting.remove(&waiter) {
            g.by_uid.remove(&l.uid);
            let why = key_gone(g, &l);
            let _ = l.tx.send(why);
        }
    }
}
