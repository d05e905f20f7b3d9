//! lockd: named locks with leases, FIFO waiters and fencing tokens, over a line protocol.
//!
//! # Map
//! - [`locks`]: the lock table, a pure state machine (`std` only: no I/O, no tokio, no clock).
//! - [`proto`]: requests and replies as text, both ways: each line formatted and parsed as a
//!   type (pure); `proto.md` is its public contract.
//! - [`auth`]: users, their hashed secrets and rights (`--auth-file`), and the shared handle
//!   a reload replaces them through.
//! - [`connection`]: bounded line framing over a `stream`: plain TCP or TLS over TCP.
//! - [`tls`]: rustls set-up (server acceptor, client connector) and a client certificate's
//!   common name.
//! - [`backend`]: the seam connection handlers talk to, and the two places locks live behind it: the
//!   embedded table (behind a mutex, with its expiry timer, waiter hand-off and watch events)
//!   and, with the `etcd` feature, an etcd cluster shared by several lockd front-ends. One
//!   call per request, answered once its change is durable; the backend knows which session
//!   leases each connection holds and ends them when it closes (`Backend::closed`).
//! - `handler`: one client connection (its handler): read, parse, dispatch, reply. ("Session"
//!   is a lease kind in proto.md, never this.)
//! - [`server`]: accept loop, connection limits, graceful shutdown; [`server::Config`].
//! - [`daemon`]: the `lockd` process from its flags ([`daemon::Flags`]: their defaults and
//!   checks): users and their SIGHUP reload, the open-files limit, listeners, the metrics
//!   endpoint, the shutdown signals, then [`server::run`]. The binary only parses and calls it.
//! - `per_ip`: open connections counted per client address (`--max-connections-per-ip`).
//! - [`store`]: durable state for `--data-dir`: a log with snapshots and a group-commit writer.
//! - [`client`]: an async client for `lockctl`, the tests and any Rust program: a connection
//!   whose answers are `proto`'s types (`client/mod.rs`), and its `connect` (several
//!   addresses, failover, retry), `tls` (the handshake and what its failures mean), `auth`
//!   (AUTH and what its refusals mean), `lock` (a LOCK sent again within its wait), `keeper`
//!   (the one renewal loop, under `hold` and `lockctl run`) and `hold` (a future run under a
//!   lock).
//! - [`docgen`]: shell completions and man pages from the binaries' clap definitions.
//! - [`compat`]: the old two-port bash/netcat protocol on one lock of the table (`--compat`).
//! - `metrics`: the Prometheus registry and the handles the hot path bumps.
//! - [`http`]: the operators' endpoint (`--metrics-listen`): `/metrics`, `/healthz`, `/readyz`,
//!   and the web view (`--web`).
//!
//! `handler`, `metrics`, `per_ip` and `stream` are internal (`pub(crate)`): nothing outside the
//! crate names them. The other modules are public because the binaries or the tests
//! use them.
//!
//! # Dependency rule
//! `locks` imports nothing of the crate; `proto` only the table's value types; `per_ip`
//! nothing; `stream` and `tls` only each other; `connection` -> `stream`; `metrics` only the table's event types and `proto`'s error codes; `auth`
//! -> `locks` (the user number), `proto` (what a valid name is). `store` -> `locks` (its
//! change and lease types), `metrics`; `backend` -> `locks`, `store`, `metrics`, `auth`,
//! `proto` (the `ERR` a refusal becomes);
//! `handler` -> `backend`, `proto`, `connection`, `auth`, `tls`; `compat` -> `backend`,
//! `locks`; `http` -> `backend`, `auth`, `locks`, `proto`, `tls`; `server` -> `handler`, `backend`, `compat`, `store`, `http`,
//! `auth`, `per_ip`, `tls`; `daemon` -> `server`, `auth`, `http`, `compat` (its flags),
//! `backend` (the etcd settings), `locks` (the limits), `tls`, `proto` (durations, names);
//! `client` -> `proto`, `connection`, `locks` (the token and mode types), `tls`, `stream`
//! (inside it, `connect` -> `tls`, `auth` and the connection; `tls` and `auth` -> the
//! connection). The table and the protocol never see a socket or a file, and `lockctl` never
//! reaches `server`, `backend`, `handler` or `store`. Nothing in the crate imports `daemon`:
//! only the `lockd` binary calls it.

#![warn(missing_docs)]

use std::time::Duration;

