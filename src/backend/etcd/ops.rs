//! The requests, each one transaction (or one read) against etcd.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::oneshot;

use crate::backend::{
    now, BackendError, Detail, HandOver, LockStart, Renewed, StatusView, WaitResult,
};
use crate::locks::{
    ConnId, EventKind, LockRequest, LockStatus, TableError, Token, UserId, WaitEnd, WaiterId,
    WaiterStatus,
};

use super::keys::{HolderValue, MarkerValue, WaiterValue};
use super::mirror::{Change, Holder, Mirror, NameState};
use super::{unavailable, wall_ms, Cluster, Local};

/// How often a LOCK whose write found the name changed decides again before it answers
/// `ERR UNAVAILABLE` (the name is changing faster than it can be decided).
const STALE_TRIES: usize = 8;

impl Cluster {
    /// LOCK: granted at once if it fits and nobody waits, else queued (unless `wait=0`).
    ///
    /// The mirror is trusted only where the write it leads to checks it (a grant at once, the
    /// same id again). Any other answer it suggests (held, wait, conflict) is made from a
    /// read of the name in etcd itself, since a mirror a few milliseconds behind would refuse
    /// a free name or queue a retry of the holder's own id behind itself.
    pub async fn lock(self: &Arc<Self>, req: LockRequest) -> Result<LockStart, BackendError> {
        let ttl = self.limits.ttl(req.ttl)?;
        self.limits.grace(req.session)?;
        let user = self.user_name(req.user);
        // This front-end's own last write emptied the name (an UNLOCK a moment ago): try the
        // grant at once without waiting for the watch to show it; the write checks it.
        if self.emptied_by_own_write(&req.name) {
            if let Some(start) = self.grant_at_once(&req, &user, ttl, 0).await? {
                return Ok(start);
            }
        }
        self.own_writes_seen(&req.name).await;
        let mut read: Option<NameState> = None;
        for _ in 0..STALE_TRIES {
            let plan = match &read {
                Some(ns) => self.plan(ns, &req, &user),
                None => {
                    let g = self.guard();
                    let (held, _) = g.mirror.counts();
                    match g.mirror.name(&req.name) {
                        None if held >= self.limits.max_locks => {
                            return Err(TableError::TooManyLocks {
                                max: self.limits.max_locks,
                            }
                            .into())
                        }
                        None => Ok(Plan::Fresh { marker_rev: 0 }),
                        Some(ns) => self.plan(ns, &req, &user),
                    }
                }
            };
            match plan {
                Ok(Plan::Fresh { marker_rev }) => {
                    if let Some(start) = self.grant_at_once(&req, &user, ttl, marker_rev).await? {
                        return Ok(start);
                    }
                }
                // The same id again: its write checks the holder is as the mirror saw it.
                Ok(Plan::Again(holder)) => {
                    if let Some(start) = self.lock_again(&req, *holder, ttl).await? {
                        return Ok(start);
                    }
                }
                // From the mirror: make sure with etcd itself.
                _ if read.is_none() => {}
                Ok(Plan::Blocked(holder)) => {
                    if req.wait == Some(Duration::ZERO) {
                        return Err(TableError::WouldBlock {
                            holder: holder.into(),
                        }
                        .into());
                    }
                    let queued = self.enqueue(req.clone(), user.clone(), ttl, read.as_ref());
                    if let Some(start) = queued.await? {
                        return Ok(start);
                    }
                }
                Err(e) => return Err(e),
            }
            read = Some(self.read_name(&req.name).await?);
        }
        Err(BackendError::Unavailable(format!(
            "{}: the lock changed {STALE_TRIES} times while this LOCK was decided",
            req.name
        )))
    }

