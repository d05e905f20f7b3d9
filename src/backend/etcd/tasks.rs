//! A front-end's background work: the watch that keeps the mirror (and grants head waiters
//! from it), the keep-alive of its etcd lease, and the expiry timer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, WatchOptions, WatchResponse,
};
use tokio_util::sync::CancellationToken;

use crate::backend::{now, unix_ms, BackendError, HandOver, Published, WaitResult};
use crate::locks::{EventKind, Token, WaitEnd};

use super::mirror::{Change, Granted, Mirror};
use super::{unavailable, wall_ms, Cluster, State};

/// Waits between attempts to reach etcd again.
const RETRY: Duration = Duration::from_millis(200);

impl Cluster {
    /// Runs the watch, the keep-alive and the expiry timer until `shutdown`. Then this
    /// front-end's waiters leave the queue and it says it is gone (another front-end takes
    /// over expiring its plain leases), but its etcd lease is left to run out rather than
    /// revoked: a session lease's holder has until then to reconnect to another front-end
    /// and RENEW, as it would ride out the restart of a single server.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::select! {
            _ = Arc::clone(&self).watch_loop() => {}
            _ = Arc::clone(&self).keep_alive_loop() => {}
            _ = Arc::clone(&self).expiry_loop() => {}
            _ = shutdown.cancelled() => {}
        }
        // Each waiter key only if it is still this front-end's write (not taken over).
        let mut ops: Vec<TxnOp> = {
            let g = self.guard();
            g.waiting
                .values()
                .map(|l| {
                    TxnOp::txn(
                        Txn::new()
                            .when([Compare::mod_revision(
                                l.key.clone(),
                                CompareOp::Equal,
                                l.mod_rev,
                            )])
                            .and_then([TxnOp::delete(l.key.clone(), None)]),
                    )
                })
                .collect()
        };
        ops.push(TxnOp::delete(self.layout.front_end(&self.fe), None));
        // etcd takes at most 128 operations per transaction by default (nested ones count).
        for chunk in ops.chunks(50) {
            let txn = Txn::new().and_then(chunk.to_vec());
            let _ = tokio::time::timeout(self.config.request_timeout, self.txn(txn)).await;
        }
    }

    /// Reads the whole prefix into a fresh mirror; waiters and watchers learn what changed.
    pub(super) async fn resync(self: &Arc<Self>) -> Result<(), BackendError> {
        let resp = self
            .get(
                self.layout.prefix().to_owned(),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(unavailable)?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let changes: Vec<Change> = resp
            .kvs()
            .iter()
            .map(|kv| Change {
                put: true,
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                create_rev: kv.create_revision(),
                mod_rev: kv.mod_revision(),
                lease: kv.lease(),
            })
            .collect();
        let mut next = Vec::new();
        let touched: Vec<String> = {
            let mut g = self.guard();
            let g = &mut *g;
            let base = g.mirror.base;
            let old = std::mem::replace(
                &mut g.mirror,
                Mirror {
                    base,
                    ..Mirror::default()
                },
            );
            g.mirror.apply(&self.layout, &changes, rev, now());
            g.fresh.retain(|(_, at), _| *at > rev);
            let mut touched: Vec<String> = old.names.keys().cloned().collect();
            touched.extend(g.mirror.names.keys().cloned());
            // Grants made while the watch was behind, to waiters of ours (still waiting, or
            // gone: then they are taken back).
            let grants: Vec<Granted> = g
                .mirror
                .names
                .iter()
                .flat_map(|(name, ns)| ns.holders.values().map(move |h| Granted::of(base, name, h)))
                .filter(|gr| gr.fe == self.fe)
                .filter(|gr| g.by_uid.contains_key(&gr.uid) || g.left.contains(&gr.uid))
                .collect();
            for gr in &grants {
                next.push(on_grant(g, gr));
            }
            // Waiters of ours whose place another front-end took over while we were behind.
            let moved: Vec<String> = g
                .mirror
                .names
                .values()
                .flat_map(|ns| ns.queue.values())
                .filter(|w| w.value.fe != self.fe && g.by_uid.contains_key(&w.uid))
                .map(|w| w.uid.clone())
                .collect();
            for uid in moved {
                taken_over(g, &uid);
            }
            // Local waiters whose key is gone were replaced or lost with an old etcd lease.
            let gone: Vec<_> = g
                .waiting
                .iter()
                .filter(|(_, l)| {
                    l.rev != 0
                        && l.rev <= rev
                        && !l.confirming
                        && !g
                            .mirror
                            .name(&l.name)
                            .is_some_and(|ns| ns.queue.values().any(|w| w.uid == l.uid))
                })
                .map(|(w, _)| *w)
                .collect();
            for w in gone {
                if let Some(l) = g.waiting.remove(&w) {
                    g.by_uid.remove(&l.uid);
                    let _ = l.tx.send(WaitResult::Failed(BackendError::Unavailable(
                        "the wait was lost while etcd was unreachable".into(),
                    )));
                }
            }
            touched
        };
        self.after_grants(next);
        self.moved.notify_waiters();
        for name in touched {
            self.evaluate(&name);
        }
        Ok(())
    }

    /// Carries out what [`on_grant`] decided, off the guard.
    fn after_grants(self: &Arc<Self>, next: Vec<Next>) {
        for step in next {
            let me = Arc::clone(self);
            match step {
                Next::Nothing => {}
                Next::TakeBack(back) => {
                    tokio::spawn(async move {
                        me.take_back(&back.name, back.token, back.handover).await;
                    });
                }
                Next::Confirm(gr) => {
                    tokio::spawn(async move { me.confirm(gr).await });
                }
            }
        }
    }

    /// Takes a plain lease that another front-end granted to a waiter of this one off this
    /// front-end's etcd lease, and then tells the waiter (see [`Granted::unconfirmed`]):
    /// from then on it outlives this front-end, as a plain lease does. A waiter that left
    /// meanwhile has its grant taken back instead; a grant that changed or went before it
    /// was confirmed (this front-end's etcd lease ran out) is answered `ERR UNAVAILABLE`.
    async fn confirm(self: Arc<Self>, gr: Granted) {
        let holder = {
            let g = self.guard();
            g.mirror
                .name(&gr.name)
                .and_then(|ns| ns.holder_by_rev(gr.rev))
                .cloned()
        };
        let resp = match holder {
            Some(h) => {
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        h.key.clone(),
                        CompareOp::Equal,
                        gr.mod_rev,
                    )])
                    .and_then([TxnOp::put(h.key.clone(), h.value.encode(), None)]);
                self.cleanup(txn).await
            }
            None => None,
        };
        let confirmed = resp.filter(|r| r.succeeded()).map(|r| {
            self.wrote(&gr.name, &r);
            HandOver(r.header().map_or(0, |h| h.revision()))
        });
        let back = {
            let mut g = self.guard();
            match confirmed {
                Some(handover) if g.by_uid.contains_key(&gr.uid) || g.left.contains(&gr.uid) => {
                    deliver(&mut g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover)
                }
                // Nobody waits for it any more (the wait was lost with an etcd lease).
                Some(handover) => Some(TakeBack {
                    name: gr.name.clone(),
                    token: gr.token,
                    handover,
                }),
                None => {
                    g.left.remove(&gr.uid);
                    if let Some(waiter) = g.by_uid.remove(&gr.uid) {
                        if let Some(l) = g.waiting.remove(&waiter) {
                            let _ = l.tx.send(WaitResult::Failed(BackendError::Unavailable(
                                "the grant could not be confirmed with etcd".into(),
                            )));
                        }
                    }
                    None
                }
            }
        };
        if let Some(back) = back {
            self.take_back(&back.name, back.token, back.handover).await;
        }
    }

    /// Keeps the mirror from one watch of the whole prefix, resuming after the last revision
    /// seen when the stream breaks (so no change is missed or applied twice), and reading
    /// everything again if that revision was compacted away.
    async fn watch_loop(self: Arc<Self>) {
        loop {
            let from = self.guard().mirror.rev + 1;
            let opts = WatchOptions::new().with_prefix().with_start_revision(from);
            let mut client = self.client.clone();
            let stream = client.watch(self.layout.prefix(), Some(opts)).await;
            let mut stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    self.unhealthy(&format!("watch: {e}"));
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if resp.compact_revision() > 0 || resp.canceled() {
                            tracing::warn!(
                                compacted = resp.compact_revision(),
                                "etcd watch cancelled; reading every lock again"
                            );
                            while let Err(e) = self.resync().await {
                                self.unhealthy(&e.to_string());
                                tokio::time::sleep(RETRY).await;
                            }
                            break;
                        }
                        self.healthy.store(true, Ordering::Relaxed);
                        self.on_watch(resp);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.unhealthy(&format!("watch: {e}"));
                        tokio::time::sleep(RETRY).await;
                        break;
                    }
                }
            }
        }
    }

    pub(super) fn unhealthy(&self, why: &str) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(error = why, "etcd unreachable or without quorum");
        }
    }

    fn on_watch(self: &Arc<Self>, resp: WatchResponse) {
        let rev = resp.header().map_or(0, |h| h.revision());
        let changes: Vec<Change> = resp
            .events()
            .iter()
            .filter_map(|e| {
                let kv = e.kv()?;
                Some(Change {
                    put: e.event_type() == EventType::Put,
                    key: kv.key().to_vec(),
                    value: kv.value().to_vec(),
                    create_rev: kv.create_revision(),
                    mod_rev: kv.mod_revision(),
                    lease: kv.lease(),
                })
            })
            .collect();
        if changes.is_empty() {
            return;
        }
        let mut next = Vec::new();
        let applied = {
            let mut g = self.guard();
            let applied = g.mirror.apply(&self.layout, &changes, rev, now());
            for event in &applied.events {
                if event.kind != EventKind::Acquired {
                    g.bound.ended(event.token);
                }
            }
            let seen = g.mirror.rev;
            g.written.retain(|_, (at, _)| *at > seen);
            g.fresh.retain(|(_, rev), _| *rev > seen);
            // Grants of our waiters (a holder key takes its waiter's uid), made by this
            // front-end or by another one's release. A waiter that left meanwhile never
            // learns of it: the grant is taken back.
            for gr in &applied.granted {
                if gr.fe == self.fe {
                    next.push(on_grant(&mut g, gr));
                }
            }
            // Waiters of ours whose place a LOCK of the same id through another front-end
            // took over.
            for (_, uid, fe) in &applied.adopted {
                if *fe != self.fe {
                    taken_over(&mut g, uid);
                }
            }
            // A waiter of ours whose key went without its grant: replaced, or lost with its
            // etcd lease.
            for (_, uid) in &applied.waiters_gone {
                g.left.remove(uid);
                let Some(waiter) = g.by_uid.get(uid).copied() else {
                    continue;
                };
                // (Its own write not answered yet: the answer decides.)
                if g.waiting
                    .get(&waiter)
                    .is_some_and(|l| l.in_flight || l.confirming || l.mod_rev == 0)
                {
                    continue;
                }
                if let Some(l) = g.waiting.remove(&waiter) {
                    g.by_uid.remove(&l.uid);
                    let why = key_gone(&g.mirror, &l);
                    let _ = l.tx.send(why);
                }
            }
            // Published under the guard, so watchers see one name's events in order.
            if !applied.events.is_empty() && self.events.receiver_count() > 0 {
                let unix_ms = unix_ms();
                for event in &applied.events {
                    let _ = self.events.send(Arc::new(Published {
                        event: event.clone(),
                        unix_ms,
                    }));
                }
            }
            applied
        };
        self.after_grants(next);
        for event in &applied.events {
            if event.kind == EventKind::Dropped {
                // A holder on a front-end's etcd lease that ran out: nobody else logs it.
                tracing::info!(
                    name = &*event.name,
                    id = &*event.id,
                    token = event.token,
                    "lease ended with its front-end's etcd lease"
                );
            }
        }
        self.moved.notify_waiters();
        for name in &applied.touched {
            self.evaluate(name);
        }
    }

    /// Grants the head waiter of `name` if it is ours and fits. Only the head: the others
    /// follow one by one as each grant shows up in the watch, which keeps FIFO exact.
    pub(super) fn evaluate(self: &Arc<Self>, name: &str) {
        let attempt = {
            let mut g = self.guard();
            let g = &mut *g;
            let Some(ns) = g.mirror.name(name) else {
                return;
            };
            let Some(head) = ns.queue.values().next() else {
                return;
            };
            if head.value.fe != self.fe {
                return;
            }
            let Some(&waiter) = g.by_uid.get(&head.uid) else {
                // Ours but no longer waited for (its clean-up write was lost): take it out,
                // or it would stop the queue for as long as this front-end lives.
                // (It only spawns the write: the guard may stay held.)
                self.forget_waiter_key(head.key.clone(), head.mod_rev);
                return;
            };
            if g.mirror.rev < head.rev || !ns.admits(head.value.mode) {
                return;
            }
            let (marker_rev, last_rev, head_rev, head_mod) =
                (ns.marker_rev, ns.last_rev, head.rev, head.mod_rev);
            let Some(local) = g.waiting.get_mut(&waiter) else {
                return;
            };
            if local.in_flight || local.tried_at == Some(last_rev) {
                return;
            }
            local.in_flight = true;
            local.tried_at = Some(last_rev);
            local.rev = head_rev;
            let waited = now().saturating_duration_since(local.queued);
            let mut value = local.value.holder(wall_ms());
            value.waited_ms = Some(waited.as_millis() as u64);
            Attempt {
                waiter,
                name: name.to_owned(),
                id: local.req.id.clone(),
                key: local.key.clone(),
                uid: local.uid.clone(),
                rev: head_rev,
                mod_rev: head_mod,
                marker_rev,
                value,
                waited,
            }
        };
        let me = Arc::clone(self);
        tokio::spawn(async move { me.try_grant(attempt).await });
    }

    /// The grant of a head waiter: "the marker is as I saw it, my key is there, nobody is
    /// ahead of me" -> holder in, waiter out, marker written.
    async fn try_grant(self: Arc<Self>, a: Attempt) {
        let marker = self.layout.marker(&a.name);
        let holder_key = self.layout.holder(&a.name, &a.uid);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(marker.clone(), CompareOp::Equal, a.marker_rev),
                Compare::create_revision(a.key.clone(), CompareOp::Equal, a.rev),
                // Still this front-end's waiter (no other took its place over).
                Compare::mod_revision(a.key.clone(), CompareOp::Equal, a.mod_rev),
                Compare::create_revision(
                    self.layout.waiters(&a.name),
                    CompareOp::Greater,
                    a.rev - 1,
                )
                .with_prefix(),
            ])
            .and_then([
                TxnOp::put(marker, self.marker(EventKind::Acquired, 0), None),
                TxnOp::put(
                    holder_key,
                    a.value.encode(),
                    self.holder_put(a.value.session_ms.is_some()),
                ),
                TxnOp::delete(a.key.clone(), None),
            ]);
        let result = self.txn(txn).await;
        let granted = match &result {
            Ok(resp) if resp.succeeded() => {
                self.wrote(&a.name, resp);
                resp.header().map(|h| h.revision())
            }
            _ => None,
        };
        let Some(rev) = granted else {
            let retry_now = {
                let mut g = self.guard();
                let last = g.mirror.name(&a.name).map_or(0, |ns| ns.last_rev);
                let still_queued = g
                    .mirror
                    .name(&a.name)
                    .is_some_and(|ns| ns.queue.contains_key(&a.rev));
                let confirming = g.waiting.get(&a.waiter).is_some_and(|l| l.confirming);
                if result.is_ok() && !still_queued && g.mirror.rev >= a.rev && !confirming {
                    // Its key went while the grant was tried (a newer LOCK of its id).
                    if let Some(l) = g.waiting.remove(&a.waiter) {
                        g.by_uid.remove(&l.uid);
                        let why = key_gone(&g.mirror, &l);
                        let _ = l.tx.send(why);
                    }
                }
                match g.waiting.get_mut(&a.waiter) {
                    Some(local) => {
                        local.in_flight = false;
                        if result.is_err() {
                            // etcd unreachable: try again after a pause.
                            local.tried_at = None;
                        }
                        local.tried_at != Some(last)
                    }
                    None => false,
                }
            };
            if result.is_err() {
                tokio::time::sleep(RETRY).await;
            }
            if retry_now || result.is_err() {
                self.evaluate(&a.name);
            }
            return;
        };
        // The waiter hears of it now, or from the watch if that saw it first (the watch also
        // delivers a grant whose answer was lost on the way back).
        let (token, back) = {
            let mut g = self.guard();
            let token = g.mirror.token(rev);
            let handover = HandOver(rev);
            let back = deliver(&mut g, &a.uid, &a.name, token, a.value.ttl_ms, handover);
            (token, back)
        };
        self.granted_log(&a.name, &a.id, token, Some(a.waited));
        if let Some(back) = back {
            self.take_back(&back.name, back.token, back.handover).await;
        }
    }

    /// Keeps this front-end's etcd lease alive. If it lapses (etcd unreachable for longer
    /// than the lease), the session leases and waiters on it are gone: waiters are told,
    /// and a new lease is taken.
    async fn keep_alive_loop(self: Arc<Self>) {
        let period = (self.config.lease_ttl / 3).max(Duration::from_millis(100));
        loop {
            let mut client = self.client.clone();
            let id = self.lease_id();
            let (mut keeper, mut stream) = match client.lease_keep_alive(id).await {
                Ok(pair) => pair,
                Err(e) if lease_gone(&e) => {
                    self.lease_lost().await;
                    continue;
                }
                Err(e) => {
                    self.leased.store(false, Ordering::Relaxed);
                    self.unhealthy(&format!("keep-alive: {e}"));
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            loop {
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match tokio::time::timeout(self.config.request_timeout, stream.message()).await {
                    Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                        self.healthy.store(true, Ordering::Relaxed);
                        self.leased.store(true, Ordering::Relaxed);
                    }
                    Ok(Ok(Some(_))) => {
                        self.lease_lost().await;
                        break;
                    }
                    Ok(Err(e)) if lease_gone(&e) => {
                        self.lease_lost().await;
                        break;
                    }
                    _ => {
                        self.leased.store(false, Ordering::Relaxed);
                        self.unhealthy("keep-alive unanswered");
                        break;
                    }
                }
                tokio::time::sleep(period).await;
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn lease_lost(self: &Arc<Self>) {
        self.leased.store(false, Ordering::Relaxed);
        tracing::warn!(
            fe = self.fe,
            "this front-end's etcd lease lapsed: its session leases and waiters are gone"
        );
        let lost: Vec<_> = {
            let mut g = self.guard();
            g.by_uid.clear();
            g.waiting.drain().map(|(_, l)| l).collect()
        };
        for l in lost {
            let _ = l.tx.send(WaitResult::Failed(BackendError::Unavailable(
                "this front-end lost etcd for longer than its lease; the wait ended".into(),
            )));
        }
        while let Err(e) = self.take_lease().await {
            self.unhealthy(&e.to_string());
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Ends leases as their deadlines pass: a timer on the mirror's deadline index, not a
    /// sweep. A front-end expires the holders it granted; a holder whose front-end is gone is
    /// expired by the live front-end with the smallest id, so one write ends it.
    async fn expiry_loop(self: Arc<Self>) {
        loop {
            let moved = self.moved.notified();
            let (due, next) = {
                let mut g = self.guard();
                let at = now();
                let mut due = Vec::new();
                let mut next = None;
                let smallest = g.mirror.front_ends.iter().min().cloned();
                for (ends, name, rev) in g.mirror.ends.iter() {
                    if *ends > at {
                        next = Some(*ends);
                        break;
                    }
                    let Some(h) = g.mirror.name(name).and_then(|ns| ns.holder_by_rev(*rev)) else {
                        continue;
                    };
                    let owner_alive = g.mirror.front_ends.contains(&h.value.fe);
                    let mine = if owner_alive {
                        h.value.fe == self.fe
                    } else {
                        smallest.as_deref() == Some(self.fe.as_str())
                    };
                    if mine {
                        due.push((name.clone(), *rev, h.clone()));
                    }
                }
                due.retain(|(name, rev, _)| g.expiring.insert((name.clone(), *rev)));
                (due, next)
            };
            for (name, rev, holder) in due {
                let me = Arc::clone(&self);
                tokio::spawn(async move {
                    let kind = if holder.value.cut_ms > 0
                        && holder.value.cut_ms <= holder.value.deadline_ms
                    {
                        EventKind::Dropped
                    } else {
                        EventKind::Expired
                    };
                    let token = me.guard().mirror.token(rev);
                    me.expire(&name, token, kind, holder).await;
                    me.guard().expiring.remove(&(name, rev));
                });
            }
            let sleep = match next {
                Some(ends) => ends
                    .saturating_duration_since(now())
                    .max(Duration::from_millis(1)),
                // Nothing to expire: look again when the mirror moves (and now and then,
                // for a front-end that died while it owned leases).
                None => Duration::from_secs(1),
            };
            tokio::select! {
                _ = tokio::time::sleep(sleep.min(Duration::from_secs(1))) => {}
                _ = moved => {}
            }
        }
    }

    /// Expires one holder unless it was renewed meanwhile; then removes the name's marker if
    /// nothing is left under it.
    async fn expire(
        &self,
        name: &str,
        token: crate::locks::Token,
        kind: EventKind,
        holder: super::mirror::Holder,
    ) {
        // Unless renewed meanwhile (a renewal rewrites the key).
        let guard = Compare::mod_revision(holder.key.clone(), CompareOp::Equal, holder.mod_rev);
        let ended = self.end_txn(name, kind, &holder, guard);
        let Some(resp) = self.cleanup(ended.txn.clone()).await else {
            return;
        };
        let granted = ended.head.is_some() && resp.succeeded();
        if !self.ended(name, token, kind, &holder, &ended, &resp) || granted {
            // Not ended, or ended by granting the next waiter: nothing to tidy.
            return;
        }
        let marker = self.layout.marker(name);
        let rev = resp.header().map_or(0, |h| h.revision());
        let tidy = Txn::new()
            .when([
                Compare::mod_revision(marker.clone(), CompareOp::Equal, rev),
                Compare::version(self.layout.holders(name), CompareOp::Equal, 0).with_prefix(),
                Compare::version(self.layout.waiters(name), CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then([TxnOp::delete(marker, None)]);
        let _ = self.txn(tidy).await;
    }
}

/// Whether etcd says the lease kept alive no longer exists (it ran out while this front-end
/// could not reach etcd): then only a new lease helps, retrying the old one never does.
fn lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(why) => why.contains("not found"),
        etcd_client::Error::GRpcStatus(status) => status.message().contains("lease not found"),
        _ => false,
    }
}

/// How the wait of `l` ends when its key is gone without its grant: a newer LOCK of its id
/// (and user) took its place, in the same write, or else its front-end's etcd lease ran out.
pub(super) fn key_gone(mirror: &Mirror, l: &super::Local) -> WaitResult {
    let replaced = mirror.name(&l.name).is_some_and(|ns| {
        ns.queue
            .values()
            .any(|w| w.value.id == l.value.id && w.value.user == l.value.user)
    });
    if replaced {
        WaitResult::Ended(WaitEnd::Replaced)
    } else {
        WaitResult::Failed(BackendError::Unavailable(
            "the wait was lost: this front-end's etcd lease ran out".into(),
        ))
    }
}

/// A grant to take back: it was handed over as `handover` to a waiter that had left.
pub(super) struct TakeBack {
    name: String,
    token: Token,
    handover: HandOver,
}

/// What to do with a grant to a waiter of this front-end.
pub(super) enum Next {
    Nothing,
    TakeBack(TakeBack),
    Confirm(Granted),
}

/// A waiter of this front-end whose key another front-end rewrote for a LOCK of the same id
/// (its place taken over): its request is answered `ERR REPLACED`, as on one server.
fn taken_over(g: &mut State, uid: &str) {
    let Some(&waiter) = g.by_uid.get(uid) else {
        g.left.remove(uid);
        return;
    };
    // A request of ours whose own write (taking the place over) is not answered yet: the
    // record seen is the one it replaces.
    if g.waiting.get(&waiter).is_some_and(|l| l.mod_rev == 0) {
        return;
    }
    g.left.remove(uid);
    g.by_uid.remove(uid);
    if let Some(l) = g.waiting.remove(&waiter) {
        let _ = l.tx.send(WaitResult::Ended(WaitEnd::Replaced));
    }
}

/// Decides what a grant to waiter `gr.uid` of this front-end, just shown by the watch or a
/// read, leads to: delivered to its waiter now, confirmed first (a plain lease on this
/// front-end's etcd lease), or taken back (its waiter left; only as it was handed over).
fn on_grant(g: &mut State, gr: &Granted) -> Next {
    let handover = HandOver(gr.mod_rev);
    if gr.unconfirmed() {
        let waiter = g.by_uid.get(&gr.uid).copied();
        return match waiter.and_then(|w| g.waiting.get_mut(&w)) {
            Some(l) if l.confirming => Next::Nothing,
            Some(l) => {
                l.confirming = true;
                Next::Confirm(gr.clone())
            }
            // Its waiter left, or nobody waits for it here any more (the wait was lost
            // with an etcd lease): never told, so taken back.
            None => {
                g.left.remove(&gr.uid);
                Next::TakeBack(TakeBack {
                    name: gr.name.clone(),
                    token: gr.token,
                    handover,
                })
            }
        };
    }
    match deliver(g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover) {
        Some(back) => Next::TakeBack(back),
        None => Next::Nothing,
    }
}

/// Hands a grant made for waiter `uid` to it, once (from the grant's answer or from the watch,
/// whichever comes first). A waiter that left meanwhile never learns of it: the grant to take
/// back is returned. A request waiting under `uid` comes first: one that took over the place
/// of a request of its id that left (the same LOCK again) is the one the grant is for, and
/// the older one's leaving no longer counts (taking the grant back after handing it over
/// would leave a client told it holds a lock that passed on).
fn deliver(
    g: &mut State,
    uid: &str,
    name: &str,
    token: Token,
    ttl_ms: u64,
    handover: HandOver,
) -> Option<TakeBack> {
    let back = || TakeBack {
        name: name.to_owned(),
        token,
        handover,
    };
    let waiting = g
        .by_uid
        .get(uid)
        .copied()
        .filter(|w| g.waiting.contains_key(w));
    let Some(waiter) = waiting else {
        // Left: taken back. Else not waited for here (another front-end's, or delivered
        // already): nothing to do.
        return g.left.remove(uid).then(back);
    };
    g.left.remove(uid);
    g.by_uid.remove(uid);
    let local = g.waiting.remove(&waiter)?;
    let deadline = now() + Duration::from_millis(ttl_ms);
    let sent = local.tx.send(WaitResult::Granted {
        token,
        deadline,
        handover,
    });
    if sent.is_ok() && local.req.session.is_some() {
        // The backend ends it when its connection closes.
        g.bound.add(local.req.conn, token, name);
    }
    sent.is_err().then(back)
}

/// A grant being tried for a head waiter.
struct Attempt {
    waiter: crate::locks::WaiterId,
    name: String,
    id: String,
    key: String,
    uid: String,
    rev: i64,
    mod_rev: i64,
    marker_rev: i64,
    value: super::keys::HolderValue,
    waited: Duration,
}