pub mod auth;
pub mod backend;
pub mod busy_poll;
pub mod client;
pub mod compat;
pub mod connection;
pub mod daemon;
pub mod docgen;
pub(crate) mod handler;
pub mod http;
pub mod locks;
pub(crate) mod metrics;
pub(crate) mod per_ip;
pub mod proto;
pub mod server;
pub mod store;
pub(crate) mod stream;
pub mod task_size;
pub mod tls;

/// Address lockd listens on unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5001";
/// Lease length of a LOCK without `ttl=`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Lock-delay of a LOCK without `delay=` (`--lock-delay`): none, a lease's end hands over at
/// once.
pub const DEFAULT_LOCK_DELAY: Duration = Duration::ZERO;
/// Longest lock-delay a LOCK may ask for (`--max-lock-delay`): a name held by nobody for
/// longer than this, after a client vanished, is an outage, not a safety margin.
pub const DEFAULT_MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// Where a cluster's keys live in etcd unless `--etcd-prefix` says otherwise.
pub const DEFAULT_ETCD_PREFIX: &str = "/lockd/";
/// How long one etcd request may take before `ERR UNAVAILABLE` (`--etcd-request-timeout`).
pub const DEFAULT_ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long to keep trying to reach etcd at start (`--etcd-connect-timeout`).
pub const DEFAULT_ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A front-end's etcd lease (`--etcd-lease-ttl`): its session leases and waiters end at
/// most about this long after it dies.
pub const DEFAULT_ETCD_LEASE_TTL: Duration = Duration::from_secs(5);
/// Requests a front-end sends to etcd as one transaction at most (`--etcd-batch`).
pub const DEFAULT_ETCD_BATCH: usize = 64;
/// How long a request waits at most for the batches in flight before it goes with the next
/// one anyway (`--etcd-batch-wait`): a slow or lost answer holds up the others this long at
/// most, not for the request timeout.
pub const DEFAULT_ETCD_BATCH_WAIT: Duration = Duration::from_millis(10);
/// How long a LOCK's new waiter key waits at most for a release of its name through the same
/// front-end, to go to etcd in one transaction with it (`--etcd-join-wait`).
pub const DEFAULT_ETCD_JOIN_WAIT: Duration = Duration::from_millis(2);
/// The most `--etcd-batch` may be: etcd takes at most 128 operations in a transaction
/// (`--max-txn-ops`), each request one at least.
pub const MAX_ETCD_BATCH: usize = 126;
/// Longest lease a client may ask for.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Most names held at once.
pub const DEFAULT_MAX_LOCKS: usize = 1_000_000;
/// Most client connections at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Most client connections at once from one address.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1000;
/// Most waiters one name may have.
pub const DEFAULT_MAX_WAITERS: usize = 10_000;
/// How long a connection that holds, waits for and watches nothing may send no line.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the bytes of an unfinished request line may wait for the rest of it.
pub const DEFAULT_LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest request line, in bytes, line ending included.
pub const DEFAULT_MAX_LINE: usize = 1024;
/// Longest note a LOCK may carry (`note=`), in bytes.
pub const DEFAULT_MAX_NOTE: usize = 256;
/// Most names one LOCK may ask for at once (its name and its `and=` names).
pub const DEFAULT_MAX_NAMES: usize = 16;
/// Events a watcher may fall behind before it is disconnected.
pub const DEFAULT_WATCH_BUFFER: usize = 1024;
/// How long a grant to a waiter that half-closed is watched for a reset (its client gone).
pub const DEFAULT_HALF_CLOSE_PROBE: Duration = Duration::from_millis(500);
/// How long a TLS client may take to complete its handshake.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for connections to finish before it closes them.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Shortest lease a LOCK or RENEW may ask for: a lease that has ended before its `OK` is sent
/// would be granted to nobody.
pub const MIN_TTL: Duration = Duration::from_millis(1);
/// How long a worker keeps polling after a request before it parks (`--busy-poll`; see
/// [`busy_poll`]).
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);
/// How long a client may leave a reply unread (each 16 KiB of it) before it is disconnected.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a wrong AUTH waits before its `ERR DENIED`: guessing secrets over a connection
/// (or many) is slow, and a failure's timing tells nothing.
pub const AUTH_FAILURE_DELAY: Duration = Duration::from_millis(200);
/// Wrong AUTHs a connection may send; the last one's refusal closes it.
pub const AUTH_FAILURES: u32 = 3;
/// Most copies of the lock table that STATUS answers being sent may hold at once.
pub const DEFAULT_STATUS_COPIES: usize = 4;
