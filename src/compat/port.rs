//! A port that is opened and closed as the lock changes state: the old protocol's clients
//! (and monitors probing with `nc -z`) read the state from which port accepts connections.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::task::Poll;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::message::Kind;

/// Connections the kernel may queue before they are accepted.
const BACKLOG: u32 = 128;

/// One port number on every address the compat host resolved to (e.g. `localhost` is often
/// both 127.0.0.1 and ::1, and clients may use either).
pub struct Port {
    /// Which port this is, for messages.
    pub kind: Kind,
    addrs: Vec<SocketAddr>,
    listeners: Vec<Option<TcpListener>>,
}

/// Binds with SO_REUSEADDR explicitly: the port is closed and reopened all the time, and the
/// connections it served linger in TIME_WAIT, which would otherwise refuse the new bind.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

impl Port {
    /// A closed port on `addrs`.
    pub fn new(kind: Kind, addrs: Vec<SocketAddr>) -> Self {
        let listeners = addrs.iter().map(|_| None).collect();
        Port {
            kind,
            addrs,
            listeners,
        }
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Opens the port on every address not open yet. `Ok(true)` if it was closed before.
    /// On an error the addresses that did bind stay open; call again to retry the rest.
    pub fn open(&mut self) -> io::Result<bool> {
        let was_closed = !self.is_open();
        let mut first_error = None;
        for (addr, slot) in self.addrs.iter().zip(self.listeners.iter_mut()) {
            if slot.is_none() {
                match bind(*addr) {
                    Ok(l) => *slot = Some(l),
                    Err(e) => {
                        first_error.get_or_insert_with(|| {
                            io::Error::new(e.kind(), format!("{} port {addr}: {e}", self.kind))
                        });
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(was_closed),
        }
    }

    /// Closes the port: new connections are refused, and connections the kernel had queued
    /// but not handed over yet are reset. `true` if it was open.
    pub fn close(&mut self) -> bool {
        let was_open = self.is_open();
        self.listeners.iter_mut().for_each(|slot| *slot = None);
        was_open
    }

    pub fn is_open(&self) -> bool {
        self.listeners.iter().any(Option::is_some)
    }

    /// The next connection on any of the port's addresses; never ready while it is closed.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        poll_fn(|cx| {
            for listener in self.listeners.iter().flatten() {
                if let Poll::Ready(r) = listener.poll_accept(cx) {
                    return Poll::Ready(r);
                }
            }
            Poll::Pending
        })
        .await
    }
}
