//! The one test harness every test binary shares (`#[path = "../common/mod.rs"] mod common;`):
//!
//! - [`start`]: the one way to start lockd, the [`Lockd`] builder (in-process or a child
//!   process; memory, a data directory or etcd; extra flags);
//! - here: the one free-port helper ([`free_port`], [`free_ports`], [`dead_addr`]), the
//!   one line client [`Raw`] (async; [`line::Line`] is its blocking facade, for threads and
//!   child-process tests), reply helpers and an HTTP GET;
//! - [`blocking`]: a server for tests that drive programs synchronously (bash, Python) and a
//!   proxy that cuts connections; [`durable`]: lockd processes on a data directory that
//!   tests crash and restart; [`lockctl`]: lockctl as a child process against an in-process
//!   server; [`detail`]: `STATUS <name> detail` helpers; [`pki`]: certificates made at run
//!   time; [`needs`]: the tools beyond Rust a test needs, skipped with a message where missing
//!   (a failure with `LOCKD_TEST_STRICT`, as in CI); [`promql`]: the dashboard's and alert
//!   rules' checks against a real exposition;
//! - for cluster mode: [`etcd`], a real etcd cluster of child processes that tests kill and
//!   restart, and lockd front-ends on it; [`link`], a link between two processes that a test
//!   cuts and heals while both run; [`history`], the record of a chaos run and the checker of
//!   lockd's promises over it; [`chaos`], the fenced-counter chaos run on cluster front-ends;
//!   [`netsplit`], packet filters that cut etcd members off from each other.
//!
//! Every read has a generous timeout: it only turns a hang into a failure, it never asserts
//! how fast the server is.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

pub mod blocking;
pub mod browser;
pub mod chaos;
pub mod detail;
pub mod durable;
pub mod etcd;
pub mod history;
pub mod line;
pub mod link;
pub mod lockctl;
pub mod needs;
pub mod netsplit;
pub mod pki;
pub mod promql;
pub mod start;

// Each test binary uses its own subset.
#[allow(unused_imports)]
pub use start::{config, Lockd, LockdProcess, TestServer};

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

/// How long any single wait may take before the test is declared hung.
pub const GUARD: Duration = Duration::from_secs(10);

/// A port that was free a moment ago: bind 127.0.0.1:0 and let it go.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `count` distinct ports that were free a moment ago. All are bound at once before any is
/// released, so the same port is never handed out twice.
pub fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

/// A loopback address where nothing listens (a server that is down): a port bound a moment
/// ago and let go.
pub fn dead_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A raw line client: writes what it is told, reads one line at a time. The one line client
/// of the tests: [`line::Line`] is its blocking facade, and the script runner's connections
/// are `Raw`s.
///
/// Every read waits at most its read guard ([`GUARD`] unless [`Raw::set_read_guard`] says
/// otherwise); every write of [`Raw::send_raw`] at most [`GUARD`].
pub struct Raw {
    stream: BufReader<TcpStream>,
    /// The read guard in nanoseconds; [`NO_GUARD`]: reads wait as long as it takes.
    read_guard: AtomicU64,
}

/// [`Raw::read_guard`] of a connection whose reads wait as long as it takes.
const NO_GUARD: u64 = u64::MAX;

/// What one read of a line gave, told apart (the script runner reports each in its own
/// words).
pub enum Read {
    /// A line, without its `\n` (bytes that are not UTF-8 replaced).
    Line(String),
    /// End of stream.
    Eof,
    /// The connection failed (a reset).
    Reset(io::Error),
    /// Nothing within the guard.
    Hang,
}

impl std::fmt::Display for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Read::Line(l) => write!(f, "{l:?}"),
            Read::Eof => write!(f, "end of stream"),
            Read::Reset(e) => write!(f, "connection error ({e})"),
            Read::Hang => write!(f, "nothing within the guard"),
        }
    }
}

