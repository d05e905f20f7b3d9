//! Reading every lock again: the whole prefix into a fresh mirror, at start and whenever the
//! watch can't resume (a compaction overtook it). What changed meanwhile is told as the watch
//! would have told it: to watchers (`gap.rs`), to this front-end's waiters (grants, places
//! taken over, waits lost), and to its slots.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::rpc::GetOptions;

use crate::backend::{now, BackendError, WaitResult};
use crate::locks::EventKind;

use super::delivery::{on_grant, taken_over};
use super::mirror::{Granted, KeyChange, Mirror};
use super::watch::change;
use super::Cluster;

impl Cluster {
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
            let wall_ms = super::wall_ms();
            let applied = g.mirror.apply(&self.layout, &changes, rev, now(), wall_ms);
            self.warn_older(&applied);
            self.sweep_orphans(g, &applied.waiters_new);
            g.fresh.retain(|(_, at), _| *at > rev);
            // What the gap held, told as the watch would have told it.
            super::gap::keep_delays(&old, &mut g.mirror, now());
            let events = super::gap::events(&old, &g.mirror, wall_ms);
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
                next.push(on_grant(g, gr, now()));
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
}
