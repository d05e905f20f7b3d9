//! The seam between the protocol layers and where the locks live.
//!
//! Connection handlers, the compat mode, the server and the metrics endpoint talk to a [`Backend`] and
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
//! The seam asks nothing of its callers beyond the request itself:
//! - a call that changes a lease (LOCK, UNLOCK, RENEW) returns once its change is durable
//!   (with `--data-dir`, on disk; in etcd, once its quorum answered), and a queued LOCK's
//!   [`Wait::result`] returns a grant only once that grant is durable, so an `OK` sent after
//!   it never reports a change a crash could undo. If the change never can be durable (the
//!   store failed and the server is stopping), the call answers [`BackendError::NotDurable`];
//! - the backend knows which session leases are bound to which connection: a closing
//!   connection says so ([`Backend::closed`]) and the backend ends them or starts their grace;
//! - a grant whose client is gone before it could be told is given back with
//!   [`Backend::revoke`], the one call besides the request's own;
//! - how the backend is doing, for `/readyz` and the metrics scrape, is one answer,
//!   [`Backend::health`].
//!
//! Calls a connection makes while it is being torn down ([`Backend::closed`], and dropping
//! a [`Wait`]) are synchronous so that `Drop` can make them: a backend that must talk to the
//! network for them does so on a task of its own.

mod clock;
mod embedded;
#[cfg(feature = "etcd")]
pub mod etcd;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot, OwnedSemaphorePermit};

use crate::locks::{
    ConnId, Event, EventKind, Limits, LockRequest, LockStatus, Origin, RenewRequest, TableError,
    Token, UserId, WaitEnd, WaiterId, WaiterStatus,
};
use crate::metrics::Metrics;
use crate::proto::ProtoError;
use crate::store::Seq;

pub use clock::{first_token, now, simulate_wall, unix_ms};
pub use embedded::Embedded;

/// Where the locks live; cheap to clone (a handle).
#[derive(Clone)]
pub enum Backend {
    /// The lock table in this process (`--data-dir` makes it durable).
    Embedded(Arc<Embedded>),
    /// An etcd cluster shared with other lockd front-ends (`--etcd`).
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
    /// The change was made but can never be made durable: the store failed and the server is
    /// stopping. The connection answers `ERR SHUTDOWN` and closes.
    NotDurable,
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
            BackendError::NotDurable => ProtoError::not_durable(),
        }
    }

    /// Whether the connection closes after answering it.
    pub fn ends_connection(&self) -> bool {
        matches!(self, BackendError::NotDurable)
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Table(e) => e.fmt(f),
            BackendError::Unavailable(why) => write!(f, "backend unavailable: {why}"),
            BackendError::NotDurable => f.write_str("the change can't be made durable"),
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
    /// The lock is this waiter's now.
    Granted {
        /// Its fencing token.
        token: Token,
        /// When the lease ends, on this process's monotonic clock.
        deadline: Instant,
        /// Which hand-over it was, for a take-back if the client is gone.
        handover: HandOver,
    },
    /// It ended without the lock: its `wait=` ran out, or a newer LOCK took its place.
    Ended(WaitEnd),
    /// The backend lost the wait (etcd unreachable for longer than the front-end's lease).
    Failed(BackendError),
}

/// How to reach an etcd cluster (`--etcd`) and how long to wait for it.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// `host:port` of the members to try.
    pub endpoints: Vec<String>,
    /// Every key of this deployment is under it, so several can share one etcd.
    pub prefix: String,
    /// Each request's limit: past it, `ERR UNAVAILABLE`.
    pub request_timeout: Duration,
    /// How long to keep trying to reach the cluster at start.
    pub connect_timeout: Duration,
    /// The front-end's etcd lease: how long its session leases and waiters outlive it.
    pub lease_ttl: Duration,
    /// Requests sent to etcd as one transaction at most (`--etcd-batch`; 1: each alone).
    pub batch: usize,
    /// How long a request waits at most for the batches in flight (`--etcd-batch-wait`).
    pub batch_wait: Duration,
    /// How long a queue write behind a holder of this front-end waits at most for company
    /// (`--etcd-join-wait`).
    pub join_wait: Duration,
    /// TLS and authentication toward etcd (`--etcd-ca`, `--etcd-cert`, `--etcd-user`).
    pub security: EtcdSecurity,
}

