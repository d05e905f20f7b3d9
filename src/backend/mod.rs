//! The seam between the protocol layers and where the locks live.
//!
//! Sessions, the compat mode, the server and the metrics endpoint talk to a [`Backend`] and
//! nothing else: LOCK, UNLOCK, RENEW, CHECK, STATUS, WATCH and the ends of connections and
//! waits, with typed outcomes. Two backends exist: [`Embedded`], the lock table in this
//! process (the default, with `--data-dir` for durability), and, with the cargo feature
//! `etcd`, [`etcd::Cluster`], which keeps every lock in an etcd cluster so that any number
//! of lockd front-ends serve the same locks.
//!
//! `Backend` is an enum, not a trait object: the set of backends is closed (each one is
//! part of lockd), an enum keeps the embedded path a direct call (no boxed future and no
//! vtable per request, so the default backend pays one branch for the seam), and the etcd
//! variant disappears entirely from a build without the feature.
//!
//! Calls a connection makes while it is being torn down ([`Backend::abandon_wait`],
//! [`Backend::drop_sessions`]) are synchronous so that `Drop` can make them: a backend that
//! must talk to the network for them does so on a task of its own.

pub mod embedded;
#[cfg(feature = "etcd")]
pub mod etcd;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, oneshot, OwnedSemaphorePermit};

use crate::locks::{
    ConnId, Event, EventKind, Limits, LockRequest, LockStatus, TableError, Token, UserId, WaitEnd,
    WaiterId, WaiterStatus,
};
use crate::metrics::Metrics;
use crate::proto::ProtoError;
use crate::store::Stopped;

pub use embedded::Embedded;

/// Where the locks live; cheap to clone (a handle).
#[derive(Clone)]
pub enum Backend {
    Embedded(Arc<Embedded>),
    #[cfg(feature = "etcd")]
    Etcd(Arc<etcd::Cluster>),
}

/// Why a backend did not do what was asked.
#[derive(Debug, Clone)]
pub enum BackendError {
    /// The lock rules said no (the same refusals in every backend).
    Table(TableError),
    /// The backend can't be reached or has no quorum. A write that timed out may still have
    /// been made: the client tries again (a LOCK with the same id then gets that grant).
    Unavailable(String),
}

impl From<TableError> for BackendError {
    fn from(e: TableError) -> Self {
        BackendError::Table(e)
    }
}

impl BackendError {
    /// The `ERR` reply for this refusal of a request on `name`.
    pub fn refusal(&self, name: &str) -> ProtoError {
        match self {
            BackendError::Table(e) => ProtoError::table(name, e),
            BackendError::Unavailable(why) => ProtoError::unavailable(why),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Table(e) => e.fmt(f),
            BackendError::Unavailable(why) => write!(f, "backend unavailable: {why}"),
        }
    }
}

/// Which hand-over of a lease a grant was, so that taking it back ([`Backend::revoke`])
/// ends it only if no client has been told of it since. In cluster mode it is the etcd mod
/// revision of the holder key when it was handed out: a LOCK of the same id through another
/// connection or front-end, or a RENEW, rewrites the key, and a take-back of the older
/// hand-over then finds the key changed and leaves it. The embedded table needs none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandOver(pub i64);

/// How a queued LOCK ends.
#[derive(Debug)]
pub enum WaitResult {
    Granted {
        token: Token,
        deadline: Instant,
        handover: HandOver,
    },
    Ended(WaitEnd),
    /// The backend lost the wait (etcd unreachable for longer than the front-end's lease).
    Failed(BackendError),
}

/// How to reach an etcd cluster (`--etcd`) and how long to wait for it.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// Every key of this deployment is under it, so several can share one etcd.
    pub prefix: String,
    /// Each request's limit: past it, `ERR UNAVAILABLE`.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// The front-end's etcd lease: how long its session leases and waiters outlive it.
    pub lease_ttl: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: Vec::new(),
            prefix: crate::DEFAULT_ETCD_PREFIX.into(),
            request_timeout: crate::DEFAULT_ETCD_REQUEST_TIMEOUT,
            connect_timeout: crate::DEFAULT_ETCD_CONNECT_TIMEOUT,
            lease_ttl: crate::DEFAULT_ETCD_LEASE_TTL,
        }
    }
}

/// `STATUS <name> detail`: the lock as STATUS shows it, every holder, and the queue's head.
#[derive(Debug)]
pub struct Detail {
    pub status: LockStatus,
    pub holders: Vec<LockStatus>,
    pub queue: Vec<WaiterStatus>,
}

