//! Reading every lock again: the whole prefix into a fresh mirror, at start and whenever the
//! watch can't resume (a compaction overtook it). The driver of `resynced.rs`, which decides
//! what changed meanwhile and what this front-end's waiters are told; this file reads,
//! publishes the gap's events, sends the writes and carries out the grants' actions.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::rpc::GetOptions;

use crate::backend::{now, BackendError};

use super::mirror::KeyChange;
use super::resynced::{reread, resynced, Resynced};
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
        let me = self.me();
        let Resynced { grants, touched } = {
            let mut g = self.guard();
            let reread = reread(&mut g, &me, &changes, rev, (now(), super::wall_ms()));
            self.warn_older(&reread.applied);
            for (keys, mod_rev) in reread.forget {
                self.forget_waiter_keys(keys, mod_rev);
            }
            // Under the guard, before any waiter is answered, as the watch would tell it.
            self.publish(&reread.events);
            resynced(&mut g, &me, &reread.old, rev, now())
        };
        self.after_grants(grants);
        self.moved.notify_waiters();
        for name in touched {
            self.evaluate(&name);
        }
        Ok(())
    }
}
