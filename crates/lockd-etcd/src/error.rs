//! Why a call failed: the client's one error type, for every call whether it went over gRPC
//! or to the simulated etcd, with the variant names of the client lockd used before (the
//! backend's `cause.rs` reads its plain sentences from them).

use std::fmt;
use std::sync::Arc;

/// Why a call failed. The variants are the ones `cause.rs` reads a plain sentence from (the
/// names of the client lockd used before, hence the `Error` suffixes). Cloned for each
/// request of a batch that failed (`batch`), so the errors that are not are shared.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Debug)]
pub enum Error {
    /// A request lockd could not even form (no endpoint, a malformed URL).
    InvalidArgs(String),
    IoError(Arc<std::io::Error>),
    /// The channel could not be built or used.
    TransportError(Arc<tonic::transport::Error>),
    /// etcd (or tonic on its behalf: a deadline, a refused connection) answered with a status.
    GRpcStatus(tonic::Status),
    /// A watch stream could not be fed.
    WatchError(String),
    /// The lease keep-alive stream could not be fed, or etcd says the lease is gone.
    LeaseKeepAliveError(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgs(e) => write!(f, "invalid arguments: {e}"),
            Error::IoError(e) => write!(f, "io error: {e}"),
            Error::TransportError(e) => write!(f, "transport error: {e}"),
            Error::GRpcStatus(e) => write!(f, "grpc request error: {e}"),
            Error::WatchError(e) => write!(f, "watch error: {e}"),
            Error::LeaseKeepAliveError(e) => write!(f, "lease keep alive error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::IoError(e) => Some(&**e),
            Error::TransportError(e) => Some(&**e),
            Error::GRpcStatus(e) => Some(e),
            _ => None,
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(e: tonic::Status) -> Self {
        Error::GRpcStatus(e)
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Self {
        Error::TransportError(Arc::new(e))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::IoError(Arc::new(e))
    }
}
