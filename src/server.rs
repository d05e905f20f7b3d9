//! Accepts connections and runs a session for each, within the connection limit; shuts down
//! gracefully when told to.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Gate;
use crate::backend::{self, Backend, Embedded, EtcdConfig};
use crate::busy_poll::BusyPoll;
use crate::compat::{Compat, CompatConfig};
use crate::connection::Connection;
use crate::handler::{Handler, HandlerLimits};
use crate::http::Endpoint;
use crate::locks::Limits;
use crate::metrics::{Deployment, Metrics, Protocol};
use crate::per_ip::PerIp;
use crate::proto::{ErrorCode, ProtoError, Reply};
use crate::store::Store;
use crate::stream::Stream;
use crate::tls::ServerTls;

/// Refused connections whose input is drained (or whose refusal is written slowly) at once;
/// past that, a refused connection is told and closed at once, without waiting for it.
const REFUSALS_AT_ONCE: usize = 64;
/// Refusals are logged at most once per this long, with a count of the others.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Everything the server needs to know; [`crate::daemon`] fills it from flags, tests from
/// `Default`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Lease and lock-count limits the table enforces.
    pub limits: Limits,
    /// Most client connections at once; more are answered `ERR LIMIT` and closed.
    pub max_connections: usize,
    /// Most client connections at once from one address (at most `max_connections`); more
    /// from it are answered `ERR LIMIT` and closed.
    pub max_connections_per_ip: usize,
    /// Longest request line in bytes; longer ones are answered `ERR TOOLONG` and closed.
    pub max_line: usize,
    /// Longest name or id in bytes (at most 255); longer ones are answered `ERR BADARG`.
    pub max_name: usize,
    /// Events a watcher may fall behind before `ERR LAGGED`.
    pub watch_buffer: usize,
    /// How long a client may leave each 16 KiB of replies unread before it is disconnected.
    pub write_timeout: Duration,
    /// How long a connection with nothing going on (no session lease, no waiting LOCK, no
    /// WATCH) may send no line before it is closed; zero never closes it.
    pub idle_timeout: Duration,
    /// How long the start of a line may wait for the rest of it before the connection is
    /// closed; zero waits as long as it takes.
    pub line_timeout: Duration,
    /// Most copies of the table that STATUS answers being sent may hold at once.
    pub status_copies: usize,
    /// How long shutdown lets connections finish before it drops them.
    pub shutdown_grace: Duration,
    /// How long a grant to a waiter that half-closed is watched for a reset.
    pub half_close_probe: Duration,
    /// How long one worker keeps polling the sockets after a request before it parks (see
    /// [`crate::busy_poll`]); zero parks at once.
    pub busy_poll: Duration,
    /// The old two-port protocol, served alongside on the same table (`--compat`).
    pub compat: Option<CompatConfig>,
    /// Where state is kept durably (`--data-dir`); `None` keeps it in memory only.
    pub data_dir: Option<PathBuf>,
    /// Cluster mode: every lock in this etcd cluster (`--etcd`), shared with the other
    /// front-ends of the same prefix. Needs the `etcd` feature.
    pub etcd: Option<EtcdConfig>,
    /// The operators' HTTP endpoint, told when the server is ready and when it stops.
    pub endpoint: Option<Endpoint>,
    /// The users of `--auth-file`: clients must AUTH and may only do what their rights
    /// allow. `None` serves everyone alike (trusted networks only).
    pub auth: Option<Arc<Gate>>,
    /// Serve the line protocol over TLS (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
    pub tls: Option<ServerTls>,
    /// How long a TLS client may take to complete its handshake.
    pub tls_handshake_timeout: Duration,
    /// Longest note a LOCK may carry, in bytes; longer ones are answered `ERR BADARG`.
    pub max_note: usize,
    /// Most names one LOCK may ask for (`--max-names`); more are answered `ERR LIMIT`.
    pub max_names: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: Limits::default(),
            max_connections: crate::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: crate::DEFAULT_MAX_CONNECTIONS_PER_IP,
            max_line: crate::DEFAULT_MAX_LINE,
            max_name: crate::proto::MAX_NAME_LEN,
            watch_buffer: crate::DEFAULT_WATCH_BUFFER,
            write_timeout: crate::DEFAULT_WRITE_TIMEOUT,
            idle_timeout: crate::DEFAULT_IDLE_TIMEOUT,
            line_timeout: crate::DEFAULT_LINE_TIMEOUT,
            status_copies: crate::DEFAULT_STATUS_COPIES,
            shutdown_grace: crate::DEFAULT_SHUTDOWN_GRACE,
            half_close_probe: crate::DEFAULT_HALF_CLOSE_PROBE,
            busy_poll: crate::DEFAULT_BUSY_POLL,
            compat: None,
            data_dir: None,
            etcd: None,
            endpoint: None,
            auth: None,
            tls: None,
            tls_handshake_timeout: crate::DEFAULT_TLS_HANDSHAKE_TIMEOUT,
            max_note: crate::DEFAULT_MAX_NOTE,
            max_names: crate::DEFAULT_MAX_NAMES,
        }
    }
}

