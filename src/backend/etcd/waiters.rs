//! This front-end's waiters: a queued LOCK's key (taking over the place of the same id's
//! older request), its wait's end, and the clean-up of keys nobody waits on.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{Compare, PutOptions, Txn, TxnOp};
use tokio::sync::oneshot;

use crate::backend::{now, BackendError, LockStart, WaitResult};
use crate::locks::rules::{self};
use crate::locks::{LockRequest, WaitEnd, WaiterId};

use super::mirror::{Mirror, NameState};
use super::values::WaiterValue;
use super::view::ask;
use super::{guards, Cluster, Local, Phase};

/// The most operations one etcd transaction may carry (etcd's `--max-txn-ops` default): a
/// supersede of a longer queue is made in several.
const TXN_OPS: usize = 128;

impl Cluster {
    /// Queues a LOCK: its waiter key, on this front-end's etcd lease, and a local entry that
    /// the watch grants when it reaches the head.
    ///
    /// A waiter of the same id and user already in the queue (`read`: the name as etcd had
    /// it a moment ago) is taken over: its key is rewritten for this request, on this
    /// front-end's etcd lease, so it keeps its place (its create revision), as on one server;
    /// its old request is answered `ERR REPLACED` by its front-end. That is how a client whose
    /// front-end died or was cut off keeps its place: its key stays in etcd until that
    /// front-end's etcd lease runs out. If the key went meanwhile (granted, left),
    /// [`Queued::Again`]: the LOCK is decided again (a grant made to the old request is then
    /// this one's, by the same-id rule). Any further waiter of the id goes in the same write.
    ///
    /// Decided from the mirror alone ([`Seen::Mirror`]: a plain exclusive wait, no place to
    /// take over), the write also reads the name as it leaves it, and that read says whether
    /// the mirror was right: the hand-over of a busy name then costs etcd two transactions,
    /// not three (a read first, then the write). If the read shows what the mirror missed (the
    /// id holds or waits already, or the rules refuse the wait), the request leaves the queue
    /// again as a waiter whose connection went does (a grant made to it meanwhile is taken
    /// back), and is decided again on that read ([`Queued::Misread`]). A name found free
    /// with nobody else waiting is no misread: the request waits at the head, and this
    /// front-end grants it as soon as its watch shows the key.
    pub(super) async fn enqueue(
        self: &Arc<Self>,
        req: LockRequest,
        user: String,
        ttl: Duration,
        seen: Seen<'_>,
    ) -> Result<Queued, BackendError> {
        let read = match seen {
            Seen::Read(ns) => Some(ns),
            Seen::Mirror => None,
        };
        let uid = self.uid();
        let name_of_wait = req.name.clone();
        let mut value = WaiterValue {
            uid: uid.clone(),
            id: req.id.clone(),
            user: user.clone(),
            mode: req.mode,
            ttl_ms: ttl.as_millis() as u64,
            session_ms: req.session().map(|g| g.as_millis() as u64),
            fe: self.fe.clone(),
            conn: req.conn,
            lease: self.lease_id(),
            queued_ms: self.wall_ms(),
            peer: req.origin.peer().map(|p| p.to_string()).unwrap_or_default(),
            note: req.note.as_deref().unwrap_or_default().to_owned(),
            set: Vec::new(),
            delay_ms: super::grant::delay_ms(&req),
        };
        // `supersede`: the whole queue as this decision sees it (guarded below), each
        // waiter with whether it is this id's own older request; and the name's marker.
        let (superseded, marker_rev) = if req.supersede {
            let g = self.guard();
            let ns = read.or_else(|| g.mirror.name(&req.name));
            let ask = ask(&req, &user);
            let mut first_same =
                ns.and_then(|ns| rules::same_waiters(&ns.view(&self.fe), &ask).next());
            let all = ns.map_or_else(Vec::new, |ns| {
                ns.queue
                    .values()
                    .map(|w| {
                        let same = first_same == Some(w.rev);
                        if same {
                            first_same = None;
                        }
                        (w.clone(), same)
                    })
                    .collect::<Vec<_>>()
            });
            (all, ns.map_or(0, |ns| ns.marker_rev))
        } else {
            (Vec::new(), 0)
        };
        let mut same: Vec<super::mirror::WaiterRecord> = if !superseded.is_empty() {
            // Taken out with the rest, its request answered REPLACED by its mark.
            Vec::new()
        } else {
            let g = self.guard();
            read.or_else(|| g.mirror.name(&req.name))
                .map_or_else(Vec::new, |ns| {
                    let ask = ask(&req, &user);
                    rules::same_waiters(&ns.view(&self.fe), &ask)
                        .filter_map(|rev| ns.queue.get(&rev).cloned())
                        .collect()
                })
        };
        // The older request is a set: this one takes over its place on this name, and its
        // keys on its other names go in the same write.
        if same.iter().any(|w| !w.value.set.is_empty()) {
            let olds = self.old_keys(&req.name, &same);
            let adopt = same.first().map(super::sets::Adopt::of);
            let names = [req.name.to_string()];
            let queued = self
                .enqueue_keys(req, user, ttl, &names, olds, adopt)
                .await?;
            return Ok(queued.map_or(Queued::Again, Queued::Started));
        }
        // The oldest one's place is taken over (the queue is in create-revision order).
        let adopt = (!same.is_empty()).then(|| same.remove(0));
        // The write reads the name too (a plain new waiter decided from the mirror).
        let check = matches!(seen, Seen::Mirror) && adopt.is_none() && superseded.is_empty();
        // Its key: the one whose place it takes over, or one in a slot of its own.
        let (slot, key) = match &adopt {
            Some(old) => (old.slot.clone(), old.key.clone()),
            None => {
                let slot = self.take_slot(1);
                let key = self.layout.waiter(&req.name, &slot);
                (slot, key)
            }
        };
        if let Some(old) = &adopt {
            value.uid.clone_from(&old.uid);
            value.queued_ms = old.value.queued_ms;
            let had = Some(old.value.note.as_str()).filter(|n| !n.is_empty());
            let note = rules::note_again(had, req.note.as_deref()).unwrap_or_default();
            value.note = note.to_owned();
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
                    name: req.name.to_string(),
                    uid: uid.clone(),
                    slot: slot.clone(),
                    key: key.clone(),
                    rev: 0,
                    mod_rev: 0,
                    tx,
                    req,
                    value: value.clone(),
                    queued: now(),
                    phase: Phase::Writing,
                    set: Vec::new(),
                    timer: None,
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
        let mut marks: Vec<String> = superseded
            .iter()
            .map(|(w, _)| self.layout.superseded(&name_of_wait, &w.uid))
            .collect();
        // A supersede of a queue longer than one etcd transaction carries: the writes (and
        // their marks) that take the waiters ahead out first, before the one with this
        // request's key.
        let mut ahead: Vec<(Vec<TxnOp>, Vec<String>, Vec<Compare>)> = Vec::new();
        let mut guard = Vec::new();
        let txn = match &adopt {
            // The further waiters of the id go only as seen: a slot whose key went since may
            // hold another request's key by now.
            Some(old) => Txn::new()
                .when(
                    std::iter::once(guards::same_key(&old.key, old.rev))
                        .chain(same.iter().map(|w| guards::same_key(&w.key, w.rev)))
                        .collect::<Vec<_>>(),
                )
                .and_then(ops(&old.key)),
            None if !superseded.is_empty() => {
                // Newest wins, in writes guarded on the name as decided: no holder came or
                // went, and nobody joined the queue or moved in it since. Each waiter's mark
                // goes before its delete, so its front-end's watch sees why it went.
                let seen = superseded.iter().map(|(w, _)| w.mod_rev).max().unwrap_or(0);
                guard = vec![
                    guards::marker_at(&self.layout, &name_of_wait, marker_rev),
                    guards::queue_unchanged_since(&self.layout, &name_of_wait, seen),
                ];
                let by = value.id.clone();
                let mut last: (Vec<TxnOp>, Vec<String>, Vec<Compare>) =
                    (vec![put(&key)], Vec::new(), Vec::new());
                for ((w, same_id), mark) in superseded.iter().zip(&marks) {
                    let mark_value = super::marks::SupersededValue {
                        by: by.clone(),
                        same_id: *same_id,
                    };
                    let mut out = vec![
                        TxnOp::put(
                            mark.clone(),
                            mark_value.encode(),
                            Some(PutOptions::new().with_lease(lease)),
                        ),
                        TxnOp::delete(w.key.clone(), None),
                    ];
                    // A set waiter leaves all its queues: its keys on its other names go too
                    // (its front-end's watch ends its wait from the mark above), each only
                    // if it is still the set's (created with it): the set may have left
                    // since, and its slot hold another request's key there.
                    let mut checks = Vec::new();
                    for n in w.value.set.iter().filter(|n| n.as_str() != &*name_of_wait) {
                        let other = self.layout.waiter(n, &w.slot);
                        checks.push(guards::same_key(&other, w.rev));
                        out.push(TxnOp::delete(other, None));
                    }
                    // Full: what is gathered so far goes ahead (this request's key moves on
                    // to the next write, the last). etcd takes as many comparisons as
                    // operations; the last write adds its slot's two.
                    let compares = guard.len() + 2 + last.2.len() + checks.len();
                    if last.0.len() + out.len() > TXN_OPS || compares > TXN_OPS {
                        let key_op = last.0.remove(0);
                        let next = (vec![key_op], Vec::new(), Vec::new());
                        ahead.push(std::mem::replace(&mut last, next));
                    }
                    last.0.extend(out);
                    last.1.push(mark.clone());
                    last.2.extend(checks);
                }
                marks = last.1;
                let when: Vec<Compare> = guard.iter().cloned().chain(last.2).collect();
                let write = Txn::new().when(when).and_then(last.0);
                guards::in_empty_slot(&self.layout, [&*name_of_wait], &slot, write)
            }
            None => {
                let write = Txn::new().and_then(ops(&key));
                let reads = check
                    .then(|| self.name_reads(&name_of_wait))
                    .into_iter()
                    .flatten();
                guards::in_empty_slot_then(&self.layout, [&*name_of_wait], &slot, write, reads)
            }
        };
        // A write ahead whose guard fails decides again, as the last one's would (the waiters
        // it already took out stay out: their clients were told).
        let mut result = None;
        for (ops, marks, checks) in ahead {
            let when: Vec<Compare> = guard.iter().cloned().chain(checks).collect();
            let went = self.txn(Txn::new().when(when).and_then(ops)).await;
            if !went.as_ref().is_ok_and(|r| r.succeeded()) {
                result = Some(went);
                break;
            }
            self.drop_marks(marks);
        }
        // Whether the write that creates its key was made (one not sent frees its slot).
        let (result, written) = match result {
            Some(failed) => {
                if adopt.is_none() {
                    self.give_back(&slot, [&*name_of_wait]);
                }
                (failed, false)
            }
            None => {
                let result = self.txn(txn).await;
                let written = match (&result, &adopt) {
                    (Ok(r), Some(_)) => r.succeeded(),
                    (Ok(r), None) => self.slot_written(&slot, [&*name_of_wait], r),
                    // (Its answer lost: the slot stays taken, see `slots.rs`.)
                    (Err(_), _) => false,
                };
                if written {
                    self.drop_marks(marks);
                }
                (result, written)
            }
        };
        for old in replaced_here {
            let _ = old.tx.send(WaitResult::Ended(WaitEnd::Replaced));
        }
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                let mut g = self.guard();
                g.waiting.remove(&waiter);
                g.by_uid.retain(|_, w| *w != waiter);
                // Its write may have been made (the answer was lost, or it reaches etcd
                // after this front-end gave up on it): a grant to its key is taken back,
                // not left to sit out its ttl (simulator seed 1519).
                g.left.insert(uid.clone());
                if let Some(old) = &adopt {
                    g.left.insert(old.uid.clone());
                }
                return Err(self.unavailable(&e));
            }
        };
        if !written {
            // The place to take over went meanwhile, or the slot was not empty: decide again.
            let mut g = self.guard();
            g.waiting.remove(&waiter);
            g.by_uid.retain(|_, w| *w != waiter);
            return Ok(Queued::Again);
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
                local.phase.written();
                if let Some(old) = adopt {
                    local.uid = old.uid;
                    local.rev = old.rev;
                } else {
                    local.rev = at;
                }
            }
            settle_answered(g, waiter, at)
        };
        if still && check {
            let mut ns = self
                .states_read(&resp.op_responses(), at, &[name_of_wait.to_string()])
                .pop()
                .unwrap_or_default();
            // The name as the mirror should have shown it: without this request.
            ns.queue.retain(|_, w| w.key != key);
            if self.misread(waiter, &ns) {
                tracing::debug!(
                    name = &*name_of_wait,
                    id = &*value.id,
                    "a wait decided on the mirror: etcd's read says otherwise; decided again on it"
                );
                // Left as a waiter whose connection went: its key out, a grant made to it
                // meanwhile taken back.
                self.abandon_wait(&name_of_wait, waiter, rx);
                return Ok(Queued::Misread(ns));
            }
        }
        if still {
            self.evaluate(&name_of_wait);
        }
        self.end_wait_after(waiter, wait);
        Ok(Queued::Started(LockStart::Waiting { waiter, rx }))
    }

    /// Whether `ns`, the name as the write of waiter `waiter` found it (without it), makes
    /// the wait the mirror decided wrong: anything but a plain place in the queue, or a free
    /// name nobody else waits for (see [`Cluster::enqueue`]).
    fn misread(&self, waiter: WaiterId, ns: &NameState) -> bool {
        let g = self.guard();
        let Some(local) = g.waiting.get(&waiter) else {
            return false;
        };
        let leases = g.mirror.holders() + g.fresh.len();
        let user = local.value.user.as_str();
        let decided = super::view::decide(ns, &self.fe, &local.req, user, &self.limits, leases);
        !matches!(
            decided,
            Ok(rules::Decision::Grant | rules::Decision::Queue { replaces: None, .. })
        )
    }

    /// Deletes the "replaced" marks `marks` a successful write put in etcd: the watch of every
    /// front-end has them now (it delivers each revision); nobody needs them kept.
    pub(super) fn drop_marks(self: &Arc<Self>, marks: Vec<String>) {
        if marks.is_empty() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let deletes: Vec<TxnOp> = marks.into_iter().map(|m| TxnOp::delete(m, None)).collect();
            me.cleanup(Txn::new().and_then(deletes)).await;
        });
    }

    /// Ends the wait of `waiter` once its `wait=` runs out ([`Cluster::wait_over`]); `None`
    /// waits without bound. The timer is a task that ends early when the waiter leaves the
    /// queue otherwise (granted, gone, replaced): the waiter's record holds the other end of
    /// its stop channel.
    pub(super) fn end_wait_after(self: &Arc<Self>, waiter: WaiterId, wait: Option<Duration>) {
        let Some(wait) = wait else {
            return;
        };
        let (stop, stopped) = oneshot::channel();
        match self.guard().waiting.get_mut(&waiter) {
            Some(local) => local.timer = Some(stop),
            // Already granted or gone.
            None => return,
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = tokio::time::sleep(wait) => me.wait_over(waiter),
                _ = stopped => {}
            }
        });
    }

    /// A waiter's `wait=` ran out: it leaves the queue, and etcd's answer to the write that
    /// takes its place out says how its wait ends. etcd orders that write and any grant: a
    /// grant made first is the waiter's (`OK`, a moment after its `wait=`); `ERR TIMEOUT`
    /// only once its place is out. Told `ERR TIMEOUT` while holding a grant, a client has a
    /// lock that nobody uses, and that only this front-end would take back: were it to die
    /// first, the lock would sit out its ttl.
    ///
    /// If etcd does not answer within `--etcd-request-timeout`, the client is told
    /// `ERR UNAVAILABLE`, as for any LOCK whose answer was lost: the waiter has left (a grant
    /// shown later is taken back, unless the same LOCK sent again took it), and the write is
    /// tried on as any clean-up is.
    pub(super) fn wait_over(self: &Arc<Self>, waiter: WaiterId) {
        let txn = {
            let mut g = self.guard();
            let Some(local) = g.waiting.get_mut(&waiter) else {
                return;
            };
            if !local.phase.leave() {
                return;
            }
            let local = &*local;
            (self.leave_txn(local), self.local_keys(local), local.mod_rev)
        };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let (txn, keys, mod_rev) = txn;
            // Tried again for as long as one request may take: a write refused at once (an
            // endpoint down) need not end the wait without knowing.
            let started = now();
            let mut tries = 0;
            let answer = loop {
                tries += 1;
                match me.txn(txn.clone()).await {
                    Err(e)
                        if now().saturating_duration_since(started) < me.config.request_timeout =>
                    {
                        me.unhealthy(&me.cause_of(&e).sentence);
                        tokio::time::sleep(super::RETRY).await;
                    }
                    done => break done,
                }
            };
            let mut g = me.guard();
            let g = &mut *g;
            let resp = match answer {
                Ok(resp) => resp,
                // Whether a grant came first is not known: as any LOCK whose answer was
                // lost, the client may send it again (its grant, if there is one, is then
                // its own; else this front-end takes it back once it shows).
                Err(e) => {
                    if let Some(l) = g.leave(waiter) {
                        let _ = l.tx.send(WaitResult::Failed(me.unavailable(&e)));
                    }
                    me.forget_waiter_keys(keys, mod_rev);
                    return;
                }
            };
            let how = match left_how(&resp) {
                // Gone on a try after the first: the first one's delete, most likely.
                Left::Gone if tries > 1 => Left::Out,
                how => how,
            };
            match how {
                Left::Out => {
                    if let Some(l) = g.leave(waiter) {
                        let _ = l.tx.send(WaitResult::Ended(WaitEnd::TimedOut));
                    }
                }
                // The grant came first: its answer, the watch or its confirmation delivers
                // it; the same for a LOCK of its id that took its place over.
                Left::Granted | Left::TakenOver => {
                    if let Some(l) = g.waiting.get_mut(&waiter) {
                        l.phase.stays();
                    }
                }
                // Gone without a grant, before the write: why, as the watch would say.
                Left::Gone => {
                    if let Some(l) = g.waiting.remove(&waiter) {
                        g.by_uid.remove(&l.uid);
                        let why = key_gone(g, &l);
                        let _ = l.tx.send(why);
                    }
                }
            }
        });
    }

    /// The write of [`Cluster::wait_over`]: each waiter key of `local` out unless it changed
    /// since this front-end wrote it (one guarded part per key, as [`forget_txn`]), else read;
    /// and the holder key a grant to it would have made, read.
    fn leave_txn(&self, local: &Local) -> Txn {
        let parts = self
            .local_keys(local)
            .into_iter()
            .map(|k| TxnOp::txn(forget_one(&k, local.mod_rev).or_else([TxnOp::get(k, None)])));
        let holder = TxnOp::get(self.layout.holder(&local.name, &local.slot), None);
        Txn::new().and_then(parts.chain(std::iter::once(holder)).collect::<Vec<_>>())
    }

    /// Every waiter key of `local`: its own, or one per name of its set (same slot).
    pub(super) fn local_keys(&self, local: &Local) -> Vec<String> {
        if local.set.is_empty() {
            return vec![local.key.clone()];
        }
        local
            .set
            .iter()
            .map(|n| self.layout.waiter(n, &local.slot))
            .collect()
    }

    /// Takes a waiter's keys (one, or a set's) out of the queue in one write, retrying while
    /// etcd is away; each unless it changed since this front-end wrote it at `mod_rev`
    /// (another took its place over).
    pub(super) fn forget_waiter_keys(self: &Arc<Self>, keys: Vec<String>, mod_rev: i64) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.cleanup(forget_txn(&keys, mod_rev)).await;
            if let Some(first) = keys.first() {
                me.guard().forgetting.remove(first);
            }
        });
    }

    /// This front-end has heard from no etcd quorum for longer than its etcd lease: that
    /// lease, and its waiters' places with it, are gone or about to be, and no grant can
    /// reach them while the link is down. So its waiters are told `ERR UNAVAILABLE` now
    /// (proto.md: send the same LOCK again, through another front-end if there is one)
    /// rather than when the link is back; each leaves as a waiter whose connection went
    /// does, so a grant made for it meanwhile is taken back. Waiters whose own write, grant,
    /// confirmation or leaving is still out are left to the answer of that request.
    pub(super) fn end_waits_cut_off(self: &Arc<Self>, silent: Duration) {
        let ended: Vec<Local> = {
            let mut g = self.guard();
            let quiet: Vec<WaiterId> = g
                .waiting
                .iter()
                .filter(|(_, l)| l.phase.settled())
                .map(|(w, _)| *w)
                .collect();
            quiet.into_iter().filter_map(|w| g.leave(w)).collect()
        };
        if ended.is_empty() {
            return;
        }
        tracing::warn!(
            fe = self.fe,
            waiters = ended.len(),
            silent_ms = silent.as_millis() as u64,
            "no etcd quorum answer for longer than the front-end's etcd lease: its waiters are told ERR UNAVAILABLE"
        );
        for l in ended {
            let keys = self.local_keys(&l);
            let _ =
                l.tx.send(WaitResult::Failed(BackendError::Unavailable(format!(
                    "this front-end has not heard from etcd for {:.1}s, longer than its \
                 --etcd-lease-ttl: the wait ended (send the same LOCK again, through another \
                 front-end if you have one)",
                    silent.as_secs_f64()
                ))));
            self.forget_waiter_keys(keys, l.mod_rev);
        }
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
            self.forget_waiter_keys(self.local_keys(&local), local.mod_rev);
        }
    }
}

