//! A lease taken up again, as the front-end's core decides it: RENEW (a new deadline, and a
//! session lease bound to the connection it came on, or detached), CHECK (the time a lease
//! has left), and a LOCK by the id that already holds (a retry after a lost reply: the same
//! token, a new lease). Each is a guarded rewrite of the holder's record ([`rewrite`]); this
//! file says what is written and what its answer means. Pure: `holders.rs` (RENEW, CHECK) and
//! `again.rs` (the same LOCK again) are its drivers, and `renewal_tests.rs` steps it by hand.

use std::time::{Duration, Instant};

use super::rpc::{Txn, TxnResponse};

use crate::backend::{HandOver, LockStart, Renewed};
use crate::locks::{rules, ConnId, LockRequest, TableError};

use super::head::Me;
use super::holding::{owned, rewrite, wrote_lease, Asker};
use super::mirror::HolderRecord;
use super::values::HolderValue;
use super::ClusterState;

/// What a RENEW asks, and of whom.
pub(super) struct Renew<'a> {
    /// Its new ttl (checked against the limits before), or the lease's own.
    pub(super) ttl: Option<Duration>,
    /// The connection it came on, which a session lease is bound to.
    pub(super) conn: ConnId,
    pub(super) asker: Asker<'a>,
    /// A session lease becomes a plain one.
    pub(super) detach: bool,
    /// This front-end's etcd lease, which a session lease's keys hang on.
    pub(super) lease: i64,
}

/// RENEW's rewrite of a holder's record being made.
pub(super) struct Rewrite {
    pub(super) value: HolderValue,
    pub(super) txn: Txn,
    /// A session lease that now is bound to this connection anew (it was in its grace, or
    /// bound to another connection or front-end).
    pub(super) bound: bool,
}

/// RENEW of `holder` at `now` (`wall_ms`: this front-end's wall clock, which the deadline is
/// written in): its rewrite, or why it is refused. With `detach`, a session lease becomes a
/// plain one: its record says so and its key no longer hangs on any front-end's etcd lease,
/// so it outlives its connection and its front-end.
pub(super) fn renewal(
    me: &Me<'_>,
    holder: &HolderRecord,
    ask: &Renew<'_>,
    now: Instant,
    wall_ms: u64,
) -> Result<Rewrite, TableError> {
    owned(holder, &ask.asker, now)?;
    if holder.value.lingering() {
        // Broken (its holder is told by whom: `Backend::renew`), or in its lock-delay.
        return Err(TableError::NotHeld);
    }
    let mut value = holder.value.clone();
    if let Some(ttl) = ask.ttl {
        value.ttl_ms = ttl.as_millis() as u64;
    }
    value.at_ms = wall_ms;
    value.deadline_ms = value.at_ms + value.ttl_ms;
    let session = value.session_ms.is_some();
    let bound = session && (value.cut_ms > 0 || value.fe != me.fe || value.conn != ask.conn);
    if session {
        value.cut_ms = 0;
        value.fe = me.fe.to_owned();
        value.conn = ask.conn;
    }
    if ask.detach {
        value.session_ms = None;
    }
    let txn = rewrite(me.layout, holder, &value, ask.lease);
    Ok(Rewrite {
        bound: bound && !ask.detach,
        value,
        txn,
    })
}

/// Steps the core with the answer `resp` to a RENEW's rewrite `r` of a lease of `name`:
/// renewed (then its names are remembered as written), or `None`: it changed meanwhile
/// (renewed elsewhere, its grace started), to be read again and tried again.
pub(super) fn renewed(
    g: &mut ClusterState,
    name: &str,
    r: &Rewrite,
    resp: &TxnResponse,
) -> Option<Renewed> {
    if !resp.succeeded() {
        return None;
    }
    wrote_lease(g, name, &r.value, revision(resp));
    Some(Renewed {
        left: Duration::from_millis(r.value.ttl_ms),
        bound: r.bound,
    })
}

/// CHECK of `holder` of `name`, just read from etcd: the least of what its record says on
/// this front-end's wall clock (`wall_ms`) and, when the mirror has seen this very write,
/// the time until this front-end would end it (which no wall clock moves).
pub(super) fn time_left(
    g: &ClusterState,
    name: &str,
    holder: &HolderRecord,
    now: Instant,
    wall_ms: u64,
) -> Result<Duration, TableError> {
    if holder.value.lingering() {
        return Err(TableError::NotHeld);
    }
    let by_wall = holder.value.ends_ms().saturating_sub(wall_ms);
    let mut left = holder.left(now).min(Duration::from_millis(by_wall));
    if let Some(seen) = g
        .mirror
        .name(name)
        .and_then(|ns| ns.holder_by_rev(holder.rev))
        .filter(|h| h.mod_rev == holder.mod_rev)
    {
        left = left.min(seen.left(now));
    }
    if left.is_zero() {
        return Err(TableError::NotHeld);
    }
    Ok(left)
}

/// The same LOCK again being made: its rewrite, and whether it claimed a grant this
/// front-end had given up on.
pub(super) struct Again {
    pub(super) value: HolderValue,
    pub(super) txn: Txn,
    pub(super) claimed: bool,
}

/// A LOCK `req` by `holder`'s own id (a retry after a lost reply), for `ttl`: the same
/// token, a new lease (`lease`: this front-end's etcd lease, for a session lease).
///
/// This LOCK claims the grant: if it was made for an earlier request of this id that this
/// front-end gave up on (remembered as left, to be taken back), it is not taken back any
/// more, also when the watch shows the rewrite before its answer comes (simulator seed 2361).
pub(super) fn lock_again(
    g: &mut ClusterState,
    me: &Me<'_>,
    (req, lease): (&LockRequest, i64),
    holder: &HolderRecord,
    ttl: Duration,
    wall_ms: u64,
) -> Again {
    let mut value = holder.value.clone();
    value.ttl_ms = ttl.as_millis() as u64;
    value.deadline_ms = wall_ms + value.ttl_ms;
    value.at_ms = wall_ms;
    value.session_ms = req.session().map(|g| g.as_millis() as u64);
    value.fe = me.fe.to_owned();
    value.conn = req.conn;
    value.cut_ms = 0;
    // As on the embedded table: the grant's time stays, the client that asked last shows.
    if let Some(peer) = req.origin.peer() {
        value.peer = peer.to_string();
    }
    let had = Some(value.note.as_str()).filter(|n| !n.is_empty());
    let note = rules::note_again(had, req.note.as_deref()).unwrap_or_default();
    value.note = note.to_owned();
    let txn = rewrite(me.layout, holder, &value, lease);
    let claimed = g.left.remove(&holder.uid);
    Again {
        value,
        txn,
        claimed,
    }
}

/// Steps the core with the answer to the same LOCK again `a` on `name` of `holder` (`None`:
/// no answer came): granted, its rewrite the hand-over (a take-back of an older one now
/// fails); or `None`, and a grant it claimed is given up on again.
pub(super) fn again_answered(
    g: &mut ClusterState,
    name: &str,
    holder: &HolderRecord,
    a: &Again,
    resp: Option<&TxnResponse>,
) -> Option<LockStart> {
    let Some(resp) = resp.filter(|r| r.succeeded()) else {
        if a.claimed {
            g.left.insert(holder.uid.clone());
        }
        return None;
    };
    let rev = revision(resp);
    wrote_lease(g, name, &a.value, rev);
    let token = g.mirror.token(holder.rev, &holder.slot);
    Some(LockStart::Granted {
        token,
        handover: HandOver(rev),
    })
}

/// The revision a write was applied at.
fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}