impl Config {
    fn handler_limits(&self) -> HandlerLimits {
        HandlerLimits {
            max_line: self.max_line,
            max_name: self.max_name.min(crate::proto::MAX_NAME_LEN),
            watch_buffer: self.watch_buffer,
            half_close_probe: self.half_close_probe,
            idle_timeout: self.idle_timeout,
            line_timeout: self.line_timeout,
            max_note: self.max_note,
            max_names: self.max_names,
        }
    }
}

/// Serves `listener` until `shutdown` is cancelled, then lets connections finish for up to
/// `shutdown_grace`. With a `data_dir`, first recovers its state (an error, naming the file,
/// if it is damaged or in use).
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> io::Result<()> {
    if let Some(dir) = config.data_dir.clone() {
        return run_durable(config, &dir, listener, shutdown).await;
    }
    if let Some(etcd) = config.etcd.clone() {
        return run_cluster(config, etcd, listener, shutdown).await;
    }
    let embedded = Embedded::new(
        config.limits.clone(),
        backend::first_token(),
        config.watch_buffer,
        Arc::new(Metrics::new(Deployment::Memory)),
    );
    serve(config, Backend::Embedded(embedded), listener, shutdown).await
}

/// [`run`] as a front-end of an etcd cluster.
#[cfg(feature = "etcd")]
async fn run_cluster(
    config: Config,
    etcd: EtcdConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let cluster = backend::etcd::Cluster::connect(config.cluster_settings(etcd))
        .await
        .map_err(io::Error::other)?;
    serve(config, Backend::Etcd(cluster), listener, shutdown).await
}

#[cfg(feature = "etcd")]
impl Config {
    /// What a front-end of `etcd` starts with under these settings: their limits,
    /// `--watch-buffer` and users. Also the simulated front-ends' (`backend::etcd::sim`).
    pub(crate) fn cluster_settings(&self, etcd: EtcdConfig) -> backend::etcd::Settings {
        backend::etcd::Settings {
            config: etcd,
            limits: self.limits.clone(),
            watch_buffer: self.watch_buffer,
            users: self.auth.clone(),
            metrics: Arc::new(Metrics::new(Deployment::Etcd)),
        }
    }
}

#[cfg(not(feature = "etcd"))]
async fn run_cluster(
    _config: Config,
    _etcd: EtcdConfig,
    _listener: TcpListener,
    _shutdown: CancellationToken,
) -> io::Result<()> {
    Err(io::Error::other(
        "cluster mode (--etcd) needs a lockd built with the etcd feature",
    ))
}

