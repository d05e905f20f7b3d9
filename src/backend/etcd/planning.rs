//! What a LOCK does next, as the front-end's core decides it from the mirror or from a read of
//! the name(s) in etcd: a grant at once, the same grant again, a place in the queue, or a read
//! first. The mirror is trusted only where the write it leads to checks it (a grant at once,
//! the same id again, a plain wait whose write reads the name too); any other answer it
//! suggests (held, a wait that takes a place over, a refusal) is made again on a read, since
//! a mirror a few milliseconds behind would refuse a free name or queue a retry of the
//! holder's own id behind itself. Pure: `grant.rs` (one name) and `sets.rs` (a set) are its
//! drivers.

use crate::backend::BackendError;
use crate::locks::rules::{Decision, SetDecision};
use crate::locks::{Limits, LockRequest, Mode, TableError};

use super::mirror::{HolderRecord, NameState, WaiterRecord};
use super::view::{decide, decide_set};
use super::waits::Waits;
use super::ClusterState;

/// A LOCK, as the lock rules are asked about it on this front-end.
pub(super) struct Asked<'a> {
    /// This front-end's id, as its waiter keys record it.
    pub(super) fe: &'a str,
    pub(super) limits: &'a Limits,
    pub(super) req: &'a LockRequest,
    /// The name of the request's user, as records name their owner.
    pub(super) user: &'a str,
}

/// What a LOCK of one name does next.
pub(super) enum LockStep {
    /// Free and nobody waits: granted at once if the marker is still at this revision.
    AtOnce { marker_rev: i64 },
    /// The id already holds it: same token, new lease (its write checks the holder is as
    /// seen).
    Again(Box<HolderRecord>),
    /// A plain wait decided on the mirror: queued by a write that reads the name too, and
    /// that read says whether the mirror was right.
    QueueUnread(Box<Waits>),
    /// Held, or others wait, as a read showed: queued where the rules said, ending whom
    /// they said.
    QueueRead(Box<Waits>),
    /// What the mirror suggests is made sure of on a read of the name first.
    Read,
    /// Refused, on a read.
    Refused(BackendError),
}

/// What LOCK `a` of one name does next: decided on `read` (the name as etcd had it a moment
/// ago) if there is one, else on the mirror (a name it does not show is free).
pub(super) fn plan_lock(g: &ClusterState, a: &Asked<'_>, read: Option<&NameState>) -> LockStep {
    let free = NameState::default();
    let ns = read.or_else(|| g.mirror.name(&a.req.name));
    let plan = decided(ns.unwrap_or(&free), a, leases(g));
    match plan {
        Ok(Plan::Fresh { marker_rev }) => LockStep::AtOnce { marker_rev },
        Ok(Plan::Again(holder)) => LockStep::Again(holder),
        Ok(Plan::Blocked(waits)) if read.is_none() && waits_unread(a.req, &waits) => {
            LockStep::QueueUnread(waits)
        }
        _ if read.is_none() => LockStep::Read,
        Ok(Plan::Blocked(waits)) => LockStep::QueueRead(waits),
        Err(e) => LockStep::Refused(e),
    }
}

/// The holders of every name, as a LOCK counts them against `--max-locks`: the mirror's,
/// with this front-end's own grants the watch has not shown yet.
fn leases(g: &ClusterState) -> usize {
    g.mirror.holders() + g.fresh.len()
}

/// What a LOCK does on `ns`, as the lock rules decide it.
enum Plan {
    Again(Box<HolderRecord>),
    Fresh { marker_rev: i64 },
    Blocked(Box<Waits>),
}

/// What LOCK `a` does on `ns`, as the lock rules decide it from this front-end.
fn decided(ns: &NameState, a: &Asked<'_>, leases: usize) -> Result<Plan, BackendError> {
    match decide(ns, a.fe, a.req, a.user, a.limits, leases)? {
        Decision::Grant => Ok(Plan::Fresh {
            marker_rev: ns.marker_rev,
        }),
        Decision::Again(rev) => match ns.holder_by_rev(rev) {
            Some(h) => Ok(Plan::Again(Box::new(h.clone()))),
            None => Err(TableError::NotHeld.into()),
        },
        Decision::Queue {
            place,
            replaced,
            superseded,
        } => {
            let waits = Waits::of(ns, a.req.supersede, place, &replaced, &superseded);
            Ok(Plan::Blocked(Box::new(waits)))
        }
    }
}

/// Whether a LOCK the mirror says must wait (`waits`) is queued without a read of the name
/// first (its write reads it): an exclusive request of one name, no `supersede`, that ends
/// nobody (a place to take over is decided on a read, as before).
fn waits_unread(req: &LockRequest, waits: &Waits) -> bool {
    req.mode == Mode::Exclusive
        && !req.supersede
        && waits.place.is_none()
        && waits.replaced.is_empty()
}

/// What a LOCK of a set does next.
pub(super) enum SetStep {
    /// Every name free and nobody waits: granted at once if each marker is still at its
    /// revision (one per name, in the request's order).
    AtOnce(Vec<i64>),
    /// The same id holds exactly this set: same token, new lease.
    Again(Box<HolderRecord>),
    /// Queued on every name, as a read showed: the same id's older requests out (per name,
    /// those the rules named that wait on it; every key of each goes), or, when the older
    /// request is this very set, its place (`taken`) taken over.
    Queue {
        replaced: Vec<(String, Vec<WaiterRecord>)>,
        taken: Option<Box<WaiterRecord>>,
    },
    /// What the mirror suggests is made sure of on a read of every name first.
    Read,
    /// Refused, on a read.
    Refused(BackendError),
}

/// What LOCK `a` of the set `names` does next: decided on `read` (every name as etcd had it
/// a moment ago, in the order of `names`) if there is one, else on the mirror.
pub(super) fn plan_set(
    g: &ClusterState,
    a: &Asked<'_>,
    names: &[String],
    read: Option<&[NameState]>,
) -> SetStep {
    let free = NameState::default();
    let states: Vec<&NameState> = match read {
        Some(r) => r.iter().collect(),
        None => names
            .iter()
            .map(|n| g.mirror.name(n).unwrap_or(&free))
            .collect(),
    };
    let decision = decide_set(&states, names, a.fe, a.req, a.user, a.limits, leases(g));
    match decision {
        Ok(SetDecision::Grant) => SetStep::AtOnce(states.iter().map(|ns| ns.marker_rev).collect()),
        Ok(SetDecision::Again(revs)) => {
            let first = revs.first().copied().unwrap_or_default();
            match states.first().and_then(|ns| ns.holder_by_rev(first)) {
                Some(h) => SetStep::Again(Box::new(h.clone())),
                None if read.is_none() => SetStep::Read,
                None => SetStep::Refused(TableError::NotHeld.into()),
            }
        }
        _ if read.is_none() => SetStep::Read,
        Ok(SetDecision::Queue { place, replaced }) => {
            // Every older request the rules name goes, found on whichever of the names it
            // waits on; the first name showing the place this request takes gives its record.
            let mut olds = Vec::new();
            let mut taken = None;
            for (ns, name) in states.iter().zip(names) {
                let same: Vec<WaiterRecord> = replaced
                    .iter()
                    .filter_map(|rev| ns.queue.get(rev).cloned())
                    .collect();
                olds.push((name.clone(), same));
                if taken.is_none() {
                    taken = place
                        .and_then(|rev| ns.queue.get(&rev))
                        .cloned()
                        .map(Box::new);
                }
            }
            SetStep::Queue {
                replaced: olds,
                taken,
            }
        }
        Err(e) => SetStep::Refused(e.into()),
    }
}
