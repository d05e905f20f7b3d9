//! A LOCK of several names at once (`and=`): one lease over all of them, decided by
//! [`rules::decide_set`] over each name's view, and carried out in one transaction per step.
//!
//! - Granted at once: one write creates every name's holder key (one create revision: one
//!   token on every name), guarded on every name as a grant at once of one name is (its
//!   marker as seen, nobody waiting), and writes every name's marker.
//! - Queued: one write puts a waiter key on every name's queue (one create revision: every
//!   queue agrees on its place), taking out the same id's older request (every key of it,
//!   a set or not) in the same write, each with its mark saying it was replaced, guarded on
//!   those keys being as read. The place is not taken over as one name's is: a new key on
//!   every name keeps the create revisions of the set equal.
//! - Granted from the queue by its own front-end (`queue_head.rs`, [`rules::set_ready`]),
//!   released, renewed or ended as one lease (`release.rs`, `holders.rs`): every key of the
//!   set in each write.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{PutOptions, Txn, TxnOp};
use tokio::sync::oneshot;

use crate::backend::{now, BackendError, HandOver, LockStart, WaitResult};
use crate::locks::rules::{self, SetDecision};
use crate::locks::{EventKind, LockRequest, TableError, WaiterId};

use super::grant::set_names;
use super::keys::names_of;
use super::marks::SupersededValue;
use super::mirror::{HolderRecord, NameState};
use super::values::WaiterValue;
use super::view::{self, ask};
use super::waiters::settle_answered;
use super::{guards, Cluster, Local, Phase};

/// How often a LOCK of a set decides again (its names changed under it) before it answers
/// `ERR UNAVAILABLE`.
const STALE_TRIES: usize = 8;

/// What a LOCK of a set does, decided from the mirror or a read.
enum SetPlan {
    /// Every name free and nobody waits: granted at once if each marker is still at its
    /// revision (one per name, in the request's order).
    Fresh(Vec<i64>),
    /// The same id holds exactly this set: same token, new lease.
    Again(Box<HolderRecord>),
    /// Queued on every name, the same id's older requests out (every key of each); or,
    /// when the older request is this very set, its place taken over.
    Blocked(Vec<OldKey>, Option<Adopt>),
}

/// The place of the same id's older request for the very same set, which a LOCK takes over
/// as one name's is (every key rewritten: the create revisions, and so the place in every
/// queue, stay): how a set waiter whose front-end died or was cut off keeps its place when
/// its client sends the same LOCK through another front-end.
pub(super) struct Adopt {
    uid: String,
    slot: String,
    rev: i64,
    queued_ms: u64,
    note: String,
}

impl Adopt {
    /// The place of the waiter `w`.
    pub(super) fn of(w: &super::mirror::WaiterRecord) -> Adopt {
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
    key: String,
    uid: String,
    mod_rev: i64,
}

impl Cluster {
    /// LOCK of a set: granted whole at once, the same set again, or queued on every name.
    /// As for one name, the mirror is trusted only where the write checks it; a refusal or
    /// a place in the queue is decided again on a read of every name from etcd itself.
    pub(super) async fn lock_set(
        self: &Arc<Self>,
        req: LockRequest,
    ) -> Result<LockStart, BackendError> {
        let ttl = self.limits.ttl(req.ttl)?;
        self.limits.grace(req.session())?;
        let user = self.user_name(req.user);
        let names = set_names(&req);
        for name in &names {
            self.own_writes_seen(name).await;
        }
        let mut read: Option<Vec<NameState>> = None;
        for _ in 0..STALE_TRIES {
            let plan = {
                let g = self.guard();
                let leases = g.mirror.holders() + g.fresh.len();
                let free = NameState::default();
                let states: Vec<&NameState> = match &read {
                    Some(r) => r.iter().collect(),
                    None => names
                        .iter()
                        .map(|n| g.mirror.name(n).unwrap_or(&free))
                        .collect(),
                };
                self.plan_set(&states, &names, &req, &user, leases)
            };
            match plan {
                Ok(SetPlan::Fresh(marker_revs)) => {
                    let granted = self.grant_set_at_once(&req, &user, ttl, &names, &marker_revs);
                    if let Some(start) = granted.await? {
                        return Ok(start);
                    }
                }
                Ok(SetPlan::Again(holder)) => {
                    if let Some(start) = self.lock_again(&req, *holder, ttl).await? {
                        return Ok(start);
                    }
                }
                // From the mirror: make sure with etcd itself.
                _ if read.is_none() => {}
                Ok(SetPlan::Blocked(olds, adopt)) => {
                    let (req, user) = (req.clone(), user.clone());
                    let queued = self.enqueue_keys(req, user, ttl, &names, olds, adopt);
                    if let Some(start) = queued.await? {
                        return Ok(start);
                    }
                }
                Err(e) => return Err(e),
            }
            read = Some(self.read_names(&names).await?);
        }
        Err(BackendError::Unavailable(format!(
            "{}: the locks changed {STALE_TRIES} times while this LOCK was decided",
            names.join(" ")
        )))
    }