/// [`run`] with a data directory. A failed write stops the server (fail-stop) and is returned
/// as its error once connections are closed.
async fn run_durable(
    config: Config,
    dir: &Path,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let metrics = Arc::new(Metrics::new(Deployment::DataDir));
    let (mut store, recovered) = {
        let (dir, metrics) = (dir.to_path_buf(), Arc::clone(&metrics));
        tokio::task::spawn_blocking(move || Store::open(&dir, metrics))
            .await
            .map_err(io::Error::other)??
    };
    let embedded = Embedded::new_durable(
        config.limits.clone(),
        backend::first_token(),
        config.watch_buffer,
        store.journal(),
        &recovered,
        config.auth.clone(),
        metrics,
    );
    tracing::info!(dir = %dir.display(), leases = embedded.status_all().len(), "state restored");
    let stop = shutdown.child_token();
    let monitor = {
        let (journal, stop) = (store.journal(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = journal.failed() => stop.cancel(),
                _ = stop.cancelled() => {}
            }
        })
    };
    let served = serve(config, Backend::Embedded(embedded), listener, stop.clone()).await;
    stop.cancel();
    let _ = monitor.await;
    let closed = tokio::task::spawn_blocking(move || store.close())
        .await
        .map_err(io::Error::other)?;
    served.and(closed)
}

/// Like [`run`], on a backend the caller made (and may share with other listeners).
pub async fn serve(
    config: Config,
    backend: Backend,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let compat = match &config.compat {
        Some(c) => Some(Compat::start(c.clone(), backend.clone()).await?),
        None => None,
    };
    backend.limit_status_copies(config.status_copies);
    // Shared by every connection's task (its limits, its TLS acceptor).
    let config = Arc::new(config);
    let tracker = TaskTracker::new();
    tracker.spawn(backend.clone().run(shutdown.clone()));
    let busy = BusyPoll::new(config.busy_poll, backend.metrics().busy_poll());
    if let Some(busy) = &busy {
        tracker.spawn(Arc::clone(busy).run(shutdown.clone()));
    }
    if let Some(compat) = compat {
        tracker.spawn(compat.run(shutdown.clone()));
    }
    let permits = Arc::new(Semaphore::new(config.max_connections));
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let per_ip = PerIp::new(config.max_connections_per_ip.min(config.max_connections));
    let mut refused = RefusalLog::new(
        "connection limit reached",
        config.max_connections,
        ProtoError::too_many_connections(config.max_connections),
    );
    let mut refused_per_ip = RefusalLog::new(
        "connection limit per address reached",
        per_ip.max(),
        ProtoError::too_many_from_address(per_ip.max()),
    );
    let force = CancellationToken::new();
    let mut backoff = Duration::from_millis(5);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "listening");
    }
    if let Some(endpoint) = &config.endpoint {
        endpoint.serving(&backend);
    }
    loop {
        let log_due = refused.due().into_iter().chain(refused_per_ip.due()).min();
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    backoff = Duration::from_millis(5);
                    accepted
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait, don't spin.
                    tracing::warn!(error = %e, "accept failed; retrying in {backoff:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.cancelled() => break,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            _ = tokio::time::sleep_until(log_due.unwrap_or_else(Instant::now)),
                if log_due.is_some() => {
                refused.tick();
                refused_per_ip.tick();
                continue;
            }
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let admitted = match Arc::clone(&permits).try_acquire_owned() {
            Err(_) => Err(&mut refused),
            Ok(permit) => per_ip
                .admit(peer.ip())
                .map(|slot| (permit, slot))
                .ok_or(&mut refused_per_ip),
        };
        match admitted {
            Ok((permit, slot)) => {
                let (backend, config, busy) = (backend.clone(), Arc::clone(&config), busy.clone());
                // A child token per connection: each request's wait for input polls it, and
                // one token shared by every connection would be one lock (and one cache line)
                // that every request on every worker takes.
                let (shutdown, force) = (shutdown.child_token(), force.clone());
                let counted = backend.metrics().connection(Protocol::Line);
                tracker.spawn(async move {
                    // Past the shutdown grace, the handler is dropped wherever it is: in its
                    // TLS handshake, or in a write to a client that never reads.
                    tokio::select! {
                        _ = serve_connection(stream, backend, &config, busy, shutdown) => {}
                        _ = force.cancelled() => {}
                    }
                    drop((permit, slot, counted));
                });
            }
            Err(log) => {
                let e = log.refused(peer.ip());
                backend.metrics().refused(e.code);
                // A TLS client can't read a plain ERR line, and a handshake per refusal
                // would make a flood dearer: closed without a word.
                if config.tls.is_none() {
                    refuse(stream, e, &refusals, &tracker).await;
                }
            }
        }
    }
    refused.finish();
    refused_per_ip.finish();
    drop(listener);
    if let Some(endpoint) = &config.endpoint {
        endpoint.stopping();
    }
    tracker.close();
    tracing::info!("shutting down");
    if tokio::time::timeout(config.shutdown_grace, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period; closing them");
        force.cancel();
        tracker.wait().await;
    }
    Ok(())
}

