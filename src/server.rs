//! Accepts connections and runs a session for each, within the connection limit; shuts down
//! gracefully when told to.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::compat::{Compat, CompatConfig};
use crate::connection::Connection;
use crate::locks::Limits;
use crate::proto::{ErrorCode, ProtoError, Reply};
use crate::session::{Session, SessionLimits};
use crate::shared::{self, Shared};
use crate::store::Store;

/// Connections over the limit that are told why at the same time.
const REFUSING_AT_ONCE: usize = 64;

/// Everything the server needs to know; `main` fills it from flags, tests from `Default`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Lease and lock-count limits the table enforces.
    pub limits: Limits,
    /// Most client connections at once; more are answered `ERR LIMIT` and closed.
    pub max_connections: usize,
    /// Longest request line in bytes; longer ones are answered `ERR TOOLONG` and closed.
    pub max_line: usize,
    /// Longest name or id in bytes (at most 255); longer ones are answered `ERR BADARG`.
    pub max_name: usize,
    /// Events a watcher may fall behind before `ERR LAGGED`.
    pub watch_buffer: usize,
    /// How long shutdown lets connections finish before it drops them.
    pub shutdown_grace: Duration,
    /// How long a grant to a waiter that half-closed is watched for a reset.
    pub half_close_probe: Duration,
    /// The old two-port protocol, served alongside on the same table (`--compat`).
    pub compat: Option<CompatConfig>,
    /// Where state is kept durably (`--data-dir`); `None` keeps it in memory only.
    pub data_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: Limits::default(),
            max_connections: crate::DEFAULT_MAX_CONNECTIONS,
            max_line: crate::DEFAULT_MAX_LINE,
            max_name: crate::proto::MAX_NAME_LEN,
            watch_buffer: crate::DEFAULT_WATCH_BUFFER,
            shutdown_grace: crate::DEFAULT_SHUTDOWN_GRACE,
            half_close_probe: crate::DEFAULT_HALF_CLOSE_PROBE,
            compat: None,
            data_dir: None,
        }
    }
}

impl Config {
    fn session_limits(&self) -> SessionLimits {
        SessionLimits {
            max_line: self.max_line,
            max_name: self.max_name.min(crate::proto::MAX_NAME_LEN),
            half_close_probe: self.half_close_probe,
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
    let shared = Shared::new(
        config.limits.clone(),
        shared::first_token(),
        config.watch_buffer,
    );
    serve(config, shared, listener, shutdown).await
}

/// [`run`] with a data directory. A failed write stops the server (fail-stop) and is returned
/// as its error once connections are closed.
async fn run_durable(
    config: Config,
    dir: &Path,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let (mut store, recovered) = {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Store::open(&dir))
            .await
            .map_err(io::Error::other)??
    };
    let shared = Shared::new_durable(
        config.limits.clone(),
        shared::first_token(),
        config.watch_buffer,
        store.journal(),
        &recovered,
    );
    tracing::info!(dir = %dir.display(), leases = shared.status_all().len(), "state restored");
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
    let served = serve(config, shared, listener, stop.clone()).await;
    stop.cancel();
    let _ = monitor.await;
    let closed = tokio::task::spawn_blocking(move || store.close())
        .await
        .map_err(io::Error::other)?;
    served.and(closed)
}

/// Like [`run`], on a table the caller made (and may share with other listeners).
pub async fn serve(
    config: Config,
    shared: Arc<Shared>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let compat = match &config.compat {
        Some(c) => Some(Compat::start(c.clone(), Arc::clone(&shared)).await?),
        None => None,
    };
    let tracker = TaskTracker::new();
    tracker.spawn(Arc::clone(&shared).run_timer(shutdown.clone()));
    if let Some(compat) = compat {
        tracker.spawn(compat.run(shutdown.clone()));
    }
    let permits = Arc::new(Semaphore::new(config.max_connections));
    // Refusals are answered by a few tasks at most; past that, a flood is just closed.
    let refusals = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    let force = CancellationToken::new();
    let mut backoff = Duration::from_millis(5);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "listening");
    }
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = Duration::from_millis(5);
                    stream
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
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                let conn = Connection::new(stream, config.max_line);
                let session = Session::new(
                    Arc::clone(&shared),
                    conn,
                    config.session_limits(),
                    shutdown.clone(),
                );
                let force = force.clone();
                tracker.spawn(async move {
                    // Past the shutdown grace, the session is dropped wherever it is, even
                    // in a write to a client that never reads.
                    tokio::select! {
                        _ = session.run() => {}
                        _ = force.cancelled() => {}
                    }
                    drop(permit);
                });
            }
            Err(_) => {
                tracing::warn!(
                    max = config.max_connections,
                    "connection limit reached; refusing a connection"
                );
                if let Ok(permit) = Arc::clone(&refusals).try_acquire_owned() {
                    let max = config.max_connections;
                    tracker.spawn(async move {
                        refuse(stream, max).await;
                        drop(permit);
                    });
                }
            }
        }
    }
    drop(listener);
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

/// Tells a connection over the limit why it is closed, without waiting on it for long.
async fn refuse(mut stream: TcpStream, max: usize) {
    let e = ProtoError::new(
        ErrorCode::Limit,
        format!("too many connections (max {max}); try again later"),
    );
    let line = format!("{}\n", Reply::Error(&e));
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(line.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}
