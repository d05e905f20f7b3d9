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

use std::collections::{BTreeMap, BTreeSet};

use super::mvccpb::{self, event::EventType};
use super::pb::{self, compare, request_op, response_op};

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
}

impl Default for MemEtcd {
    fn default() -> Self {
        MemEtcd {
            revision: 1,
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
        self.kv
            .range(key.to_vec()..)
            .take_while(|(k, _)| range_end.is_empty() || in_range(key, range_end, k))
            .filter(|(k, _)| in_range(key, range_end, k))
            .map(|(k, r)| key_value(k, r))
            .collect()
    }

    /// `Txn`: the compares decide the branch, whose operations apply in order, every write at
    /// one new revision (none if nothing is written). A failure changes nothing.
    pub fn txn(&mut self, req: &pb::TxnRequest) -> Result<pb::TxnResponse, MemError> {
        if count_ops(req) > MAX_TXN_OPS {
            return Err(MemError::TooManyOps);
        }
        check_intervals(&req.success)?;
        check_intervals(&req.failure)?;
        // etcd decides every branch of the tree first, on the store as it was before the
        // transaction (a nested compare does not see the writes made before it).
        let mut path = Vec::new();
        self.branches(req, &mut path);
        let mut path = path.into_iter();
        let mut draft = self.clone();
        let next = self.revision + 1;
        let mut wrote = false;
        let resp = draft.apply_txn(req, next, &mut wrote, &mut path)?;
        if wrote {
            draft.revision = next;
        }
        *self = draft;
        let mut resp = resp;
        resp.header = self.header();
        Ok(resp)
    }

    /// The branch every transaction of the tree takes, in the order [`MemEtcd::apply_txn`]
    /// meets them: this one's, then the nested ones' of the branch it takes.
    fn branches(&self, req: &pb::TxnRequest, path: &mut Vec<bool>) {
        let succeeded = req.compare.iter().all(|c| self.compare(c));
        path.push(succeeded);
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        for op in ops {
            if let Some(request_op::Request::RequestTxn(t)) = &op.request {
                self.branches(t, path);
            }
        }
    }

    fn apply_txn(
        &mut self,
        req: &pb::TxnRequest,
        rev: i64,
        wrote: &mut bool,
        path: &mut std::vec::IntoIter<bool>,
    ) -> Result<pb::TxnResponse, MemError> {
        let succeeded = path.next().unwrap_or(false);
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let Some(op) = &op.request else { continue };
            let response = match op {
                request_op::Request::RequestRange(r) => {
                    let mut got = self.range(r);
                    got.header = None;
                    response_op::Response::ResponseRange(got)
                }
                request_op::Request::RequestPut(p) => {
                    self.put(p, rev)?;
                    *wrote = true;
                    response_op::Response::ResponsePut(pb::PutResponse { header: None })
                }
                request_op::Request::RequestDeleteRange(d) => {
                    let deleted = self.delete(&d.key, &d.range_end, rev);
                    *wrote |= deleted > 0;
                    response_op::Response::ResponseDeleteRange(pb::DeleteRangeResponse {
                        header: None,
                        deleted,
                    })
                }
                request_op::Request::RequestTxn(t) => {
                    let inner = self.apply_txn(t, rev, wrote, path)?;
                    response_op::Response::ResponseTxn(inner)
                }
            };
            responses.push(pb::ResponseOp {
                response: Some(response),
            });
        }
        Ok(pb::TxnResponse {
            header: None,
            succeeded,
            responses,
        })
    }

    fn compare(&self, c: &pb::Compare) -> bool {
        let kvs = self.read(&c.key, &c.range_end);
        let target = compare::CompareTarget::try_from(c.target).ok();
        if kvs.is_empty() {
            // No key: etcd compares a key of zeros, and never passes on a value.
            if target == Some(compare::CompareTarget::Value) {
                return false;
            }
            return compare_one(c, &mvccpb::KeyValue::default());
        }
        kvs.iter().all(|kv| compare_one(c, kv))
    }

    fn put(&mut self, p: &pb::PutRequest, rev: i64) -> Result<(), MemError> {
        if p.lease != 0 && !self.leases.contains_key(&p.lease) {
            return Err(MemError::LeaseNotFound);
        }
        let old = self.kv.get(&p.key).cloned();
        if let Some(old) = &old {
            if old.lease != 0 && old.lease != p.lease {
                if let Some(l) = self.leases.get_mut(&old.lease) {
                    l.keys.remove(&p.key);
                }
            }
        }
        let record = Record {
            value: p.value.clone(),
            create: old.as_ref().map_or(rev, |o| o.create),
            modified: rev,
            version: old.as_ref().map_or(1, |o| o.version + 1),
            lease: p.lease,
        };
        if let Some(l) = self.leases.get_mut(&p.lease) {
            l.keys.insert(p.key.clone());
        }
        self.history.push(mvccpb::Event {
            r#type: EventType::Put as i32,
            kv: Some(key_value(&p.key, &record)),
        });
        self.kv.insert(p.key.clone(), record);
        Ok(())
    }