/// How a front-end checks etcd and proves itself to it: files and names only, as the flags
/// give them. `etcd/secure.rs` reads and checks them at connect, so a refusal names the flag.
/// No password here: it is read from [`ETCD_PASSWORD_ENV`] or the file at connect, so that
/// no copy of it is printed with a config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    /// `--etcd-ca`: etcd's server certificate must be signed by this CA (PEM); TLS on.
    pub ca: Option<std::path::PathBuf>,
    /// `--etcd-cert` and `--etcd-key`: the client certificate (PEM) for etcd's
    /// `--client-cert-auth`.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// `--etcd-user`, for etcd's own authentication.
    pub user: Option<String>,
    /// `--etcd-password-file`: the password of `user` is its first line (else it is in
    /// [`ETCD_PASSWORD_ENV`]).
    pub password_file: Option<std::path::PathBuf>,
}

/// The environment variable that carries `--etcd-user`'s password. There is deliberately
/// no flag for it: a process's arguments show in `ps` to every user of the machine.
pub const ETCD_PASSWORD_ENV: &str = "LOCKD_ETCD_PASSWORD";

/// etcd refused this front-end at start for a reason no retry mends (its certificates, its
/// user or password, its rights on the prefix; or a file of `--etcd-ca` and the like that
/// can't be used): `lockd` exits 2, as for a bad flag, with this one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdRefused(pub String);

impl fmt::Display for EtcdRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EtcdRefused {}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: Vec::new(),
            prefix: crate::DEFAULT_ETCD_PREFIX.into(),
            request_timeout: crate::DEFAULT_ETCD_REQUEST_TIMEOUT,
            connect_timeout: crate::DEFAULT_ETCD_CONNECT_TIMEOUT,
            lease_ttl: crate::DEFAULT_ETCD_LEASE_TTL,
            batch: crate::DEFAULT_ETCD_BATCH,
            batch_wait: crate::DEFAULT_ETCD_BATCH_WAIT,
            join_wait: crate::DEFAULT_ETCD_JOIN_WAIT,
            security: EtcdSecurity::default(),
        }
    }
}

/// `STATUS <name> detail`: the lock as STATUS shows it, every holder, and the queue's head.
#[derive(Debug)]
pub struct Detail {
    /// The lock as `STATUS <name>` shows it.
    pub status: LockStatus,
    /// Every holder, in the order they were granted.
    pub holders: Vec<LockStatus>,
    /// The queue's head (as many as asked for), first in line first.
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

/// What a backend's LOCK did at once, before the seam makes it durable and wraps a wait in
/// a [`Wait`].
#[derive(Debug)]
pub enum LockStart {
    /// Granted at once (not durable yet).
    Granted {
        /// Its fencing token.
        token: Token,
        /// Which hand-over it was.
        handover: HandOver,
    },
    /// Queued: `rx` receives the outcome.
    Waiting {
        /// The wait, to cancel it by.
        waiter: WaiterId,
        /// Where its outcome arrives.
        rx: oneshot::Receiver<WaitResult>,
    },
}

/// What a LOCK did at once, as [`Backend::lock`] answers it.
#[derive(Debug)]
pub enum Locked {
    /// Granted, and durable.
    Granted {
        /// Its fencing token.
        token: Token,
        /// Which hand-over it was.
        handover: HandOver,
    },
    /// Queued.
    Waiting(Wait),
}

/// How the backend is doing, for `/readyz`, STATUS and the metrics scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Ready to grant: the journal writes, or an etcd quorum answered this front-end within
    /// the bound; if not, why (one line, for people).
    pub ready: Result<(), std::borrow::Cow<'static, str>>,
    /// How long the oldest change not yet durable has waited (`None`: none waits, or changes
    /// are durable once made).
    pub journal_backlog: Option<Duration>,
    /// Cluster mode: how old this front-end's view of etcd may be (the age of its last
    /// quorum answer) and the bound past which it is not ready. `None`: the embedded
    /// backend, whose table is never stale.
    pub confirmed: Option<crate::proto::EtcdAge>,
}

/// A queued LOCK. Dropping it (the connection went, the task was cancelled) takes the waiter
/// out of the queue, or gives back a grant its client was never told of.
pub struct Wait {
    backend: Backend,
    name: Arc<str>,
    waiter: WaiterId,
    rx: Option<oneshot::Receiver<WaitResult>>,
    /// A grant received and not returned yet: it is returned once durable up to this mark.
    arrived: Option<(WaitResult, Seq)>,
}

