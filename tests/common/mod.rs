//! Shared by the integration tests: a real server on 127.0.0.1:0 and a raw line client.
//!
//! Every read has a generous timeout: it only turns a hang into a failure, it never asserts
//! how fast the server is.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd::server::{self, Config};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any single wait may take before the test is declared hung.
pub const GUARD: Duration = Duration::from_secs(10);

/// A server running on the test's runtime.
pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<io::Result<()>>>,
}

/// Binds 127.0.0.1:0 and serves `config` there until [`TestServer::shutdown`] (or drop).
pub async fn start_server(config: Config) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::run(config, listener, shutdown.clone()));
    TestServer {
        addr,
        shutdown,
        task: Some(task),
    }
}

/// A default config whose shutdown does not keep a failing test waiting long.
pub fn config() -> Config {
    Config {
        shutdown_grace: Duration::from_secs(2),
        ..Config::default()
    }
}

impl TestServer {
    /// Starts the server's shutdown without waiting for it.
    pub fn cancel(&self) {
        self.shutdown.cancel();
    }

    /// Cancels the server and waits until `run` has returned.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(GUARD, task)
                .await
                .expect("server did not stop in time");
            result.expect("server task panicked").expect("server run");
        }
    }

    /// A raw connection to this server.
    pub async fn raw(&self) -> Raw {
        Raw::connect(self.addr).await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A raw line client: writes what it is told, reads one line at a time.
pub struct Raw {
    stream: BufReader<TcpStream>,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        let stream = tokio::time::timeout(GUARD, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        Raw::from_stream(stream)
    }

    pub fn from_stream(stream: TcpStream) -> Raw {
        let _ = stream.set_nodelay(true);
        Raw {
            stream: BufReader::new(stream),
        }
    }

    pub fn stream(&self) -> &TcpStream {
        self.stream.get_ref()
    }

    /// Sends `line` and a `\n`.
    pub async fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\n").as_bytes()).await;
    }

    /// Sends bytes exactly as given.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        tokio::time::timeout(GUARD, self.stream.get_mut().write_all(bytes))
            .await
            .expect("write timed out")
            .expect("write");
    }

    /// Reads one line (without its `\n`); `None` at EOF.
    pub async fn try_line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(GUARD, self.stream.read_until(b'\n', &mut buf))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no line within the guard"))??;
        if n == 0 {
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
        loop {
            match tokio::time::timeout(GUARD, self.stream.read(&mut sink)).await {
                Err(_) => panic!("connection still open after the guard"),
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Closes our sending side; the server sees end of input.
    pub async fn shutdown_write(&mut self) {
        self.stream.get_mut().shutdown().await.expect("shutdown");
    }

    /// Drops the connection with a reset instead of a FIN.
    pub fn reset(self) {
        self.stream().set_zero_linger().expect("SO_LINGER 0");
        drop(self);
    }
}

/// The token of an `OK <token>` reply.
pub fn token(reply: &str) -> u64 {
    reply
        .strip_prefix("OK ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("expected OK <token>, got {reply:?}"))
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