    /// The name as etcd has it now (a linearizable read of its marker, holders and queue).
    async fn read_name(&self, name: &str) -> Result<NameState, BackendError> {
        let prefix = || Some(GetOptions::new().with_prefix());
        let txn = Txn::new().and_then([
            TxnOp::get(self.layout.marker(name), None),
            TxnOp::get(self.layout.holders(name), prefix()),
            TxnOp::get(self.layout.waiters(name), prefix()),
        ]);
        let resp = self.txn(txn).await.map_err(unavailable)?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut changes = Vec::new();
        for op in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(got) = op {
                changes.extend(got.kvs().iter().map(|kv| Change {
                    put: true,
                    key: kv.key().to_vec(),
                    value: kv.value().to_vec(),
                    create_rev: kv.create_revision(),
                    mod_rev: kv.mod_revision(),
                    lease: kv.lease(),
                }));
            }
        }
        let mut one = Mirror {
            base: self.base_token(),
            ..Mirror::default()
        };
        one.apply(&self.layout, &changes, rev, now());
        Ok(one.names.remove(name).unwrap_or_default())
    }

    /// Waits (at most a request timeout) until the mirror shows this front-end's own last
    /// write to `name`: a client's LOCK right after its UNLOCK is decided on the state that
    /// UNLOCK left.
    async fn own_writes_seen(&self, name: &str) {
        let until = tokio::time::Instant::now() + self.config.request_timeout;
        loop {
            let moved = self.moved.notified();
            {
                let g = self.guard();
                match g.written.get(name) {
                    Some((rev, _)) if *rev > g.mirror.rev => {}
                    _ => return,
                }
            }
            if tokio::time::timeout_at(until, moved).await.is_err() {
                return;
            }
        }
    }

    /// Remembers that this front-end wrote `name` at `rev` (see [`Cluster::own_writes_seen`]).
    pub(super) fn wrote(&self, name: &str, resp: &etcd_client::TxnResponse) {
        self.wrote_as(name, resp, false);
    }

    /// [`Cluster::wrote`]; `emptied`: the write left the name with no holder, waiter or
    /// marker.
    fn wrote_as(&self, name: &str, resp: &etcd_client::TxnResponse, emptied: bool) {
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut g = self.guard();
        if rev > g.mirror.rev {
            let at = g.written.entry(name.to_owned()).or_insert((0, false));
            if rev >= at.0 {
                *at = (rev, emptied);
            }
        }
    }

    /// Whether this front-end's last write to `name`, not yet in the mirror, emptied it.
    fn emptied_by_own_write(&self, name: &str) -> bool {
        let g = self.guard();
        g.written
            .get(name)
            .is_some_and(|(rev, emptied)| *emptied && *rev > g.mirror.rev)
    }

    /// What a LOCK on a name the mirror knows should do.
    fn plan(&self, ns: &NameState, req: &LockRequest, user: &str) -> Result<Plan, BackendError> {
        if let Some(mode) = ns.mode() {
            if !mode.same_kind(req.mode) {
                return Err(TableError::WrongMode {
                    held: mode,
                    asked: req.mode,
                }
                .into());
            }
        }
        let same = ns
            .holders
            .values()
            .find(|h| h.value.id == req.id && h.value.user == user);
        if let Some(h) = same {
            if h.value.mode != req.mode {
                return Err(TableError::WrongMode {
                    held: h.value.mode,
                    asked: req.mode,
                }
                .into());
            }
            // Bound to another open connection of this front-end: two processes on one id.
            // One bound to another front-end's connection moves here, as a RENEW through
            // this front-end would move it: whether that connection is still open can't be
            // known from here (its front-end may be dead, the client coming back through
            // this one).
            let bound_elsewhere = h.value.session_ms.is_some()
                && h.value.cut_ms == 0
                && h.value.fe == self.fe
                && h.value.conn != req.conn;
            if bound_elsewhere {
                return Err(TableError::Conflict.into());
            }
            return Ok(Plan::Again(Box::new(h.clone())));
        }
        if ns.queue.is_empty() && ns.admits(req.mode) {
            return Ok(Plan::Fresh {
                marker_rev: ns.marker_rev,
            });
        }
        let waiters = ns.queue.len();
        if waiters >= self.limits.max_waiters && req.wait != Some(Duration::ZERO) {
            return Err(TableError::TooManyWaiters {
                max: self.limits.max_waiters,
            }
            .into());
        }
        let holder = ns
            .holders
            .values()
            .next()
            .map_or_else(|| "(queue)".to_owned(), |h| h.value.id.clone());
        Ok(Plan::Blocked(holder))
    }

    pub(super) fn holder_value(&self, req: &LockRequest, user: &str, ttl: Duration) -> HolderValue {
        let at = wall_ms();
        HolderValue {
            id: req.id.clone(),
            user: user.to_owned(),
            mode: req.mode,
            ttl_ms: ttl.as_millis() as u64,
            deadline_ms: at + ttl.as_millis() as u64,
            session_ms: req.session.map(|g| g.as_millis() as u64),
            fe: self.fe.clone(),
            conn: req.conn,
            cut_ms: 0,
            granted_ms: at,
            waited_ms: None,
            at_ms: at,
        }
    }

    /// Put options for a holder: a session lease hangs on this front-end's etcd lease.
    pub(super) fn holder_put(&self, session: bool) -> Option<PutOptions> {
        session.then(|| PutOptions::new().with_lease(self.lease_id()))
    }

    /// Writes `value` over `holder` unless it changed since it was read (renewed, ended,
    /// its grace started): the token stays (the key's create revision does not move).
    fn rewrite(&self, holder: &Holder, value: &HolderValue) -> Txn {
        Txn::new()
            .when([Compare::mod_revision(
                holder.key.clone(),
                CompareOp::Equal,
                holder.mod_rev,
            )])
            .and_then([TxnOp::put(
                holder.key.clone(),
                value.encode(),
                self.holder_put(value.session_ms.is_some()),
            )])
    }

    /// The grant of a free name nobody waits for; `None` if the mirror was stale.
    async fn grant_at_once(
        &self,
        req: &LockRequest,
        user: &str,
        ttl: Duration,
        marker_rev: i64,
    ) -> Result<Option<LockStart>, BackendError> {
        let value = self.holder_value(req, user, ttl);
        let lease = if req.session.is_some() {
            self.lease_id()
        } else {
            0
        };
        let marker = self.layout.marker(&req.name);
        let uid = self.uid();
        let key = self.layout.holder(&req.name, &uid);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(marker.clone(), CompareOp::Equal, marker_rev),
                Compare::version(self.layout.waiters(&req.name), CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then([
                TxnOp::put(marker, self.marker(EventKind::Acquired, 0), None),
                TxnOp::put(
                    key.clone(),
                    value.encode(),
                    (lease != 0).then(|| PutOptions::new().with_lease(lease)),
                ),
            ]);
        let resp = self.txn(txn).await.map_err(unavailable)?;
        if !resp.succeeded() {
            return Ok(None);
        }
        self.wrote(&req.name, &resp);
        let rev = resp.header().map_or(0, |h| h.revision());
        let token = {
            let mut g = self.guard();
            // Until the watch brings it: an UNLOCK or RENEW right after needs no read.
            if rev > g.mirror.rev {
                let holder = Holder {
                    key,
                    uid,
                    rev,
                    mod_rev: rev,
                    lease,
                    ends_at: now() + ttl,
                    value,
                };
                g.fresh.insert((req.name.clone(), rev), holder);
            }
            g.mirror.token(rev)
        };
        self.granted_log(&req.name, &req.id, token, None);
        Ok(Some(LockStart::Granted {
            token,
            handover: HandOver(rev),
        }))
    }

    /// A LOCK by a holder's own id (a retry after a lost reply): the same token, a new lease.
    async fn lock_again(
        &self,
        req: &LockRequest,
        holder: Holder,
        ttl: Duration,
    ) -> Result<Option<LockStart>, BackendError> {
        let mut value = holder.value.clone();
        let at = wall_ms();
        value.ttl_ms = ttl.as_millis() as u64;
        value.deadline_ms = at + value.ttl_ms;
        value.at_ms = at;
        value.session_ms = req.session.map(|g| g.as_millis() as u64);
        value.fe = self.fe.clone();
        value.conn = req.conn;
        value.cut_ms = 0;
        let txn = self.rewrite(&holder, &value);
        let resp = self.txn(txn).await.map_err(unavailable)?;
        if !resp.succeeded() {
            // Renewed, released or expired meanwhile: decide again.
            return Ok(None);
        }
        self.wrote(&req.name, &resp);
        let token = self.guard().mirror.token(holder.rev);
        // This rewrite is the hand-over: a take-back of an older one now fails.
        let handover = HandOver(resp.header().map_or(0, |h| h.revision()));
        Ok(Some(LockStart::Granted { token, handover }))
    }

    /// Queues a LOCK: its waiter key, on this front-end's etcd lease, and a local entry that
    /// the watch grants when it reaches the head.
    ///
    /// A waiter of the same id and user already in the queue (`read`: the name as etcd had
    /// it a moment ago) is taken over: its key is rewritten for this request, on this
    /// front-end's etcd lease, so it keeps its place (its create revision), as on one server;
    /// its old request is answered `ERR REPLACED` by its front-end. That is how a client whose
    /// front-end died or was cut off keeps its place: its key stays in etcd until that
    /// front-end's etcd lease runs out. If the key went meanwhile (granted, left), `None`:
    /// the LOCK is decided again (a grant made to the old request is then this one's, by the
    /// same-id rule). Any further waiter of the id goes in the same write.
    async fn enqueue(
        self: &Arc<Self>,
        req: LockRequest,
        user: String,
        ttl: Duration,
        read: Option<&NameState>,
    ) -> Result<Option<LockStart>, BackendError> {
        let uid = self.uid();
        let name_of_wait = req.name.clone();
        let key = self.layout.waiter(&req.name, &uid);
        let mut value = WaiterValue {
            id: req.id.clone(),
            user: user.clone(),
            mode: req.mode,
            ttl_ms: ttl.as_millis() as u64,
            session_ms: req.session.map(|g| g.as_millis() as u64),
            fe: self.fe.clone(),
            conn: req.conn,
            lease: self.lease_id(),
            queued_ms: wall_ms(),
        };
        let mut same: Vec<super::mirror::Waiter> = {
            let g = self.guard();
            read.or_else(|| g.mirror.name(&req.name))
                .map_or_else(Vec::new, |ns| {
                    ns.queue
                        .values()
                        .filter(|w| w.value.id == req.id && w.value.user == user)
                        .cloned()
                        .collect()
                })
        };
        // The oldest one's place is taken over (the queue is in create-revision order).
        let adopt = (!same.is_empty()).then(|| same.remove(0));
        if let Some(old) = &adopt {
            value.queued_ms = old.value.queued_ms;
        }
        let (tx, rx) = oneshot::channel();
        let lease = value.lease;
        let waiter: WaiterId = self
            .next_uid
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wait = req.wait;
        // A request of this front-end with that id is replaced whichever way the write goes.
        let mut replaced_here = Vec::new();
        {
            let mut g = self.guard();
            for w in adopt.iter().chain(&same) {
                if let Some(old) = g.by_uid.remove(&w.uid) {
                    replaced_here.extend(g.waiting.remove(&old));
                }
            }
            // Under both uids until the write says which key it is: the watch may bring
            // its grant before the write's answer.
            if let Some(old) = &adopt {
                g.by_uid.insert(old.uid.clone(), waiter);
            }
            g.by_uid.insert(uid.clone(), waiter);
            g.waiting.insert(
                waiter,
                Local {
                    name: req.name.clone(),
                    uid: uid.clone(),
                    key: key.clone(),
                    rev: 0,
                    mod_rev: 0,
                    tx,
                    req,
                    value: value.clone(),
                    queued: now(),
                    tried_at: None,
                    in_flight: false,
                    confirming: false,
                },
            );
        }
        // On the lease its record names: a grant to it is made on that lease (see end_txn).
        let put = |key: &str| {
            TxnOp::put(
                key.to_owned(),
                value.encode(),
                Some(PutOptions::new().with_lease(lease)),
            )
        };
        let others = || same.iter().map(|w| TxnOp::delete(w.key.clone(), None));
        let ops = |key: &str| {
            std::iter::once(put(key))
                .chain(others())
                .collect::<Vec<_>>()
        };
        let txn = match &adopt {
            Some(old) => Txn::new()
                .when([Compare::create_revision(
                    old.key.clone(),
                    CompareOp::Equal,
                    old.rev,
                )])
                .and_then(ops(&old.key)),
            None => Txn::new().and_then(ops(&key)),
        };
        let result = self.txn(txn).await;
        for old in replaced_here {
            let _ = old.tx.send(WaitResult::Ended(WaitEnd::Replaced));
        }
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                let mut g = self.guard();
                g.waiting.remove(&waiter);
                g.by_uid.retain(|_, w| *w != waiter);
                return Err(unavailable(e));
            }
        };
        if !resp.succeeded() {
            // The place to take over went meanwhile: decide again.
            let mut g = self.guard();
            g.waiting.remove(&waiter);
            g.by_uid.retain(|_, w| *w != waiter);
            return Ok(None);
        }
        self.wrote(&name_of_wait, &resp);
        let at = resp.header().map_or(0, |h| h.revision());
        let still = {
            let mut g = self.guard();
            let g = &mut *g;
            // Known by the uid it became only; the place is this request's now, whatever the
            // request it took it over from did (it may have left: its wait ran out).
            if let Some(old) = &adopt {
                g.by_uid.remove(&uid);
                g.left.remove(&old.uid);
            }
            if let Some(local) = g.waiting.get_mut(&waiter) {
                local.mod_rev = at;
                if let Some(old) = adopt {
                    local.uid = old.uid;
                    local.key = old.key;
                    local.rev = old.rev;
                } else {
                    local.rev = at;
                }
            }
            settle_answered(g, waiter, at)
        };
        if still {
            self.evaluate(&name_of_wait);
        }
        if let Some(wait) = wait {
            let me = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                me.wait_over(waiter);
            });
        }
        Ok(Some(LockStart::Waiting { waiter, rx }))
    }

    /// A waiter's `wait=` ran out: it leaves the queue. If its grant is being made right now,
    /// the grant finds the waiter gone and gives the lock back.
    fn wait_over(self: &Arc<Self>, waiter: WaiterId) {
        let Some(local) = self.guard().leave(waiter) else {
            return;
        };
        let _ = local.tx.send(WaitResult::Ended(WaitEnd::TimedOut));
        self.forget_waiter_key(local.key, local.mod_rev);
    }

    /// Takes a waiter's key out of the queue, retrying while etcd is away; unless the key
    /// changed since this front-end wrote it at `mod_rev` (another took its place over).
    pub(super) fn forget_waiter_key(self: &Arc<Self>, key: String, mod_rev: i64) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    mod_rev,
                )])
                .and_then([TxnOp::delete(key, None)]);
            me.cleanup(txn).await;
        });
    }

    /// A waiting connection went away; a grant it never read is given back.
    pub fn abandon_wait(
        self: &Arc<Self>,
        name: &str,
        waiter: WaiterId,
        mut rx: oneshot::Receiver<WaitResult>,
    ) {
        rx.close();
        if let Ok(WaitResult::Granted {
            token, handover, ..
        }) = rx.try_recv()
        {
            let (me, name) = (Arc::clone(self), name.to_owned());
            tokio::spawn(async move { me.take_back(&name, token, handover).await });
        }
        let local = self.guard().leave(waiter);
        if let Some(local) = local {
            self.forget_waiter_key(local.key, local.mod_rev);
        }
    }

    /// The holder of `name` with `token`: from the mirror, or read from etcd if the mirror
    /// has not seen it yet (a grant made through another front-end a moment ago).
    async fn find_holder(&self, name: &str, token: Token) -> Result<Holder, BackendError> {
        let rev = {
            let g = self.guard();
            let Some(rev) = g.mirror.rev_of(token) else {
                return Err(TableError::NotHeld.into());
            };
            if let Some(h) = g.mirror.name(name).and_then(|ns| ns.holder_by_rev(rev)) {
                return Ok(h.clone());
            }
            if let Some(h) = g.fresh.get(&(name.to_owned(), rev)) {
                return Ok(h.clone());
            }
            if g.mirror.rev >= rev {
                return Err(TableError::NotHeld.into());
            }
            rev
        };
        self.read_holder(name, rev).await
    }

    /// A linearizable read of one holder.
    async fn read_holder(&self, name: &str, rev: i64) -> Result<Holder, BackendError> {
        let resp = self
            .get(
                self.layout.holders(name),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(unavailable)?;
        for kv in resp.kvs() {
            if kv.create_revision() == rev {
                let value = HolderValue::decode(kv.value())
                    .ok_or(BackendError::Table(TableError::NotHeld))?;
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let uid = key.rsplit('/').next().unwrap_or_default();
                // Not seen being written: counted as if written now, but never past what
                // this front-end's wall clock says is left.
                let left = value
                    .left_ms()
                    .min(value.ends_ms().saturating_sub(wall_ms()));
                return Ok(Holder {
                    uid: super::keys::decode(uid).unwrap_or_default(),
                    key,
                    rev,
                    mod_rev: kv.mod_revision(),
                    lease: kv.lease(),
                    ends_at: now() + Duration::from_millis(left),
                    value,
                });
            }
        }
        Err(TableError::NotHeld.into())
    }

    fn owned_by(&self, holder: &Holder, user: UserId) -> Result<(), BackendError> {
        if holder.left(now()).is_zero() {
            return Err(TableError::NotHeld.into());
        }
        if user != crate::locks::NO_USER && holder.value.user != self.user_name(user) {
            return Err(TableError::NotOwner.into());
        }
        if user == crate::locks::NO_USER && !holder.value.user.is_empty() && self.users.is_some() {
            return Err(TableError::NotOwner.into());
        }
        Ok(())
    }

    /// UNLOCK.
    pub async fn unlock(&self, name: &str, token: Token, user: UserId) -> Result<(), BackendError> {
        let holder = self.find_holder(name, token).await?;
        self.owned_by(&holder, user)?;
        // One try: without etcd, the client hears UNAVAILABLE now and may try again.
        let ended = self.end_txn(name, EventKind::Released, &holder, created(&holder));
        let resp = self.txn(ended.txn.clone()).await.map_err(unavailable)?;
        if self.ended(name, token, EventKind::Released, &holder, &ended, &resp) {
            Ok(())
        } else {
            Err(TableError::NotHeld.into())
        }
    }

    /// Ends one holder with an event of `kind` (a clean-up: retried while etcd is away).
    async fn end_holder(&self, name: &str, token: Token, kind: EventKind, holder: Holder) -> bool {
        let ended = self.end_txn(name, kind, &holder, created(&holder));
        match self.cleanup(ended.txn.clone()).await {
            Some(resp) => self.ended(name, token, kind, &holder, &ended, &resp),
            None => false,
        }
    }

    /// The write that ends `holder`: the marker says why, in the same transaction. When it
    /// is the last holder and nobody waits, an UNLOCK removes the marker too, so a name used
    /// once leaves nothing behind. When the head waiter fits once it is gone, the same write
    /// grants it (one etcd write per hand-over, not two), if the mirror is current; if not,
    /// that branch fails and the plain end is made instead.
    ///
    /// A grant to another front-end's waiter hangs on that front-end's etcd lease (the one
    /// its waiter key hangs on), whatever kind of lease it is: if that front-end is dead,
    /// the grant goes when its etcd lease runs out, as its waiter would have, and the next
    /// waiter is granted. A plain lease's front-end takes it off its etcd lease before it
    /// tells its client (see `Cluster::confirm`). etcd checks a put's lease only on the
    /// branch taken, and a lease that ran out took the waiter key with it, which this
    /// branch compares: a dead lease never fails the write, it only fails the branch.
    pub(super) fn end_txn(
        &self,
        name: &str,
        kind: EventKind,
        holder: &Holder,
        guard: Compare,
    ) -> Ended {
        let marker = self.layout.marker(name);
        let end = |marker_op: TxnOp| vec![marker_op, TxnOp::delete(holder.key.clone(), None)];
        let with_marker = end(TxnOp::put(
            marker.clone(),
            self.marker(kind, holder.rev),
            None,
        ));
        let plain = if kind == EventKind::Released {
            let alone = [
                guard.clone(),
                Compare::create_revision(self.layout.holders(name), CompareOp::Equal, holder.rev)
                    .with_prefix(),
                Compare::version(self.layout.waiters(name), CompareOp::Equal, 0).with_prefix(),
            ];
            let otherwise = Txn::new()
                .when([guard.clone()])
                .and_then(with_marker.clone());
            Txn::new()
                .when(alone)
                .and_then(end(TxnOp::delete(marker.clone(), None)))
                .or_else([TxnOp::txn(otherwise)])
        } else {
            Txn::new()
                .when([guard.clone()])
                .and_then(with_marker.clone())
        };
        let Some((head, marker_rev, lease)) = self.head_after(name, holder) else {
            return Ended {
                txn: plain,
                head: None,
            };
        };
        let value = head.value.holder(wall_ms());
        let lease = lease.map(|l| PutOptions::new().with_lease(l));
        let mut ops = vec![
            TxnOp::put(marker.clone(), self.marker(kind, holder.rev), None),
            TxnOp::put(self.layout.holder(name, &head.uid), value.encode(), lease),
            TxnOp::delete(head.key.clone(), None),
        ];
        ops.push(TxnOp::delete(holder.key.clone(), None));
        let txn = Txn::new()
            .when([
                guard,
                Compare::mod_revision(marker, CompareOp::Equal, marker_rev),
                Compare::create_revision(head.key.clone(), CompareOp::Equal, head.rev),
                // As the mirror has it: not taken over by another front-end meanwhile.
                Compare::mod_revision(head.key.clone(), CompareOp::Equal, head.mod_rev),
                Compare::create_revision(
                    self.layout.waiters(name),
                    CompareOp::Greater,
                    head.rev - 1,
                )
                .with_prefix(),
            ])
            .and_then(ops)
            .or_else([TxnOp::txn(plain)]);
        Ended {
            txn,
            head: Some((head.value.id.clone(), value)),
        }
    }

    /// The head waiter of `name`, if it fits once `holder` is gone: with the marker's
    /// revision the grant depends on, and the etcd lease the grant hangs on (none for a
    /// plain lease of this front-end's own waiter).
    fn head_after(
        &self,
        name: &str,
        holder: &Holder,
    ) -> Option<(super::mirror::Waiter, i64, Option<i64>)> {
        let g = self.guard();
        let ns = g.mirror.name(name)?;
        let head = ns.queue.values().next()?;
        // A mirror behind may still show, as the head waiter, the very waiter whose grant is
        // now being released (its holder key takes the waiter's uid): etcd refuses a write
        // that puts and deletes one key.
        if head.uid == holder.uid {
            return None;
        }
        let ours = head.value.fe == self.fe;
        let lease = (head.value.session_ms.is_some() || !ours).then_some(head.value.lease);
        // A waiter record without its lease (written by an older lockd): its own front-end
        // grants it.
        if lease == Some(0) {
            return None;
        }
        ns.admits_without(head.value.mode, Some(holder.rev))
            .then(|| (head.clone(), ns.marker_rev, lease))
    }

    /// Whether [`Cluster::end_txn`]'s write ended the holder (then logged and counted, with
    /// the grant it made, if it made one).
    pub(super) fn ended(
        &self,
        name: &str,
        token: Token,
        kind: EventKind,
        holder: &Holder,
        ended: &Ended,
        resp: &etcd_client::TxnResponse,
    ) -> bool {
        let Some(depth) = success_depth(resp) else {
            return false;
        };
        let plain = usize::from(ended.head.is_some());
        // A release's plain write empties the name when its outer transaction succeeds.
        self.wrote_as(name, resp, kind == EventKind::Released && depth == plain);
        let held = Duration::from_millis(wall_ms().saturating_sub(holder.value.granted_ms));
        self.ended_log(name, &holder.value.id, token, kind, held);
        if let (0, Some((id, value))) = (depth, &ended.head) {
            let rev = resp.header().map_or(0, |h| h.revision());
            let granted = self.guard().mirror.token(rev);
            let waited = value.waited_ms.map(Duration::from_millis);
            self.granted_log(name, id, granted, waited);
        }
        true
    }

    /// RENEW: a new deadline; a session lease in its grace is bound to this connection again.
    pub async fn renew(
        &self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewed, BackendError> {
        if ttl.is_some() {
            self.limits.ttl(ttl)?;
        }
        let mut holder = self.find_holder(name, token).await?;
        for _ in 0..2 {
            self.owned_by(&holder, user)?;
            let mut value = holder.value.clone();
            if let Some(ttl) = ttl {
                value.ttl_ms = ttl.as_millis() as u64;
            }
            value.at_ms = wall_ms();
            value.deadline_ms = value.at_ms + value.ttl_ms;
            let session = value.session_ms.is_some();
            let bound = session && (value.cut_ms > 0 || value.fe != self.fe || value.conn != conn);
            if session {
                value.cut_ms = 0;
                value.fe = self.fe.clone();
                value.conn = conn;
            }
            let txn = self.rewrite(&holder, &value);
            let resp = self.txn(txn).await.map_err(unavailable)?;
            if resp.succeeded() {
                self.wrote(name, &resp);
                return Ok(Renewed {
                    left: Duration::from_millis(value.ttl_ms),
                    bound,
                });
            }
            // Changed meanwhile (renewed elsewhere, its grace started): read it and try again.
            holder = self.read_holder(name, holder.rev).await?;
        }
        Err(TableError::NotHeld.into())
    }

    /// CHECK: read from etcd itself, not the mirror, so it is never behind. The time left
    /// is the least of what the record says on this front-end's wall clock and, when the
    /// mirror has seen this very write, the time until this front-end would end it (which no
    /// wall clock moves).
    pub async fn check(&self, name: &str, token: Token) -> Result<Duration, BackendError> {
        let rev = self
            .guard()
            .mirror
            .rev_of(token)
            .ok_or(BackendError::Table(TableError::NotHeld))?;
        let holder = self.read_holder(name, rev).await?;
        let at = now();
        let mut left = holder.left(at);
        if let Some(seen) = self
            .guard()
            .mirror
            .name(name)
            .and_then(|ns| ns.holder_by_rev(rev))
            .filter(|h| h.mod_rev == holder.mod_rev)
        {
            left = left.min(seen.left(at));
        }
        if left.is_zero() {
            return Err(TableError::NotHeld.into());
        }
        Ok(left)
    }

    /// Takes back a grant its client never read: ended (event `revoked`, and the next waiter
    /// granted) only if its key is still as it was when it was handed over. A key rewritten
    /// since was confirmed to a client (a LOCK of the same id through another connection or
    /// front-end, a RENEW): taking it back would leave two clients told they hold the lock.
    pub async fn take_back(&self, name: &str, token: Token, handover: HandOver) -> bool {
        let Ok(holder) = self.find_holder(name, token).await else {
            return false;
        };
        let guard = Compare::mod_revision(holder.key.clone(), CompareOp::Equal, handover.0);
        let ended = self.end_txn(name, EventKind::Revoked, &holder, guard);
        let Some(resp) = self.cleanup(ended.txn.clone()).await else {
            return false;
        };
        let taken = self.ended(name, token, EventKind::Revoked, &holder, &ended, &resp);
        if !taken {
            tracing::info!(
                name,
                token,
                "grant kept: a client was told of it since it was handed over"
            );
        }
        taken
    }

    fn base_token(&self) -> Token {
        self.guard().mirror.base
    }

    /// STATUS of one name, as this front-end's watch has seen it (milliseconds behind).
    pub async fn status(&self, name: &str) -> Result<Option<LockStatus>, BackendError> {
        let base = self.base_token();
        let g = self.guard();
        Ok(g.mirror
            .name(name)
            .and_then(|ns| Self::status_with(base, name, ns)))
    }

    fn status_with(base: Token, name: &str, ns: &NameState) -> Option<LockStatus> {
        let first = ns.holders.values().next()?;
        Some(holder_status(base, name, first, ns))
    }

    pub async fn status_detail(
        &self,
        name: &str,
        max: usize,
    ) -> Result<Option<Detail>, BackendError> {
        let base = self.base_token();
        let g = self.guard();
        let Some(ns) = g.mirror.name(name) else {
            return Ok(None);
        };
        let Some(status) = Self::status_with(base, name, ns) else {
            return Ok(None);
        };
        let at = wall_ms();
        Ok(Some(Detail {
            status,
            holders: ns
                .holders
                .values()
                .map(|h| holder_status(base, name, h, ns))
                .collect(),
            queue: ns
                .queue
                .values()
                .take(max)
                .map(|w| WaiterStatus {
                    id: w.value.id.as_str().into(),
                    waited: Duration::from_millis(at.saturating_sub(w.value.queued_ms)),
                    session: w.value.session_ms.is_some(),
                    mode: w.value.mode,
                })
                .collect(),
        }))
    }

    pub async fn status_snapshot(&self) -> Result<StatusView, BackendError> {
        let base = self.base_token();
        let locks = {
            let g = self.guard();
            g.mirror
                .names
                .iter()
                .filter_map(|(name, ns)| Self::status_with(base, name, ns))
                .collect()
        };
        Ok(StatusView::of(locks))
    }

    /// Connection `conn`, to which session lease `token` was bound, closed: the lease ends
    /// now, or starts its grace, if it is still bound to it.
    pub(super) async fn session_closed(&self, name: &str, token: Token, conn: ConnId) {
        let Ok(holder) = self.find_holder(name, token).await else {
            return;
        };
        let v = &holder.value;
        if v.fe != self.fe || v.conn != conn || v.cut_ms > 0 {
            return;
        }
        match v.session_ms {
            None => {}
            Some(0) => {
                self.end_holder(name, token, EventKind::Dropped, holder)
                    .await;
            }
            Some(grace) => {
                // Both ends on this front-end's clock, so that the time left stays right
                // whoever wrote the deadline.
                let mut value = v.clone();
                value.at_ms = wall_ms();
                value.deadline_ms = value.at_ms + holder.left(now()).as_millis() as u64;
                value.cut_ms = value.at_ms + grace;
                let txn = self.rewrite(&holder, &value);
                self.cleanup(txn).await;
            }
        }
    }

    pub(super) fn marker(&self, kind: EventKind, rev: i64) -> String {
        MarkerValue {
            kind,
            rev,
            fe: self.fe.clone(),
        }
        .encode()
    }

    /// Logs and counts a grant this front-end made.
    pub(super) fn granted_log(&self, name: &str, id: &str, token: Token, waited: Option<Duration>) {
        let event = crate::locks::Event {
            kind: EventKind::Acquired,
            name: name.into(),
            id: id.into(),
            token,
            held: Duration::ZERO,
            waited,
        };
        crate::backend::log_event(&event);
        self.metrics.lease_event(&event);
    }

    pub(super) fn ended_log(
        &self,
        name: &str,
        id: &str,
        token: Token,
        kind: EventKind,
        held: Duration,
    ) {
        let event = crate::locks::Event {
            kind,
            name: name.into(),
            id: id.into(),
            token,
            held,
            waited: None,
        };
        crate::backend::log_event(&event);
        self.metrics.lease_event(&event);
    }
}

/// "It is still this grant" (a renewal does not change it).
fn created(holder: &Holder) -> Compare {
    Compare::create_revision(holder.key.clone(), CompareOp::Equal, holder.rev)
}

fn holder_status(base: Token, name: &str, h: &Holder, ns: &NameState) -> LockStatus {
    let at = wall_ms();
    LockStatus {
        name: name.into(),
        holder: h.value.id.as_str().into(),
        token: base + h.rev as Token,
        remaining: h.left(now()),
        held: Duration::from_millis(at.saturating_sub(h.value.granted_ms)),
        session: h.value.session_ms.is_some(),
        waiters: ns.queue.len(),
        holders: ns.holders.len(),
        mode: h.value.mode,
    }
}

/// The write that ends a holder, and the head waiter it grants if its first branch succeeds.
pub(super) struct Ended {
    pub txn: Txn,
    pub head: Option<(String, HolderValue)>,
}

/// Which branch of a transaction with nested ones succeeded: 0 the outer one, 1 the one
/// nested in its else, and so on; `None`: none did.
fn success_depth(resp: &etcd_client::TxnResponse) -> Option<usize> {
    if resp.succeeded() {
        return Some(0);
    }
    resp.op_responses().iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Txn(t) => success_depth(t).map(|d| d + 1),
        _ => None,
    })
}

/// What a LOCK does, decided from the mirror.
enum Plan {
    /// The id already holds it: same token, new lease.
    Again(Box<Holder>),
    /// Free and nobody waits: grant at once if the marker is still at this revision.
    Fresh { marker_rev: i64 },
    /// Held (by this id) or others wait: queue.
    Blocked(String),
}

/// A waiter's own write was answered at revision `at`. The watch leaves a waiter alone until
/// then, so if the mirror is past `at` and its key is no longer there as written, it is told
/// now. Whether it still waits.
fn settle_answered(g: &mut super::State, waiter: WaiterId, at: i64) -> bool {
    let Some(local) = g.waiting.get(&waiter) else {
        return false;
    };
    // Granted already, by another front-end's release: its grant is being confirmed.
    if local.confirming || local.in_flight {
        return false;
    }
    let there = g
        .mirror
        .name(&local.name)
        .is_some_and(|ns| ns.queue.get(&local.rev).is_some_and(|w| w.mod_rev == at));
    if g.mirror.rev < at || there {
        return true;
    }
    let why = super::tasks::key_gone(&g.mirror, local);
    if let Some(l) = g.waiting.remove(&waiter) {
        g.by_uid.remove(&l.uid);
        let _ = l.tx.send(why);
    }
    false
}
