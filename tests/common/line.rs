//! The line client for blocking code (threads, tests that drive child processes): a blocking
//! facade over the one line client, the async [`super::Raw`], with the same names (`send`,
//! `line`, `try_line`, `req`, `lock`). Each `Line` runs its `Raw` on a current-thread runtime
//! of its own, so it must not be used from async code (a runtime inside a runtime panics).
//! Every read has a timeout, so a hang becomes a failure.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::Raw;

/// How long a connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long [`Line::connect`] waits for a line: long, for tests that hold connections across
/// process kills (a waiter, a session holder) on a loaded machine.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A blocking line-protocol connection.
pub struct Line {
    // Dropped before the runtime it is registered with.
    raw: Raw,
    rt: tokio::runtime::Runtime,
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
    /// `read` (`None`: as long as it takes); the error, for a caller whose server may be down.
    pub fn open(
        addr: SocketAddr,
        connect: Option<Duration>,
        read: Option<Duration>,
    ) -> io::Result<Line> {
        check_timeout(read)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let raw = rt.block_on(Raw::try_connect(addr, connect))?;
        raw.set_read_guard(read);
        Ok(Line {
            raw,
            rt,
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
        self.rt
            .block_on(self.raw.try_send_raw(format!("{line}\n").as_bytes()))
    }

    /// The next line; panics on end of stream or after the read timeout.
    pub fn line(&mut self) -> String {
        self.try_line()
            .unwrap_or_else(|e| panic!("no reply line: {e}"))
    }

    /// The next line, or why there is none (end of stream, timeout, reset).
    pub fn try_line(&mut self) -> io::Result<String> {
        let mut reply = String::new();
        if self.read_line_into(&mut reply)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        Ok(reply.trim_end().to_string())
    }

    /// Appends what comes up to the end of the next line to `buf` (`Ok(0)` at end of
    /// stream); after a timeout, the part of a line already read stays in `buf`.
    pub fn read_line_into(&mut self, buf: &mut String) -> io::Result<usize> {
        let start = buf.len();
        let mut bytes = std::mem::take(buf).into_bytes();
        let got = self.rt.block_on(self.raw.read_line_into(&mut bytes));
        // What came must be text, as `BufRead::read_line` wants it: if not, `buf` is as it was.
        match String::from_utf8(bytes) {
            Ok(text) => {
                *buf = text;
                got
            }
            Err(e) => {
                let mut bytes = e.into_bytes();
                bytes.truncate(start);
                *buf = String::from_utf8(bytes).expect("what was there before was text");
                got.and(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "stream did not contain valid UTF-8",
                )))
            }
        }
    }

    /// Changes how long a read waits (until [`Line::line_within`] restores the one given at
    /// the start).
    pub fn set_read_timeout(&self, read: Option<Duration>) -> io::Result<()> {
        check_timeout(read)?;
        self.raw.set_read_guard(read);
        Ok(())
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
        self.set_read_timeout(Some(within)).expect("read timeout");
        let got = self.try_line().ok();
        self.set_read_timeout(self.read_timeout)
            .expect("read timeout");
        got
    }
}

/// A zero timeout is refused, as by `TcpStream::set_read_timeout`.
fn check_timeout(read: Option<Duration>) -> io::Result<()> {
    if read == Some(Duration::ZERO) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        ));
    }
    Ok(())
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