    /// What a LOCK of the set `names` (each name's state in `states`) does, as
    /// [`view::decide_set`] decides it from this front-end, with what carrying it out needs.
    fn plan_set(
        &self,
        states: &[&NameState],
        names: &[String],
        req: &LockRequest,
        user: &str,
        leases: usize,
    ) -> Result<SetPlan, BackendError> {
        let decision = view::decide_set(states, names, &self.fe, req, user, &self.limits, leases)?;
        let views: Vec<_> = states.iter().map(|ns| ns.view(&self.fe)).collect();
        let ask = ask(req, user);
        match decision {
            SetDecision::Grant => Ok(SetPlan::Fresh(
                states.iter().map(|ns| ns.marker_rev).collect(),
            )),
            SetDecision::Again(revs) => {
                let first = revs.first().copied().unwrap_or_default();
                match states.first().and_then(|ns| ns.holder_by_rev(first)) {
                    Some(h) => Ok(SetPlan::Again(Box::new(h.clone()))),
                    None => Err(TableError::NotHeld.into()),
                }
            }
            SetDecision::Queue { .. } => {
                // Every waiter of the same id on any of the names goes (the rules name the
                // first on each; a cluster may briefly show more), and with each, every
                // key of its own set.
                let mut olds: Vec<OldKey> = Vec::new();
                let mut requests: Vec<super::mirror::WaiterRecord> = Vec::new();
                for (view, (ns, name)) in views.iter().zip(states.iter().zip(names)) {
                    let same: Vec<_> = rules::same_waiters(view, &ask)
                        .filter_map(|rev| ns.queue.get(&rev).cloned())
                        .collect();
                    for old in self.old_keys(name, &same) {
                        if olds.iter().all(|o| o.key != old.key) {
                            olds.push(old);
                        }
                    }
                    for w in same {
                        if requests.iter().all(|r| r.uid != w.uid) {
                            requests.push(w);
                        }
                    }
                }
                // One older request, waiting for exactly this set: its place is taken over.
                let adopt = match requests.as_slice() {
                    [w] if rules::same_set(&w.value.set, names) && olds.len() == names.len() => {
                        Some(Adopt::of(w))
                    }
                    _ => None,
                };
                Ok(SetPlan::Blocked(olds, adopt))
            }
        }
    }

