//! A transaction and its answer: the builders the backend writes every transaction with
//! ([`Txn`], its [`Compare`]s and [`TxnOp`]s, which make etcd's `TxnRequest`), and the answer
//! read back one operation at a time ([`TxnOpResponse`]).

use super::options::prefix_end;
use super::pb;
#[cfg(any(test, feature = "test-util"))]
use super::KeyValue;
use super::{DeleteOptions, GetOptions, GetResponse, PutOptions, ResponseHeader, TxnResponse};

/// How a [`Compare`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    Greater,
    Less,
}

impl CompareOp {
    fn result(self) -> pb::compare::CompareResult {
        use pb::compare::CompareResult as R;
        match self {
            CompareOp::Equal => R::Equal,
            CompareOp::Greater => R::Greater,
            CompareOp::Less => R::Less,
        }
    }
}

/// One condition of a transaction, on a key (or, [`Compare::with_prefix`], on every key of
/// a prefix: true only if it holds for each of them).
#[derive(Clone, Debug)]
pub struct Compare(pub(crate) pb::Compare);

impl Compare {
    fn new(
        key: impl Into<Vec<u8>>,
        op: CompareOp,
        target: pb::compare::CompareTarget,
        value: pb::compare::TargetUnion,
    ) -> Self {
        Compare(pb::Compare {
            result: op.result() as i32,
            target: target as i32,
            key: key.into(),
            target_union: Some(value),
            range_end: Vec::new(),
        })
    }

    /// On the key's version (0: the key does not exist).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Self {
        use pb::compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Version,
            TargetUnion::Version(version),
        )
    }

    /// On the revision that created the key.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        use pb::compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Create,
            TargetUnion::CreateRevision(revision),
        )
    }

    /// On the revision that last changed the key.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        use pb::compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Mod,
            TargetUnion::ModRevision(revision),
        )
    }

    /// The key compared (the first of the range, with a prefix).
    #[cfg(any(test, feature = "test-util"))]
    pub fn key(&self) -> &[u8] {
        &self.0.key
    }

    /// Compares every key that starts with this one.
    pub fn with_prefix(mut self) -> Self {
        self.0.range_end = prefix_end(&self.0.key);
        self
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug)]
pub struct TxnOp(pb::request_op::Request);

impl TxnOp {
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Self {
        let req = options.unwrap_or_default().request(key.into());
        TxnOp(pb::request_op::Request::RequestRange(req))
    }

    pub fn put(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Self {
        let req = options
            .unwrap_or_default()
            .request(key.into(), value.into());
        TxnOp(pb::request_op::Request::RequestPut(req))
    }

    pub fn delete(key: impl Into<Vec<u8>>, _options: Option<DeleteOptions>) -> Self {
        let req = pb::DeleteRangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        TxnOp(pb::request_op::Request::RequestDeleteRange(req))
    }

    /// A transaction inside this one (etcd 3.3 and later).
    pub fn txn(txn: Txn) -> Self {
        TxnOp(pb::request_op::Request::RequestTxn(txn.req))
    }

    fn op(self) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(self.0),
        }
    }
}

/// A transaction: if every [`Txn::when`] comparison holds, the [`Txn::and_then`] operations,
/// else the [`Txn::or_else`] ones, all at one revision.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    pub(crate) req: pb::TxnRequest,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn when(mut self, compares: impl Into<Vec<Compare>>) -> Self {
        self.req
            .compare
            .extend(compares.into().into_iter().map(|c| c.0));
        self
    }

    pub fn and_then(mut self, ops: impl Into<Vec<TxnOp>>) -> Self {
        self.req
            .success
            .extend(ops.into().into_iter().map(TxnOp::op));
        self
    }

    pub fn or_else(mut self, ops: impl Into<Vec<TxnOp>>) -> Self {
        self.req
            .failure
            .extend(ops.into().into_iter().map(TxnOp::op));
        self
    }
}

/// The answer to one operation of a transaction.
#[derive(Clone, Copy, Debug)]
pub enum TxnOpResponse<'a> {
    Get(&'a GetResponse),
    /// A put's or a delete's answer: nothing lockd reads.
    Put,
    Delete,
    Txn(&'a TxnResponse),
}

impl TxnResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// Whether the comparisons held (the `and_then` branch ran).
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }

    /// The answers of the branch that ran, in order.
    pub fn op_responses(&self) -> Vec<TxnOpResponse<'_>> {
        use pb::response_op::Response as R;
        self.responses
            .iter()
            .filter_map(|r| {
                Some(match r.response.as_ref()? {
                    R::ResponseRange(r) => TxnOpResponse::Get(r),
                    R::ResponsePut(_) => TxnOpResponse::Put,
                    R::ResponseDeleteRange(_) => TxnOpResponse::Delete,
                    R::ResponseTxn(r) => TxnOpResponse::Txn(r),
                })
            })
            .collect()
    }
}

/// A transaction's answer as etcd would give it: `succeeded`, at `revision`, with one read
/// that found `kvs`. For the tests of code that reads answers.
#[cfg(any(test, feature = "test-util"))]
pub fn txn_answer(succeeded: bool, revision: i64, kvs: Vec<KeyValue>) -> TxnResponse {
    use pb::response_op::Response as R;
    TxnResponse {
        header: Some(ResponseHeader {
            revision,
            ..Default::default()
        }),
        succeeded,
        responses: vec![pb::ResponseOp {
            response: Some(R::ResponseRange(GetResponse {
                kvs,
                ..Default::default()
            })),
        }],
    }
}