/// What a RENEW did.
#[derive(Debug)]
pub struct Renewed {
    /// The lease's time left.
    pub left: Duration,
    /// A session lease in its grace is now bound to the renewing connection, which must end
    /// it (or start its grace again) when it closes.
    pub bound: bool,
}

/// What a LOCK did at once.
#[derive(Debug)]
pub enum LockStart {
    Granted {
        token: Token,
        handover: HandOver,
    },
    /// Queued: `rx` receives the outcome. Give it back through [`Backend::abandon_wait`] if
    /// the connection goes first.
    Waiting {
        waiter: WaiterId,
        rx: oneshot::Receiver<WaitResult>,
    },
}

/// An event as watchers see it: what happened and when (wall clock, for people).
#[derive(Debug)]
pub struct Published {
    pub event: Event,
    pub unix_ms: u64,
}

/// Every held lock, sorted by name, as one moment saw them.
pub struct StatusSnapshot {
    /// Which state of the backend it shows, for a backend that reuses snapshots.
    pub(crate) generation: u64,
    /// When `left` was measured.
    pub(crate) taken: Instant,
    pub(crate) locks: Box<[LockStatus]>,
    /// Returned when the last STATUS answer streaming this copy is done with it.
    pub(crate) _copy: Option<OwnedSemaphorePermit>,
}

/// A STATUS of every held lock, as of the moment it was asked for: a shared snapshot (a
/// client that reads slowly holds a reference to it, not a copy of its own).
pub struct StatusView {
    pub(crate) snapshot: Arc<StatusSnapshot>,
    pub(crate) at: Instant,
}

impl StatusView {
    /// A view of `locks` (sorted here) measured now.
    pub fn of(mut locks: Vec<LockStatus>) -> StatusView {
        locks.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let taken = now();
        StatusView {
            snapshot: Arc::new(StatusSnapshot {
                generation: 0,
                taken,
                locks: locks.into_boxed_slice(),
                _copy: None,
            }),
            at: taken,
        }
    }

    /// How many locks are held.
    pub fn len(&self) -> usize {
        self.snapshot.locks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot.locks.is_empty()
    }

    /// The held locks in name order, their time left counted from when STATUS was asked
    /// (the snapshot may be older: the locks have not changed since).
    pub fn iter(&self) -> impl Iterator<Item = LockStatus> + '_ {
        let since = self.at.saturating_duration_since(self.snapshot.taken);
        self.snapshot.locks.iter().map(move |s| LockStatus {
            left: s.left.saturating_sub(since),
            ..s.clone()
        })
    }
}

/// The current time as leases count it. Tokio's clock, so paused-time tests drive leases.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Where tokens start: wall-clock microseconds, so a restarted server continues above the
/// tokens it granted before (as long as it granted fewer than a million a second on average
/// and the clock did not step back). The etcd backend starts its tokens here too, so a
/// deployment that moves from one backend to the other keeps its tokens growing.
pub fn first_token() -> Token {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as Token)
        .unwrap_or(1)
}

/// Wall-clock milliseconds, for events shown to people.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Dispatches to the backend; `$call` is an expression on `b`, the backend's own handle.
macro_rules! each {
    ($self:expr, $b:ident => $call:expr) => {
        match $self {
            Backend::Embedded($b) => $call,
            #[cfg(feature = "etcd")]
            Backend::Etcd($b) => $call,
        }
    };
}

impl Backend {
    pub fn metrics(&self) -> &Metrics {
        each!(self, b => b.metrics())
    }

