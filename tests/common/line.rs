//! The line client for blocking code (threads, tests that drive child processes): the twin
//! of the async [`super::Raw`], with the same names (`send`, `line`, `try_line`, `req`,
//! `lock`). Every read has a timeout, so a hang becomes a failure.

use std::io::{self, BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long [`Line::connect`] waits for a line: long, for tests that hold connections across
/// process kills (a waiter, a session holder) on a loaded machine.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A blocking line-protocol connection.
pub struct Line {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    read_timeout: Option<Duration>,
}

impl Line {
    /// Connects within [`CONNECT_TIMEOUT`], reads wait up to [`READ_TIMEOUT`]; panics if the
    /// connect fails.
    pub fn connect(addr: SocketAddr) -> Line {
        Line::open(addr, Some(CONNECT_TIMEOUT), Some(READ_TIMEOUT))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    /// Connects within `connect` (`None`: the system's own timeout), reads wait up to
    /// `read`; the error, for a caller whose server may be down.
    pub fn open(
        addr: SocketAddr,
        connect: Option<Duration>,
        read: Option<Duration>,
    ) -> io::Result<Line> {
        let stream = match connect {
            Some(within) => TcpStream::connect_timeout(&addr, within)?,
            None => TcpStream::connect(addr)?,
        };
        stream.set_read_timeout(read)?;
        let writer = stream.try_clone()?;
        Ok(Line {
            reader: BufReader::new(stream),
            writer,
            read_timeout: read,
        })
    }

    /// Sends `line` and a `\n`; panics if it can't.
    pub fn send(&mut self, line: &str) {
        self.try_send(line).expect("send");
    }

    /// Sends `line` and a `\n` in one write (a line split over two segments waits for a
    /// delayed ACK: Nagle).
    pub fn try_send(&mut self, line: &str) -> io::Result<()> {
        self.writer.write_all(format!("{line}\n").as_bytes())
    }

    /// The next line; panics on end of stream or after the read timeout.
    pub fn line(&mut self) -> String {
        self.try_line()
            .unwrap_or_else(|e| panic!("no reply line: {e}"))
    }

    /// The next line, or why there is none (end of stream, timeout, reset).
    pub fn try_line(&mut self) -> io::Result<String> {
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        Ok(reply.trim_end().to_string())
    }

    /// Appends what comes up to the end of the next line to `buf` (`Ok(0)` at end of
    /// stream); after a timeout, the part of a line already read stays in `buf`.
    pub fn read_line_into(&mut self, buf: &mut String) -> io::Result<usize> {
        self.reader.read_line(buf)
    }

    /// Changes how long a read waits (until [`Line::line_within`] restores the one given at
    /// the start).
    pub fn set_read_timeout(&self, read: Option<Duration>) -> io::Result<()> {
        self.writer.set_read_timeout(read)
    }

    /// Sends one request and returns its (first) reply line; panics if there is none.
    pub fn req(&mut self, line: &str) -> String {
        self.send(line);
        self.line()
    }

    /// [`Line::req`], for a caller whose server may go away.
    pub fn try_req(&mut self, line: &str) -> io::Result<String> {
        self.try_send(line)?;
        self.try_line()
    }

    /// LOCK that must be granted at once: its token.
    pub fn lock(&mut self, args: &str) -> u64 {
        let reply = self.req(&format!("LOCK {args}"));
        super::token(&reply)
    }

    /// Waits at most `within` for a line (none: `None`), then restores the read timeout.
    pub fn line_within(&mut self, within: Duration) -> Option<String> {
        self.writer
            .set_read_timeout(Some(within))
            .expect("read timeout");
        let got = self.try_line().ok();
        self.writer
            .set_read_timeout(self.read_timeout)
            .expect("read timeout");
        got
    }
}

/// One request on a fresh connection (connected within `connect`, answered within `read`):
/// the first reply line (empty if the server closed the connection instead).
pub fn request(
    addr: SocketAddr,
    line: &str,
    connect: Option<Duration>,
    read: Duration,
) -> io::Result<String> {
    let mut conn = Line::open(addr, connect, Some(read))?;
    conn.try_send(line)?;
    match conn.try_line() {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(String::new()),
        reply => reply,
    }
}
