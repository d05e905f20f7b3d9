//! An async client of the line protocol, for `lockctl`, the tests and any Rust program.
//!
//! - [`Client`]: one connection; each request's answer comes back as the types of
//!   [`crate::proto`] ([`StatusLine`], [`HeldLine`], [`LockDetail`], [`EventLine`]), read by the
//!   same grammar the server writes them with.
//! - [`connect`]: [`Connector`], one lockd at one address or several (a cluster's
//!   front-ends), with failover, retry and backoff, over [`tls`] and logged in by [`auth`].
//! - [`retry`]: what may be tried again (`ERR UNAVAILABLE`, a lost connection) and for how
//!   long: [`Retry`], [`Backoff`], used with [`Connector::retry_after`] and
//!   [`Connector::reconnect_for`].
//! - [`tls`]: the TLS settings of a connection, and what a failed handshake means.
//! - [`auth`]: AUTH as a user, and what its refusals mean.
//! - [`lock`]: every LOCK option ([`LockOptions`]), and [`Connector::lock`], the LOCK sent
//!   again through the next address within its wait; its errors are [`LockError`]s, whose
//!   [`LockError::code`] is the server's `ERR` code. [`LockOptions::and`] makes it a set of
//!   names, taken at once as one lease ([`Locked::tokens`]; on one connection,
//!   [`Client::lock_set`]).
//! - [`hold`](mod@hold): [`hold()`], a future run under a lock whose lease is renewed in the
//!   background, stopped the moment the lease is lost, the lock released however it ends.
//! - [`keeper`]: the one renewal loop, [`Keeper`], under `hold()` and `lockctl run`: renews a
//!   held lease on its [`Timing`], moves to the next address when a front-end cannot serve,
//!   tells an observer each renewal, failure and reconnection, and tells the loss early enough
//!   to stop what runs under the lease before lockd could grant the lock to anyone else.
//! - [`watch`]: [`Client::events`], WATCH as typed [`EventLine`]s.
//!
//! A program's whole use of a lock, renewed for as long as the work takes:
//!
//! ```
//! # async fn deploy(token: u64) -> u64 { token }
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let addr = listener.local_addr()?.to_string();
//! # let stop = tokio_util::sync::CancellationToken::new();
//! # tokio::spawn(lockd::server::run(Default::default(), listener, stop.clone()));
//! use std::time::Duration;
//! use lockd::client::{Addrs, Connector, LockOptions};
//!
//! let lockd = Connector::new(Addrs::one(addr), Duration::from_secs(10)); // one address or several
//! let opts = LockOptions::new().ttl(Duration::from_secs(30)).session(Duration::from_secs(10));
//! let done = lockd.hold("deploy", "web-1", &opts, |lease| deploy(lease.token())).await?;
//! # assert!(done > 0);
//! # stop.cancel();
//! # Ok(()) }
//! ```

use std::fmt;
use std::io;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::stream::Stream;

use crate::connection::{Connection, Frame};
use crate::locks::{LockRequest, Mode, RenewRequest, Token};
use crate::proto::{
    self, Asked, BadReply, ErrorCode, EtcdAge, EventLine, HeldLine, HolderLine, ProtoError,
    Received, ReplyLine, Request, StatusLine, Tie, WaiterLine,
};

pub mod auth;
pub mod connect;
pub mod hold;
pub mod id;
pub mod keeper;
pub mod lock;
pub mod retry;
pub mod tls;
pub mod watch;

pub use auth::{Credentials, LoggedIn, LoginError};
pub use connect::{Addrs, ConnectError, Connector, Notes};
pub use hold::{hold, Lease};
pub use id::default_id;
pub use keeper::{Keeper, Timing};
pub use lock::{LockError, LockOptions, Locked};
pub use retry::{retryable, Backoff, Retry};
pub use tls::Tls;
pub use watch::Events;

/// Longest reply line a client accepts.
const MAX_REPLY: usize = 64 * 1024;

