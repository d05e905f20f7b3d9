//! Where a queued LOCK of one name waits and whom it ends, as the lock rules decided it
//! ([`Decision::Queue`]), read off the state of the name the decision was made on: the
//! records of those waiters, which the writes carrying it out are guarded on.

#[cfg(doc)]
use crate::locks::rules::Decision;

use super::mirror::{NameState, WaiterRecord};

/// The queue a `supersede` LOCK takes out, and the name's marker its writes are guarded on.
pub(super) struct Superseded {
    /// Each waiter, with whether it is this id's own older request.
    pub(super) queue: Vec<(WaiterRecord, bool)>,
    pub(super) marker_rev: i64,
}

impl Superseded {
    /// The waiters of `ns` a `supersede` LOCK ends, as the lock rules decided
    /// ([`Decision::Queue`]): the same id's older request it `replaced` and every
    /// other waiter it `superseded`, in queue order; and the name's marker.
    pub(super) fn of(ns: &NameState, replaced: &[i64], superseded: &[i64]) -> Superseded {
        let queue = ns
            .queue
            .values()
            .filter_map(|w| {
                let same = replaced.contains(&w.rev);
                (same || superseded.contains(&w.rev)).then(|| (w.clone(), same))
            })
            .collect();
        Superseded {
            queue,
            marker_rev: ns.marker_rev,
        }
    }

    /// Nothing: a LOCK without `supersede`.
    pub(super) fn none() -> Superseded {
        Superseded {
            queue: Vec::new(),
            marker_rev: 0,
        }
    }
}

/// Where a queued LOCK of one name waits and whom it ends, as the lock rules decided it
/// ([`Decision::Queue`]) on a state of the name, with those waiters' records as that
/// state had them: the writes carrying it out are guarded on them being so still.
pub(super) struct Waits {
    /// The same id's older request whose place it takes (its key rewritten for it), if any.
    pub(super) place: Option<WaiterRecord>,
    /// The same id's further older requests, which go in the same write.
    pub(super) replaced: Vec<WaiterRecord>,
    /// For a `supersede` LOCK, the whole queue it takes out (it waits at the back).
    pub(super) superseded: Superseded,
}

impl Waits {
    /// The waiters of `ns` named by the decision `place`, `replaced` and `superseded` of a
    /// LOCK (with `supersede` or not).
    pub(super) fn of(
        ns: &NameState,
        supersede: bool,
        place: Option<i64>,
        replaced: &[i64],
        superseded: &[i64],
    ) -> Waits {
        if supersede {
            return Waits {
                place: None,
                replaced: Vec::new(),
                superseded: Superseded::of(ns, replaced, superseded),
            };
        }
        let record = |rev: &i64| ns.queue.get(rev).cloned();
        Waits {
            place: place.as_ref().and_then(record),
            replaced: replaced
                .iter()
                .filter(|&&rev| Some(rev) != place)
                .filter_map(record)
                .collect(),
            superseded: Superseded::none(),
        }
    }
}
