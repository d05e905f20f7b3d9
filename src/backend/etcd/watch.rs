//! The watch that keeps the mirror: one stream of every change under the prefix in revision
//! order, resumed after the last revision seen when it breaks (`resync.rs` reads everything
//! again when it can't be), each message applied to the mirror and acted on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rpc::{EventType, WatchOptions, WatchResponse};

use crate::backend::now;
use crate::locks::EventKind;

use super::mirror::KeyChange;
use super::watched::watched;
use super::Cluster;
use super::RETRY;

/// How long the watch may stay broken before that is warned of as an etcd outage (a member's
/// restart or an election heals well within it).
const WATCH_OUTAGE: Duration = Duration::from_secs(10);

/// How often the watch is asked for its progress.
const PROGRESS: std::time::Duration = std::time::Duration::from_secs(1);

impl Cluster {
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
                            self.heard_from_etcd();
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
        let me = self.me();
        let watched = {
            let mut g = self.guard();
            let seen = (now(), super::wall_ms());
            let mut watched = watched(&mut g, &me, &changes, rev, seen);
            for (keys, mod_rev) in std::mem::take(&mut watched.forget) {
                self.forget_waiter_keys(keys, mod_rev);
            }
            // Published under the guard, so watchers see one name's events in order.
            self.publish(&watched.applied.events);
            watched
        };
        self.warn_older(&watched.applied);
        let (applied, next) = (watched.applied, watched.grants);
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
