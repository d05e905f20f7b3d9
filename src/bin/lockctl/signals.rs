//! The signals lockctl passes on to a job, or ends a view on.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::fail::Failure;

/// SIGINT, SIGTERM and SIGHUP sent to lockctl, to pass on to the command.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub fn new() -> Result<Signals, Failure> {
        let listen =
            |kind| signal(kind).map_err(|e| Failure::usage(format!("cannot handle signals: {e}")));
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next signal's number. Cancel-safe.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            Some(()) = self.int.recv() => libc::SIGINT,
            Some(()) = self.term.recv() => libc::SIGTERM,
            Some(()) = self.hup.recv() => libc::SIGHUP,
            else => std::future::pending().await,
        }
    }
}
