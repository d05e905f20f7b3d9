//! Line framing over a TCP or TLS stream, with bounded buffers in both directions.
//!
//! Hand-rolled rather than `LinesCodec` because lockd must answer two kinds of bad line
//! differently: invalid UTF-8 gets an `ERR` and the connection goes on, an over-long line gets
//! an `ERR` and the connection ends, and in neither case may memory grow with the bytes sent.
//!
//! Writes are bounded in time as well as in memory: with a write timeout, a peer that stops
//! taking what is written (a full receive window) makes the write fail instead of pinning the
//! connection forever. And the server's own close is graceful ([`Connection::close`]), so the
//! replies sent before it are not lost to a reset.

use std::fmt::{self, Write as _};
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::stream::Stream;

/// Bytes asked of the socket per read (reads go through `BufMut::limit`: `read_buf` would
/// otherwise fill all the spare capacity the buffer has grown to, several chunks at a time).
const READ_CHUNK: usize = 512;
/// Replies are written out once this much is queued, so a long STATUS streams; also the
/// amount a peer must take within each write timeout.
pub const WRITE_CHUNK: usize = 16 * 1024;
/// At close, how long input the peer still sends is read and discarded (see
/// [`Connection::close`]).
const CLOSE_DRAIN_TIME: Duration = Duration::from_secs(1);
/// At close, how many bytes of input are read and discarded at most.
const CLOSE_DRAIN_BYTES: usize = 256 * 1024;

/// How much [`Connection::drain`] reads at a time (into the input buffer, for the close).
const DRAIN_CHUNK: usize = 4096;

/// What the peer sent next.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A line without its `\n` or `\r\n`.
    Line(String),
    /// A line that is not valid UTF-8 (already skipped).
    BadUtf8,
    /// A line over the limit; the rest of the stream can't be trusted to be framed.
    TooLong,
    /// The peer closed its side and every line it sent has been read.
    Eof,
}

/// A framed connection.
#[derive(Debug)]
pub struct Connection {
    stream: Stream,
    input: BytesMut,
    output: BytesMut,
    max_line: usize,
    eof: bool,
    /// How long the peer may take to accept the next [`WRITE_CHUNK`] of output (or all of
    /// it, if less is queued); `None` waits as long as it takes.
    write_timeout: Option<Duration>,
    /// When the output queued now must have moved on by; `None` while nothing is queued.
    stall_deadline: Option<Instant>,
    /// Bytes written since `stall_deadline` was set.
    written: usize,
}

impl Connection {
    /// Frames `stream`; lines longer than `max_line` bytes (line ending excluded) are refused.
    pub fn new(stream: impl Into<Stream>, max_line: usize) -> Self {
        Connection {
            stream: stream.into(),
            input: BytesMut::new(),
            output: BytesMut::new(),
            max_line,
            eof: false,
            write_timeout: None,
            stall_deadline: None,
            written: 0,
        }
    }