/// One accepted connection: its TLS handshake, if the server speaks TLS, then its session.
pub(crate) async fn serve_connection(
    stream: TcpStream,
    backend: Backend,
    config: &Config,
    busy: Option<Arc<BusyPoll>>,
    shutdown: CancellationToken,
) {
    let stream = match &config.tls {
        None => Stream::Plain(stream),
        // Boxed, and freed once it is done: a task is as large as its largest await point
        // for as long as it lives, and a handshake's state (a rustls connection, about 1.2
        // KiB) would otherwise stay in every connection's task, TLS or not.
        Some(tls) => match Box::pin(accept_tls(stream, tls, &backend, config, &shutdown)).await {
            Some(stream) => stream,
            None => return,
        },
    };
    let conn = Connection::new(stream, config.max_line).with_write_timeout(config.write_timeout);
    let gate = config.auth.as_deref();
    let mut handler =
        Handler::new(backend, conn, config.handler_limits(), shutdown, gate).busy_poll(busy);
    handler.run().await;
}

/// The TLS handshake of a new connection: the stream to serve, or `None` when the connection
/// ends here (no handshake in time, a failed one, or plain text, which is told so).
async fn accept_tls(
    stream: TcpStream,
    tls: &ServerTls,
    backend: &Backend,
    config: &Config,
    shutdown: &CancellationToken,
) -> Option<Stream> {
    let peer = stream.peer_addr().ok();
    // A client that sends no handshake is closed promptly; one that sends plain text is told
    // so in plain text first.
    let handshake = async {
        if !starts_tls(&stream).await {
            return Err(stream);
        }
        Ok(tls.acceptor().accept(stream).await)
    };
    let handshake = tokio::select! {
        hs = tokio::time::timeout(config.tls_handshake_timeout, handshake) => hs,
        _ = shutdown.cancelled() => return None,
    };
    match handshake {
        Ok(Err(plain)) => {
            tracing::debug!(?peer, "plain text on the TLS port; told so, closing");
            backend.metrics().refused(ErrorCode::Tls);
            let mut conn =
                Connection::new(plain, config.max_line).with_write_timeout(config.write_timeout);
            if conn
                .send(Reply::Error(&ProtoError::tls_port()))
                .await
                .is_ok()
            {
                let _ = conn.close().await;
            }
            None
        }
        Ok(Ok(Ok(tls))) => Some(Stream::Server(Box::new(tls))),
        Ok(Ok(Err(e))) => {
            match crate::tls::refused_certificate(&e) {
                // An operator's question ("why is this client refused?"), answered in words.
                Some(why) => tracing::info!(?peer, "client certificate refused: {why}"),
                None => tracing::debug!(?peer, error = %e, "TLS handshake failed"),
            }
            None
        }
        Err(_) => {
            tracing::debug!(?peer, "no TLS handshake in time; closing");
            None
        }
    }
}

/// Whether the first byte the client sent can start a TLS handshake (a handshake record,
/// 0x16), without taking it from the socket. True for a client that closed or failed before
/// sending anything: the handshake then fails at once, as it always did.
async fn starts_tls(stream: &TcpStream) -> bool {
    /// The content type of a TLS handshake record: every ClientHello starts with it.
    const HANDSHAKE_RECORD: u8 = 0x16;
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) => first[0] == HANDSHAKE_RECORD,
        // End of input, or an error: the handshake fails at once either way.
        _ => true,
    }
}

