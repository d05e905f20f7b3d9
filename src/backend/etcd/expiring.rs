//! Leases whose time ran out, as the front-end's core decides it when its timer fires: which
//! of them this front-end ends, and how (into its lock-delay, or over: expired, or dropped
//! with its front-end's etcd lease); and a lock-delay kept by the mirror alone, over. Pure:
//! `expiry.rs` is its driver (the timer, the writes).

use std::time::Instant;

use crate::locks::{Event, EventKind, Token};

use super::mirror::HolderRecord;
use super::values::HolderValue;
use super::ClusterState;

/// How a holder whose time ran out ends.
pub(super) enum Ending {
    /// Over for its holder but kept in its place for its lock-delay, as `kind` once that is
    /// over: its record rewritten as this value.
    Delay(Box<HolderValue>),
    /// Over, as `kind`, with its token.
    End(EventKind, Token),
}

/// What the timer's firing at `now` leads to.
pub(super) struct Expiry {
    /// Holders this front-end ends now, each on its name at its create revision, and how.
    pub(super) due: Vec<(String, i64, HolderRecord, Ending)>,
    /// Lock-delays kept by the mirror alone that are over: name and revision.
    pub(super) delays_over: Vec<(String, i64)>,
    /// When the next holder's time runs out, if any does.
    pub(super) next: Option<Instant>,
}

/// Steps the core's timer at `now` (`wall_ms` on the wall clock, which a lock-delay's
/// deadline is written in). A front-end expires the holders it granted; a holder whose
/// front-end is gone is expired by the live front-end with the smallest id (`fe` is this
/// one), so one write ends it. A holder is due once: it stays in `g.expiring` until its
/// driver's write is answered.
pub(super) fn expiry(g: &mut ClusterState, fe: &str, now: Instant, wall_ms: u64) -> Expiry {
    let mut due = Vec::new();
    let mut delays_over = Vec::new();
    let mut next = None;
    // This front-end counts itself alive even where its own key is not shown: a key that
    // went unseen (put on a lease that then lapsed; simulator seed 43119) must not leave the
    // leases of front-ends that look dead to nobody.
    let smallest = g
        .mirror
        .front_ends
        .iter()
        .map(String::as_str)
        .chain([fe])
        .min()
        .map(str::to_owned);
    for (ends, name, rev) in g.mirror.ends.iter() {
        if *ends > now {
            next = Some(*ends);
            break;
        }
        let Some(h) = g.mirror.name(name).and_then(|ns| ns.holder_by_rev(*rev)) else {
            continue;
        };
        // Kept by every front-end's mirror alone: each ends its own.
        if h.keyless {
            delays_over.push((name.clone(), *rev));
            continue;
        }
        let owner_alive = h.value.fe == fe || g.mirror.front_ends.contains(&h.value.fe);
        let mine = if owner_alive {
            h.value.fe == fe
        } else {
            smallest.as_deref() == Some(fe)
        };
        if mine {
            due.push((name.clone(), *rev, h.clone()));
        }
    }
    due.retain(|(name, rev, _)| g.expiring.insert((name.clone(), *rev)));
    let due = due
        .into_iter()
        .map(|(name, rev, holder)| {
            let ending = ending(&holder, g.mirror.token(rev, &holder.slot), wall_ms);
            (name, rev, holder, ending)
        })
        .collect();
    Expiry {
        due,
        delays_over,
        next,
    }
}

/// How `holder` (of token `token`) ends now that its time ran out: dropped if its front-end's
/// etcd lease was cut before its deadline, else expired; into its lock-delay first if it has
/// one and is not in it yet.
fn ending(holder: &HolderRecord, token: Token, wall_ms: u64) -> Ending {
    let v = &holder.value;
    let kind = if v.cut_ms > 0 && v.cut_ms <= v.deadline_ms {
        EventKind::Dropped
    } else {
        EventKind::Expired
    };
    if v.delay_ms > 0 && v.delaying.is_none() {
        return Ending::Delay(Box::new(delaying(holder, kind, wall_ms)));
    }
    Ending::End(v.delaying.unwrap_or(kind), token)
}

/// `holder`'s record in its lock-delay, from `wall_ms` on: over for its holder, ending as
/// `kind` at the delay's end, on no etcd lease.
pub(super) fn delaying(holder: &HolderRecord, kind: EventKind, wall_ms: u64) -> HolderValue {
    let mut value = holder.value.clone();
    value.delaying = Some(kind);
    value.at_ms = wall_ms;
    value.deadline_ms = value.at_ms + value.delay_ms;
    value.cut_ms = 0;
    value
}

/// The lock-delay of a lease whose key went with its front-end's etcd lease (`rev` on
/// `name`, kept by the mirror alone) is over at `wall_ms`: it leaves the mirror, and its end
/// event (to publish) is returned; `None` if the mirror no longer keeps it.
pub(super) fn delay_over(
    g: &mut ClusterState,
    name: &str,
    rev: i64,
    wall_ms: u64,
) -> Option<Event> {
    let tokens = g.mirror.tokens;
    let ns = g.mirror.names.get_mut(name)?;
    let kept = ns.holders.remove(&rev)?;
    let empty = ns.is_empty();
    g.mirror.ends.remove(&(kept.ends_at, name.to_owned(), rev));
    if empty {
        g.mirror.names.remove(name);
    }
    let event = super::holder_events::ended(tokens, name, &kept, None, wall_ms);
    let event = Event {
        kind: kept.value.delaying.unwrap_or(EventKind::Dropped),
        ..event
    };
    g.bound.ended(event.token);
    Some(event)
}