/// What a LOCK given to [`Cluster::enqueue`] was decided on.
pub(super) enum Seen<'a> {
    /// A read of the name in etcd itself, a moment ago.
    Read(&'a NameState),
    /// The mirror alone: the write reads the name too.
    Mirror,
}

/// How [`Cluster::enqueue`] went.
pub(super) enum Queued {
    /// Waiting (or answered already).
    Started(LockStart),
    /// The write found the name changed (the place to take over gone, the slot not
    /// empty): decide again on a read.
    Again,
    /// The mirror missed something that changes the decision, as the write's read shows:
    /// decide again on that read (the request has left the queue).
    Misread(NameState),
}

/// The write that takes a waiter's keys out (each unless it changed since this front-end
/// wrote it at `mod_rev`): one transaction, each key its own guarded part, so that a key
/// taken over stays and the others still go.
pub(super) fn forget_txn(keys: &[String], mod_rev: i64) -> Txn {
    if let [key] = keys {
        return forget_one(key, mod_rev);
    }
    let parts: Vec<TxnOp> = keys
        .iter()
        .map(|k| TxnOp::txn(forget_one(k, mod_rev)))
        .collect();
    Txn::new().and_then(parts)
}

/// One waiter key out, unless it changed since this front-end wrote it at `mod_rev`.
fn forget_one(key: &str, mod_rev: i64) -> Txn {
    Txn::new()
        .when([guards::unchanged(key, mod_rev)])
        .and_then([TxnOp::delete(key.to_owned(), None)])
}