impl Wait {
    /// The name waited for.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// How the wait ends; a grant only once it is durable (if it never will be:
    /// [`WaitResult::Failed`] with [`BackendError::NotDurable`]). Cancel-safe: a grant that
    /// arrived stays here until this returns it, and dropping the wait then gives it back.
    pub async fn result(&mut self) -> WaitResult {
        if self.arrived.is_none() {
            let result = match self.rx.as_mut() {
                Some(rx) => rx.await,
                None => std::future::pending().await,
            };
            self.rx = None;
            // The sender is only dropped unused when the server is going away.
            let result = result.unwrap_or(WaitResult::Ended(WaitEnd::TimedOut));
            if !matches!(result, WaitResult::Granted { .. }) {
                return result;
            }
            match self.backend.durable_mark() {
                None => return result,
                Some(mark) => self.arrived = Some((result, mark)),
            }
        }
        let Some(mark) = self.arrived.as_ref().map(|(_, mark)| *mark) else {
            return std::future::pending().await;
        };
        // Boxed: only a grant on a --data-dir server waits here, and only for a moment;
        // inline, its state would be in every waiting connection's task all along.
        let durable = Box::pin(self.backend.durable(mark)).await;
        let Some((result, _)) = self.arrived.take() else {
            return std::future::pending().await;
        };
        match durable {
            Ok(()) => result,
            Err(e) => WaitResult::Failed(e),
        }
    }
}

impl fmt::Debug for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wait")
            .field("name", &self.name)
            .field("waiter", &self.waiter)
            .finish_non_exhaustive()
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            self.backend.abandon_wait(&self.name, self.waiter, rx);
        }
        if let Some((
            WaitResult::Granted {
                token, handover, ..
            },
            _,
        )) = self.arrived.take()
        {
            self.backend.give_back(&self.name, token, handover);
        }
    }
}

/// An event as watchers see it: what happened and when (wall clock, for people).
#[derive(Debug)]
pub struct Published {
    /// What happened.
    pub event: Event,
    /// When it was published, in milliseconds since the Unix epoch.
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

    /// Whether no lock is held.
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

/// Dispatches to the backend; `$call` is an expression on `b`, the backend's own handle.
// The cluster backend's request futures are boxed where they are awaited below: each of them
// (etcd transactions through tonic) is several KiB, and inline they would size every
// connection's task (a future is as large as its largest await point) in every mode, the
// embedded one too; a request to etcd costs a round trip, next to which the allocation is
// nothing.
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
    /// The handles this backend's counters are bumped through.
    pub fn metrics(&self) -> &Metrics {
        each!(self, b => b.metrics())
    }

    /// Whether it is ready to grant, and how far behind its journal is.
    pub fn health(&self) -> Health {
        each!(self, b => b.health())
    }

    /// How old a cluster front-end's view of the locks is (`None`: the embedded table, never
    /// behind). Cheap: for every STATUS line.
    pub fn view_age(&self) -> Option<crate::proto::EtcdAge> {
        match self {
            Backend::Embedded(_) => None,
            #[cfg(feature = "etcd")]
            Backend::Etcd(c) => Some(c.freshness()),
        }
    }

    /// Held locks and queued waiters, for the metrics scrape.
    pub fn counts(&self) -> (usize, usize) {
        each!(self, b => b.counts())
    }

    /// Sets the backend's own gauges before a scrape (the etcd backend's `lockd_etcd_*`).
    pub fn scrape(&self) {
        match self {
            Backend::Embedded(_) => {}
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => b.scrape(),
        }
    }

    /// What to wait for so that every change made so far is durable; `None` when a change
    /// is durable once it is made.
    fn durable_mark(&self) -> Option<Seq> {
        each!(self, b => b.durable_mark())
    }

    /// Waits until the changes up to `mark` are durable.
    async fn durable(&self, mark: Seq) -> Result<(), BackendError> {
        each!(self, b => b.durable(mark).await)
    }

    /// Waits until every change made so far is durable.
    async fn made_durable(&self) -> Result<(), BackendError> {
        match self.durable_mark() {
            Some(mark) => self.durable(mark).await,
            None => Ok(()),
        }
    }

