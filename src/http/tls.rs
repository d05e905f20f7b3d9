//! The HTTP port over TLS (`--metrics-tls`): a listener whose connections are TLS streams,
//! with `--tls-cert` and `--tls-key` (reloaded by SIGHUP with the line protocol's).
//!
//! Handshakes run beside each other, each within `--tls-handshake-timeout`, so one slow
//! client does not hold up the next; at most [`HANDSHAKES`] at once.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;

use crate::tls::ServerTls;

/// Most handshakes in progress at once; more connections wait in the kernel's backlog.
const HANDSHAKES: usize = 64;

/// A TCP listener whose accepted connections have completed a TLS handshake.
pub struct TlsListener {
    tcp: TcpListener,
    tls: ServerTls,
    timeout: Duration,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    /// Serves `tcp` with `tls`'s certificate (no client certificate asked for).
    pub fn new(tcp: TcpListener, tls: ServerTls, timeout: Duration) -> TlsListener {
        TlsListener {
            tcp,
            tls,
            timeout,
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept(), if self.handshakes.len() < HANDSHAKES => {
                    match accepted {
                        Ok((stream, peer)) => {
                            let acceptor = self.tls.acceptor_without_client_auth();
                            let timeout = self.timeout;
                            self.handshakes.spawn(async move {
                                let handshake = acceptor.accept(stream);
                                match tokio::time::timeout(timeout, handshake).await {
                                    Ok(Ok(tls)) => Some((tls, peer)),
                                    Ok(Err(e)) => {
                                        tracing::debug!(%peer, error = %e, "HTTP port: TLS handshake failed");
                                        None
                                    }
                                    Err(_) => None,
                                }
                            });
                        }
                        // Out of descriptors, say: as axum's own listener, wait and go on.
                        Err(e) => {
                            tracing::warn!(error = %e, "HTTP port: accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(ready)) = done {
                        return ready;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}
