//! Two-port compatibility mode: the old bash/netcat mutex protocol, served on one named lock of
//! the ordinary table, so old clients keep working unchanged and take turns with line-protocol
//! clients.
//!
//! The old protocol tells the lock's state by which port accepts connections: while the lock
//! is free the *lock port* is open and the *unlock port* refuses connections; while it is held,
//! the other way round. One task (`Compat::run`) owns both ports and keeps them matching the
//! table: it opens and closes them after its own grants and releases (before the client gets
//! its `ok...` reply, so a client that read `oklocked` finds the lock port already closed),
//! and after the table's events for the name (line-protocol grants and releases, expiry).
//! A connection is read by a task of its own, so a silent one delays nobody; the table work
//! for a well-formed message goes back to the owning task, which serializes it with the port
//! changes.
//!
//! An unlock message carries no token, so it can only release a lease that was granted
//! through the lock port: a line-protocol holder keeps its fencing guarantee.

mod args;
mod conn;
mod message;
mod port;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::{Backend, Locked, Published};
use crate::locks::{ConnId, Event, EventKind, LockRequest, Origin, Token, NO_USER};
use crate::metrics::Protocol;

use conn::{Answer, CompatRequest, ConnCtx};

pub use args::CompatArgs;
pub(crate) use message::{Kind, Message};

/// `SERVER_ADDR`'s default: the host the two ports are bound on.
pub const DEFAULT_HOST: &str = "localhost";
/// `LOCK_PORT`'s default.
pub const DEFAULT_LOCK_PORT: u16 = 5001;
/// `UNLOCK_PORT`'s default.
pub const DEFAULT_UNLOCK_PORT: u16 = 5002;
/// `UNLOCK_PORT_TIMEOUT`'s default: the lease of a lock taken through the lock port.
pub const DEFAULT_UNLOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// The lock in the table that the two ports stand for.
pub const DEFAULT_NAME: &str = "compat";
/// How long a compat connection may take to send its message.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the line protocol listens when compat mode is on and `--listen` is not given: the
/// ordinary default, 127.0.0.1:5001, is the old lock port.
pub const DEFAULT_COMPAT_LISTEN: &str = "127.0.0.1:5003";

/// Compat connections handled at once; more are closed at once (a flood, not a client).
const MAX_CONNECTIONS: usize = 64;
/// Messages queued for the owning task.
const QUEUE: usize = 64;
/// Wait before binding a port again after a bind failed.
const REBIND_DELAY: Duration = Duration::from_secs(1);
/// Wait after an accept error (out of file descriptors and the like) so it can't spin.
const ACCEPT_ERROR_DELAY: Duration = Duration::from_millis(100);

/// The two-port mode's settings; `server::Config::compat` turns it on.
#[derive(Clone, Debug)]
pub struct CompatConfig {
    /// Host or address both ports bind on, on every address it resolves to (`SERVER_ADDR`).
    pub host: String,
    /// Port that accepts `lock:` messages while the lock is free (`LOCK_PORT`).
    pub lock_port: u16,
    /// Port that accepts `unlock:` messages while the lock is held (`UNLOCK_PORT`).
    pub unlock_port: u16,
    /// Lease of a lock taken through the lock port: released if no unlock comes in time
    /// (`UNLOCK_PORT_TIMEOUT`).
    pub unlock_timeout: Duration,
    /// The lock in the table the two ports stand for.
    pub name: String,
    /// How long a connection may take to send its message before it is closed unanswered.
    pub read_timeout: Duration,
}

impl Default for CompatConfig {
    fn default() -> Self {
        CompatConfig {
            host: DEFAULT_HOST.into(),
            lock_port: DEFAULT_LOCK_PORT,
            unlock_port: DEFAULT_UNLOCK_PORT,
            unlock_timeout: DEFAULT_UNLOCK_TIMEOUT,
            name: DEFAULT_NAME.into(),
            read_timeout: DEFAULT_READ_TIMEOUT,
        }
    }
}

impl CompatConfig {
    /// Checks what the table or the ports would refuse later, so it fails at start instead.
    pub fn validate(&self, max_ttl: Duration) -> Result<(), String> {
        if self.lock_port == 0 || self.unlock_port == 0 {
            return Err(
                "--lock-port (LOCK_PORT) and --unlock-port (UNLOCK_PORT) must not be 0".into(),
            );
        }
        if self.lock_port == self.unlock_port {
            return Err(format!(
                "--lock-port (LOCK_PORT) and --unlock-port (UNLOCK_PORT) must differ (both {})",
                self.lock_port
            ));
        }
        if self.unlock_timeout < crate::MIN_TTL || self.unlock_timeout > max_ttl {
            return Err(format!(
                "--unlock-timeout (UNLOCK_PORT_TIMEOUT) must be at least {} and at most --max-ttl ({})",
                humantime::format_duration(crate::MIN_TTL),
                humantime::format_duration(max_ttl)
            ));
        }
        if self.read_timeout.is_zero() {
            return Err("--compat-read-timeout must be more than 0".into());
        }
        crate::proto::validate_name("compat lock name", &self.name).map_err(|e| e.message)
    }
}