/// Tells a connection over a limit why it is closed (`e`), without holding up the accept loop.
///
/// The `ERR LIMIT` line fits in the empty send buffer of a new socket, so it is written at
/// once, non-blocking, and followed by a FIN: every refused client is told, however many
/// arrive. Then, while fewer than [`REFUSALS_AT_ONCE`] are in progress, a task reads and
/// discards what the client still sends for a moment (see [`Connection::drain`]), so the close
/// is not a reset that could destroy the line before it is read. Past that, input that has
/// already arrived is discarded and the socket closed at once.
async fn refuse(
    mut stream: TcpStream,
    e: ProtoError,
    drains: &Arc<Semaphore>,
    tracker: &TaskTracker,
) {
    let line = format!("{}\n", Reply::Error(&e));
    let permit = Arc::clone(drains).try_acquire_owned().ok();
    if !matches!(stream.try_write(line.as_bytes()), Ok(n) if n == line.len()) {
        // Not written at once (a full buffer can't happen on a new socket, but an error can):
        // only a task that may wait can do better.
        if let Some(permit) = permit {
            tracker.spawn(async move {
                let mut conn =
                    Connection::new(stream, 0).with_write_timeout(Duration::from_secs(1));
                conn.push(&line);
                let _ = conn.close().await;
                drop(permit);
            });
        }
        return;
    }
    // Immediate: a shutdown of the sending side does not wait for the peer.
    let _ = stream.shutdown().await;
    match permit {
        Some(permit) => {
            tracker.spawn(async move {
                Connection::new(stream, 0).drain().await;
                drop(permit);
            });
        }
        None => Connection::new(stream, 0).drain_arrived(),
    }
}

/// Logs connections refused by one limit at most once per [`REFUSAL_LOG_INTERVAL`]: the
/// first at once (with its address), the rest as a count, so a flood of connections is not
/// also a flood of log lines.
struct RefusalLog {
    /// Which limit, for the log: "connection limit reached".
    what: &'static str,
    max: usize,
    /// What a refused client is told.
    refusal: ProtoError,
    /// When the current interval began; `None` when nothing was refused in the last one.
    since: Option<Instant>,
    /// Refusals in the current interval not logged yet.
    unlogged: u64,
}

impl RefusalLog {
    fn new(what: &'static str, max: usize, refusal: ProtoError) -> Self {
        RefusalLog {
            what,
            max,
            refusal,
            since: None,
            unlogged: 0,
        }
    }

    /// Counts (or logs) a connection from `from` refused; returns what to tell it.
    fn refused(&mut self, from: IpAddr) -> ProtoError {
        if self.since.is_some() {
            self.unlogged += 1;
            return self.refusal.clone();
        }
        tracing::warn!(
            max = self.max,
            %from,
            "{}; refusing connections with ERR LIMIT (more refusals are counted and logged \
             every {})",
            self.what,
            humantime::format_duration(REFUSAL_LOG_INTERVAL)
        );
        self.since = Some(Instant::now());
        self.refusal.clone()
    }

    /// When the count is due, if any.
    fn due(&self) -> Option<Instant> {
        self.since.map(|t| t + REFUSAL_LOG_INTERVAL)
    }

    /// If the interval is over: log its count, if any, and start the next.
    fn tick(&mut self) {
        if self.due().is_none_or(|due| due > Instant::now()) {
            return;
        }
        if self.unlogged == 0 {
            self.since = None;
            return;
        }
        self.finish();
        self.since = Some(Instant::now());
    }

    /// Logs the count not yet logged.
    fn finish(&mut self) {
        if self.unlogged > 0 {
            tracing::warn!(
                max = self.max,
                refused = self.unlogged,
                "{}; refused {} more connections",
                self.what,
                self.unlogged
            );
            self.unlogged = 0;
        }
    }
}