    /// Ready to grant: the journal writes, or the cluster is reachable; if not, why.
    pub fn ready(&self) -> Result<(), &'static str> {
        each!(self, b => b.ready())
    }

    /// How long the oldest change not yet on disk has waited (embedded with a data
    /// directory only), for the metrics scrape.
    pub fn journal_backlog(&self) -> Option<Duration> {
        match self {
            Backend::Embedded(b) => b.journal_backlog(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => None,
        }
    }

    /// Held locks and queued waiters, for the metrics scrape.
    pub fn counts(&self) -> (usize, usize) {
        each!(self, b => b.counts())
    }

    /// Waits until every change made so far is durable: call it after a change and before
    /// the `OK` that reports it. `None` when a change is durable once it is made (in memory,
    /// or in etcd, whose answer comes after its quorum wrote it). `Err`: it never will be, the
    /// server is stopping.
    pub fn durable(&self) -> Option<impl Future<Output = Result<(), Stopped>> + '_> {
        match self {
            Backend::Embedded(b) => b.durable(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => None,
        }
    }

    /// A number for a new connection.
    pub fn connection_id(&self) -> ConnId {
        each!(self, b => b.connection_id())
    }

    pub fn limits(&self) -> Limits {
        each!(self, b => b.limits())
    }

    /// LOCK.
    pub async fn lock(&self, req: LockRequest) -> Result<LockStart, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.lock(req)?),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.lock(req).await,
        }
    }

    /// UNLOCK by `user`.
    pub async fn unlock(&self, name: &str, token: Token, user: UserId) -> Result<(), BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.unlock(name, token, user)?),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.unlock(name, token, user).await,
        }
    }

    /// RENEW by `user` on connection `conn`.
    pub async fn renew(
        &self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewed, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.renew(name, token, ttl, conn, user)?),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.renew(name, token, ttl, conn, user).await,
        }
    }

    /// CHECK: the lease's time left.
    pub async fn check(&self, name: &str, token: Token) -> Result<Duration, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.check(name, token)?),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.check(name, token).await,
        }
    }

    /// Takes back a grant whose client is gone before it could read it (event `dropped`);
    /// the next waiter is granted. False if `token` was no longer the live lease, or if a
    /// client was told of it after `handover` (the same id's LOCK again, a RENEW).
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    pub async fn revoke(&self, name: &str, token: Token, handover: HandOver) -> bool {
        match self {
            Backend::Embedded(b) => b.revoke(name, token),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.take_back(name, token, handover).await,
        }
    }

    /// STATUS of one name.
    pub async fn status(&self, name: &str) -> Result<Option<LockStatus>, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.status(name)),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.status(name).await,
        }
    }

    /// One lock, its holders, and the first `max` of its queue, for `STATUS <name> detail`.
    pub async fn status_detail(
        &self,
        name: &str,
        max: usize,
    ) -> Result<Option<Detail>, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.status_detail(name, max)),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.status_detail(name, max).await,
        }
    }

    /// Every held lock, sorted by name, as of now; see [`Embedded::status_snapshot`] for
    /// how copies are shared and bounded.
    pub async fn status_snapshot(&self) -> Result<StatusView, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.status_snapshot().await),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.status_snapshot().await,
        }
    }

    /// At most `copies` copies of the locks are held by STATUS answers at once.
    pub fn limit_status_copies(&self, copies: usize) {
        each!(self, b => b.limit_status_copies(copies))
    }

    /// A waiting connection is going away. If it was granted in the meantime (the grant sits
    /// unread in `rx`), its client never learned the token, so the lock is released at once.
    pub fn abandon_wait(&self, name: &str, waiter: WaiterId, rx: oneshot::Receiver<WaitResult>) {
        each!(self, b => b.abandon_wait(name, waiter, rx))
    }

    /// Ends the session leases a closing connection still holds (or starts their grace).
    pub fn drop_sessions(&self, conn: ConnId, leases: &HashMap<Token, String>) {
        each!(self, b => b.drop_sessions(conn, leases))
    }

    /// Keeps only the session leases that are still live, so a long-lived connection's list
    /// stays as small as what it holds.
    pub fn retain_live(&self, leases: &mut HashMap<Token, String>) {
        each!(self, b => b.retain_live(leases))
    }

    /// The backend's own background work (expiry timers; for etcd, its watch and keep-alive)
    /// until `shutdown`.
    pub async fn run(self, shutdown: tokio_util::sync::CancellationToken) {
        match self {
            Backend::Embedded(b) => b.run_timer(shutdown).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.run(shutdown).await,
        }
    }

    /// Events from now on; a receiver more than `watch_buffer` behind gets `Lagged`.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Published>> {
        each!(self, b => b.subscribe())
    }
}

/// The log line of a lease event (both backends log alike).
pub(crate) fn log_event(e: &Event) {
    let (name, id, token) = (&*e.name, &*e.id, e.token);
    let held_ms = e.held.as_millis() as u64;
    match e.kind {
        EventKind::Acquired => match e.waited {
            Some(waited) => {
                let waited_ms = waited.as_millis() as u64;
                tracing::info!(name, id, token, waited_ms, "granted")
            }
            None => tracing::info!(name, id, token, waited_ms = 0u64, "granted"),
        },
        EventKind::Released => tracing::info!(name, id, token, held_ms, "released"),
        EventKind::Expired => tracing::info!(name, id, token, held_ms, "lease expired"),
        EventKind::Dropped => {
            tracing::info!(name, id, token, held_ms, "session closed, released")
        }
        EventKind::Revoked => {
            tracing::info!(name, id, token, "grant taken back: the waiter was gone")
        }
    }
}