    /// A number for a new connection.
    pub fn connection_id(&self) -> ConnId {
        each!(self, b => b.connection_id())
    }

    /// The limits in force (`--max-locks`, `--max-ttl`, ...).
    pub fn limits(&self) -> Limits {
        each!(self, b => b.limits())
    }

    /// LOCK: granted (once durable), or queued. A session lease is bound to `req.conn`:
    /// [`Backend::closed`] ends it.
    pub async fn lock(&self, req: LockRequest) -> Result<Locked, BackendError> {
        let name = req.name.clone();
        let start = match self {
            Backend::Embedded(b) => b.lock(req)?,
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => Box::pin(b.lock_bound(req)).await?,
        };
        match start {
            LockStart::Granted { token, handover } => {
                self.made_durable().await?;
                Ok(Locked::Granted { token, handover })
            }
            LockStart::Waiting { waiter, rx } => Ok(Locked::Waiting(Wait {
                backend: self.clone(),
                name,
                waiter,
                rx: Some(rx),
                arrived: None,
            })),
        }
    }

    /// UNLOCK by `user`; returns once the release is durable.
    pub async fn unlock(&self, name: &str, token: Token, user: UserId) -> Result<(), BackendError> {
        match self {
            Backend::Embedded(b) => b.unlock(name, token, user)?,
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => Box::pin(b.unlock_bound(name, token, user)).await?,
        }
        self.made_durable().await
    }

    /// BREAK by `by` (an operator's; the `admin` right is the caller's to check): every
    /// lease of `name`, or only `token`'s, ends for its holder; the queue moves on once each
    /// has let go or run out, or at once with `force` (proto.md). Returns how many leases it
    /// broke, once that is durable.
    pub async fn break_lock(
        &self,
        name: &str,
        token: Option<Token>,
        by: &Origin,
        force: bool,
    ) -> Result<usize, BackendError> {
        let ended = match self {
            Backend::Embedded(b) => b.break_lock(name, token, by, force)?,
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => Box::pin(b.break_bound(name, token, by, force)).await?,
        };
        self.made_durable().await?;
        Ok(ended)
    }

