//! lockd's own etcd v3 client: the few KV, Lease, Watch and Auth calls lockd's etcd backend
//! makes, over tonic, with the types and method names the backend was written against. With
//! it, an in-memory etcd ([`mem`]) and the simulated network the cluster simulator runs
//! lockd's front-ends over ([`sim`]): a crate of its own, so that these can be read and
//! tested apart from lockd.
//!
//! The gRPC code is generated from trimmed copies of etcd's protos (`proto/`: etcd's
//! packages, services, field numbers and types, only what lockd uses) and checked in
//! (`generated/`), so that building lockd needs no protoc. After changing a `.proto`,
//! regenerate from the workspace root with
//!
//! ```text
//! cargo run -p etcd-proto-gen
//! ```
//!
//! (it needs protoc); lockd's `tests/it/etcd_proto.rs` checks that the checked-in code is
//! what the protos give.
//!
//! Behaviour kept from the client lockd used before: one channel balanced over every
//! endpoint (a dead member is left out until it answers again), a per-request timeout, a
//! connect timeout, HTTP/2 keep-alives (also while idle), and `hasleader: true` on every call
//! when a leader is required, so that a member cut off from the others refuses at once
//! instead of waiting for a leader. Added since: KV requests go straight to the leader while
//! it answers, else to a member that does ([`route`]). Channels are made in [`Client::connect`] alone (with TLS when
//! [`ConnectOptions::with_tls`] gives it); [`ConnectOptions::with_user`] adds etcd's
//! user/password authentication, its token on every call.
//!
//! # Map (one concept a file)
//! - This file: the crate's public names (every type is re-exported here, under the path the
//!   backend uses) and the answers' types.
//! - `client`: [`Client`], each call over gRPC or to the simulated etcd; `grpc`: the gRPC side
//!   (its channels, the token renewed, KV requests routed); `connect`: the options and
//!   endpoints the channels are made from; `auth`: the metadata every call carries, and the
//!   token; `route`: KV requests straight to the leader; `error`: [`Error`].
//! - `options`: what a read, a put, a delete, a lease grant and a watch ask for; `txn`:
//!   [`Txn`] and its answer; `responses`: what the other answers say; `streams`: the lease
//!   keep-alive and watch streams.
//! - [`batch`]: requests' transactions sent as one (group commit), and the answer split.
//! - [`mem`]: the in-memory etcd; [`sim`]: the simulated network around it.

mod auth;
pub mod batch;
mod client;
mod connect;
mod error;
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    dead_code,
    rustdoc::all
)]
#[rustfmt::skip]
mod generated;
mod grpc;
pub mod mem;
mod options;
mod responses;
mod route;
pub mod sim;
mod streams;
mod txn;

use generated::etcdserverpb as pb;
use generated::mvccpb;

pub use client::Client;
pub use connect::{ConnectOptions, TlsOptions};
pub use error::Error;
pub use mvccpb::event::EventType;
pub use mvccpb::{Event, KeyValue};
pub use options::{DeleteOptions, GetOptions, LeaseGrantOptions, PutOptions, WatchOptions};
pub use pb::ResponseHeader;
pub use streams::{
    LeaseKeepAliveStream, LeaseKeeper, WatchRequestSender, WatchResponseStream, WatchStream,
};
#[cfg(any(test, feature = "test-util"))]
pub use txn::txn_answer;
pub use txn::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

/// A range read's answer.
pub type GetResponse = pb::RangeResponse;
pub type TxnResponse = pb::TxnResponse;
pub type WatchResponse = pb::WatchResponse;
pub type LeaseGrantResponse = pb::LeaseGrantResponse;
pub type LeaseKeepAliveResponse = pb::LeaseKeepAliveResponse;

#[cfg(test)]
mod tests;