    /// The grant of a free set nobody waits for, in one write; `None` if the mirror (or the
    /// read) was stale.
    async fn grant_set_at_once(
        self: &Arc<Self>,
        req: &LockRequest,
        user: &str,
        ttl: Duration,
        names: &[String],
        marker_revs: &[i64],
    ) -> Result<Option<LockStart>, BackendError> {
        let uid = self.uid();
        let value = self.holder_value(&uid, req, user, ttl);
        let lease = if req.session().is_some() {
            self.lease_id()
        } else {
            0
        };
        let slot = self.take_slot(names.len());
        let encoded = value.encode();
        let mut when = Vec::new();
        let mut ops = Vec::new();
        for (name, marker_rev) in names.iter().zip(marker_revs) {
            let key = self.layout.holder(name, &slot);
            when.extend(guards::grant_at_once(&self.layout, name, *marker_rev));
            ops.push(TxnOp::put(
                self.layout.marker(name),
                self.marker(EventKind::Acquired, 0),
                None,
            ));
            ops.push(TxnOp::put(
                key,
                encoded.clone(),
                (lease != 0).then(|| PutOptions::new().with_lease(lease)),
            ));
        }
        let each = || names.iter().map(String::as_str);
        let write = Txn::new().when(when).and_then(ops);
        let txn = guards::in_empty_slot(&self.layout, each(), &slot, write);
        // (A write whose answer was lost keeps its slot: it may have been applied.) Its grant,
        // if it was, is taken back unless the same LOCK sent again claims it (as one name's:
        // `Cluster::given_up`; simulator seed 130753, a set's grant that sat out its ttl).
        let resp = match self.txn(txn).await {
            Ok(resp) => resp,
            Err(e) => {
                self.given_up(&names[0], &uid);
                return Err(self.unavailable(&e));
            }
        };
        if !self.slot_written(&slot, each(), &resp) {
            return Ok(None);
        }
        for name in names {
            self.wrote(name, &resp);
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        let token = {
            let mut g = self.guard();
            // Until the watch brings them: an UNLOCK or RENEW right after needs no read.
            if rev > g.mirror.rev {
                for name in names {
                    let holder = HolderRecord {
                        key: self.layout.holder(name, &slot),
                        slot: slot.clone(),
                        uid: uid.clone(),
                        rev,
                        mod_rev: rev,
                        lease,
                        ends_at: now() + ttl,
                        keyless: false,
                        value: value.clone(),
                    };
                    g.fresh.insert((name.clone(), rev), holder);
                }
            }
            g.mirror.token(rev)
        };
        for name in names {
            self.granted_log(name, &req.id, token, None, &req.origin);
        }
        Ok(Some(LockStart::Granted {
            token,
            handover: HandOver(rev),
        }))
    }

    /// Queues a LOCK on every one of `names` in one write (one waiter key per name, one
    /// create revision), taking out every key of the same id's older requests (`olds`) in
    /// the same write, each after its mark (`ERR REPLACED` for its request, through its
    /// front-end's watch). `None`: one of those keys changed meanwhile; decide again.
    ///
    /// With `adopt`, the older request's keys on `names` are rewritten for this one (their
    /// place kept) rather than taken out. A LOCK of one name comes here too when the request
    /// it replaces is a set: it takes over the set's place on its name, and the set's keys
    /// on its other names go.
    pub(super) async fn enqueue_keys(
        self: &Arc<Self>,
        req: LockRequest,
        user: String,
        ttl: Duration,
        names: &[String],
        olds: Vec<OldKey>,
        adopt: Option<Adopt>,
    ) -> Result<Option<LockStart>, BackendError> {
        let uid = adopt.as_ref().map_or_else(|| self.uid(), |a| a.uid.clone());
        let slot = match &adopt {
            Some(a) => a.slot.clone(),
            None => self.take_slot(names.len()),
        };
        let set = if names.len() > 1 {
            names.to_vec()
        } else {
            Vec::new()
        };
        let first = names
            .first()
            .cloned()
            .unwrap_or_else(|| req.name.to_string());
        let value = WaiterValue {
            uid: uid.clone(),
            id: req.id.clone(),
            user,
            mode: req.mode,
            ttl_ms: ttl.as_millis() as u64,
            session_ms: req.session().map(|g| g.as_millis() as u64),
            fe: self.fe.clone(),
            conn: req.conn,
            lease: self.lease_id(),
            queued_ms: self.wall_ms(),
            peer: req.origin.peer().map(|p| p.to_string()).unwrap_or_default(),
            note: req.note.as_deref().unwrap_or_default().to_owned(),
            set: set.clone(),
            delay_ms: super::grant::delay_ms(&req),
        };
        let mut value = value;
        if let Some(old) = &adopt {
            value.queued_ms = old.queued_ms;
            let had = Some(old.note.as_str()).filter(|n| !n.is_empty());
            value.note = rules::note_again(had, req.note.as_deref())
                .unwrap_or_default()
                .to_owned();
        }
        let lease = value.lease;
        let (tx, rx) = oneshot::channel();
        let waiter: WaiterId = self
            .next_uid
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wait = req.wait;
        let mut replaced_here = Vec::new();
        {
            let mut g = self.guard();
            for old in &olds {
                if let Some(w) = g.by_uid.remove(&old.uid) {
                    replaced_here.extend(g.waiting.remove(&w));
                }
            }
            g.by_uid.insert(uid.clone(), waiter);
            g.waiting.insert(
                waiter,
                Local {
                    name: first.clone(),
                    uid: uid.clone(),
                    slot: slot.clone(),
                    key: self.layout.waiter(&first, &slot),
                    rev: 0,
                    mod_rev: 0,
                    tx,
                    req,
                    value: value.clone(),
                    queued: now(),
                    phase: Phase::Writing,
                    set,
                    timer: None,
                },
            );
        }
        let on_lease = || Some(PutOptions::new().with_lease(lease));
        let mark = SupersededValue {
            by: value.id.clone(),
            same_id: true,
        }
        .encode();
        // The keys whose place this request takes over (rewritten below), if any.
        let adopted: Vec<String> = match &adopt {
            Some(a) => names
                .iter()
                .map(|n| self.layout.waiter(n, &a.slot))
                .collect(),
            None => Vec::new(),
        };
        let taken_over = |key: &str| adopted.iter().any(|k| k == key);
        let gone: Vec<&OldKey> = olds.iter().filter(|o| !taken_over(&o.key)).collect();
        let marks: Vec<String> = gone
            .iter()
            .map(|o| self.layout.superseded(&o.name, &o.uid))
            .collect();
        let mut ops = Vec::new();
        for (old, mark_key) in gone.iter().zip(&marks) {
            ops.push(TxnOp::put(mark_key.clone(), mark.clone(), on_lease()));
            ops.push(TxnOp::delete(old.key.clone(), None));
        }
        let encoded = value.encode();
        let keys: Vec<String> = names.iter().map(|n| self.layout.waiter(n, &slot)).collect();
        for key in &keys {
            ops.push(TxnOp::put(key.clone(), encoded.clone(), on_lease()));
        }
        // Taken out only as read; taken over only while still that request's place; and a
        // key of a slot of its own only into an empty one.
        let when: Vec<_> = olds
            .iter()
            .map(|o| match &adopt {
                Some(a) if taken_over(&o.key) => guards::same_key(&o.key, a.rev),
                _ => guards::unchanged(&o.key, o.mod_rev),
            })
            .collect();
        let write = Txn::new().when(when).and_then(ops);
        let each = || names.iter().map(String::as_str);
        let txn = match &adopt {
            Some(_) => write,
            None => guards::in_empty_slot(&self.layout, each(), &slot, write),
        };
        let result = self.txn(txn).await;
        let written = match &result {
            Ok(r) if adopt.is_some() => r.succeeded(),
            Ok(r) => self.slot_written(&slot, each(), r),
            // (Its answer lost: the slot stays taken, see `slots.rs`.)
            Err(_) => false,
        };
        if written {
            self.drop_marks(marks);
        }
        for old in replaced_here {
            let _ = old
                .tx
                .send(WaitResult::Ended(crate::locks::WaitEnd::Replaced));
        }
        let resp = match result {
            Ok(resp) if written => resp,
            other => {
                let mut g = self.guard();
                g.waiting.remove(&waiter);
                g.by_uid.retain(|_, w| *w != waiter);
                return match other {
                    Err(e) => Err(self.unavailable(&e)),
                    // One of the keys to take out changed meanwhile, or the slot was not
                    // empty: decide again.
                    Ok(_) => Ok(None),
                };
            }
        };
        for name in names {
            self.wrote(name, &resp);
        }
        let at = resp.header().map_or(0, |h| h.revision());
        let still = {
            let mut g = self.guard();
            if let Some(local) = g.waiting.get_mut(&waiter) {
                local.mod_rev = at;
                local.phase.written();
                local.rev = adopt.as_ref().map_or(at, |a| a.rev);
            }
            // The place is this request's now, whatever the request it took it over from did.
            if adopt.is_some() {
                g.left.remove(&uid);
            }
            settle_answered(&mut g, waiter, at)
        };
        if still {
            self.evaluate(&first);
        }
        self.end_wait_after(waiter, wait);
        Ok(Some(LockStart::Waiting { waiter, rx }))
    }

    /// Every key of the same id's older requests `same` (waiters of `name`), each with every
    /// key of its set: what a LOCK of one name takes out when one of them is a set.
    pub(super) fn old_keys(&self, name: &str, same: &[super::mirror::WaiterRecord]) -> Vec<OldKey> {
        let mut olds: Vec<OldKey> = Vec::new();
        for w in same {
            for n in names_of(name, &w.value.set) {
                let key = self.layout.waiter(n, &w.slot);
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
}
