//! The byte stream under a connection: plain TCP, or TLS over TCP.
//!
//! An enum rather than a boxed trait object: the plain path stays statically dispatched, and
//! the TCP socket under either kind stays reachable for what only TCP can answer (whether the
//! peer reset the connection, see [`crate::connection::Connection::peer_reset`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::BufMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{client, server};

/// A connection's bytes.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    /// The server's side of a TLS connection.
    Server(Box<server::TlsStream<TcpStream>>),
    /// A client's side of a TLS connection.
    Client(Box<client::TlsStream<TcpStream>>),
}

impl From<TcpStream> for Stream {
    fn from(stream: TcpStream) -> Self {
        Stream::Plain(stream)
    }
}

impl Stream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Server(s) => s.get_ref().0,
            Stream::Client(s) => s.get_ref().0,
        }
    }

    /// Reads what has already arrived, without waiting, into `buf`'s spare capacity (limit
    /// it to bound the read): `Ok(None)` if nothing has. (For TLS, whatever decrypts from the
    /// bytes at hand.)
    pub fn read_arrived<B: BufMut>(&mut self, buf: &mut B) -> io::Result<Option<usize>> {
        if let Stream::Plain(s) = self {
            return match s.try_read_buf(buf) {
                Ok(n) => Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e),
            };
        }
        // Polled once with a waker that does nothing: a pending read is simply "nothing yet".
        let mut cx = Context::from_waker(Waker::noop());
        match tokio_util::io::poll_read_buf(Pin::new(self), &mut cx, buf) {
            Poll::Ready(r) => r.map(Some),
            Poll::Pending => Ok(None),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