/// The running mode: both ports, and the lock they stand for.
pub struct Compat {
    config: CompatConfig,
    backend: Backend,
    lock_port: port::Port,
    unlock_port: port::Port,
    events: broadcast::Receiver<Arc<Published>>,
    requests_tx: mpsc::Sender<CompatRequest>,
    requests: mpsc::Receiver<CompatRequest>,
    /// The token of the lease granted through the lock port, while it lasts: the only lease
    /// an unlock message may release.
    granted: Option<Token>,
    conn: ConnId,
    rebind_at: Option<Instant>,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
}

impl Compat {
    /// Checks the settings and both ports (a port in use fails here, not at the first grant),
    /// subscribes to the table's events and opens the port that matches the lock's state.
    /// Connections queue there until [`Compat::run`] serves them.
    pub async fn start(config: CompatConfig, backend: Backend) -> io::Result<Compat> {
        config
            .validate(backend.limits().max_ttl)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let addrs = bindable_addrs(&config.host, config.lock_port).await?;
        for addr in &addrs {
            let addr = SocketAddr::new(addr.ip(), config.unlock_port);
            port::bind(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("compat unlock port {addr}: {e}")))?;
        }
        let unlock_addrs = addrs
            .iter()
            .map(|a| SocketAddr::new(a.ip(), config.unlock_port))
            .collect();
        // Subscribed before the first look at the table, so no change is missed.
        let events = backend.subscribe();
        let (requests_tx, requests) = mpsc::channel(QUEUE);
        // A lease held before anyone could connect was restored from --data-dir. Which
        // protocol took it is not recorded, so it is taken to be an old client's: an
        // `unlock:` can release it, and its holder is not stuck until the timeout.
        let restored = match backend.status(&config.name).await {
            Ok(status) => status.map(|s| s.token),
            Err(e) => return Err(io::Error::other(format!("compat: {e}"))),
        };
        let mut compat = Compat {
            lock_port: port::Port::new(Kind::Lock, addrs),
            unlock_port: port::Port::new(Kind::Unlock, unlock_addrs),
            conn: backend.connection_id(),
            config,
            backend,
            events,
            requests_tx,
            requests,
            granted: restored,
            rebind_at: None,
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            tracker: TaskTracker::new(),
        };
        tracing::info!(
            name = compat.config.name,
            lock = ?compat.lock_port.addrs(),
            unlock = ?compat.unlock_port.addrs(),
            timeout = %humantime::format_duration(compat.config.unlock_timeout),
            "compat mode"
        );
        // The ports match the table before the server accepts anything: a client that got an
        // answer on the line protocol finds the compat ports up too.
        compat.sync_ports().await;
        Ok(compat)
    }

    /// Serves both ports until `shutdown`, then closes them and waits for the connections
    /// being read (each ends within the read timeout, or at once on shutdown).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let ctx = ConnCtx {
            backend: self.backend.clone(),
            name: self.config.name.as_str().into(),
            read_timeout: self.config.read_timeout,
            requests: self.requests_tx.clone(),
            shutdown: shutdown.clone(),
        };
        let mut resync = true;
        loop {
            if resync {
                self.sync_ports().await;
            }
            let rebind = async {
                match self.rebind_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            resync = tokio::select! {
                _ = shutdown.cancelled() => break,
                event = self.events.recv() => match event {
                    Ok(p) => self.on_event(&p.event),
                    // Missed events: the table itself says where things stand.
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => break,
                },
                accepted = self.lock_port.accept() => self.on_accept(Kind::Lock, accepted, &ctx).await,
                accepted = self.unlock_port.accept() => self.on_accept(Kind::Unlock, accepted, &ctx).await,
                Some(req) = self.requests.recv() => {
                    self.on_request(req).await;
                    false
                }
                _ = rebind => true,
            };
        }
        self.lock_port.close();
        self.unlock_port.close();
        // Requests still queued are dropped: their connections close unanswered.
        drop(self.requests);
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Opens the port that matches the table's state and closes the other. Closing comes
    /// first, so the two are never open at once.
    async fn sync_ports(&mut self) {
        let held = match self.backend.status(&self.config.name).await {
            Ok(status) => status.is_some(),
            Err(e) => {
                // The backend can't say (no quorum): look again shortly, ports as they are.
                tracing::warn!(error = %e, "compat: cannot read the lock's state; retrying");
                self.rebind_at = Some(Instant::now() + REBIND_DELAY);
                return;
            }
        };
        let (open, close) = if held {
            (&mut self.unlock_port, &mut self.lock_port)
        } else {
            (&mut self.lock_port, &mut self.unlock_port)
        };
        if close.close() {
            tracing::debug!("{} port closed", close.kind);
        }
        match open.open() {
            Ok(opened) => {
                self.rebind_at = None;
                if opened {
                    let addr = open.addrs();
                    tracing::info!(?addr, "listening for {} request", open.kind.with_article());
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot reopen the {} port; retrying", open.kind);
                self.rebind_at = Some(Instant::now() + REBIND_DELAY);
            }
        }
    }

    /// Whether the ports need a look: only events of our lock matter.
    fn on_event(&mut self, event: &Event) -> bool {
        if *event.name != *self.config.name {
            return false;
        }
        if event.kind != EventKind::Acquired && self.granted == Some(event.token) {
            self.granted = None;
            if event.kind == EventKind::Expired {
                tracing::warn!(
                    id = &*event.id,
                    "timed out waiting for unlock; lock released after {}",
                    humantime::format_duration(self.config.unlock_timeout)
                );
            }
        }
        true
    }

    async fn on_accept(
        &mut self,
        kind: Kind,
        accepted: io::Result<(TcpStream, SocketAddr)>,
        ctx: &ConnCtx,
    ) -> bool {
        match accepted {
            Ok((stream, peer)) => match Arc::clone(&self.permits).try_acquire_owned() {
                Ok(permit) => {
                    let ctx = ctx.clone();
                    let counted = self.backend.metrics().connection(Protocol::Compat);
                    self.tracker.spawn(async move {
                        conn::serve(stream, peer, kind, ctx).await;
                        drop((permit, counted));
                    });
                }
                Err(_) => {
                    tracing::warn!(%peer, "too many compat connections at once; closing one")
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "accept failed on the {kind} port");
                tokio::time::sleep(ACCEPT_ERROR_DELAY).await;
            }
        }
        false
    }

    /// Carries out a well-formed message against the table, brings the ports up to date,
    /// and only then tells the connection what to answer.
    async fn on_request(&mut self, req: CompatRequest) {
        let Message { id, at } = &req.msg;
        let answer = match req.kind {
            Kind::Lock => self.lock(id, at, req.peer).await,
            Kind::Unlock => self.unlock(id, at, req.peer).await,
        };
        self.sync_ports().await;
        let _ = req.done.send(answer);
    }

    async fn lock(&mut self, id: &str, at: &str, peer: SocketAddr) -> Answer {
        tracing::info!(%peer, "lock requested by {id} at {at}");
        let name = &self.config.name;
        // A connection accepted just before the port closed: the lock is taken already.
        if let Ok(Some(status)) = self.backend.status(name).await {
            tracing::info!(%peer, holder = &*status.holder, "lock held; not granted to {id}");
            return Answer::Nothing;
        }
        let req = LockRequest {
            name: name.as_str().into(),
            id: id.to_owned(),
            ttl: Some(self.config.unlock_timeout),
            wait: Some(Duration::ZERO),
            conn: self.conn,
            // The old protocol has no users: its lease belongs to none.
            user: NO_USER,
            origin: Origin::new(None, Some(peer)),
            ..LockRequest::default()
        };
        match self.backend.lock(req).await {
            Ok(Locked::Granted { token, .. }) => {
                self.granted = Some(token);
                Answer::Locked(token)
            }
            // wait=0 never queues; if it ever did, leave the queue rather than hold it (the
            // dropped wait leaves it).
            Ok(Locked::Waiting(_)) => Answer::Nothing,
            Err(e) => {
                tracing::info!(%peer, "lock not granted to {id}: {e}");
                Answer::Nothing
            }
        }
    }

    async fn unlock(&mut self, id: &str, at: &str, peer: SocketAddr) -> Answer {
        let name = &self.config.name;
        let Ok(Some(status)) = self.backend.status(name).await else {
            tracing::info!(%peer, "unlock requested by {id} at {at}, but the lock is free");
            return Answer::Nothing;
        };
        if self.granted != Some(status.token) {
            tracing::warn!(
                %peer,
                holder = &*status.holder,
                token = status.token,
                "unlock requested by {id} at {at} refused: a line-protocol client holds the lock"
            );
            return Answer::Nothing;
        }
        match self.backend.unlock(name, status.token, NO_USER).await {
            Ok(()) => {
                self.granted = None;
                if *status.holder == *id {
                    tracing::info!(%peer, "lock released by {id} at {at}");
                } else {
                    tracing::info!(%peer, holder = &*status.holder, "lock released by {id} at {at}");
                }
                Answer::Unlocked
            }
            Err(e) => {
                tracing::info!(%peer, "unlock requested by {id} at {at} not done: {e}");
                Answer::Nothing
            }
        }
    }
}

/// The addresses `host` resolves to that this machine can bind `port` on. `localhost` often
/// resolves to ::1 too, which a host without IPv6 can't bind: such an address is skipped. A
/// port already in use is an error.
async fn bindable_addrs(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let context =
        |e: io::Error| io::Error::new(e.kind(), format!("compat lock port {host}:{port}: {e}"));
    let mut resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(context)?
        .collect();
    resolved.sort();
    resolved.dedup();
    let mut usable = Vec::new();
    let mut first_error = None;
    for addr in resolved {
        match port::bind(addr) {
            Ok(_) => usable.push(addr),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("compat lock port {addr}: {e}"),
                ))
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, "compat: skipping an address that can't be bound");
                first_error.get_or_insert(e);
            }
        }
    }
    if usable.is_empty() {
        return Err(context(first_error.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "resolves to no address")
        })));
    }
    Ok(usable)
}
