//! The wire protocols, by hand: lockd's line protocol (over plain TCP or TLS), the sliver of
//! Redis RESP a lock needs, and dflockd's three-line requests (the optional peer of
//! `lockbench peer`).

use std::io;
use std::net::SocketAddr;
use std::sync::OnceLock;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

async fn open(addr: SocketAddr) -> io::Result<(BufReader<OwnedReadHalf>, OwnedWriteHalf)> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (rd, wr) = stream.into_split();
    Ok((BufReader::with_capacity(4096, rd), wr))
}

/// Set once, before any scenario runs, by `--tls-ca`: then every lockd connection of this
/// process is TLS. Process-wide because one lockbench process measures one lockd, and a lockd
/// port is either plain or TLS, never both.
static TLS: OnceLock<TlsConnector> = OnceLock::new();

/// Makes every later lockd connection of this process a TLS one, through `connector`.
pub fn use_tls(connector: TlsConnector) {
    let _ = TLS.set(connector);
}

/// The protocol version and cipher suite the first TLS connection agreed on, for the log.
static NEGOTIATED: OnceLock<String> = OnceLock::new();

/// What the first TLS connection negotiated (`None` before one, or without TLS).
pub fn negotiated() -> Option<&'static str> {
    NEGOTIATED.get().map(String::as_str)
}

/// A lockd connection's byte stream: plain TCP, or TLS over it. Boxed behind one trait, so
/// that both kinds take exactly the same path through the load generator.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<S: AsyncRead + AsyncWrite + Send + Unpin> Stream for S {}

/// Sends `bytes` and flushes them (a TLS stream may hold written bytes until a flush).
async fn write(stream: &mut dyn Stream, bytes: &[u8]) -> io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// A lockd connection: one line out, one line back.
pub struct Line {
    /// Reads are buffered; writes go straight to the stream underneath.
    io: BufReader<Box<dyn Stream>>,
    out: Vec<u8>,
    line: String,
}

impl Line {
    /// Connects to `addr`, and completes the TLS handshake too after [`use_tls`]: the
    /// connection is ready for requests when this returns.
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match TLS.get() {
            None => Box::new(tcp),
            Some(tls) => {
                // The throwaway server certificate names 127.0.0.1 and localhost.
                let name = ServerName::IpAddress(addr.ip().into());
                let s = tls.connect(name, tcp).await?;
                if NEGOTIATED.get().is_none() {
                    let (_, session) = s.get_ref();
                    if let (Some(version), Some(suite)) = (
                        session.protocol_version(),
                        session.negotiated_cipher_suite(),
                    ) {
                        let _ = NEGOTIATED.set(format!("{version:?}, {:?}", suite.suite()));
                    }
                }
                Box::new(s)
            }
        };
        Ok(Line {
            io: BufReader::with_capacity(4096, stream),
            out: Vec::with_capacity(128),
            line: String::with_capacity(128),
        })
    }

    /// Sends one request line (without its newline).
    pub async fn send(&mut self, req: &str) -> io::Result<()> {
        self.out.clear();
        self.out.extend_from_slice(req.as_bytes());
        self.out.push(b'\n');
        write(self.io.get_mut(), &self.out).await
    }

    /// Sends many lines in one write (pipelining).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        write(self.io.get_mut(), bytes).await
    }

    /// Closes the connection cleanly: TLS's close_notify, then the TCP FIN.
    pub async fn close(mut self) -> io::Result<()> {
        self.io.get_mut().shutdown().await
    }

    /// The next reply line, without its newline.
    pub async fn recv(&mut self) -> io::Result<&str> {
        self.line.clear();
        if self.io.read_line(&mut self.line).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed",
            ));
        }
        Ok(self.line.trim_end())
    }

    pub async fn call(&mut self, req: &str) -> io::Result<&str> {
        self.send(req).await?;
        self.recv().await
    }

    /// `OK <token>` from a LOCK, or an error with the reply.
    pub async fn recv_token(&mut self) -> io::Result<u64> {
        let reply = self.recv().await?;
        reply
            .strip_prefix("OK ")
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| bad(format!("LOCK: unexpected reply {reply:?}")))
    }

    /// Expects a plain `OK` (or `OK ...`).
    pub async fn call_ok(&mut self, req: &str) -> io::Result<()> {
        let reply = self.call(req).await?;
        if reply == "OK" || reply.starts_with("OK ") {
            Ok(())
        } else {
            Err(bad(format!("{req}: unexpected reply {reply:?}")))
        }
    }
}

/// A reply in RESP2, as far as locks need it.
#[derive(Debug, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
}

/// The compare-and-delete release every Redis lock library uses.
pub const RELEASE_LUA: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// A Redis connection speaking RESP2.
pub struct Redis {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    out: Vec<u8>,
    line: Vec<u8>,
}

/// Appends one command as a RESP array of bulk strings.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

