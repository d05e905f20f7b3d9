//! A transaction in the in-memory etcd, as etcd applies one: first etcd's checks (at most
//! `--max-txn-ops` ([`super::MAX_TXN_OPS`] by default) operations, no key written twice in a branch), then every branch of the
//! tree decided on the store as it was, then the writes at one new revision, or none at all
//! if anything fails.

use std::collections::BTreeSet;

use super::super::mvccpb::{self, event::EventType};
use super::super::pb::{self, compare, request_op, response_op};
use super::{in_range, key_value, MemError, MemEtcd, Record};

impl MemEtcd {
    /// [`MemEtcd::txn`] of a transaction as the client builds one: how a test steps a
    /// front-end's core against the in-memory etcd without a client or a network.
    pub fn apply(&mut self, txn: &crate::Txn) -> Result<pb::TxnResponse, MemError> {
        self.txn(&txn.req)
    }

    /// `Txn`: the compares decide the branch, whose operations apply in order, every write at
    /// one new revision (none if nothing is written). A failure changes nothing.
    pub fn txn(&mut self, req: &pb::TxnRequest) -> Result<pb::TxnResponse, MemError> {
        if count_ops(req) > self.max_txn_ops {
            return Err(MemError::TooManyOps);
        }
        check_intervals(&req.success)?;
        check_intervals(&req.failure)?;
        // etcd decides every branch of the tree first, on the store as it was before the
        // transaction (a nested compare does not see the writes made before it).
        let mut path = Vec::new();
        self.branches(req, &mut path);
        // etcd checks every put of the branches taken before it writes anything
        // (`checkRequestPut`): one naming a lease that does not exist fails the transaction,
        // and nothing is written. Past this check nothing can fail, so the writes go to the
        // store itself (a copy of the store per transaction made a long run quadratic).
        self.check_leases(req, &mut path.iter().copied())?;
        let next = self.revision + 1;
        let mut wrote = false;
        let mut resp = self.apply_txn(req, next, &mut wrote, &mut path.into_iter())?;
        if wrote {
            self.revision = next;
        }
        resp.header = self.header();
        Ok(resp)
    }

    /// [`MemError::LeaseNotFound`] if a put of the branches `path` takes (as
    /// [`MemEtcd::branches`] found them) names a lease that does not exist.
    fn check_leases(
        &self,
        req: &pb::TxnRequest,
        path: &mut impl Iterator<Item = bool>,
    ) -> Result<(), MemError> {
        let ops = if path.next().unwrap_or(false) {
            &req.success
        } else {
            &req.failure
        };
        for op in ops {
            match &op.request {
                Some(request_op::Request::RequestPut(p))
                    if p.lease != 0 && !self.leases.contains_key(&p.lease) =>
                {
                    return Err(MemError::LeaseNotFound)
                }
                Some(request_op::Request::RequestTxn(t)) => self.check_leases(t, path)?,
                _ => {}
            }
        }
        Ok(())
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

    /// A put, its lease checked before ([`MemEtcd::check_leases`]).
    fn put(&mut self, p: &pb::PutRequest, rev: i64) -> Result<(), MemError> {
        if p.lease != 0 && !self.leases.contains_key(&p.lease) {
            debug_assert!(
                false,
                "a put's lease is checked before the transaction writes"
            );
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

    pub(super) fn delete(&mut self, key: &[u8], range_end: &[u8], rev: i64) -> i64 {
        let gone: Vec<Vec<u8>> = self
            .entries(key, range_end)
            .map(|(k, _)| k.clone())
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
}

/// Operations of a transaction as etcd counts them against `--max-txn-ops`: each branch's,
/// nested transactions' included, the larger branch at each level.
pub(crate) fn count_ops(req: &pb::TxnRequest) -> usize {
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
