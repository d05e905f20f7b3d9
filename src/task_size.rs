//! What one connection's task weighs, measured in the build that ships.
//!
//! Every connection, idle or waiting for a lock, carries its task (the `serve_connection`
//! future; tokio adds its header) for its whole life, and a future is as large as its largest
//! await point: one big state on a rare path (a 4 KiB buffer to drain a close, a TLS handshake
//! inline) grows every connection. Release builds lay futures out far tighter than debug ones,
//! and a test build is not what ships either (dev-dependencies turn on features of tokio and
//! of the etcd client), so `crates/layout-check` measures it in the release build of the
//! Debian package's binaries (.ci/run runs it after `contrib/debian/check`, on the same
//! artifacts).

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::backend::{self, Backend, Embedded};
use crate::busy_poll::BusyPoll;
use crate::metrics::{Deployment, Metrics};
use crate::server::{serve_connection, Config};

/// The bound on a connection's task, in bytes: 2,392 when it was set, 2,776 once sets of
/// names came, 2,072 since a LOCK's request is boxed and no parse temporary waits with it
/// (`Handler::lock`), all measured in a test build; 1,952 in the shipped build when the
/// check moved there. Room left for another compiler's layout.
pub const TASK_BOUND: usize = 2304;

/// The size of one connection's task, as the server makes it for a connection accepted on
/// loopback with the default configuration (the embedded backend).
pub async fn connection_task() -> std::io::Result<usize> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let client = TcpStream::connect(listener.local_addr()?).await?;
    let (stream, _) = listener.accept().await?;
    let config = Config::default();
    let embedded = Embedded::new(
        config.limits.clone(),
        backend::first_token(),
        config.watch_buffer,
        Arc::new(Metrics::new(Deployment::Memory)),
    );
    let task = serve_connection(
        stream,
        Backend::Embedded(embedded),
        &config,
        BusyPoll::new(crate::DEFAULT_BUSY_POLL, Default::default()),
        CancellationToken::new(),
    );
    let size = std::mem::size_of_val(&task);
    drop((task, client));
    Ok(size)
}
