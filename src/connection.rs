//! Line framing over a TCP stream, with bounded buffers in both directions.
//!
//! Hand-rolled rather than `LinesCodec` because lockd must answer two kinds of bad line
//! differently: invalid UTF-8 gets an `ERR` and the connection goes on, an over-long line gets
//! an `ERR` and the connection ends, and in neither case may memory grow with the bytes sent.

use std::fmt::{self, Write as _};
use std::io;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 512;
/// Replies are written out once this much is queued, so a long STATUS streams.
const WRITE_CHUNK: usize = 64 * 1024;

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
    stream: TcpStream,
    input: BytesMut,
    output: String,
    max_line: usize,
    eof: bool,
}

impl Connection {
    /// Frames `stream`; lines longer than `max_line` bytes (line ending excluded) are refused.
    pub fn new(stream: TcpStream, max_line: usize) -> Self {
        Connection {
            stream,
            input: BytesMut::new(),
            output: String::new(),
            max_line,
            eof: false,
        }
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Whether the peer reset the connection: it closed its socket with data unread, or
    /// data (a reply) reached a socket it no longer has. A reset that arrives after the
    /// peer's FIN shows in neither reads (they keep returning end of input) nor the error
    /// queue of every platform, so the connection's state is asked too: a reset one has no
    /// peer any more.
    pub fn peer_reset(&self) -> bool {
        matches!(self.stream.take_error(), Ok(Some(_))) || self.stream.peer_addr().is_err()
    }

    /// Whether the peer has closed its sending side (it may still read).
    pub fn is_eof(&self) -> bool {
        self.eof
    }

    /// Bytes received and not yet framed.
    pub fn buffered(&self) -> usize {
        self.input.len()
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

    /// Reads what the peer has sent into the buffer without framing it, so a server busy
    /// with a waiting request still notices a close. Cancel-safe.
    pub async fn fill(&mut self) -> io::Result<()> {
        if self.eof {
            return Ok(());
        }
        self.input.reserve(READ_CHUNK);
        if self.stream.read_buf(&mut self.input).await? == 0 {
            self.eof = true;
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

    /// Queues one line (a newline is added); [`Connection::flush`] sends it.
    pub async fn queue(&mut self, line: impl fmt::Display) -> io::Result<()> {
        // Writing to a String can't fail.
        let _ = writeln!(self.output, "{line}");
        if self.output.len() >= WRITE_CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends what is queued. Not cancel-safe: call it in a `select!` arm's body.
    pub async fn flush(&mut self) -> io::Result<()> {
        if self.output.is_empty() {
            return Ok(());
        }
        let result = self.stream.write_all(self.output.as_bytes()).await;
        self.output.clear();
        if self.output.capacity() > WRITE_CHUNK * 2 {
            self.output.shrink_to(WRITE_CHUNK);
        }
        result
    }

    /// Queues one line and sends everything queued.
    pub async fn send(&mut self, line: impl fmt::Display) -> io::Result<()> {
        self.queue(line).await?;
        self.flush().await
    }

    /// Sends what is queued and closes our sending side.
    pub async fn close(&mut self) -> io::Result<()> {
        self.flush().await?;
        self.stream.shutdown().await
    }
}
