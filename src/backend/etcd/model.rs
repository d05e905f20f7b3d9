//! The etcd backend's LOCK decisions (one name, and a set of names) over names built from
//! plain parts, sets among their holders and waiters: the model test (tests/props/model.rs)
//! asks them on the LOCKs of its random histories and of its cases of sets, and compares them
//! with the reference model and the table, so the cluster's view of a name goes through the
//! same check as the embedded table. Not part of lockd's interface.

use std::time::Instant;

use crate::locks::rules::{Decision, SetDecision};
use crate::locks::{ConnId, Limits, LockRequest, Mode, TableError};

use super::mirror::{HolderRecord, NameState, WaiterRecord};
use super::values::set_names;
use super::values::{HolderValue, WaiterValue};
use super::view;

/// The front-end the decision is made on; holders bound to its connections name it.
const HERE: &str = "here";

/// A holder, in grant order.
pub struct HolderPart<'a> {
    /// What the decision names it by: its lease's create revision, one for every name of
    /// a set.
    pub key: usize,
    pub id: &'a str,
    pub user: &'a str,
    pub mode: Mode,
    /// `None`: a plain lease; `Some(Some(conn))`: a session lease bound to this front-end's
    /// open connection `conn`; `Some(None)`: a session lease in its grace.
    pub session: Option<Option<ConnId>>,
    /// Over for its holder but still in its place (broken, or in its lock-delay).
    pub lingering: bool,
    /// Every name of its set, as its record keeps them (empty: this name alone).
    pub set: Vec<String>,
}

/// A waiter, first in line first.
pub struct WaiterPart<'a> {
    /// What the decision names it by: its keys' create revision, one for every name of a
    /// set, growing along the queue.
    pub key: usize,
    pub id: &'a str,
    pub user: &'a str,
    pub mode: Mode,
    /// Every name of its set, as its record keeps them (empty: this name alone).
    pub set: Vec<String>,
}

/// What [`super::view::decide`] says of `req` by `user` on a name with these holders and
/// queue, naming them by their keys.
pub fn decide(
    holders: &[HolderPart<'_>],
    queue: &[WaiterPart<'_>],
    req: &LockRequest,
    user: &str,
    limits: &Limits,
    leases: usize,
) -> Result<Decision<usize, usize>, TableError> {
    let ns = state(holders, queue);
    Ok(match view::decide(&ns, HERE, req, user, limits, leases)? {
        Decision::Grant => Decision::Grant,
        Decision::Again(rev) => Decision::Again(key(rev)),
        Decision::Queue {
            place,
            replaced,
            superseded,
        } => Decision::Queue {
            place: place.map(key),
            replaced: replaced.into_iter().map(key).collect(),
            superseded: superseded.into_iter().map(key).collect(),
        },
    })
}

/// What [`super::view::decide_set`] says of `req` (a LOCK of a set) by `user`, on its
/// names (in the request's order) with these holders and queues, naming them by their keys.
pub fn decide_set(
    names: &[(&[HolderPart<'_>], &[WaiterPart<'_>])],
    req: &LockRequest,
    user: &str,
    limits: &Limits,
    leases: usize,
) -> Result<SetDecision<usize, usize>, TableError> {
    let states: Vec<NameState> = names.iter().map(|(h, q)| state(h, q)).collect();
    let states: Vec<&NameState> = states.iter().collect();
    let asked = set_names(req);
    Ok(
        match view::decide_set(&states, &asked, HERE, req, user, limits, leases)? {
            SetDecision::Grant => SetDecision::Grant,
            SetDecision::Again(revs) => SetDecision::Again(revs.into_iter().map(key).collect()),
            SetDecision::Queue { place, replaced } => SetDecision::Queue {
                place: place.map(key),
                replaced: replaced.into_iter().map(key).collect(),
            },
        },
    )
}

/// What the etcd backend's BREAK ends ([`crate::locks::rules::breaks`] over the cluster's
/// view of a name) on a name with these holders: all of them, or with `only` the one of that
/// key; holders are named by their keys.
pub fn breaks(holders: &[HolderPart<'_>], only: Option<usize>) -> Result<Vec<usize>, TableError> {
    let ns = state(holders, &[]);
    // A key past any revision is a token that is not one of them.
    let only = only.map(|k| rev(k).unwrap_or(i64::MAX));
    let revs = crate::locks::rules::breaks(&ns.view(HERE), only.as_ref())?;
    Ok(revs.into_iter().map(key).collect())
}

/// The create revision of the part of key `key`: revisions start at 1.
fn rev(key: usize) -> Option<i64> {
    i64::try_from(key).ok()?.checked_add(1)
}

/// The key of the part of create revision `rev`.
fn key(rev: i64) -> usize {
    usize::try_from(rev - 1).unwrap_or(usize::MAX)
}

/// A name with `holders` (in grant order) and `queue` (first in line first), each record at
/// the create revision of its key.
fn state(holders: &[HolderPart<'_>], queue: &[WaiterPart<'_>]) -> NameState {
    let mut ns = NameState::default();
    let at = Instant::now();
    for h in holders {
        let rev = rev(h.key).unwrap_or(i64::MAX);
        let uid = format!("h{rev}");
        let value = HolderValue {
            uid: uid.clone(),
            id: h.id.into(),
            user: h.user.into(),
            mode: h.mode,
            ttl_ms: 1000,
            deadline_ms: 1000,
            session_ms: h.session.map(|_| 0),
            fe: HERE.into(),
            conn: h.session.flatten().unwrap_or(0),
            cut_ms: u64::from(matches!(h.session, Some(None))),
            granted_ms: 0,
            waited_ms: None,
            at_ms: 0,
            peer: String::new(),
            note: String::new(),
            set: h.set.clone(),
            broken_by: h.lingering.then(crate::locks::Origin::default),
            broken_over: 0,
            delay_ms: 0,
            delaying: None,
        };
        let holder = HolderRecord {
            key: uid.clone(),
            slot: uid.clone(),
            uid,
            rev,
            mod_rev: rev,
            lease: 0,
            value,
            ends_at: at,
            keyless: false,
        };
        ns.holders.insert(rev, holder);
    }
    for w in queue {
        let rev = rev(w.key).unwrap_or(i64::MAX);
        let uid = format!("w{rev}");
        let value = WaiterValue {
            uid: uid.clone(),
            id: w.id.into(),
            user: w.user.into(),
            mode: w.mode,
            ttl_ms: 1000,
            session_ms: None,
            fe: HERE.into(),
            conn: 0,
            lease: 1,
            queued_ms: 0,
            peer: String::new(),
            note: String::new(),
            set: w.set.clone(),
            delay_ms: 0,
        };
        let waiter = WaiterRecord {
            key: uid.clone(),
            slot: uid.clone(),
            uid,
            rev,
            mod_rev: rev,
            value,
        };
        ns.queue.insert(rev, waiter);
    }
    ns
}