    /// Fails a write with [`io::ErrorKind::TimedOut`] when the peer has not taken the next
    /// [`WRITE_CHUNK`] of output (or all of it, if less is queued) within `timeout`.
    pub fn with_write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = Some(timeout);
        self
    }

    /// The TCP socket underneath (under TLS too).
    pub fn tcp(&self) -> &TcpStream {
        self.stream.tcp()
    }

    /// The stream itself: plain, or TLS with its session.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Whether the peer reset the connection: it closed its socket with data unread, or
    /// data (a reply) reached a socket it no longer has. A reset that arrives after the
    /// peer's FIN shows in neither reads (they keep returning end of input) nor the error
    /// queue of every platform, so the connection's state is asked too: a reset one has no
    /// peer any more.
    pub fn peer_reset(&self) -> bool {
        let tcp = self.stream.tcp();
        matches!(tcp.take_error(), Ok(Some(_))) || tcp.peer_addr().is_err()
    }

    /// Whether the peer has closed its sending side (it may still read).
    pub fn is_eof(&self) -> bool {
        self.eof
    }

    /// Bytes received and not yet framed.
    pub fn buffered(&self) -> usize {
        self.input.len()
    }

    /// Bytes queued and not yet written.
    pub fn unsent(&self) -> usize {
        self.output.len()
    }

    /// Whether a whole frame can be had without reading.
    pub fn has_frame(&self) -> bool {
        self.eof || self.input.contains(&b'\n') || self.input.len() > self.max_line + 1
    }

    /// The next frame. Cancel-safe: bytes read stay buffered for the next call.
    pub async fn read_frame(&mut self) -> io::Result<Frame> {
        loop {
            if let Some(frame) = self.take_frame() {
                return Ok(frame);
            }
            self.fill().await?;
        }
    }

    /// The next frame if one is already buffered.
    pub fn next_frame(&mut self) -> Option<Frame> {
        self.take_frame()
    }

    /// Reads what the peer has sent into the buffer without framing it, so a server busy
    /// with a waiting request still notices a close. Cancel-safe.
    ///
    /// Without a buffer (see [`Connection::release_input`]), a plain socket is awaited
    /// readable first, so the buffer is only made once there is something to put in it.
    pub async fn fill(&mut self) -> io::Result<()> {
        if self.eof {
            return Ok(());
        }
        if self.input.capacity() == 0 {
            if let Stream::Plain(s) = &self.stream {
                s.readable().await?;
            }
        }
        self.input.reserve(READ_CHUNK);
        let mut input = (&mut self.input).limit(READ_CHUNK);
        if self.stream.read_buf(&mut input).await? == 0 {
            self.eof = true;
        }
        Ok(())
    }

    /// Gives the input buffer's memory back while it holds nothing, for a connection about
    /// to wait long (a queued LOCK): thousands of waiters would otherwise keep a read chunk
    /// each for nothing. The next [`Connection::fill`] makes it again.
    pub fn release_input(&mut self) {
        if self.input.is_empty() {
            self.input = BytesMut::new();
        }
    }

    /// Takes in what has already arrived, without waiting: so a close (or reset) that came
    /// in the same instant as something else is not missed. Bounded like [`Connection::fill`]:
    /// reads at most one chunk.
    pub fn fill_arrived(&mut self) -> io::Result<()> {
        if self.eof {
            return Ok(());
        }
        self.input.reserve(READ_CHUNK);
        let mut input = (&mut self.input).limit(READ_CHUNK);
        if self.stream.read_arrived(&mut input)? == Some(0) {
            self.eof = true;
        }
        Ok(())
    }

    /// Reads (if `read` and the peer has not closed its side) and writes queued output at
    /// the same time, until one of them has made progress: a streaming session keeps
    /// watching its input, and the write timeout runs, while the peer is not reading.
    /// Cancel-safe. Never returns while there is nothing to do.
    pub async fn pump(&mut self, read: bool) -> io::Result<()> {
        let read = read && !self.eof;
        let write = !self.output.is_empty();
        if read {
            self.input.reserve(READ_CHUNK);
        }
        let mut stalled = self
            .stall_deadline
            .map(|d| Box::pin(tokio::time::sleep_until(d)));
        let (stream, input, output) = (&mut self.stream, &mut self.input, &self.output);
        // One stream polled both ways (a TLS stream can't be split into independent halves).
        let done = poll_fn(|cx| {
            if read {
                let stream = Pin::new(&mut *stream);
                let mut input = (&mut *input).limit(READ_CHUNK);
                if let Poll::Ready(n) = tokio_util::io::poll_read_buf(stream, cx, &mut input) {
                    return Poll::Ready(n.map(Pumped::Read));
                }
            }
            if write {
                if let Poll::Ready(n) = Pin::new(&mut *stream).poll_write(cx, output) {
                    return Poll::Ready(n.map(Pumped::Wrote));
                }
                if stalled
                    .as_mut()
                    .is_some_and(|s| s.as_mut().poll(cx).is_ready())
                {
                    return Poll::Ready(Err(write_timed_out()));
                }
            }
            Poll::Pending
        })
        .await?;
        match done {
            Pumped::Read(0) => self.eof = true,
            Pumped::Read(_) => {}
            Pumped::Wrote(n) => self.advance(n),
        }
        Ok(())
    }

    fn take_frame(&mut self) -> Option<Frame> {
        let line = match self.input.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let mut line = self.input.split_to(end + 1);
                line.truncate(end);
                line
            }
            None if self.input.len() > self.max_line + 1 => {
                // Drop what we hold so memory stays bounded; the caller closes the connection.
                self.input.clear();
                return Some(Frame::TooLong);
            }
            None if self.eof && !self.input.is_empty() => {
                // A last line without a newline still counts, as `printf 'PING' | nc -N` sends.
                self.input.split()
            }
            None if self.eof => return Some(Frame::Eof),
            None => return None,
        };
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if line.len() > self.max_line {
            return Some(Frame::TooLong);
        }
        Some(match std::str::from_utf8(line) {
            Ok(text) => Frame::Line(text.to_owned()),
            Err(_) => Frame::BadUtf8,
        })
    }

    /// Queues one line (a newline is added) without writing anything.
    pub fn push(&mut self, line: impl fmt::Display) {
        // Writing to a BytesMut can't fail.
        let _ = writeln!(self.output, "{line}");
        if self.stall_deadline.is_none() {
            self.stall_deadline = self.write_timeout.map(|t| Instant::now() + t);
        }
    }

    /// Queues one line (a newline is added); [`Connection::flush`] sends it. Writes out what
    /// is queued once it reaches [`WRITE_CHUNK`], so the buffer stays bounded.
    pub async fn queue(&mut self, line: impl fmt::Display) -> io::Result<()> {
        self.push(line);
        if self.output.len() >= WRITE_CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends what is queued; fails with [`io::ErrorKind::TimedOut`] if the peer stops taking
    /// it for the write timeout. Cancel-safe (what was written stays written), though a
    /// caller that gives up on it usually gives up on the connection.
    pub async fn flush(&mut self) -> io::Result<()> {
        while !self.output.is_empty() {
            let n = write_by(self.stall_deadline, self.stream.write(&self.output)).await?;
            self.advance(n);
        }
        // TLS keeps records it could not send yet; plain TCP has nothing to flush.
        if !matches!(self.stream, Stream::Plain(_)) {
            let deadline = self.write_timeout.map(|t| Instant::now() + t);
            write_by(deadline, async { self.stream.flush().await.map(|()| 0) }).await?;
        }
        if self.output.capacity() > WRITE_CHUNK * 2 {
            self.output = BytesMut::new();
        }
        Ok(())
    }

    /// `n` queued bytes were written: the stall deadline moves on once a whole
    /// [`WRITE_CHUNK`] was taken, and ends when nothing is left.
    fn advance(&mut self, n: usize) {
        self.output.advance(n);
        self.written += n;
        if self.output.is_empty() {
            self.stall_deadline = None;
            self.written = 0;
        } else if self.written >= WRITE_CHUNK {
            self.stall_deadline = self.write_timeout.map(|t| Instant::now() + t);
            self.written = 0;
        }
    }

    /// Queues one line and sends everything queued.
    pub async fn send(&mut self, line: impl fmt::Display) -> io::Result<()> {
        self.queue(line).await?;
        self.flush().await
    }

    /// Sends what is queued and closes our sending side (a FIN: the peer reads every reply,
    /// then end of input).
    pub async fn close_write(&mut self) -> io::Result<()> {
        self.flush().await?;
        self.stream.shutdown().await
    }

    /// Waits, for a short bounded time and number of bytes, for the peer to close its side,
    /// discarding what it still sends. Closing a socket whose input has not all been read
    /// makes the kernel send a reset, and a reset can destroy replies the peer has not read
    /// yet; after this, the close is an orderly one unless the peer keeps sending.
    ///
    /// It reads into the input buffer, which it empties after each read: a buffer of its own
    /// on the stack would sit in every connection's task for the connection's whole life
    /// (a task is as large as its largest await point), 4 KiB per connection to close it.
    pub async fn drain(&mut self) {
        self.input.clear();
        let deadline = Instant::now() + CLOSE_DRAIN_TIME;
        let mut left = CLOSE_DRAIN_BYTES;
        while !self.eof && left > 0 {
            self.input.reserve(DRAIN_CHUNK);
            let mut input = (&mut self.input).limit(DRAIN_CHUNK);
            let read = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut input)).await;
            self.input.clear();
            match read {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                Ok(Ok(n)) => left = left.saturating_sub(n),
            }
        }
    }

    /// Like [`Connection::drain`] without waiting: discards only the input that has already
    /// arrived, for a close that must not wait (the server is stopping).
    pub fn drain_arrived(&mut self) {
        self.input.clear();
        let mut left = CLOSE_DRAIN_BYTES;
        let mut sink = BytesMut::with_capacity(4096);
        while left > 0 {
            sink.clear();
            match self.stream.read_arrived(&mut sink) {
                Ok(Some(n)) if n > 0 => left = left.saturating_sub(n),
                _ => break,
            }
        }
    }

    /// An orderly close: [`Connection::close_write`], then [`Connection::drain`].
    pub async fn close(&mut self) -> io::Result<()> {
        self.close_write().await?;
        self.drain().await;
        Ok(())
    }
}

/// What [`Connection::pump`] did.
enum Pumped {
    Read(usize),
    Wrote(usize),
}

/// One write that must make progress by `deadline` (if any).
async fn write_by(
    deadline: Option<Instant>,
    write: impl std::future::Future<Output = io::Result<usize>>,
) -> io::Result<usize> {
    let Some(deadline) = deadline else {
        return write.await;
    };
    match tokio::time::timeout_at(deadline, write).await {
        Ok(result) => result,
        Err(_) => Err(write_timed_out()),
    }
}

fn write_timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the peer stopped reading: write timed out",
    )
}
