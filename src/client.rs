//! An async client of the line protocol, for `lockctl` and the tests.

use std::fmt;
use std::io;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::stream::Stream;

use crate::connection::{Connection, Frame};
use crate::locks::{Mode, Token};
use crate::proto::{self, ErrorCode, ProtoError, ReplyLine, Request, Tie};

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

pub type Result<T> = std::result::Result<T, ClientError>;

/// The answer to `STATUS <name> detail`, each line without its first word.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detail {
    /// `<name> id=.. token=.. held_ms=.. ...`, one per holder, in token order.
    pub holders: Vec<String>,
    /// `<name> <position> id=.. waited_ms=.. ...`, in queue order.
    pub waiters: Vec<String>,
    /// The `OK` line's text, as `STATUS <name>` answers it: `<name> free` or `<name> held ...`.
    pub status: String,
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
        let _ = stream.set_nodelay(true);
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let stream = tls.connect(crate::tls::server_name(host)?, stream).await?;
        Ok(Client {
            conn: Connection::new(Stream::Client(Box::new(stream)), MAX_REPLY),
        })
    }

    /// Sends a request and returns the text after `OK` of its reply.
    pub async fn request(&mut self, req: &Request) -> Result<String> {
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
        self.read_ok().await
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
        let reply = self
            .request(&Request::Lock {
                name: name.into(),
                id: id.into(),
                ttl,
                wait,
                tie,
                mode,
            })
            .await?;
        reply
            .parse()
            .map_err(|_| ClientError::Unexpected(format!("OK {reply}")))
    }

    /// UNLOCK.
    pub async fn unlock(&mut self, name: &str, token: Token) -> Result<()> {
        self.request(&Request::Unlock {
            name: name.into(),
            token,
        })
        .await
        .map(drop)
    }

    /// RENEW; returns the time the lease has left.
    pub async fn renew(
        &mut self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
    ) -> Result<Duration> {
        let reply = self
            .request(&Request::Renew {
                name: name.into(),
                token,
                ttl,
            })
            .await?;
        lease_left(&reply)
    }

    /// CHECK; returns the time the lease has left.
    pub async fn check(&mut self, name: &str, token: Token) -> Result<Duration> {
        let reply = self
            .request(&Request::Check {
                name: name.into(),
                token,
            })
            .await?;
        lease_left(&reply)
    }

    /// STATUS: the lines describing the named lock (`<name> free` or `<name> held ...`), or
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

    /// `STATUS <name> detail`: who holds the lock and who waits for it, in queue order.
    pub async fn status_detail(&mut self, name: &str) -> Result<Detail> {
        let req = Request::StatusDetail { name: name.into() };
        req.validate()?;
        self.conn.send(&req).await?;
        let mut detail = Detail::default();
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
        self.request(&Request::Ping).await.map(drop)
    }

    /// WATCH; then [`Client::read_line`] returns `EVENT` lines.
    pub async fn watch(&mut self, name: Option<&str>) -> Result<()> {
        self.request(&Request::Watch {
            name: name.map(str::to_owned),
        })
        .await
        .map(drop)
    }
}

fn lease_left(reply: &str) -> Result<Duration> {
    proto::field(reply, "ttl_ms")
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| ClientError::Unexpected(format!("OK {reply}")))
}
