//! What the simulated etcd says: its errors as etcd's gRPC statuses, and a transaction in
//! words for the trace.

use super::super::mem::MemError;
use super::super::pb;
use super::super::Error;

/// A transaction in words: its comparisons' keys and what each branch writes.
pub(super) fn describe(req: &pb::TxnRequest) -> String {
    use pb::request_op::Request as R;
    fn short(key: &[u8]) -> String {
        let key = String::from_utf8_lossy(key);
        // Without the deployment's prefix (its first component).
        match key.get(1..).and_then(|k| k.find('/')) {
            Some(i) => key[i + 2..].to_owned(),
            None => key.into_owned(),
        }
    }
    fn branch(ops: &[pb::RequestOp]) -> String {
        let words: Vec<String> = ops
            .iter()
            .filter_map(|op| match op.request.as_ref()? {
                R::RequestPut(p) => Some(format!("put {}", short(&p.key))),
                R::RequestDeleteRange(d) => Some(format!("del {}", short(&d.key))),
                R::RequestRange(_) => None,
                R::RequestTxn(t) => Some(format!("txn{{{}}}", describe(t))),
            })
            .collect();
        words.join(", ")
    }
    let guards: Vec<String> = req.compare.iter().map(|c| short(&c.key)).collect();
    let mut text = format!("if [{}] then [{}]", guards.join(", "), branch(&req.success));
    let otherwise = branch(&req.failure);
    if !otherwise.is_empty() {
        text.push_str(&format!(" else [{otherwise}]"));
    }
    text
}

pub(super) fn status(code: tonic::Code, message: &str) -> Error {
    Error::GRpcStatus(tonic::Status::new(code, message))
}

pub(super) fn timed_out() -> Error {
    status(tonic::Code::DeadlineExceeded, "context deadline exceeded")
}

pub(super) fn mem_error(e: MemError) -> Error {
    match e {
        MemError::LeaseNotFound => status(
            tonic::Code::NotFound,
            "etcdserver: requested lease not found",
        ),
        MemError::TooManyOps => status(
            tonic::Code::InvalidArgument,
            "etcdserver: too many operations in txn request",
        ),
        MemError::DuplicateKey => status(
            tonic::Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request",
        ),
        MemError::Compacted(_) => status(
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        ),
    }
}
