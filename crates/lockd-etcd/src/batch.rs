//! Group commit's transaction: several requests' transactions sent to etcd as one, each a
//! nested transaction with its own comparisons (so one's failed comparison fails only it),
//! and the one answer split back into each request's.
//!
//! etcd decides every nested transaction's branch on the store as it was before the whole
//! transaction, then runs their operations in order (a read sees the writes before it), and
//! refuses one that writes a key twice. So a request may join a batch only if it compares no
//! key that a request before it writes, and writes no key that one before it writes or reads
//! ([`Footprint::may_follow`]): then each request's answer is the one it would have had going
//! after those before it, alone, and every read answer is the store as the whole batch leaves
//! it. All of a batch's writes share one revision. What a batch cannot keep apart is failure:
//! a batch is applied whole or not at all (a put naming a lease that is gone fails it all),
//! and its answer is lost or late for all of its requests at once.

use prost::Message;

use super::mem::count_ops;
use super::pb::{self, request_op, response_op};
use super::{Error, Txn, TxnOp, TxnResponse};

/// etcd's default bound on a transaction's operations (`--max-txn-ops`).
pub const MAX_TXN_OPS: usize = 128;

/// A range of keys, `[start, end)`; `end` `None`: every key from `start` on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Span {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Span {
    /// The keys an etcd request names: `key` alone (no `range_end`), every key from `key` on
    /// (`range_end` "\0"), or `[key, range_end)`.
    fn of(key: &[u8], range_end: &[u8]) -> Span {
        let end = match range_end {
            [] => {
                let mut next = key.to_vec();
                next.push(0);
                Some(next)
            }
            [0] => None,
            end => Some(end.to_vec()),
        };
        Span {
            start: key.to_vec(),
            end,
        }
    }

    fn overlaps(&self, other: &Span) -> bool {
        let below = |start: &[u8], end: &Option<Vec<u8>>| end.as_deref().is_none_or(|e| start < e);
        below(&self.start, &other.end) && below(&other.start, &self.end)
    }
}

/// What a transaction touches, whichever of its branches (and its nested transactions')
/// runs: the keys it compares, reads and writes (puts and deletes), and the leases its puts
/// name.
#[derive(Clone, Debug, Default)]
pub struct Footprint {
    compares: Vec<Span>,
    reads: Vec<Span>,
    writes: Vec<Span>,
    puts: Vec<Vec<u8>>,
    leases: Vec<i64>,
    last: bool,
}

impl Footprint {
    pub fn of(txn: &Txn) -> Footprint {
        let mut out = Footprint::default();
        out.add(&txn.req);
        out
    }

    fn add(&mut self, req: &pb::TxnRequest) {
        for c in &req.compare {
            self.compares.push(Span::of(&c.key, &c.range_end));
        }
        for op in req.success.iter().chain(&req.failure) {
            match &op.request {
                Some(request_op::Request::RequestRange(r)) => {
                    self.reads.push(Span::of(&r.key, &r.range_end));
                }
                Some(request_op::Request::RequestPut(p)) => {
                    self.writes.push(Span::of(&p.key, &[]));
                    self.puts.push(p.key.clone());
                    if p.lease != 0 && !self.leases.contains(&p.lease) {
                        self.leases.push(p.lease);
                    }
                }
                Some(request_op::Request::RequestDeleteRange(d)) => {
                    self.writes.push(Span::of(&d.key, &d.range_end));
                }
                Some(request_op::Request::RequestTxn(t)) => self.add(t),
                None => {}
            }
        }
    }

    /// Counts `key` as written too: a caller's way to keep two requests apart that touch no
    /// common key but must not share a revision (two new holders would share a token).
    pub fn also_writes(mut self, key: impl Into<Vec<u8>>) -> Footprint {
        self.writes.push(Span::of(&key.into(), &[]));
        self
    }

    /// Counts `key` as compared too: a caller's way to keep a request from following one
    /// that [`Footprint::also_writes`] it.
    pub fn also_compares(mut self, key: impl Into<Vec<u8>>) -> Footprint {
        self.compares.push(Span::of(&key.into(), &[]));
        self
    }

    /// Marks the request as one to put after the others of a round: those it may follow
    /// can then share its batch ([`Footprint::may_follow`] is not symmetric).
    pub fn last(mut self) -> Footprint {
        self.last = true;
        self
    }

    pub fn is_last(&self) -> bool {
        self.last
    }

    /// The first key of each key or range the transaction compares, reads or writes.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.compares
            .iter()
            .chain(&self.reads)
            .chain(&self.writes)
            .map(|span| span.start.as_slice())
    }

    /// The keys the transaction may put.
    pub fn puts(&self) -> impl Iterator<Item = &[u8]> {
        self.puts.iter().map(Vec::as_slice)
    }

    /// The leases the transaction's puts name (a batch fails whole if one is gone).
    pub fn leases(&self) -> &[i64] {
        &self.leases
    }

    /// Whether this request may go after `earlier` in one batch, as if it went alone right
    /// after it: it compares nothing `earlier` writes (its comparisons are made on the store
    /// before the batch), and writes nothing `earlier` writes (etcd refuses a key written
    /// twice) or reads (`earlier`'s read answers are the store as the batch leaves it). What
    /// it reads it sees as `earlier` left it, as it would going after it; what `earlier`
    /// compared was decided before this request wrote anything, as it would be too.
    pub fn may_follow(&self, earlier: &Footprint) -> bool {
        let any = |a: &[Span], b: &[Span]| a.iter().any(|x| b.iter().any(|y| x.overlaps(y)));
        !(any(&self.compares, &earlier.writes)
            || any(&self.writes, &earlier.writes)
            || any(&self.writes, &earlier.reads))
    }

    /// Whether the two may not share a batch in either order.
    pub fn conflicts(&self, other: &Footprint) -> bool {
        !self.may_follow(other) && !other.may_follow(self)
    }
}