/// What the write of [`Cluster::wait_over`] found.
#[derive(Debug, PartialEq)]
enum Left {
    /// It took the waiter's place out (a set's, on at least one name: then no grant of the
    /// set can come, which takes every name at once).
    Out,
    /// The place was gone, and the grant it led to is there.
    Granted,
    /// The place was rewritten: a LOCK of the same id took it over.
    TakenOver,
    /// The place was gone, without a grant.
    Gone,
}

/// Reads the answer to [`Cluster::leave_txn`]: one part per key, then the holder read.
fn left_how(resp: &super::rpc::TxnResponse) -> Left {
    use super::rpc::TxnOpResponse;
    let ops = resp.op_responses();
    let Some((holder, parts)) = ops.split_last() else {
        return Left::Gone;
    };
    let parts: Vec<_> = parts
        .iter()
        .filter_map(|op| match op {
            TxnOpResponse::Txn(t) => Some(t),
            _ => None,
        })
        .collect();
    if parts.iter().any(|t| t.succeeded()) {
        return Left::Out;
    }
    let found = |op: &TxnOpResponse| matches!(op, TxnOpResponse::Get(got) if !got.kvs().is_empty());
    if found(holder) {
        Left::Granted
    } else if parts.iter().any(|t| t.op_responses().iter().any(found)) {
        Left::TakenOver
    } else {
        Left::Gone
    }
}