    /// RENEW (with `detach`, RENEW ... detach: a session lease becomes a plain one, that lasts
    /// until UNLOCK or its ttl whatever becomes of any connection); returns once that is
    /// durable. A broken lease's refusal names who broke it, either way.
    pub async fn renew(
        &self,
        req: &RenewRequest,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewed, BackendError> {
        let renewed = match self {
            Backend::Embedded(b) => b.renew(req, conn, user)?,
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => Box::pin(b.renew(req, conn, user)).await?,
        };
        self.made_durable().await?;
        Ok(renewed)
    }

    /// CHECK: the lease's time left.
    pub async fn check(&self, name: &str, token: Token) -> Result<Duration, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.check(name, token)?),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => Box::pin(b.check(name, token)).await,
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
            Backend::Etcd(b) => Box::pin(b.take_back(name, token, handover)).await,
        }
    }

    /// STATUS of one name.
    pub async fn status(&self, name: &str) -> Result<Option<LockStatus>, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.status(name)),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => Box::pin(b.status(name)).await,
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
            Backend::Etcd(b) => Box::pin(b.status_detail(name, max)).await,
        }
    }

    /// Every held lock, sorted by name, as of now; see [`Embedded::status_snapshot`] for
    /// how copies are shared and bounded.
    pub async fn status_snapshot(&self) -> Result<StatusView, BackendError> {
        match self {
            Backend::Embedded(b) => Ok(b.status_snapshot().await),
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => Box::pin(b.status_snapshot()).await,
        }
    }

    /// At most `copies` copies of the locks are held by STATUS answers at once.
    pub fn limit_status_copies(&self, copies: usize) {
        each!(self, b => b.limit_status_copies(copies))
    }

    /// A waiting connection is going away. If it was granted in the meantime (the grant sits
    /// unread in `rx`), its client never learned the token, so the lock is released at once.
    fn abandon_wait(&self, name: &str, waiter: WaiterId, rx: oneshot::Receiver<WaitResult>) {
        each!(self, b => b.abandon_wait(name, waiter, rx))
    }

    /// [`Backend::revoke`] without waiting for it, for `Drop`.
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    fn give_back(&self, name: &str, token: Token, handover: HandOver) {
        match self {
            Backend::Embedded(b) => {
                b.revoke(name, token);
            }
            #[cfg(feature = "etcd")]
            Backend::Etcd(b) => {
                let (b, name) = (Arc::clone(b), name.to_owned());
                tokio::spawn(async move { b.take_back(&name, token, handover).await });
            }
        }
    }

    /// Connection `conn` closed: the session leases still bound to it end (event `dropped`)
    /// or start their grace. Synchronous, for `Drop`; calling it again does nothing.
    pub fn closed(&self, conn: ConnId) {
        each!(self, b => b.closed(conn))
    }

    /// Whether a session lease is bound to connection `conn` (its client must keep it open,
    /// so it is not closed for being idle).
    pub fn holds_sessions(&self, conn: ConnId) -> bool {
        each!(self, b => b.holds_sessions(conn))
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

/// A client's address as a log field: `-` where it is not known, so that every audit line
/// has the same fields.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerField(pub(crate) Option<std::net::SocketAddr>);

impl fmt::Display for PeerField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(peer) => peer.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// The log line of a lease event (both backends log alike): one per grant and per end, with
/// who took the lease (`user`, `-` without one; `peer`, the client's `ip:port`, `-` where not
/// known): the holder carries them, as an expiry has no request in flight.
pub(crate) fn log_event(e: &Event) {
    let (name, id, token) = (&*e.name, &*e.id, e.token);
    let user = e.origin.user().unwrap_or("-");
    let peer = PeerField(e.origin.peer());
    let held_ms = e.held.as_millis() as u64;
    match e.kind {
        EventKind::Acquired => {
            let waited_ms = e.waited.map_or(0, |w| w.as_millis() as u64);
            tracing::info!(name, id, token, user, %peer, waited_ms, "granted")
        }
        EventKind::Released => tracing::info!(name, id, token, user, %peer, held_ms, "released"),
        EventKind::Expired => {
            tracing::info!(name, id, token, user, %peer, held_ms, "lease expired")
        }
        EventKind::Dropped => {
            tracing::info!(name, id, token, user, %peer, held_ms, "session closed, released")
        }
        EventKind::Revoked => tracing::info!(
            name,
            id,
            token,
            user,
            %peer,
            held_ms,
            "grant taken back: the waiter was gone"
        ),
        // The audit line of a BREAK: whose lease it was, and who broke it; `breaking`: it
        // keeps its place until its holder lets go or runs out (its end is a line of its own).
        EventKind::Broken | EventKind::Breaking => {
            let what = match e.kind {
                EventKind::Broken => "lock broken",
                _ => "lock broken, held until its holder lets go",
            };
            let by_user = e.broken_by.user().unwrap_or("-");
            let by_peer = PeerField(e.broken_by.peer());
            tracing::info!(
                name,
                id,
                token,
                holder_user = user,
                holder_peer = %peer,
                by_user,
                by_peer = %by_peer,
                held_ms,
                "{what}"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::locks::{Mode, NO_USER};
    use crate::store::{Journal, Store};

    /// A data directory of its own, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(what: &str) -> Dir {
            let unique = format!("lockd-seam-{what}-{}-{}", std::process::id(), unix_ms());
            Dir(std::env::temp_dir().join(unique))
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn durable_backend(dir: &Dir) -> (Store, Journal, Arc<Embedded>) {
        let (store, recovered) = Store::open(&dir.0, Default::default()).expect("data dir");
        let journal = store.journal();
        let embedded = Embedded::new_durable(
            Limits::default(),
            1,
            16,
            store.journal(),
            &recovered,
            None,
            Default::default(),
        );
        (store, journal, embedded)
    }

    /// Whether every change made so far is on disk already.
    async fn durable_now(journal: &Journal) -> bool {
        let all = journal.durable(journal.appended());
        tokio::time::timeout(Duration::ZERO, all).await.is_ok()
    }

    fn req(name: &str, id: &str, conn: ConnId, session: bool) -> LockRequest {
        LockRequest {
            name: name.into(),
            id: id.into(),
            ttl: Some(Duration::from_secs(60)),
            wait: None,
            tie: if session {
                crate::locks::Tie::Session(Duration::ZERO)
            } else {
                crate::locks::Tie::Plain
            },
            conn,
            mode: Mode::Exclusive,
            user: NO_USER,
            origin: Default::default(),
            note: None,
            supersede: false,
            and: Box::default(),
            delay: None,
        }
    }

    #[tokio::test]
    async fn a_change_is_durable_when_its_call_returns() {
        let dir = Dir::new("calls");
        let (mut store, journal, embedded) = durable_backend(&dir);
        let backend = Backend::Embedded(embedded);
        let Ok(Locked::Granted { token, .. }) = backend.lock(req("x", "a", 1, false)).await else {
            panic!("not granted");
        };
        assert!(durable_now(&journal).await);
        let renew = RenewRequest {
            name: "x".into(),
            token,
            ttl: None,
            detach: false,
        };
        backend.renew(&renew, 1, NO_USER).await.unwrap();
        assert!(durable_now(&journal).await);
        backend.unlock("x", token, NO_USER).await.unwrap();
        assert!(durable_now(&journal).await);
        store.close().unwrap();
    }

    #[tokio::test]
    async fn a_waiter_hears_of_its_grant_once_it_is_durable_and_its_close_ends_it() {
        let dir = Dir::new("wait");
        let (mut store, journal, embedded) = durable_backend(&dir);
        let backend = Backend::Embedded(Arc::clone(&embedded));
        let Ok(Locked::Granted { token, .. }) = backend.lock(req("x", "a", 1, false)).await else {
            panic!("not granted");
        };
        let Ok(Locked::Waiting(mut wait)) = backend.lock(req("x", "b", 2, true)).await else {
            panic!("not queued");
        };
        assert!(!backend.holds_sessions(2));
        // Released behind the seam's back: the grant is queued for the disk, not on it yet.
        embedded.unlock("x", token, NO_USER).unwrap();
        let WaitResult::Granted { token: next, .. } = wait.result().await else {
            panic!("not granted");
        };
        assert!(durable_now(&journal).await);
        drop(wait);
        // Its session lease is bound to connection 2, and ends with it.
        assert!(backend.holds_sessions(2));
        assert_eq!(
            backend.status("x").await.unwrap().map(|s| s.token),
            Some(next)
        );
        backend.closed(2);
        assert!(!backend.holds_sessions(2));
        assert!(backend.status("x").await.unwrap().is_none());
        store.close().unwrap();
    }

    /// A wait whose grant has arrived, made to wait for a mark the disk never reaches.
    async fn arrived_never_durable(backend: &Backend, embedded: &Embedded) -> Wait {
        let Ok(Locked::Granted { token, .. }) = backend.lock(req("x", "a", 1, false)).await else {
            panic!("not granted");
        };
        let Ok(Locked::Waiting(mut wait)) = backend.lock(req("x", "b", 2, false)).await else {
            panic!("not queued");
        };
        embedded.unlock("x", token, NO_USER).unwrap();
        let grant = wait.rx.take().expect("a receiver").await.expect("a grant");
        assert!(matches!(grant, WaitResult::Granted { .. }));
        wait.arrived = Some((grant, Seq::MAX));
        wait
    }

    #[tokio::test]
    async fn a_wait_dropped_before_its_grant_is_durable_gives_it_back() {
        let dir = Dir::new("drop");
        let (mut store, _journal, embedded) = durable_backend(&dir);
        let backend = Backend::Embedded(Arc::clone(&embedded));
        let mut wait = arrived_never_durable(&backend, &embedded).await;
        // Not reported while it is not durable, and kept across a cancelled look.
        let first = tokio::time::timeout(Duration::ZERO, wait.result()).await;
        assert!(first.is_err());
        assert!(wait.arrived.is_some());
        // The client was never told: dropped, the grant is taken back.
        drop(wait);
        assert!(backend.status("x").await.unwrap().is_none());
        store.close().unwrap();
    }

    #[tokio::test]
    async fn a_grant_that_can_never_be_durable_is_not_reported() {
        let dir = Dir::new("stop");
        let (mut store, _journal, embedded) = durable_backend(&dir);
        let backend = Backend::Embedded(Arc::clone(&embedded));
        let mut wait = arrived_never_durable(&backend, &embedded).await;
        // The store stops (as when a write failed): the wait answers NotDurable.
        store.close().unwrap();
        let result = wait.result().await;
        assert!(matches!(
            result,
            WaitResult::Failed(BackendError::NotDurable)
        ));
        assert!(matches!(
            backend.lock(req("y", "c", 3, false)).await,
            Err(BackendError::NotDurable)
        ));
    }
}
