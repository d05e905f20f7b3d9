//! Leases in the in-memory etcd, and time: a lease is granted, kept alive, revoked or, once
//! [`MemEtcd::advance`] brings its time, expired (its keys deleted at one revision), with no
//! clock of the store's own, so that a run replays exactly.

use std::collections::BTreeSet;

use super::super::pb;
use super::{Lease, MemError, MemEtcd};

/// A key a lease's expiry deleted, and its create revision.
pub type TakenKey = (Vec<u8>, i64);

impl MemEtcd {
    /// `LeaseGrant`: `id` 0 takes the next free one.
    pub fn lease_grant(&mut self, ttl: i64, id: i64) -> pb::LeaseGrantResponse {
        let id = match id {
            0 => {
                // As etcd, never an id used before (a lease's id is not reused).
                while self.leases.contains_key(&self.next_lease) {
                    self.next_lease += 1;
                }
                self.next_lease += 1;
                self.next_lease - 1
            }
            id => id,
        };
        self.leases.insert(
            id,
            Lease {
                ttl,
                expires_ms: self.now_ms.saturating_add(ttl.max(0) as u64 * 1000),
                keys: BTreeSet::new(),
            },
        );
        pb::LeaseGrantResponse {
            header: self.header(),
            id,
            ttl,
        }
    }

    /// `LeaseKeepAlive`: its ttl again from now; the ttl, or `LeaseNotFound`.
    pub fn keep_alive(&mut self, id: i64) -> Result<i64, MemError> {
        let now = self.now_ms;
        let lease = self.leases.get_mut(&id).ok_or(MemError::LeaseNotFound)?;
        lease.expires_ms = now.saturating_add(lease.ttl.max(0) as u64 * 1000);
        Ok(lease.ttl)
    }

    /// `LeaseRevoke`: its keys deleted in one revision.
    pub fn revoke(&mut self, id: i64) -> Result<(), MemError> {
        let lease = self.leases.remove(&id).ok_or(MemError::LeaseNotFound)?;
        if lease.keys.is_empty() {
            return Ok(());
        }
        let rev = self.revision + 1;
        for key in &lease.keys {
            self.delete(key, &[], rev);
        }
        self.revision = rev;
        Ok(())
    }

    /// Time passes to `now_ms`: every lease whose time is up is revoked, soonest first.
    /// Returns the leases that expired, each with the keys it took and their create
    /// revisions.
    pub fn advance(&mut self, now_ms: u64) -> Vec<(i64, Vec<TakenKey>)> {
        self.now_ms = self.now_ms.max(now_ms);
        let mut expired = Vec::new();
        loop {
            let due = self
                .leases
                .iter()
                .filter(|(_, l)| l.expires_ms <= self.now_ms)
                .min_by_key(|(id, l)| (l.expires_ms, **id))
                .map(|(id, _)| *id);
            let Some(id) = due else { break };
            let created = self.leases.get(&id).map_or_else(Vec::new, |l| {
                let records = l.keys.iter().filter_map(|k| Some((k, self.kv.get(k)?)));
                records.map(|(k, r)| (k.clone(), r.create)).collect()
            });
            let _ = self.revoke(id);
            expired.push((id, created));
        }
        expired
    }
}
