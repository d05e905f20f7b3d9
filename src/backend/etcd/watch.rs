//! The watch that keeps the mirror: a full read at start (and after a compaction or a lost
//! stream), then every change in revision order; and the background tasks' start.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rpc::{EventType, GetOptions, Txn, TxnOp, WatchOptions, WatchResponse};
use tokio_util::sync::CancellationToken;

use crate::backend::{now, unix_ms, BackendError, Published, WaitResult};
use crate::locks::{EventKind, WaitEnd};

use super::handover::{on_grant, taken_over};
use super::keys::Key;
use super::marks::SupersededValue;
use super::mirror::{Granted, KeyChange, Mirror};
use super::waiters::key_gone;
use super::Cluster;
use super::RETRY;

/// How long the watch may stay broken before that is warned of as an etcd outage (a member's
/// restart or an election heals well within it).
const WATCH_OUTAGE: Duration = Duration::from_secs(10);

/// How often the watch is asked for its progress.
const PROGRESS: std::time::Duration = std::time::Duration::from_secs(1);

impl Cluster {
    /// Runs the watch, the keep-alive, the expiry timer, the quorum probe and the route to
    /// etcd's leader until `shutdown`. Then this
    /// front-end's waiters leave the queue and it says it is gone (another front-end takes
    /// over expiring its plain leases), but its etcd lease is left to run out rather than
    /// revoked: a session lease's holder has until then to reconnect to another front-end
    /// and RENEW, as it would ride out the restart of a single server.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::select! {
            biased;
            _ = Arc::clone(&self).watch_loop() => {}
            _ = Arc::clone(&self).keep_alive_loop() => {}
            _ = Arc::clone(&self).expiry_loop() => {}
            _ = Arc::clone(&self).probe_loop() => {}
            _ = Arc::clone(&self).route_loop() => {}
            _ = shutdown.cancelled() => {}
        }
        // Each waiter key only if it is still this front-end's write (not taken over); a
        // set's keys one by one, so that the chunks below stay within etcd's bound (they
        // hang on this front-end's etcd lease anyway).
        let mut ops: Vec<TxnOp> = {
            let g = self.guard();
            g.waiting
                .values()
                .flat_map(|l| {
                    self.local_keys(l)
                        .into_iter()
                        .map(|k| TxnOp::txn(super::waiters::forget_txn(&[k], l.mod_rev)))
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

    /// Says that a front-end of an older lockd shares this prefix, as its key shows up.
    fn warn_older(&self, applied: &super::apply::Applied) {
        for fe in &applied.older_front_ends {
            tracing::warn!(
                fe = self.fe,
                older = fe,
                prefix = self.layout.prefix(),
                "a front-end of an older lockd shares this prefix: a grant it makes to a \
                 waiter of this one is taken back, and the wait fails; stop the older \
                 front-ends before starting new ones"
            );
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
            .map_err(|e| self.unavailable(&e))?;
        let rev = resp.header().map_or(0, |h| h.revision());
        self.watch_rev.fetch_max(rev, Ordering::Relaxed);
        self.seen_rev.fetch_max(rev, Ordering::Relaxed);
        let changes: Vec<KeyChange> = resp.kvs().iter().map(|kv| change(kv, true)).collect();
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
            let applied = g.mirror.apply(&self.layout, &changes, rev, now());
            self.warn_older(&applied);
            self.sweep_orphans(g, &applied.waiters_new);
            g.fresh.retain(|(_, at), _| *at > rev);
            // What the gap held, told as the watch would have told it.
            super::gap::keep_delays(&old, &mut g.mirror, now());
            let events = super::gap::events(&old, &g.mirror);
            for event in events.iter().filter(|e| e.kind != EventKind::Acquired) {
                g.bound.ended(event.token);
            }
            self.publish(&events);
            // Slots whose keys went while the watch was behind: a key the old mirror showed
            // was written, so its slot is free once the new one shows none on that name.
            for (name, ns) in &old.names {
                let slots = ns.holders.values().map(|h| &h.slot);
                for slot in slots.chain(ns.queue.values().map(|w| &w.slot)) {
                    if !g.mirror.name(name).is_some_and(|now| now.uses_slot(slot)) {
                        g.slots.gone(slot);
                    }
                }
            }
            let mut touched: Vec<String> = old.names.keys().cloned().collect();
            touched.extend(g.mirror.names.keys().cloned());
            // Grants made while the watch was behind, to waiters of ours (still waiting, or
            // gone: then they are taken back).
            let grants: Vec<Granted> = g
                .mirror
                .names
                .iter()
                .flat_map(|(name, ns)| {
                    let keyed = ns.holders.values().filter(|h| !h.keyless);
                    keyed.map(move |h| Granted::of(base, name, h))
                })
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
                        && l.phase.settled()
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

    /// Keeps the mirror from one watch of the whole prefix, resuming after the last revision
    /// seen when the stream breaks (so no change is missed or applied twice), and reading
    /// everything again if that revision was compacted away.
    async fn watch_loop(self: Arc<Self>) {
        // Since when the watch is broken, if it is, and whether that was warned of.
        let mut down_since: Option<(Instant, bool)> = None;
        loop {
            let from = self.guard().mirror.rev + 1;
            let opts = WatchOptions::new().with_prefix().with_start_revision(from);
            let mut client = self.client.clone();
            let stream = client.watch(self.layout.prefix(), Some(opts)).await;
            let (mut requests, mut stream) = match stream {
                Ok(s) => s.split(),
                Err(e) => {
                    self.watch_broke(&e, &mut down_since);
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            // Asked now and then where the watch is (a progress answer carries the current
            // revision once everything before it was delivered), so the lag gauge shows the
            // mirror's real lag, not revisions of keys outside the prefix.
            let mut progress = tokio::time::interval(PROGRESS);
            progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let lag = super::lag::watch_lag();
            loop {
                let message = tokio::select! {
                    biased;
                    message = stream.message() => message,
                    _ = progress.tick() => {
                        // Bounded: the request channel of a stalled stream may be full, and
                        // the stream must still be read meanwhile.
                        let ask = requests.request_progress();
                        let _ = tokio::time::timeout(PROGRESS, ask).await;
                        continue;
                    }
                };
                match message {
                    Ok(Some(resp)) => {
                        if resp.compact_revision() > 0 || resp.canceled() {
                            let reason = resp.cancel_reason();
                            tracing::warn!(
                                compacted = resp.compact_revision(),
                                reason = reason.strip_prefix("etcdserver: ").unwrap_or(reason),
                                "etcd watch cancelled; reading every lock again"
                            );
                            while let Err(e) = self.resync().await {
                                self.unhealthy(&e.to_string());
                                tokio::time::sleep(RETRY).await;
                            }
                            break;
                        }
                        if let Some((since, _)) = down_since.take() {
                            let after = Duration::from_millis(
                                now().saturating_duration_since(since).as_millis() as u64,
                            );
                            tracing::info!(
                                after = %humantime::format_duration(after),
                                "etcd watch healthy again"
                            );
                            self.healthy.store(true, Ordering::Relaxed);
                        }
                        if let Some(lag) = lag {
                            tokio::time::sleep(lag).await;
                        }
                        self.on_watch(resp);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.watch_broke(&e, &mut down_since);
                        tokio::time::sleep(RETRY).await;
                        break;
                    }
                }
            }
        }
    }

    /// The watch failed with `e`. A break is routine (a member restarted or stepped down, an
    /// election: the balanced channel's error names every endpoint, whichever one failed), so
    /// it is said at info, as an election when it is one; only a watch still broken after
    /// [`WATCH_OUTAGE`] is an outage ([`Cluster::unhealthy`], a warning). `down_since` keeps
    /// when it broke and whether that was warned of, for the line that says it is back.
    fn watch_broke(&self, e: &super::rpc::Error, down_since: &mut Option<(Instant, bool)>) {
        let cause = self.explain(e);
        let (since, warned) = down_since.get_or_insert_with(|| (now(), false));
        if !*warned && now().saturating_duration_since(*since) >= WATCH_OUTAGE {
            *warned = true;
            self.unhealthy(&format!("the etcd watch failed: {}", cause.sentence));
        } else if cause.kind == super::cause::Kind::NoLeader {
            tracing::info!(
                cause = cause.sentence,
                "etcd is electing a leader; watching again"
            );
        } else {
            tracing::info!(
                cause = cause.sentence,
                "the etcd watch broke; watching again"
            );
        }
    }

    /// Tells watchers `events` (called under the guard, so they see one name's in order).
    pub(super) fn publish(&self, events: &[crate::locks::Event]) {
        if events.is_empty() || self.events.receiver_count() == 0 {
            return;
        }
        let unix_ms = unix_ms();
        for event in events {
            let _ = self.events.send(Arc::new(Published {
                event: event.clone(),
                unix_ms,
            }));
        }
    }

    fn on_watch(self: &Arc<Self>, resp: WatchResponse) {
        let rev = resp.header().map_or(0, |h| h.revision());
        // Everything up to the header's revision is delivered (a progress answer carries no
        // event and says just that).
        self.watch_rev.fetch_max(rev, Ordering::Relaxed);
        self.seen_rev.fetch_max(rev, Ordering::Relaxed);
        let changes: Vec<KeyChange> = resp
            .events()
            .iter()
            .filter_map(|e| Some(change(e.kv()?, e.event_type() == EventType::Put)))
            .collect();
        if changes.is_empty() {
            return;
        }
        let mut next = Vec::new();
        let applied = {
            let mut g = self.guard();
            let applied = g.mirror.apply(&self.layout, &changes, rev, now());
            self.warn_older(&applied);
            self.sweep_orphans(&mut g, &applied.waiters_new);
            for (_, slot) in &applied.slots_gone {
                g.slots.gone(slot);
            }
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
            // A grant of ours being confirmed, taken off its etcd lease: the confirmation's
            // own write, maybe, shown before its answer (`on_grant` delivers it then).
            for gr in &applied.off_lease {
                let confirming = g
                    .waiting_mut(&gr.uid)
                    .is_some_and(|l| l.phase.confirming().is_some());
                if gr.fe == self.fe && confirming {
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
            // Marks of waiters of ours that a `supersede` LOCK took the queue from (written
            // before their keys' deletes, in the same transaction).
            for c in changes.iter().filter(|c| c.put) {
                if let Some(Key::Superseded { name, uid }) = self.layout.parse(&c.key) {
                    let mark = SupersededValue::decode(&c.value);
                    if let (Some(mark), true) = (mark, g.waits_on(&uid, &name)) {
                        let why = if mark.same_id {
                            WaitEnd::Replaced
                        } else {
                            WaitEnd::Superseded { by: mark.by.into() }
                        };
                        g.superseded.insert(uid, why);
                    }
                }
            }
            // A waiter of ours whose key went without its grant: replaced, superseded, or
            // lost with its etcd lease.
            for (name, uid) in &applied.waiters_gone {
                g.left.remove(uid);
                // (A key of the uid on a name it no longer waits on: the rest of a set whose
                // place on one name a LOCK of that name took over.)
                if !g.waits_on(uid, name) {
                    continue;
                }
                let Some(waiter) = g.by_uid.get(uid).copied() else {
                    continue;
                };
                // (Its own write not answered yet, or the one taking it out: the answer
                // decides.)
                if g.waiting.get(&waiter).is_some_and(|l| !l.phase.settled()) {
                    continue;
                }
                if let Some(l) = g.waiting.remove(&waiter) {
                    g.by_uid.remove(&l.uid);
                    let why = key_gone(&mut g, &l);
                    let _ = l.tx.send(why);
                }
            }
            // Published under the guard, so watchers see one name's events in order.
            self.publish(&applied.events);
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
}

/// A key as etcd sent it (a read, or a watch event: `put` false for a delete), as the mirror
/// applies it.
pub(super) fn change(kv: &super::rpc::KeyValue, put: bool) -> KeyChange {
    KeyChange {
        put,
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_rev: kv.create_revision(),
        mod_rev: kv.mod_revision(),
        lease: kv.lease(),
    }
}
