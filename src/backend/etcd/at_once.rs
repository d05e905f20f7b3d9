//! A LOCK granted at once (a free name nobody waits for), as the front-end's core decides
//! it: the one write that makes the holder, guarded by "the marker is as I saw it, nobody
//! holds or waits, the slot is empty", and what its answer leaves behind (the grant kept as
//! fresh until the watch shows it). Pure: `grant.rs` is its driver.

use std::time::{Duration, Instant};

use super::rpc::{PutOptions, Txn, TxnOp};

use crate::locks::Token;

use super::keys::Layout;
use super::mirror::HolderRecord;
use super::values::HolderValue;
use super::{guards, ClusterState};

/// A grant at once being made.
pub(super) struct AtOnce {
    pub(super) name: String,
    pub(super) uid: String,
    /// Its key's slot, and its key.
    pub(super) slot: String,
    pub(super) key: String,
    pub(super) value: HolderValue,
    /// This front-end's etcd lease for a session lease; 0 for a plain one.
    pub(super) lease: i64,
    pub(super) ttl: Duration,
}

impl AtOnce {
    /// Its write, if the name's marker is still at `marker_rev` (`marker`: the value it
    /// writes there).
    pub(super) fn txn(&self, layout: &Layout, marker_rev: i64, marker: &str) -> Txn {
        let put = (self.lease != 0).then(|| PutOptions::new().with_lease(self.lease));
        let write = Txn::new()
            .when(guards::grant_at_once(layout, &self.name, marker_rev))
            .and_then([
                TxnOp::put(layout.marker(&self.name), marker.to_owned(), None),
                TxnOp::put(self.key.clone(), self.value.encode(), put),
            ]);
        guards::in_empty_slot(layout, [self.name.as_str()], &self.slot, write)
    }
}

/// Steps the core with grant `a`'s write applied at revision `rev` (its slot written): it is
/// remembered as written, and as a fresh grant until the watch brings it (an UNLOCK or RENEW
/// right after needs no read); its token.
pub(super) fn granted_at_once(g: &mut ClusterState, a: AtOnce, rev: i64, now: Instant) -> Token {
    g.wrote(&a.name, rev, false);
    let token = g.mirror.token(rev, &a.slot);
    if rev > g.mirror.rev {
        let holder = HolderRecord {
            key: a.key,
            slot: a.slot,
            uid: a.uid,
            rev,
            mod_rev: rev,
            lease: a.lease,
            ends_at: now + a.ttl,
            keyless: false,
            value: a.value,
        };
        g.fresh.insert((a.name, rev), holder);
    }
    token
}