impl Redis {
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let (rd, wr) = open(addr).await?;
        Ok(Redis {
            rd,
            wr,
            out: Vec::with_capacity(256),
            line: Vec::with_capacity(128),
        })
    }

    pub async fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        self.out.clear();
        encode(&mut self.out, args);
        self.wr.write_all(&self.out).await
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.wr.write_all(bytes).await
    }

    pub async fn recv(&mut self) -> io::Result<Resp> {
        self.line.clear();
        if self.rd.read_until(b'\n', &mut self.line).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "redis closed"));
        }
        let text = std::str::from_utf8(&self.line)
            .map_err(|_| bad("redis: reply header is not UTF-8"))?
            .trim_end();
        let (kind, rest) = text.split_at(text.len().min(1));
        match kind {
            "+" => Ok(Resp::Simple(rest.to_owned())),
            "-" => Ok(Resp::Error(rest.to_owned())),
            ":" => rest
                .parse()
                .map(Resp::Int)
                .map_err(|_| bad(format!("redis: bad integer {rest:?}"))),
            "$" => {
                let n: i64 = rest
                    .parse()
                    .map_err(|_| bad(format!("redis: bad length {rest:?}")))?;
                if n < 0 {
                    return Ok(Resp::Bulk(None));
                }
                let mut body = vec![0; n as usize + 2];
                self.rd.read_exact(&mut body).await?;
                body.truncate(n as usize);
                Ok(Resp::Bulk(Some(body)))
            }
            _ => Err(bad(format!("redis: unsupported reply {text:?}"))),
        }
    }

    pub async fn call(&mut self, args: &[&[u8]]) -> io::Result<Resp> {
        self.send(args).await?;
        self.recv().await
    }

    /// `SET key value NX PX ttl_ms`: whether this call took the lock.
    pub async fn try_lock(&mut self, key: &str, value: &str, ttl_ms: u64) -> io::Result<bool> {
        let ttl = ttl_ms.to_string();
        let args: [&[u8]; 6] = [
            b"SET",
            key.as_bytes(),
            value.as_bytes(),
            b"NX",
            b"PX",
            ttl.as_bytes(),
        ];
        match self.call(&args).await? {
            Resp::Simple(s) if s == "OK" => Ok(true),
            Resp::Bulk(None) => Ok(false),
            other => Err(bad(format!("SET NX: unexpected reply {other:?}"))),
        }
    }

    /// Compare-and-delete through EVAL: whether our value was still there to delete.
    pub async fn unlock(&mut self, key: &str, value: &str) -> io::Result<bool> {
        let args: [&[u8]; 5] = [
            b"EVAL",
            RELEASE_LUA.as_bytes(),
            b"1",
            key.as_bytes(),
            value.as_bytes(),
        ];
        match self.call(&args).await? {
            Resp::Int(n) => Ok(n == 1),
            other => Err(bad(format!("EVAL release: unexpected reply {other:?}"))),
        }
    }

    pub async fn ping(&mut self) -> io::Result<()> {
        match self.call(&[b"PING"]).await? {
            Resp::Simple(s) if s == "PONG" => Ok(()),
            other => Err(bad(format!("PING: unexpected reply {other:?}"))),
        }
    }
}

/// A dflockd connection: each request is three lines (`l`, the key, `<wait-s> <ttl-s>` to
/// acquire; `r`, the key, the token to release), each reply one line.
pub struct Dflockd {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    out: Vec<u8>,
    line: String,
}

impl Dflockd {
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let (rd, wr) = open(addr).await?;
        Ok(Dflockd {
            rd,
            wr,
            out: Vec::with_capacity(128),
            line: String::with_capacity(128),
        })
    }

    async fn call(&mut self, op: &str, key: &str, arg: &str) -> io::Result<&str> {
        self.out.clear();
        for part in [op, key, arg] {
            self.out.extend_from_slice(part.as_bytes());
            self.out.push(b'\n');
        }
        self.wr.write_all(&self.out).await?;
        self.line.clear();
        if self.rd.read_line(&mut self.line).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "dflockd closed",
            ));
        }
        Ok(self.line.trim_end())
    }

    /// Waits up to `wait_s` in dflockd's FIFO queue for `key` with a lease of `ttl_s`: the
    /// token (dflockd's are strings), or `None` if the wait ran out.
    pub async fn lock(&mut self, key: &str, wait_s: u64, ttl_s: u64) -> io::Result<Option<String>> {
        let arg = format!("{wait_s} {ttl_s}");
        let reply = self.call("l", key, &arg).await?;
        if reply == "timeout" {
            return Ok(None);
        }
        match reply.strip_prefix("ok ").and_then(|r| r.split(' ').next()) {
            Some(token) => Ok(Some(token.to_owned())),
            None => Err(bad(format!("dflockd acquire: unexpected reply {reply:?}"))),
        }
    }

    /// Releases `key` held with `token`: whether dflockd still had it so.
    pub async fn unlock(&mut self, key: &str, token: &str) -> io::Result<bool> {
        let reply = self.call("r", key, token).await?;
        Ok(reply == "ok")
    }
}
