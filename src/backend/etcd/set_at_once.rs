//! A LOCK of a set granted at once (every name free, nobody waiting), as the front-end's
//! core decides it: the one write that makes a holder key on every name (one create
//! revision: one token on every name), guarded on each name as a grant at once of one name
//! is (`at_once.rs`), in one empty slot; and what its answer leaves behind (every name
//! remembered as written, the grant kept as fresh until the watch shows it). Pure:
//! `sets.rs` is its driver.

use std::time::{Duration, Instant};

use super::rpc::{PutOptions, Txn, TxnOp};

use crate::locks::Token;

use super::keys::Layout;
use super::mirror::HolderRecord;
use super::values::HolderValue;
use super::{guards, ClusterState};

/// A set's grant at once being made.
pub(super) struct SetAtOnce {
    /// Every name of the set, in the request's order.
    pub(super) names: Vec<String>,
    pub(super) uid: String,
    /// The slot of its keys, on every name.
    pub(super) slot: String,
    pub(super) value: HolderValue,
    /// This front-end's etcd lease for a session lease; 0 for a plain one.
    pub(super) lease: i64,
    pub(super) ttl: Duration,
}

impl SetAtOnce {
    /// Its write, if every name's marker is still at its revision in `marker_revs` (in the
    /// order of the names; `marker`: the value it writes there).
    pub(super) fn txn(&self, layout: &Layout, marker_revs: &[i64], marker: &str) -> Txn {
        let encoded = self.value.encode();
        let mut when = Vec::new();
        let mut ops = Vec::new();
        for (name, marker_rev) in self.names.iter().zip(marker_revs) {
            when.extend(guards::grant_at_once(layout, name, *marker_rev));
            ops.push(TxnOp::put(layout.marker(name), marker.to_owned(), None));
            ops.push(TxnOp::put(
                layout.holder(name, &self.slot),
                encoded.clone(),
                (self.lease != 0).then(|| PutOptions::new().with_lease(self.lease)),
            ));
        }
        let write = Txn::new().when(when).and_then(ops);
        guards::in_empty_slot(layout, self.each(), &self.slot, write)
    }

    /// Its names, as the slot's guards and answers take them.
    pub(super) fn each(&self) -> impl Iterator<Item = &str> + Clone {
        self.names.iter().map(String::as_str)
    }
}

/// Steps the core with set grant `a`'s write applied at revision `rev` (its slot written):
/// every name is remembered as written, and the grant as fresh on every name until the watch
/// brings it (an UNLOCK or RENEW right after needs no read); its token, one for every name.
pub(super) fn granted_set_at_once(
    g: &mut ClusterState,
    layout: &Layout,
    a: &SetAtOnce,
    rev: i64,
    now: Instant,
) -> Token {
    for name in &a.names {
        g.wrote(name, rev, false);
    }
    if rev > g.mirror.rev {
        for name in &a.names {
            let holder = HolderRecord {
                key: layout.holder(name, &a.slot),
                slot: a.slot.clone(),
                uid: a.uid.clone(),
                rev,
                mod_rev: rev,
                lease: a.lease,
                ends_at: now + a.ttl,
                keyless: false,
                value: a.value.clone(),
            };
            g.fresh.insert((name.clone(), rev), holder);
        }
    }
    g.mirror.token(rev, &a.slot)
}