/// Whether `txn` only creates keys: it deletes nothing, and every key it may put is one it
/// compares as absent (version 0) first, in itself or a transaction around the put.
pub fn creates_only(txn: &Txn) -> bool {
    fn walk(req: &pb::TxnRequest, absent: &mut Vec<Vec<u8>>) -> bool {
        let ops_ok = |ops: &[pb::RequestOp], absent: &mut Vec<Vec<u8>>| {
            ops.iter().all(|op| match &op.request {
                Some(request_op::Request::RequestPut(p)) => absent.contains(&p.key),
                Some(request_op::Request::RequestDeleteRange(_)) => false,
                Some(request_op::Request::RequestTxn(t)) => walk(t, absent),
                Some(request_op::Request::RequestRange(_)) | None => true,
            })
        };
        // Only the success branch runs with this level's comparisons holding.
        let failure_ok = ops_ok(&req.failure, absent);
        let before = absent.len();
        absent.extend(
            req.compare
                .iter()
                .filter(|c| is_absent(c))
                .map(|c| c.key.clone()),
        );
        let success_ok = ops_ok(&req.success, absent);
        absent.truncate(before);
        failure_ok && success_ok
    }
    fn is_absent(c: &pb::Compare) -> bool {
        use pb::compare::{CompareResult, CompareTarget, TargetUnion};
        c.range_end.is_empty()
            && c.result == CompareResult::Equal as i32
            && c.target == CompareTarget::Version as i32
            && c.target_union == Some(TargetUnion::Version(0))
    }
    walk(&txn.req, &mut Vec::new())
}

/// How large a batch may grow.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// Requests in one batch.
    pub requests: usize,
    /// Operations in one batch, as etcd counts them against its `--max-txn-ops`.
    pub ops: usize,
    /// The batch's encoded size (etcd refuses a request over `--max-request-bytes`, 1.5 MiB
    /// by default).
    pub bytes: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            requests: 64,
            ops: MAX_TXN_OPS,
            bytes: 1 << 20,
        }
    }
}

/// Requests gathered to go to etcd as one transaction.
#[derive(Debug, Default)]
pub struct Batch {
    txns: Vec<Txn>,
    footprints: Vec<Footprint>,
    bytes: usize,
    widest: usize,
    ops: usize,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    pub fn len(&self) -> usize {
        self.txns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// Whether `txn` (of footprint `footprint`) can join at the end: it may follow every
    /// request of the batch ([`Footprint::may_follow`]), and the batch stays within `limits` and etcd's bound on operations, counted
    /// both ways etcd has counted them (the outer width plus each nested transaction's, and
    /// every operation of the tree).
    pub fn fits(&self, txn: &Txn, footprint: &Footprint, limits: &BatchLimits) -> bool {
        if self.txns.is_empty() {
            return true;
        }
        let n = self.txns.len() + 1;
        n <= limits.requests
            && self.bytes + txn.req.encoded_len() + 8 <= limits.bytes
            && n + self.widest.max(width(&txn.req)) <= limits.ops
            && self.ops + count_ops(&txn.req) <= limits.ops
            && self.footprints.iter().all(|f| footprint.may_follow(f))
    }

    /// Adds `txn`; check [`Batch::fits`] first.
    pub fn push(&mut self, txn: Txn, footprint: Footprint) {
        self.bytes += txn.req.encoded_len() + 8;
        self.widest = self.widest.max(width(&txn.req));
        self.ops += count_ops(&txn.req);
        self.txns.push(txn);
        self.footprints.push(footprint);
    }

    /// Its operations as etcd counts them against `--max-txn-ops` (both ways: see
    /// [`Batch::fits`]).
    pub fn ops(&self) -> usize {
        (self.txns.len() + self.widest).max(self.ops)
    }

    /// The one transaction: no comparison of its own, each request a nested transaction. A
    /// batch of one is that request itself, as it would go alone.
    pub fn txn(&self) -> Txn {
        match self.txns.as_slice() {
            [one] => one.clone(),
            many => Txn::new().and_then(many.iter().cloned().map(TxnOp::txn).collect::<Vec<_>>()),
        }
    }
}

/// Whether etcd refused a transaction for its operations' count (more than its
/// `--max-txn-ops`): refused whole, nothing applied.
pub fn too_many_ops(e: &Error) -> bool {
    matches!(e, Error::GRpcStatus(s) if s.code() == tonic::Code::InvalidArgument
        && s.message().contains("too many operations in txn request"))
}

/// Each request's answer out of a batch's answer (of [`Batch::txn`] for `n` requests), with
/// the batch's header; `None` if the answer is not one of such a batch.
pub fn split(resp: TxnResponse, n: usize) -> Option<Vec<TxnResponse>> {
    if n == 1 {
        return Some(vec![resp]);
    }
    if !resp.succeeded || resp.responses.len() != n {
        return None;
    }
    let header = resp.header;
    resp.responses
        .into_iter()
        .map(|r| match r.response {
            Some(response_op::Response::ResponseTxn(mut inner)) => {
                inner.header = header;
                Some(inner)
            }
            _ => None,
        })
        .collect()
}

/// The operations etcd's check counts along the widest path of the tree: a transaction's
/// widest part (its comparisons, or either branch) plus its widest nested transaction's.
fn width(req: &pb::TxnRequest) -> usize {
    let own = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    let nested = req
        .success
        .iter()
        .chain(&req.failure)
        .filter_map(|op| match &op.request {
            Some(request_op::Request::RequestTxn(t)) => Some(width(t)),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    own + nested
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
