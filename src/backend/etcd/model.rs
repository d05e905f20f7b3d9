//! The etcd backend's LOCK decision over a name built from plain parts: the model test
//! (tests/props/model.rs) asks it on every LOCK of its random histories and compares it with the
//! reference model, so the cluster's view of a name goes through the same check as the
//! embedded table. Not part of lockd's interface.

use std::time::Instant;

use crate::locks::rules::Decision;
use crate::locks::{ConnId, Limits, LockRequest, Mode, TableError};

use super::mirror::{HolderRecord, NameState, WaiterRecord};
use super::values::{HolderValue, WaiterValue};
use super::view;

/// The front-end the decision is made on; holders bound to its connections name it.
const HERE: &str = "here";

/// A holder, in grant order.
pub struct HolderPart<'a> {
    pub id: &'a str,
    pub user: &'a str,
    pub mode: Mode,
    /// `None`: a plain lease; `Some(Some(conn))`: a session lease bound to this front-end's
    /// open connection `conn`; `Some(None)`: a session lease in its grace.
    pub session: Option<Option<ConnId>>,
    /// Over for its holder but still in its place (broken, or in its lock-delay).
    pub lingering: bool,
}

/// A waiter, first in line first.
pub struct WaiterPart<'a> {
    pub id: &'a str,
    pub user: &'a str,
    pub mode: Mode,
}

/// What [`super::view::decide`] says of `req` by `user` on a name with these holders and
/// queue; holders and waiters are named by their index in the slices.
pub fn decide(
    holders: &[HolderPart<'_>],
    queue: &[WaiterPart<'_>],
    req: &LockRequest,
    user: &str,
    limits: &Limits,
    leases: usize,
) -> Result<Decision<usize, usize>, TableError> {
    let mut ns = with_holders(holders);
    let first_waiter = holders.len() as i64 + 1;
    for (i, w) in queue.iter().enumerate() {
        let rev = first_waiter + i as i64;
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
            set: Vec::new(),
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
    let index = |rev: i64, first: i64| usize::try_from(rev - first).unwrap_or(usize::MAX);
    Ok(match view::decide(&ns, HERE, req, user, limits, leases)? {
        Decision::Grant => Decision::Grant,
        Decision::Again(rev) => Decision::Again(index(rev, 1)),
        Decision::Queue {
            replaces,
            superseded,
        } => Decision::Queue {
            replaces: replaces.map(|rev| index(rev, first_waiter)),
            superseded: superseded
                .into_iter()
                .map(|rev| index(rev, first_waiter))
                .collect(),
        },
    })
}

/// What the etcd backend's BREAK ends ([`crate::locks::rules::breaks`] over the cluster's
/// view of a name) on a name with these holders: all of them, or with `only` the one of that
/// index; holders are named by their index in the slice.
pub fn breaks(holders: &[HolderPart<'_>], only: Option<usize>) -> Result<Vec<usize>, TableError> {
    let ns = with_holders(holders);
    // An index past the holders is a token that is not one of them.
    let only = only.map(|i| i64::try_from(i).map_or(i64::MAX, |i| i.saturating_add(1)));
    let revs = crate::locks::rules::breaks(&ns.view(HERE), only.as_ref())?;
    Ok(revs
        .into_iter()
        .map(|rev| usize::try_from(rev - 1).unwrap_or(usize::MAX))
        .collect())
}

/// A name with `holders`, in grant order (the first at revision 1), and nobody waiting.
fn with_holders(holders: &[HolderPart<'_>]) -> NameState {
    let mut ns = NameState::default();
    let at = Instant::now();
    for (i, h) in holders.iter().enumerate() {
        let rev = i as i64 + 1;
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
            set: Vec::new(),
            broken_by: h.lingering.then(crate::locks::Origin::default),
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
    ns
}