/// A waiter's own write was answered at revision `at`. The watch leaves a waiter alone until
/// then, so if the mirror is past `at` and its key is no longer there as written, it is told
/// now. Whether it still waits.
pub(super) fn settle_answered(g: &mut super::ClusterState, waiter: WaiterId, at: i64) -> bool {
    let Some(local) = g.waiting.get(&waiter) else {
        return false;
    };
    // Granted already, by another front-end's release: its grant is being confirmed.
    if !local.phase.settled() {
        return false;
    }
    let there = g
        .mirror
        .name(&local.name)
        .is_some_and(|ns| ns.queue.get(&local.rev).is_some_and(|w| w.mod_rev == at));
    if g.mirror.rev < at || there {
        return true;
    }
    if let Some(l) = g.waiting.remove(&waiter) {
        g.by_uid.remove(&l.uid);
        let why = key_gone(g, &l);
        let _ = l.tx.send(why);
    }
    false
}

/// How the wait of `l` ends when its key is gone without its grant: a `supersede` LOCK took
/// the queue (its mark came first), a newer LOCK of its id (and user) took its place, in the
/// same write, or else its front-end's etcd lease ran out.
pub(super) fn key_gone(g: &mut super::ClusterState, l: &super::Local) -> WaitResult {
    if let Some(why) = g.superseded.remove(&l.uid) {
        return WaitResult::Ended(why);
    }
    let mirror: &Mirror = &g.mirror;
    let same = crate::locks::rules::Ask {
        id: &l.value.id,
        user: l.value.user.as_str(),
        mode: l.value.mode,
        conn: l.value.conn,
        wait: None,
        supersede: false,
    };
    let replaced = mirror.name(&l.name).is_some_and(|ns| {
        let fe = &l.value.fe;
        crate::locks::rules::same_waiters(&ns.view(fe), &same)
            .next()
            .is_some()
    });
    if replaced {
        WaitResult::Ended(WaitEnd::Replaced)
    } else {
        WaitResult::Failed(BackendError::Unavailable(
            "the wait was lost: this front-end's etcd lease ran out".into(),
        ))
    }
}
