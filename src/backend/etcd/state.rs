//! What a front-end keeps under its one lock ([`super::Cluster::guard`]): the mirror, its own
//! waiters (each a [`Local`], by waiter and by uid), and what it wrote or is writing until the
//! mirror shows it. Every decision reads these; no I/O is done while they are held.

use super::hashing::{HashMap, HashSet};
use std::time::Instant;

use tokio::sync::oneshot;

use crate::backend::WaitResult;
use crate::locks::{LockRequest, WaiterId};

use super::mirror::{self, Mirror};
use super::phase::Phase;
use super::values::WaiterValue;
use super::{bound, slots};

/// A waiter of this front-end.
pub(super) struct Local {
    pub(super) name: String,
    pub(super) uid: String,
    /// Its keys' slot (`slots.rs`): on its other names too, for a set.
    pub(super) slot: String,
    pub(super) key: String,
    /// Its key's create revision (its place in the queue), once known (from the put's
    /// answer or the watch).
    pub(super) rev: i64,
    /// The revision of this front-end's write of its key: the key is still this waiter's
    /// only while its mod revision is that (another front-end may take the place over).
    pub(super) mod_rev: i64,
    pub(super) tx: oneshot::Sender<WaitResult>,
    pub(super) req: LockRequest,
    pub(super) value: WaiterValue,
    pub(super) queued: Instant,
    /// Which request of it is out, and so what may be done to it now.
    pub(super) phase: Phase,
    /// Every name of its set (`name` first), each with a key in `slot`; empty for one name.
    pub(super) set: Vec<String>,
    /// Dropped with the waiter, however it leaves, which ends its `wait=` timer task (see
    /// `Cluster::end_wait_after`): no task outlives the wait it times.
    pub(super) timer: Option<oneshot::Sender<()>>,
}

pub(super) struct ClusterState {
    pub(super) mirror: Mirror,
    pub(super) waiting: HashMap<WaiterId, Local>,
    pub(super) by_uid: HashMap<String, WaiterId>,
    /// Waiters of this front-end that left (timed out, went away, were replaced) while their
    /// key may still be granted, by this or another front-end: if their holder appears, the
    /// grant is taken back. Forgotten once their key is seen gone.
    pub(super) left: HashSet<String>,
    /// Names this front-end wrote, at the revision of its last write (and whether that
    /// write emptied the name), until the mirror has seen it.
    pub(super) written: HashMap<String, (i64, bool)>,
    /// Grants made at once by this front-end that the mirror has not shown yet (by name and
    /// create revision).
    pub(super) fresh: HashMap<(String, i64), mirror::HolderRecord>,
    /// Holders an expiry transaction is out for, so the timer does not send it twice.
    pub(super) expiring: HashSet<(String, i64)>,
    /// The session leases this front-end granted or bound, by connection.
    pub(super) bound: bound::BoundLeases,
    /// Waiters of this front-end (by uid) whose superseded mark the watch brought, until
    /// their gone key is answered: how the wait ends, told apart from a lost etcd lease.
    pub(super) superseded: HashMap<String, crate::locks::WaitEnd>,
    /// The slots of this front-end's keys, free and taken.
    pub(super) slots: slots::Slots,
    /// Waiter keys (a set's first) of no request of this front-end whose removal is out
    /// (`head.rs::orphans`, `head_step`): one write each, however often the name changes meanwhile.
    pub(super) forgetting: HashSet<String>,
    /// Waiters (by uid) whose grant the watch delivered from their confirmation's own write
    /// while its answer was out (`delivery.rs::on_grant`): that answer, when it comes, neither
    /// delivers nor takes the grant back.
    pub(super) confirmed_by_watch: HashSet<String>,
    /// Waiters (by uid) that left while their grant was being confirmed, and what that
    /// confirmation writes: the watch tells its write by it and takes the grant back then,
    /// not only when the confirmation's answer comes (`watched.rs`; simulator seed 194622).
    pub(super) left_confirming: HashMap<String, String>,
}

impl ClusterState {
    /// Front-end `fe`'s state before it read anything: an empty mirror, no waiters.
    pub(super) fn new(fe: &str) -> ClusterState {
        ClusterState {
            mirror: Mirror::default(),
            waiting: HashMap::default(),
            by_uid: HashMap::default(),
            left: HashSet::default(),
            written: HashMap::default(),
            fresh: HashMap::default(),
            expiring: HashSet::default(),
            bound: Default::default(),
            superseded: HashMap::default(),
            slots: slots::Slots::new(fe),
            forgetting: HashSet::default(),
            confirmed_by_watch: HashSet::default(),
            left_confirming: HashMap::default(),
        }
    }

    /// The waiter of this front-end that waits under `uid`.
    pub(super) fn waiting_mut(&mut self, uid: &str) -> Option<&mut Local> {
        let waiter = self.by_uid.get(uid)?;
        self.waiting.get_mut(waiter)
    }

    /// Whether a waiter of this front-end waits under `uid` on `name` (its own name, or one
    /// of its set's).
    pub(super) fn waits_on(&self, uid: &str, name: &str) -> bool {
        self.by_uid
            .get(uid)
            .and_then(|w| self.waiting.get(w))
            .is_some_and(|l| l.name == name || l.set.iter().any(|n| n == name))
    }

    /// A new waiter of this front-end whose own write was not made, or whose outcome is not
    /// known: out of the local tables, under every uid it was entered under
    /// ([`super::Cluster::register`]).
    pub(super) fn unregister(&mut self, waiter: WaiterId) {
        self.waiting.remove(&waiter);
        self.by_uid.retain(|_, w| *w != waiter);
    }

    /// Whether a client of front-end `fe` (this one) holds `name`, as far as it knows (its UNLOCK would
    /// come through here).
    pub(super) fn holds_here(&self, name: &str, fe: &str) -> bool {
        let shown = self
            .mirror
            .name(name)
            .is_some_and(|ns| ns.holders.values().any(|h| !h.keyless && h.value.fe == fe));
        shown || self.fresh.keys().any(|(n, _)| n == name)
    }

    /// This front-end wrote `name` at revision `rev` (`emptied`: leaving it with no holder,
    /// waiter or marker): remembered until the mirror has seen it
    /// ([`super::Cluster::own_writes_seen`]).
    pub(super) fn wrote(&mut self, name: &str, rev: i64, emptied: bool) {
        if rev > self.mirror.rev {
            let at = self.written.entry(name.to_owned()).or_insert((0, false));
            if rev >= at.0 {
                *at = (rev, emptied);
            }
        }
    }

    /// A waiter of this front-end leaves (its wait ran out, its connection went): out of the
    /// local tables, and remembered as gone in case its grant is being made right now.
    pub(super) fn leave(&mut self, waiter: WaiterId) -> Option<Local> {
        let local = self.waiting.remove(&waiter)?;
        self.by_uid.remove(&local.uid);
        self.superseded.remove(&local.uid);
        self.left.insert(local.uid.clone());
        if let Some(writes) = local.phase.confirming() {
            self.left_confirming
                .insert(local.uid.clone(), writes.to_owned());
        }
        Some(local)
    }
}
