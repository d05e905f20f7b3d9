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
    ///
    /// A plain socket is read with a syscall of its own: tokio's `try_read` answers "would
    /// block" from its own record of the socket's readiness, without asking the kernel, until
    /// its reactor has polled the socket's event, which a busy runtime may not have done yet.
    /// A waiter's close that reached the kernel before its grant would then go unseen, and the
    /// grant to a client that is gone would sit out its ttl (seen in CI under load).
    pub fn read_arrived<B: BufMut>(&mut self, buf: &mut B) -> io::Result<Option<usize>> {
        if let Stream::Plain(s) = self {
            return match recv_now(s, buf) {
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

/// One non-blocking `recv` on `tcp` into `buf`'s spare capacity (see
/// [`Stream::read_arrived`]).
#[cfg(unix)]
fn recv_now<B: BufMut>(tcp: &TcpStream, buf: &mut B) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let spare = buf.chunk_mut();
    let len = spare.len();
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: the socket is open for as long as `tcp` is borrowed, and `recv` writes at most
    // `len` bytes into the spare capacity `spare` points at.
    let n = unsafe {
        libc::recv(
            tcp.as_raw_fd(),
            spare.as_mut_ptr().cast(),
            len,
            libc::MSG_DONTWAIT,
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: `recv` initialised the first `n` bytes of the spare capacity.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

/// Elsewhere, tokio's own non-blocking read (see [`Stream::read_arrived`] for what it misses).
#[cfg(not(unix))]
fn recv_now<B: BufMut>(tcp: &TcpStream, buf: &mut B) -> io::Result<usize> {
    tcp.try_read_buf(buf)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A close that has reached the kernel is seen at once, before the runtime's reactor has
    /// polled the socket (tokio's own `try_read` would say nothing has arrived).
    #[tokio::test]
    async fn a_close_already_in_the_kernel_is_read_before_the_reactor_sees_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut stream = Stream::Plain(server);
        let mut buf = Vec::with_capacity(64);
        assert_eq!(stream.read_arrived(&mut buf).unwrap(), None, "nothing yet");
        drop(client);
        // Blocking, so that the reactor does not run: only the kernel has the close.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            stream.read_arrived(&mut buf).unwrap(),
            Some(0),
            "end of input"
        );
    }

    /// Data, likewise.
    #[tokio::test]
    async fn data_already_in_the_kernel_is_read_before_the_reactor_sees_it() {
        use std::io::Write;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut stream = Stream::Plain(server);
        let mut buf = Vec::with_capacity(64);
        assert_eq!(stream.read_arrived(&mut buf).unwrap(), None);
        client.write_all(b"LOCK x\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(stream.read_arrived(&mut buf).unwrap(), Some(7));
        assert_eq!(buf, b"LOCK x\n");
    }
}
