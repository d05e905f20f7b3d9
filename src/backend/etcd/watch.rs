//! The watch that keeps the mirror: one stream of every change under the prefix in revision
//! order, resumed after the last revision seen when it breaks (`resync.rs` reads everything
//! again when it can't be), each message applied to the mirror and acted on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rpc::{EventType, WatchOptions, WatchResponse};

use crate::backend::{now, unix_ms, Published};
use crate::locks::{EventKind, WaitEnd};

use super::handover::{on_grant, taken_over};
use super::keys::Key;
use super::marks::SupersededValue;
use super::mirror::KeyChange;
use super::waiters::key_gone;
use super::Cluster;
use super::RETRY;

/// How long the watch may stay broken before that is warned of as an etcd outage (a member's
/// restart or an election heals well within it).
const WATCH_OUTAGE: Duration = Duration::from_secs(10);

/// How often the watch is asked for its progress.
const PROGRESS: std::time::Duration = std::time::Duration::from_secs(1);

impl Cluster {
    /// Says that a front-end of an older lockd shares this prefix, as its key shows up.
    pub(super) fn warn_older(&self, applied: &super::apply::Applied) {
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

    /// Keeps the mirror from one watch of the whole prefix, resuming after the last revision
    /// seen when the stream breaks (so no change is missed or applied twice), and reading
    /// everything again if that revision was compacted away.
    pub(super) async fn watch_loop(self: Arc<Self>) {
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