    fn delete(&mut self, key: &[u8], range_end: &[u8], rev: i64) -> i64 {
        let gone: Vec<Vec<u8>> = self
            .kv
            .keys()
            .filter(|k| in_range(key, range_end, k))
            .cloned()
            .collect();
        for k in &gone {
            if let Some(old) = self.kv.remove(k) {
                if let Some(l) = self.leases.get_mut(&old.lease) {
                    l.keys.remove(k);
                }
                self.history.push(mvccpb::Event {
                    r#type: EventType::Delete as i32,
                    kv: Some(mvccpb::KeyValue {
                        key: k.clone(),
                        mod_revision: rev,
                        ..Default::default()
                    }),
                });
            }
        }
        gone.len() as i64
    }

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
    /// Returns the leases that expired, each with the create revisions of the keys it took.
    pub fn advance(&mut self, now_ms: u64) -> Vec<(i64, Vec<i64>)> {
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
                let records = l.keys.iter().filter_map(|k| self.kv.get(k));
                records.map(|r| r.create).collect()
            });
            let _ = self.revoke(id);
            expired.push((id, created));
        }
        expired
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

/// Operations of a transaction as etcd counts them against `--max-txn-ops`: each branch's,
/// nested transactions' included, the larger branch at each level.
fn count_ops(req: &pb::TxnRequest) -> usize {
    let branch = |ops: &[pb::RequestOp]| -> usize {
        ops.iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestTxn(t)) => count_ops(t).max(1),
                _ => 1,
            })
            .sum()
    };
    branch(&req.success).max(branch(&req.failure))
}

/// A delete's keys, `[key, range_end)` as [`in_range`] reads them.
type Interval = (Vec<u8>, Vec<u8>);

/// etcd's check of one branch (`checkIntervals`, v3rpc): its puts and deletes, nested
/// transactions' included, may not write a key twice or put a key a delete covers; a nested
/// transaction's two branches may put the same key (only one of them runs).
fn check_intervals(ops: &[pb::RequestOp]) -> Result<(BTreeSet<Vec<u8>>, Vec<Interval>), MemError> {
    let mut dels: Vec<Interval> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(request_op::Request::RequestDeleteRange(d)) => {
                Some((d.key.clone(), d.range_end.clone()))
            }
            _ => None,
        })
        .collect();
    let covered = |dels: &[Interval], k: &[u8]| dels.iter().any(|(key, end)| in_range(key, end, k));
    let mut puts = BTreeSet::new();
    for op in ops {
        let Some(request_op::Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (then_puts, then_dels) = check_intervals(&t.success)?;
        let (else_puts, else_dels) = check_intervals(&t.failure)?;
        for k in &then_puts {
            if puts.contains(k) || covered(&dels, k) {
                return Err(MemError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &else_puts {
            if (puts.contains(k) && !then_puts.contains(k)) || covered(&dels, k) {
                return Err(MemError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(then_dels);
        dels.extend(else_dels);
    }
    for op in ops {
        let Some(request_op::Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || covered(&dels, &p.key) {
            return Err(MemError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

fn compare_one(c: &pb::Compare, kv: &mvccpb::KeyValue) -> bool {
    use compare::TargetUnion as T;
    use std::cmp::Ordering;
    let ord = match &c.target_union {
        Some(T::Version(v)) => kv.version.cmp(v),
        Some(T::CreateRevision(v)) => kv.create_revision.cmp(v),
        Some(T::ModRevision(v)) => kv.mod_revision.cmp(v),
        Some(T::Value(v)) => kv.value.as_slice().cmp(v.as_slice()),
        Some(T::Lease(v)) => kv.lease.cmp(v),
        None => return false,
    };
    match compare::CompareResult::try_from(c.result) {
        Ok(compare::CompareResult::Equal) => ord == Ordering::Equal,
        Ok(compare::CompareResult::NotEqual) => ord != Ordering::Equal,
        Ok(compare::CompareResult::Greater) => ord == Ordering::Greater,
        Ok(compare::CompareResult::Less) => ord == Ordering::Less,
        Err(_) => false,
    }
}

#[cfg(test)]
#[path = "mem_tests.rs"]
mod tests;
