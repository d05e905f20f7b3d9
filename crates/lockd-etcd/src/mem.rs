//! An in-memory etcd: the part of etcd's v3 API lockd relies on, over the same messages the
//! client sends and gets (`pb::TxnRequest` in, `pb::TxnResponse` out), with no I/O and no
//! clock of its own (time passes only through [`MemEtcd::advance`]), so that a simulator can
//! step it and replay any run. Kept honest by a differential test against a real etcd
//! (`mem_tests.rs`): the same operations, the same answers.
//!
//! What it keeps as etcd does: one global revision (1 for an empty store), bumped once by a
//! transaction that writes anything; per key its create and mod revisions, version and lease;
//! compares over one key or a range (every key in the range must pass; a range with no key
//! compares a key of zeros, and never passes on its value); nested transactions; leases with
//! a ttl, kept alive, revoked or expired (each expiry one revision that deletes its keys); a
//! history of events for watches from a revision, and compaction (a watch from below it gets
//! the compacted revision instead).
//!
//! This file: the store, its reads and its history (watches, compaction); `mem/txn.rs`: a
//! transaction (etcd's checks, the branches, the writes); `mem/lease.rs`: leases and time.

mod lease;
mod txn;

pub(crate) use txn::count_ops;

use std::collections::{BTreeMap, BTreeSet};

use super::mvccpb;
use super::pb;

/// etcd's limit on the operations of one transaction (`--max-txn-ops`, default 128).
pub const MAX_TXN_OPS: usize = 128;

/// Why a request failed without changing anything (etcd's gRPC errors lockd tells apart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemError {
    /// A put named a lease that does not exist ("requested lease not found").
    LeaseNotFound,
    /// More operations than [`MAX_TXN_OPS`] ("too many operations in txn request").
    TooManyOps,
    /// One branch writes a key twice, or puts a key it also deletes ("duplicate key given in
    /// txn request"; nested transactions count, their two branches excepted from each other).
    DuplicateKey,
    /// A watch from a compacted revision; the compaction's revision.
    Compacted(i64),
}

/// One key's record.
#[derive(Clone, Debug)]
struct Record {
    value: Vec<u8>,
    create: i64,
    modified: i64,
    version: i64,
    lease: i64,
}

/// A lease: its ttl (seconds), when it expires (ms on the caller's clock), its keys.
#[derive(Clone, Debug)]
struct Lease {
    ttl: i64,
    expires_ms: u64,
    keys: BTreeSet<Vec<u8>>,
}

/// The store.
#[derive(Clone, Debug)]
pub struct MemEtcd {
    revision: i64,
    kv: BTreeMap<Vec<u8>, Record>,
    /// Every event since the last compaction, in revision order.
    history: Vec<mvccpb::Event>,
    compacted: i64,
    leases: BTreeMap<i64, Lease>,
    next_lease: i64,
    now_ms: u64,
    /// Operations a transaction may have (etcd's `--max-txn-ops`).
    max_txn_ops: usize,
}

impl Default for MemEtcd {
    fn default() -> Self {
        MemEtcd {
            revision: 1,
            max_txn_ops: MAX_TXN_OPS,
            kv: BTreeMap::new(),
            history: Vec::new(),
            compacted: 0,
            leases: BTreeMap::new(),
            next_lease: 1,
            now_ms: 0,
        }
    }
}

/// The keys `[key, range_end)` as etcd reads a request's pair: an empty `range_end` is the
/// key alone, `"\0"` every key from `key` on.
fn in_range(key: &[u8], range_end: &[u8], k: &[u8]) -> bool {
    match range_end {
        [] => k == key,
        [0] => k >= key,
        end => k >= key && k < end,
    }
}

impl MemEtcd {
    pub fn new() -> MemEtcd {
        MemEtcd::default()
    }

    /// Sets the operations a transaction may have, as etcd's `--max-txn-ops` does.
    pub fn set_max_txn_ops(&mut self, n: usize) {
        self.max_txn_ops = n;
    }

    /// The current revision.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    fn header(&self) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            revision: self.revision,
            ..Default::default()
        })
    }

    /// `Range`.
    pub fn range(&self, req: &pb::RangeRequest) -> pb::RangeResponse {
        let kvs = self.read(&req.key, &req.range_end);
        pb::RangeResponse {
            header: self.header(),
            count: kvs.len() as i64,
            kvs: if req.count_only { Vec::new() } else { kvs },
            more: false,
        }
    }

    fn read(&self, key: &[u8], range_end: &[u8]) -> Vec<mvccpb::KeyValue> {
        self.entries(key, range_end)
            .map(|(k, r)| key_value(k, r))
            .collect()
    }

    /// The records of the keys in `[key, range_end)` ([`in_range`]), in key order, without
    /// a look at any key past them.
    fn entries<'a>(
        &'a self,
        key: &'a [u8],
        range_end: &'a [u8],
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a Record)> + 'a {
        self.kv
            .range(key.to_vec()..)
            .take_while(move |(k, _)| in_range(key, range_end, k))
    }

    /// Forgets the history up to `rev`: a watch from there or before is told it was
    /// compacted.
    pub fn compact(&mut self, rev: i64) {
        self.compacted = self.compacted.max(rev.min(self.revision));
        let upto = self.compacted;
        self.history.retain(|e| event_rev(e) > upto);
    }

    /// The events of keys in `[key, range_end)` from revision `from` on, in order; or the
    /// revision the history was compacted at, if `from` is not after it.
    pub fn watch(
        &self,
        key: &[u8],
        range_end: &[u8],
        from: i64,
    ) -> Result<Vec<mvccpb::Event>, MemError> {
        if from != 0 && from <= self.compacted {
            return Err(MemError::Compacted(self.compacted));
        }
        let start = self.history.partition_point(|e| event_rev(e) < from);
        Ok(self.history[start..]
            .iter()
            .filter(|e| {
                e.kv.as_ref()
                    .is_some_and(|kv| in_range(key, range_end, &kv.key))
            })
            .cloned()
            .collect())
    }
}

fn event_rev(e: &mvccpb::Event) -> i64 {
    e.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

fn key_value(k: &[u8], r: &Record) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: k.to_vec(),
        create_revision: r.create,
        mod_revision: r.modified,
        version: r.version,
        value: r.value.clone(),
        lease: r.lease,
    }
}

#[cfg(test)]
#[path = "mem_tests.rs"]
pub(crate) mod tests;