/// Why a request failed.
#[derive(Debug)]
pub enum ClientError {
    /// The connection failed.
    Io(io::Error),
    /// The server answered `ERR`.
    Refused(ProtoError),
    /// The server closed the connection before replying.
    Closed,
    /// The server replied something this client does not understand.
    Unexpected(String),
}

impl ClientError {
    /// The server's error code, if the server refused.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused(e) => Some(e.code),
            _ => None,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "connection failed: {e}"),
            ClientError::Refused(e) => write!(f, "server refused: {} {}", e.code, e.message),
            ClientError::Closed => f.write_str("server closed the connection"),
            ClientError::Unexpected(line) => write!(f, "unexpected reply {line:?}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

impl From<ProtoError> for ClientError {
    fn from(e: ProtoError) -> Self {
        ClientError::Refused(e)
    }
}

/// What every client call returns.
pub type Result<T> = std::result::Result<T, ClientError>;

/// The answer to `STATUS <name> detail` as text, each line without its first word: for tests
/// that look at the wire itself; [`Client::detail`] reads it as types.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DetailLines {
    /// `<name> id=.. token=.. held_ms=.. ...`, one per holder, in token order.
    pub holders: Vec<String>,
    /// `<name> <position> id=.. waited_ms=.. ...`, in queue order.
    pub waiters: Vec<String>,
    /// The `OK` line's text, as `STATUS <name>` answers it: `<name> free` or `<name> held ...`.
    pub status: String,
}

/// The answer to `STATUS <name> detail`, read: who holds the lock and who waits for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockDetail {
    /// One per holder, in the order they were granted.
    pub holders: Vec<HolderLine>,
    /// The queue (its first [`proto::DETAIL_WAITERS`]), in the order it will be granted.
    pub waiters: Vec<WaiterLine>,
    /// The same line as `STATUS <name>` answers: its `waiters` counts the whole queue.
    pub status: StatusLine,
    /// From a cluster front-end: how old its view is (the holders shown may be gone, or
    /// new ones missing, when it is past its bound).
    pub aged: Option<EtcdAge>,
}

impl LockDetail {
    /// How long the lock has been held: by its first holder, the longest.
    pub fn age(&self) -> Option<Duration> {
        self.holders.iter().map(|h| h.held).max()
    }
}

/// What a plain client says when the server answers in TLS records.
const TLS_SERVER: &str = "this lockd speaks TLS: add --tls or --tls-ca";