/// `io` within `guard` (`None`: as long as it takes); `None` if the guard ran out first.
async fn within<T>(
    guard: Option<Duration>,
    io: impl std::future::Future<Output = io::Result<T>>,
) -> Option<io::Result<T>> {
    match guard {
        Some(guard) => tokio::time::timeout(guard, io).await.ok(),
        None => Some(io.await),
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

impl Raw {
    /// Connects within [`GUARD`]; fails the test if it can't.
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw::try_connect(addr, Some(GUARD))
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    /// Connects with a receive buffer of about `bytes`, so a client that does not read fills
    /// its side with little data.
    pub async fn connect_small(addr: SocketAddr, bytes: u32) -> Raw {
        Raw::try_connect_small(addr, bytes, Some(GUARD))
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    /// Connects from the local address `from` (port chosen by the kernel) within [`GUARD`];
    /// fails the test if it can't.
    pub async fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> Raw {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(from, 0))
            .expect("bind the client side");
        let stream = tokio::time::timeout(GUARD, socket.connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        Raw::from_stream(stream)
    }

    /// Connects within `within` (`None`: the system's own timeout); the error (`TimedOut`
    /// after `within`), for a caller whose server may be down.
    pub async fn try_connect(addr: SocketAddr, within: Option<Duration>) -> io::Result<Raw> {
        Raw::open(addr, None, within).await
    }

    /// [`Raw::connect_small`] within `within`; the error, as [`Raw::try_connect`].
    pub async fn try_connect_small(
        addr: SocketAddr,
        bytes: u32,
        within: Option<Duration>,
    ) -> io::Result<Raw> {
        Raw::open(addr, Some(bytes), within).await
    }

    async fn open(
        addr: SocketAddr,
        recv_buffer: Option<u32>,
        within: Option<Duration>,
    ) -> io::Result<Raw> {
        let connect = async {
            match recv_buffer {
                Some(bytes) => {
                    let socket = TcpSocket::new_v4()?;
                    socket.set_recv_buffer_size(bytes)?;
                    socket.connect(addr).await
                }
                None => TcpStream::connect(addr).await,
            }
        };
        let stream = self::within(within, connect)
            .await
            .unwrap_or_else(|| Err(timed_out("no connection within the guard")))?;
        Ok(Raw::from_stream(stream))
    }

    pub fn from_stream(stream: TcpStream) -> Raw {
        let _ = stream.set_nodelay(true);
        Raw {
            stream: BufReader::new(stream),
            read_guard: AtomicU64::new(GUARD.as_nanos() as u64),
        }
    }

    pub fn stream(&self) -> &TcpStream {
        self.stream.get_ref()
    }

    /// How long a read waits (`None`: as long as it takes).
    pub fn read_guard(&self) -> Option<Duration> {
        match self.read_guard.load(Ordering::Relaxed) {
            NO_GUARD => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Changes how long a read waits (`None`: as long as it takes).
    pub fn set_read_guard(&self, guard: Option<Duration>) {
        let nanos = guard.map_or(NO_GUARD, |g| {
            u64::try_from(g.as_nanos()).unwrap_or(NO_GUARD - 1)
        });
        self.read_guard.store(nanos, Ordering::Relaxed);
    }

    /// Sends `line` and a `\n`.
    pub async fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\n").as_bytes()).await;
    }

    /// Sends bytes exactly as given.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.send_within(bytes, GUARD)
            .await
            .expect("write timed out")
            .expect("write");
    }

    /// Sends bytes exactly as given, for a test that expects the server may stop taking them.
    pub async fn try_send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.get_mut().write_all(bytes).await
    }

    /// Sends bytes exactly as given; `None` if the server took nothing within `guard`.
    pub async fn send_within(&mut self, bytes: &[u8], guard: Duration) -> Option<io::Result<()>> {
        within(Some(guard), self.stream.get_mut().write_all(bytes)).await
    }

    /// Appends what comes up to and including the next `\n` to `buf`, within `guard`: how
    /// many bytes (0 at end of stream), or `None` if the guard ran out first, when the part of
    /// the line read so far stays in `buf`. The one reader of lines.
    async fn next_line(
        &mut self,
        buf: &mut Vec<u8>,
        guard: Option<Duration>,
    ) -> Option<io::Result<usize>> {
        within(guard, self.stream.read_until(b'\n', buf)).await
    }

    /// Appends what comes up to and including the next `\n` to `buf` (`Ok(0)` at end of
    /// stream); after the read guard (`TimedOut`), the part of a line already read stays in
    /// `buf`.
    pub async fn read_line_into(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let guard = self.read_guard();
        self.next_line(buf, guard)
            .await
            .unwrap_or_else(|| Err(timed_out("no line within the guard")))
    }

    /// Reads one line within `guard`, telling end of stream, a failed connection and nothing
    /// at all apart.
    pub async fn read_within(&mut self, guard: Duration) -> Read {
        let mut buf = Vec::new();
        match self.next_line(&mut buf, Some(guard)).await {
            None => Read::Hang,
            Some(Err(e)) => Read::Reset(e),
            Some(Ok(0)) => Read::Eof,
            Some(Ok(_)) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                }
                Read::Line(String::from_utf8_lossy(&buf).into_owned())
            }
        }
    }

    /// What has arrived and not been read yet, without reading it, waiting at most `within`
    /// for something: empty at end of stream, `None` if nothing came.
    pub async fn peek_within(&mut self, within: Duration) -> Option<io::Result<Vec<u8>>> {
        tokio::time::timeout(within, self.stream.fill_buf())
            .await
            .ok()
            .map(|got| got.map(<[u8]>::to_vec))
    }

    /// Reads one line (without its `\n`); `None` at EOF.
    pub async fn try_line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        if self.read_line_into(&mut buf).await? == 0 {
            return Ok(None);
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
        }
        Ok(Some(
            String::from_utf8(buf).expect("server sent invalid UTF-8"),
        ))
    }

    /// Reads one line; fails the test at EOF or on a timeout.
    pub async fn line(&mut self) -> String {
        match self.try_line().await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("expected a line, got EOF"),
            Err(e) => panic!("expected a line, got {e}"),
        }
    }

    /// Sends one request and returns its (first) reply line.
    pub async fn req(&mut self, line: &str) -> String {
        self.send(line).await;
        self.line().await
    }

    /// Reads one line and checks it.
    pub async fn expect(&mut self, want: &str) {
        assert_eq!(self.line().await, want);
    }

    /// Reads one line and checks it starts with `prefix`.
    pub async fn expect_prefix(&mut self, prefix: &str) -> String {
        let line = self.line().await;
        assert!(
            line.starts_with(prefix),
            "{line:?} should start with {prefix:?}"
        );
        line
    }

    /// Sends a LOCK that must be granted at once; returns the token.
    pub async fn lock(&mut self, args: &str) -> u64 {
        let reply = self.req(&format!("LOCK {args}")).await;
        token(&reply)
    }

    /// Asserts the server closed the connection cleanly (EOF, nothing more).
    pub async fn expect_eof(&mut self) {
        match self.try_line().await {
            Ok(None) => {}
            Ok(Some(line)) => panic!("expected EOF, got {line:?}"),
            Err(e) => panic!("expected EOF, got {e}"),
        }
    }

    /// Asserts the connection is closed: EOF or a reset both count (the server closed with
    /// unread input, so the kernel may answer with a reset).
    pub async fn expect_closed(&mut self) {
        let mut sink = [0u8; 64 * 1024];
        let guard = self.read_guard();
        loop {
            match within(guard, self.stream.read(&mut sink)).await {
                None => panic!("connection still open after the guard"),
                Some(Ok(0)) | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Reads to the end of the connection: the lines before it, and whether it ended with a
    /// reset rather than a clean EOF. Fails the test if it is still open after the guard.
    pub async fn read_to_end(&mut self) -> (Vec<String>, bool) {
        let mut data = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        let guard = self.read_guard();
        let reset = loop {
            match within(guard, self.stream.read(&mut buf)).await {
                None => panic!("connection still open after the guard"),
                Some(Ok(0)) => break false,
                Some(Ok(n)) => data.extend_from_slice(&buf[..n]),
                Some(Err(_)) => break true,
            }
        };
        let text = String::from_utf8_lossy(&data);
        (text.lines().map(str::to_owned).collect(), reset)
    }

    /// Closes our sending side; the server sees end of input.
    pub async fn shutdown_write(&mut self) {
        self.try_shutdown_write().await.expect("shutdown");
    }

    /// [`Raw::shutdown_write`]; the error.
    pub async fn try_shutdown_write(&mut self) -> io::Result<()> {
        self.stream.get_mut().shutdown().await
    }

    /// Drops the connection with a reset instead of a FIN.
    pub fn reset(self) {
        self.try_reset().expect("SO_LINGER 0");
    }

    /// [`Raw::reset`]; the error of setting SO_LINGER 0 (the connection is dropped anyway).
    pub fn try_reset(self) -> io::Result<()> {
        self.stream().set_zero_linger()
    }
}

/// The token of an `OK <token>` reply.
pub fn token(reply: &str) -> u64 {
    reply
        .strip_prefix("OK ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("expected OK <token>, got {reply:?}"))
}

/// The tokens of a set's grant, `OK <token> <token> ...`, one per name, in order.
pub fn tokens(reply: &str) -> Vec<u64> {
    let rest = reply
        .strip_prefix("OK ")
        .unwrap_or_else(|| panic!("expected OK <token>..., got {reply:?}"));
    rest.split(' ')
        .map(|t| {
            t.parse()
                .unwrap_or_else(|_| panic!("expected tokens, got {reply:?}"))
        })
        .collect()
}

/// The value of `key=` in a reply line.
pub fn field(line: &str, key: &str) -> Option<String> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
}

/// The exact STATUS line of a held lock, with `ttl_ms` blanked as `*` (it counts down).
pub fn status_shape(line: &str) -> String {
    line.split(' ')
        .map(|w| {
            if w.starts_with("ttl_ms=") {
                "ttl_ms=*"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Polls `STATUS <name>` on `conn` until `done` accepts the reply; fails after the guard.
pub async fn wait_status(conn: &mut Raw, name: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let line = conn.req(&format!("STATUS {name}")).await;
        if done(&line) {
            return line;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "STATUS {name} never got there; last {line:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls until the lock `name` has exactly `n` waiters.
pub async fn wait_waiters(conn: &mut Raw, name: &str, n: usize) -> String {
    let want = n.to_string();
    wait_status(conn, name, |l| {
        field(l, "waiters").as_deref() == Some(&*want)
    })
    .await
}

/// Checks one `EVENT <kind> <name> <id> <token> <unix-ms>` line; returns its unix-ms.
pub fn assert_event(line: &str, kind: &str, name: &str, id: &str, token: u64) -> u64 {
    let prefix = format!("EVENT {kind} {name} {id} {token} ");
    let ms = line
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{line:?} should start with {prefix:?}"));
    let ms: u64 = ms
        .parse()
        .unwrap_or_else(|_| panic!("unix-ms of {line:?} is not a number"));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Wall clock, for people: only check that it is today's, not how exact.
    assert!(
        ms.abs_diff(now) < 3_600_000,
        "unix-ms {ms} is far from {now}"
    );
    ms
}

/// `GET path` over HTTP/1.1; the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    try_http_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// [`http_get`], for a server that may be going away.
pub async fn try_http_get(addr: std::net::SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: lockd\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut raw = String::new();
    tokio::time::timeout(GUARD, s.read_to_string(&mut raw))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer"))??;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response");
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}

/// `line` without a trailing ` etcd_age_ms=<n> etcd_bound_ms=<n>` (or those two before a last
/// `note=`) on an `OK` line: the age of
/// a cluster front-end's view, which changes by the millisecond, for tests that compare
/// STATUS lines whole (`tests/cluster/health.rs` checks the age itself).
pub fn without_etcd_age(line: String) -> String {
    let Some(at) = line
        .find(" etcd_age_ms=")
        .filter(|_| line.starts_with("OK "))
    else {
        return line;
    };
    let rest: Vec<&str> = line[at + 1..].split(' ').collect();
    let number = |w: &str, key: &str| {
        w.strip_prefix(key)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match rest.as_slice() {
        [age, bound] if number(age, "etcd_age_ms=") && number(bound, "etcd_bound_ms=") => {
            line[..at].to_owned()
        }
        // A holder's note comes after them, last.
        [age, bound, note]
            if number(age, "etcd_age_ms=")
                && number(bound, "etcd_bound_ms=")
                && note.starts_with("note=") =>
        {
            format!("{} {note}", &line[..at])
        }
        _ => line,
    }
}
