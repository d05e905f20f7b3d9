//! Every lock read again (at start, and whenever the watch can't resume because a compaction
//! overtook it), as the front-end's core takes it in: a fresh mirror, and what changed while
//! the watch was behind told as the watch would have told it, to watchers (`gap.rs`), to this
//! front-end's waiters (grants delivered, confirmed or taken back; places taken over; waits
//! lost) and to its slots. Two steps, so that watchers hear of the gap before any waiter is
//! answered, as before: [`reread`] (the mirror, its events, keys to take out), then
//! [`resynced`] (the waiters). Pure: `resync.rs` is its driver (it reads, publishes, sends
//! the writes and carries out the grants' actions).

use std::time::Instant;

use crate::backend::{BackendError, WaitResult};
use crate::locks::{Event, EventKind};

use super::apply::Applied;
use super::delivery::{on_grant, taken_over, GrantAction};
use super::head::{orphans, Me};
use super::mirror::{Granted, KeyChange, Mirror};
use super::{gap, ClusterState};

/// The mirror read again, for the driver.
pub(super) struct Reread {
    /// The new mirror's change (as from nothing).
    pub(super) applied: Applied,
    /// Keys of ours no request waits for, to take out ([`orphans`]).
    pub(super) forget: Vec<(Vec<String>, i64)>,
    /// What changed in the gap, as the watch would have told watchers.
    pub(super) events: Vec<Event>,
    /// The mirror as it was before: [`resynced`] compares the waiters with it.
    pub(super) old: Mirror,
}

/// Steps the core with the whole prefix read at revision `rev` (`changes`: each key, a put),
/// seen at `now` on the monotonic clock and `wall_ms` on the wall clock: the mirror is made
/// anew, grants of its own the old one had not shown are forgotten once the read has them,
/// lock-delays the gap hid are kept, what the gap held becomes events (the session leases it
/// ended unbound), and slots whose keys went meanwhile are free again.
pub(super) fn reread(
    g: &mut ClusterState,
    me: &Me<'_>,
    changes: &[KeyChange],
    rev: i64,
    (now, wall_ms): (Instant, u64),
) -> Reread {
    let tokens = g.mirror.tokens;
    let fresh = Mirror {
        tokens,
        ..Mirror::default()
    };
    let old = std::mem::replace(&mut g.mirror, fresh);
    let applied = g.mirror.apply(me.layout, changes, rev, now, wall_ms);
    let forget = orphans(g, me, &applied.waiters_new);
    g.fresh.retain(|(_, at), _| *at > rev);
    gap::keep_delays(&old, &mut g.mirror, now);
    let events = gap::events(&old, &g.mirror, wall_ms);
    for event in events.iter().filter(|e| e.kind != EventKind::Acquired) {
        g.bound.ended(event.token);
    }
    // Slots whose keys went while the watch was behind: a key the old mirror showed was
    // written, so its slot is free once the new one shows none on that name.
    for (name, ns) in &old.names {
        let slots = ns.holders.values().map(|h| &h.slot);
        for slot in slots.chain(ns.queue.values().map(|w| &w.slot)) {
            if !g.mirror.name(name).is_some_and(|now| now.uses_slot(slot)) {
                g.slots.gone(slot);
            }
        }
    }
    Reread {
        applied,
        forget,
        events,
        old,
    }
}

/// What the read means for this front-end's waiters, for the driver.
pub(super) struct Resynced {
    /// Grants to waiters of ours made while the watch was behind: what to do with each.
    pub(super) grants: Vec<GrantAction>,
    /// Every name the old mirror or the new one shows, to look at their heads again.
    pub(super) touched: Vec<String>,
}

/// Steps the core's waiters with the mirror [`reread`] at `rev` (`old`: the one before), at
/// `now`: grants made meanwhile to waiters of ours (still waiting, or gone: then they are
/// taken back), places another front-end took over (`ERR REPLACED`), and settled waiters
/// whose key is gone (replaced, or lost with an old etcd lease: `ERR UNAVAILABLE`).
pub(super) fn resynced(
    g: &mut ClusterState,
    me: &Me<'_>,
    old: &Mirror,
    rev: i64,
    now: Instant,
) -> Resynced {
    let mut touched: Vec<String> = old.names.keys().cloned().collect();
    touched.extend(g.mirror.names.keys().cloned());
    let tokens = g.mirror.tokens;
    let shown: Vec<Granted> = g
        .mirror
        .names
        .iter()
        .flat_map(|(name, ns)| {
            let keyed = ns.holders.values().filter(|h| !h.keyless);
            keyed.map(move |h| Granted::of(tokens, name, h))
        })
        .filter(|gr| gr.fe == me.fe)
        .filter(|gr| g.by_uid.contains_key(&gr.uid) || g.left.contains(&gr.uid))
        .collect();
    let grants = shown.iter().map(|gr| on_grant(g, gr, now)).collect();
    let moved: Vec<String> = g
        .mirror
        .names
        .values()
        .flat_map(|ns| ns.queue.values())
        .filter(|w| w.value.fe != me.fe && g.by_uid.contains_key(&w.uid))
        .map(|w| w.uid.clone())
        .collect();
    for uid in moved {
        taken_over(g, &uid);
    }
    let gone: Vec<_> = g
        .waiting
        .iter()
        .filter(|(_, l)| {
            l.rev != 0
                && l.rev <= rev
                && l.phase.settled()
                && !g
                    .mirror
                    .name(&l.name)
                    .is_some_and(|ns| ns.queue.values().any(|w| w.uid == l.uid))
        })
        .map(|(w, _)| *w)
        .collect();
    for w in gone {
        if let Some(l) = g.waiting.remove(&w) {
            g.by_uid.remove(&l.uid);
            let _ = l.tx.send(WaitResult::Failed(BackendError::Unavailable(
                "the wait was lost while etcd was unreachable".into(),
            )));
        }
    }
    Resynced { grants, touched }
}