/// Whether `bytes` start like a TLS record (an alert, 0x15, or a handshake, 0x16, then
/// version 3.x): what a TLS server (or a TLS proxy in front of lockd) sends a client that
/// spoke plain text to it. No reply line starts with a control character.
fn is_tls_record(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

/// One connection to lockd.
pub struct Client {
    conn: Connection,
}

impl Client {
    /// Connects to `addr` (`host:port`).
    pub async fn connect(addr: &str) -> Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        let _ = stream.set_nodelay(true);
        Ok(Client {
            conn: Connection::new(stream, MAX_REPLY),
        })
    }

    /// Connects to `addr` (`host:port`) over TLS: the server's certificate must be valid for
    /// `host` and signed by a CA `tls` trusts.
    pub async fn connect_tls(addr: &str, tls: &TlsConnector) -> Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        Client::handshake(stream, host, tls).await
    }

    /// The TLS handshake on a connected `stream`: the server's certificate must be valid for
    /// `host` and signed by a CA `tls` trusts. Apart from [`Client::connect_tls`], so that a
    /// caller can bound the TCP connect and the handshake each with its own timeout (a plain
    /// port accepts the connection, then never answers the handshake).
    pub async fn handshake(stream: TcpStream, host: &str, tls: &TlsConnector) -> Result<Client> {
        let _ = stream.set_nodelay(true);
        let stream = tls.connect(crate::tls::server_name(host)?, stream).await?;
        Ok(Client {
            conn: Connection::new(Stream::Client(Box::new(stream)), MAX_REPLY),
        })
    }

    /// Sends a request and returns the text after `OK` of its reply.
    pub async fn request(&mut self, req: &Request) -> Result<String> {
        self.send(req).await?;
        self.read_ok().await
    }

    /// Sends a request and reads its (first) reply as a type; an `ERR` is
    /// [`ClientError::Refused`], a line that is no answer to it [`ClientError::Unexpected`].
    pub async fn ask(&mut self, req: &Request) -> Result<Received> {
        self.send(req).await?;
        self.read_reply(Asked::from(req)).await
    }

    /// Reads the next reply line as an answer to `asked` (the lines after the first of a
    /// STATUS, a detail or a watch).
    pub async fn read_reply(&mut self, asked: Asked) -> Result<Received> {
        let line = self.read_line().await?;
        match Received::parse(&line, asked) {
            Ok(Received::Error(e)) => Err(ClientError::Refused(e)),
            Ok(reply) => Ok(reply),
            Err(bad) => Err(ClientError::Unexpected(bad.0)),
        }
    }

    /// Checks and sends one request line.
    async fn send(&mut self, req: &Request) -> Result<()> {
        req.validate()?;
        match req {
            // A request displays its secret as `***`: the line on the wire has it.
            Request::Auth { user, secret } => {
                let line = proto::AuthLine {
                    user,
                    secret: secret.expose(),
                };
                self.conn.send(line).await?
            }
            _ => self.conn.send(req).await?,
        }
        Ok(())
    }

    /// AUTH as `user` (a server with `--auth-file` answers other commands `ERR NOAUTH` until
    /// then); returns the user name the server confirms.
    pub async fn auth(&mut self, user: &str, secret: &str) -> Result<String> {
        self.request(&Request::Auth {
            user: user.into(),
            secret: proto::Secret::new(secret),
        })
        .await
    }

    /// Reads one reply line.
    pub async fn read_line(&mut self) -> Result<String> {
        match self.conn.read_frame().await? {
            Frame::Line(line) if is_tls_record(line.as_bytes()) => Err(ClientError::Io(
                io::Error::new(io::ErrorKind::InvalidData, TLS_SERVER),
            )),
            Frame::Line(line) => Ok(line),
            Frame::Eof => Err(ClientError::Closed),
            Frame::TooLong => Err(ClientError::Unexpected("over-long line".into())),
            Frame::BadUtf8 => Err(ClientError::Unexpected("invalid UTF-8".into())),
        }
    }

    async fn read_ok(&mut self) -> Result<String> {
        let line = self.read_line().await?;
        match proto::parse_reply(&line) {
            ReplyLine::Ok(rest) => Ok(rest.to_owned()),
            ReplyLine::Err(e) => Err(ClientError::Refused(e)),
            ReplyLine::Other(_) => Err(ClientError::Unexpected(line)),
        }
    }

    /// LOCK; returns the fencing token.
    pub async fn lock(
        &mut self,
        name: &str,
        id: &str,
        ttl: Option<Duration>,
        wait: Option<Duration>,
        tie: Tie,
    ) -> Result<Token> {
        self.lock_mode(name, id, ttl, wait, tie, Mode::Exclusive)
            .await
    }

    /// LOCK in `mode` (shared, or a semaphore's slot); returns the fencing token.
    pub async fn lock_mode(
        &mut self,
        name: &str,
        id: &str,
        ttl: Option<Duration>,
        wait: Option<Duration>,
        tie: Tie,
        mode: Mode,
    ) -> Result<Token> {
        self.lock_with(name, id, (ttl, wait), tie, mode, false, None)
            .await
    }

    /// LOCK in `mode`, with `supersede` if asked (a wait takes the whole queue: those
    /// waiting are answered `ERR SUPERSEDED`) and a note for people (`note=`, sent last;
    /// `None` or empty: none); returns the fencing token. A note with a control character
    /// (a newline would end the request early) is refused here, as the server would:
    /// [`ClientError::Refused`] with `ERR BADARG`, and nothing is sent.
    #[allow(clippy::too_many_arguments)] // the LOCK's words, one each
    pub async fn lock_with(
        &mut self,
        name: &str,
        id: &str,
        (ttl, wait): (Option<Duration>, Option<Duration>),
        tie: Tie,
        mode: Mode,
        supersede: bool,
        note: Option<&str>,
    ) -> Result<Token> {
        match self
            .ask_lock(&[name], id, (ttl, wait), tie, mode, supersede, note)
            .await?
        {
            Received::Token(token) => Ok(token),
            other => Err(unexpected(other)),
        }
    }

    /// LOCK of a set: `names` (at least one, none twice) all at once or not at all, in
    /// `mode`, with a note for people (`None` or empty: none); returns one fencing token per
    /// name, in `names`' order. One lease covers the set: RENEW, CHECK or UNLOCK of any one
    /// of its names with its token applies to all of them. A note with a control character
    /// is refused here, as by [`Client::lock_with`].
    pub async fn lock_set(
        &mut self,
        names: &[&str],
        id: &str,
        (ttl, wait): (Option<Duration>, Option<Duration>),
        tie: Tie,
        mode: Mode,
        note: Option<&str>,
    ) -> Result<Vec<Token>> {
        let reply = self
            .ask_lock(names, id, (ttl, wait), tie, mode, false, note)
            .await?;
        let tokens = match reply {
            Received::Token(token) => vec![token],
            Received::Tokens(tokens) => tokens,
            other => return Err(unexpected(other)),
        };
        if tokens.len() != names.len() {
            return Err(unexpected(Received::Tokens(tokens)));
        }
        Ok(tokens)
    }

    /// Sends the LOCK of `names` (the first, then each further one as `and=`) and returns
    /// the reply. A note with a control character, or no name at all, is refused here as
    /// the server would refuse it, and nothing is sent.
    #[allow(clippy::too_many_arguments)] // the LOCK's words, one each
    async fn ask_lock(
        &mut self,
        names: &[&str],
        id: &str,
        (ttl, wait): (Option<Duration>, Option<Duration>),
        tie: Tie,
        mode: Mode,
        supersede: bool,
        note: Option<&str>,
    ) -> Result<Received> {
        let note = match note {
            Some(note) => proto::note::valid_note(note).map_err(ClientError::Refused)?,
            None => None,
        };
        let Some((first, and)) = names.split_first() else {
            return Err(ClientError::Refused(ProtoError::new(
                ErrorCode::Syntax,
                "LOCK of no names",
            )));
        };
        self.ask(&Request::Lock(Box::new(LockRequest {
            name: (*first).into(),
            id: id.into(),
            ttl,
            wait,
            tie,
            mode,
            note: note.map(Into::into),
            supersede,
            and: and.iter().map(|n| (*n).to_owned()).collect(),
            ..LockRequest::default()
        })))
        .await
    }

    /// UNLOCK.
    pub async fn unlock(&mut self, name: &str, token: Token) -> Result<()> {
        match self
            .ask(&Request::Unlock {
                name: name.into(),
                token,
            })
            .await?
        {
            Received::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// BREAK (an operator's; needs the `admin` right with `--auth-file`): every lease of
    /// `name`, or only `token`'s, ends for its holder; the name passes on once each holder
    /// has let go or its deadline passed, or at once with `force` (proto.md). Returns how
    /// many leases it broke. A free name or a token that is not a live lease of it:
    /// [`ErrorCode::NotHeld`].
    pub async fn break_lock(
        &mut self,
        name: &str,
        token: Option<Token>,
        force: bool,
    ) -> Result<u32> {
        match self
            .ask(&Request::Break {
                name: name.into(),
                token,
                force,
            })
            .await?
        {
            Received::Broken(n) => Ok(u32::try_from(n).unwrap_or(u32::MAX)),
            other => Err(unexpected(other)),
        }
    }

    /// RENEW; returns the time the lease has left.
    pub async fn renew(
        &mut self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
    ) -> Result<Duration> {
        self.renew_as(name, token, ttl, false).await
    }

    /// `RENEW ... detach`: renews, and a session lease becomes a plain one that no longer
    /// ends with any connection (it lasts until UNLOCK or its ttl); returns the time left.
    pub async fn renew_detach(
        &mut self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
    ) -> Result<Duration> {
        self.renew_as(name, token, ttl, true).await
    }

    async fn renew_as(
        &mut self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        detach: bool,
    ) -> Result<Duration> {
        let reply = self
            .ask(&Request::Renew(RenewRequest {
                name: name.into(),
                token,
                ttl,
                detach,
            }))
            .await?;
        lease_left(reply)
    }

    /// CHECK; returns the time the lease has left.
    pub async fn check(&mut self, name: &str, token: Token) -> Result<Duration> {
        let reply = self
            .ask(&Request::Check {
                name: name.into(),
                token,
            })
            .await?;
        lease_left(reply)
    }

    /// `STATUS <name>`: whether the lock is free, and who holds it.
    pub async fn lock_status(&mut self, name: &str) -> Result<StatusLine> {
        Ok(self.lock_status_aged(name).await?.0)
    }

    /// `STATUS <name>`, and from a cluster front-end how old its view may be.
    pub async fn lock_status_aged(&mut self, name: &str) -> Result<(StatusLine, Option<EtcdAge>)> {
        let req = Request::Status {
            name: Some(name.into()),
        };
        match self.ask(&req).await? {
            Received::Status(status) => Ok((status, None)),
            Received::StatusAged(status, aged) => Ok((status, Some(aged))),
            other => Err(unexpected(other)),
        }
    }

    /// `STATUS`: every held lock, sorted by name.
    pub async fn held_locks(&mut self) -> Result<Vec<HeldLine>> {
        Ok(self.held_locks_aged().await?.0)
    }

    /// `STATUS`: every held lock, sorted by name, and from a cluster front-end how old its
    /// view may be.
    pub async fn held_locks_aged(&mut self) -> Result<(Vec<HeldLine>, Option<EtcdAge>)> {
        self.held_aged(None).await
    }

    /// `STATUS <prefix>*`: every held lock whose name starts with `prefix`, sorted by name,
    /// and from a cluster front-end how old its view may be.
    pub async fn held_under_aged(
        &mut self,
        prefix: &str,
    ) -> Result<(Vec<HeldLine>, Option<EtcdAge>)> {
        self.held_aged(Some(format!("{prefix}*"))).await
    }

    async fn held_aged(
        &mut self,
        pattern: Option<String>,
    ) -> Result<(Vec<HeldLine>, Option<EtcdAge>)> {
        let mut reply = self.ask(&Request::Status { name: pattern }).await?;
        let mut locks = Vec::new();
        loop {
            match reply {
                Received::Info(held) => locks.push(held),
                Received::Count(_) => return Ok((locks, None)),
                Received::CountAged(_, aged) => return Ok((locks, Some(aged))),
                other => return Err(unexpected(other)),
            }
            reply = self.read_reply(Asked::StatusAll).await?;
        }
    }

    /// `STATUS <name> detail`: who holds the lock and who waits for it, in queue order.
    pub async fn detail(&mut self, name: &str) -> Result<LockDetail> {
        let mut reply = self
            .ask(&Request::StatusDetail { name: name.into() })
            .await?;
        let (mut holders, mut waiters) = (Vec::new(), Vec::new());
        loop {
            match reply {
                Received::Holder(h) => holders.push(h),
                Received::Waiter(w) => waiters.push(w),
                Received::Status(status) => {
                    return Ok(LockDetail {
                        holders,
                        waiters,
                        status,
                        aged: None,
                    })
                }
                Received::StatusAged(status, aged) => {
                    return Ok(LockDetail {
                        holders,
                        waiters,
                        status,
                        aged: Some(aged),
                    })
                }
                other => return Err(unexpected(other)),
            }
            reply = self.read_reply(Asked::Detail).await?;
        }
    }

    /// After [`Client::watch`]: the next event, or (inside) the line that came instead of
    /// one, after which the watch goes on. An `ERR` (`LAGGED`, `SHUTDOWN`, a right taken away)
    /// ends the watch: [`ClientError::Refused`].
    pub async fn next_event(&mut self) -> Result<std::result::Result<EventLine, BadReply>> {
        loop {
            let line = self.read_line().await?;
            match Received::parse(&line, Asked::Watch) {
                Ok(Received::Event(event)) => return Ok(Ok(event)),
                Ok(Received::Error(e)) => return Err(ClientError::Refused(e)),
                // Its confirmation, if the caller did not wait for it, or another `OK`.
                Ok(Received::Watching(_)) => {}
                Err(_) if matches!(proto::parse_reply(&line), ReplyLine::Ok(_)) => {}
                Ok(other) => return Ok(Err(BadReply(other.to_string()))),
                Err(bad) => return Ok(Err(bad)),
            }
        }
    }

    /// STATUS as text: the lines describing the named lock (`<name> free` or `<name> held ...`), or
    /// every held lock.
    pub async fn status(&mut self, name: Option<&str>) -> Result<Vec<String>> {
        let req = Request::Status {
            name: name.map(str::to_owned),
        };
        if name.is_some() {
            return Ok(vec![self.request(&req).await?]);
        }
        req.validate()?;
        self.conn.send(&req).await?;
        let mut lines = Vec::new();
        loop {
            let line = self.read_line().await?;
            match proto::parse_reply(&line) {
                ReplyLine::Other(rest) => match rest.strip_prefix("INFO ") {
                    Some(info) => lines.push(info.to_owned()),
                    None => return Err(ClientError::Unexpected(line)),
                },
                ReplyLine::Ok(_) => return Ok(lines),
                ReplyLine::Err(e) => return Err(ClientError::Refused(e)),
            }
        }
    }

    /// `STATUS <name> detail` as text (see [`DetailLines`]).
    pub async fn status_detail(&mut self, name: &str) -> Result<DetailLines> {
        let req = Request::StatusDetail { name: name.into() };
        req.validate()?;
        self.conn.send(&req).await?;
        let mut detail = DetailLines::default();
        loop {
            let line = self.read_line().await?;
            match proto::parse_reply(&line) {
                ReplyLine::Other(rest) => {
                    if let Some(h) = rest.strip_prefix("HOLDER ") {
                        detail.holders.push(h.to_owned());
                    } else if let Some(w) = rest.strip_prefix("WAITER ") {
                        detail.waiters.push(w.to_owned());
                    } else {
                        return Err(ClientError::Unexpected(line));
                    }
                }
                ReplyLine::Ok(status) => {
                    detail.status = status.to_owned();
                    return Ok(detail);
                }
                ReplyLine::Err(e) => return Err(ClientError::Refused(e)),
            }
        }
    }

    /// PING.
    pub async fn ping(&mut self) -> Result<()> {
        match self.ask(&Request::Ping).await? {
            Received::Pong => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// WATCH; then [`Client::next_event`] (or [`Client::read_line`]) returns its events.
    pub async fn watch(&mut self, name: Option<&str>) -> Result<()> {
        let req = Request::Watch {
            name: name.map(str::to_owned),
        };
        match self.ask(&req).await? {
            Received::Watching(_) => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// A well-formed reply to the wrong question.
fn unexpected(reply: Received) -> ClientError {
    ClientError::Unexpected(reply.to_string())
}

fn lease_left(reply: Received) -> Result<Duration> {
    match reply {
        Received::Lease(left) => Ok(left),
        other => Err(unexpected(other)),
    }
}
