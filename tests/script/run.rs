//! Runs one parsed script against a lockd at an address: named connections, opened on first
//! use, each read bounded by a generous guard that only turns a hang into a failure.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::parse::{Action, Line, Step};
use super::pattern::{expand, matches, Vars};
use crate::common::{without_etcd_age, Raw, Read};

/// How long `silent` listens. Only a line that does arrive fails it; a slow server passes.
const SILENT: Duration = Duration::from_millis(100);

/// How a script run ends badly: where, and what was seen.
pub struct Failure {
    pub line: usize,
    pub source: String,
    pub what: String,
}

/// The lockd under test, as `server:` steps drive it.
pub trait ServerControl {
    /// SIGTERM: lockd starts shutting down.
    fn stop(&mut self);
    /// The auth file rewritten with these users, then SIGHUP.
    fn reload_users(&mut self, specs: &[String]) -> Result<(), String>;
}

/// One client connection of a script: the tests' one line client.
struct Conn {
    raw: Raw,
}

impl Conn {
    async fn open(addr: SocketAddr, small: bool, guard: Duration) -> Result<Conn, String> {
        let raw = if small {
            Raw::try_connect_small(addr, 4096, Some(guard)).await
        } else {
            Raw::try_connect(addr, Some(guard)).await
        };
        match raw {
            Ok(raw) => Ok(Conn { raw }),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                Err("connect: no answer within the guard".to_string())
            }
            Err(e) => Err(format!("connect: {e}")),
        }
    }

    async fn send(&mut self, bytes: &[u8], guard: Duration) -> Result<(), String> {
        match self.raw.send_within(bytes, guard).await {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(format!("send failed: {e}")),
            None => Err("send: the server took nothing within the guard".into()),
        }
    }

    /// The next line, with the age of a cluster front-end's view (`etcd_age_ms=..
    /// etcd_bound_ms=..`, which only cluster mode adds to STATUS's `OK` line and which
    /// changes by the millisecond) taken off, so that one script expects the same line of
    /// both backends. `tests/cluster/health.rs` checks the age itself.
    async fn read(&mut self, guard: Duration) -> Read {
        match self.raw.read_within(guard).await {
            Read::Line(l) => Read::Line(without_etcd_age(l)),
            other => other,
        }
    }
}

/// A script's run: its connections and captured values.
pub struct Run {
    /// The server's addresses: one, or a simulated cluster's front-ends.
    addrs: Vec<SocketAddr>,
    /// The script's connections in order of first appearance: the `k`th is served by
    /// `addrs[k % addrs.len()]`.
    order: Vec<String>,
    guard: Duration,
    conns: HashMap<String, Conn>,
    vars: Vars,
    /// What was sent and received, for a failure's report.
    pub transcript: Vec<String>,
    /// What `server:` steps ask of the lockd under test.
    server: Box<dyn ServerControl>,
}

impl Run {
    pub fn new(
        addrs: Vec<SocketAddr>,
        order: Vec<String>,
        guard: Duration,
        server: Box<dyn ServerControl>,
    ) -> Run {
        assert!(!addrs.is_empty(), "a server to talk to");
        Run {
            addrs,
            order,
            guard,
            conns: HashMap::new(),
            vars: Vars::new(),
            transcript: Vec::new(),
            server,
        }
    }

    /// Where connection `name` goes; on several front-ends, noted in the transcript.
    fn addr(&mut self, name: &str) -> SocketAddr {
        if self.addrs.len() == 1 {
            return self.addrs[0];
        }
        let k = self.order.iter().position(|n| n == name).unwrap_or(0);
        let fe = k % self.addrs.len();
        self.note(format!("{name}: opened on fe{fe}"));
        self.addrs[fe]
    }

    async fn conn(&mut self, name: &str) -> Result<&mut Conn, String> {
        if !self.conns.contains_key(name) {
            let addr = self.addr(name);
            let c = Conn::open(addr, false, self.guard).await?;
            self.conns.insert(name.to_owned(), c);
        }
        Ok(self.conns.get_mut(name).expect("just opened"))
    }

    fn note(&mut self, line: String) {
        self.transcript.push(line);
    }

    pub async fn steps(&mut self, steps: &[Line]) -> Result<(), Failure> {
        for line in steps {
            self.step(line).await.map_err(|what| Failure {
                line: line.number,
                source: line.source.clone(),
                what,
            })?;
        }
        Ok(())
    }

    async fn expect(&mut self, conn: &str, pattern: &str) -> Result<(), String> {
        let guard = self.guard;
        let got = self.conn(conn).await?.read(guard).await;
        if let Read::Line(l) = &got {
            self.note(format!("{conn}< {l}"));
            if matches(pattern, l, &mut self.vars) {
                return Ok(());
            }
        }
        Err(format!("expected: {pattern}\n  actual:   {got}"))
    }

    async fn step(&mut self, line: &Line) -> Result<(), String> {
        let guard = self.guard;
        match &line.step {
            Step::Send { conn, text } => {
                let mut bytes = expand(text, &self.vars)?;
                self.note(format!("{conn}> {}", String::from_utf8_lossy(&bytes)));
                bytes.push(b'\n');
                self.conn(conn).await?.send(&bytes, guard).await
            }
            Step::Expect { conn, pattern } => self.expect(conn, pattern).await,
            Step::Poll {
                conn,
                request,
                pattern,
            } => {
                let mut bytes = expand(request, &self.vars)?;
                bytes.push(b'\n');
                let deadline = tokio::time::Instant::now() + guard;
                loop {
                    let c = self.conn(conn).await?;
                    c.send(&bytes, guard).await?;
                    let got = c.read(guard).await;
                    if let Read::Line(l) = &got {
                        if ["INFO ", "HOLDER ", "WAITER "]
                            .iter()
                            .any(|p| l.starts_with(p))
                        {
                            return Err(format!("a poll takes one-line replies only; got {l:?}"));
                        }
                        if matches(pattern, l, &mut self.vars) {
                            let sent = String::from_utf8_lossy(&bytes);
                            self.note(format!("{conn}? {} => {l}", sent.trim_end()));
                            return Ok(());
                        }
                    }
                    if !matches!(got, Read::Line(_)) || tokio::time::Instant::now() > deadline {
                        return Err(format!("polled until: {pattern}\n  last:     {got}"));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Step::Act { conn, action } => {
                self.note(line.source.clone());
                self.act(conn, action).await
            }
            Step::Sleep(d) => {
                tokio::time::sleep(*d).await;
                Ok(())
            }
            Step::Assert { a, op, b } => {
                let value = |w: &str| -> Result<String, String> {
                    match w.strip_prefix('$') {
                        Some(v) => self
                            .vars
                            .get(v)
                            .cloned()
                            .ok_or_else(|| format!("${v} was never captured")),
                        None => Ok(w.to_owned()),
                    }
                };
                let (x, y) = (value(a)?, value(b)?);
                let holds = match (x.parse::<i128>(), y.parse::<i128>()) {
                    (Ok(x), Ok(y)) => match op.as_str() {
                        "<" => x < y,
                        "<=" => x <= y,
                        ">" => x > y,
                        ">=" => x >= y,
                        "==" => x == y,
                        _ => x != y,
                    },
                    _ => match op.as_str() {
                        "==" => x == y,
                        "!=" => x != y,
                        _ => return Err(format!("{x:?} {op} {y:?}: not numbers")),
                    },
                };
                if holds {
                    Ok(())
                } else {
                    Err(format!("does not hold: {x} {op} {y}"))
                }
            }
            Step::StopServer => {
                self.note("server: stop".into());
                self.server.stop();
                Ok(())
            }
            Step::ReloadUsers(specs) => {
                self.note(format!("server: users {}", specs.join(" | ")));
                self.server.reload_users(specs)
            }
            Step::Repeat { count, body } => {
                for i in 0..*count {
                    let before: Vec<String> = self.vars.keys().cloned().collect();
                    self.vars.insert("i".into(), i.to_string());
                    Box::pin(self.steps(body)).await.map_err(|f| {
                        format!("round {i}, line {}: {}\n  {}", f.line, f.source, f.what)
                    })?;
                    self.vars.retain(|k, _| before.contains(k));
                }
                Ok(())
            }
        }
    }

    async fn act(&mut self, conn: &str, action: &Action) -> Result<(), String> {
        let guard = self.guard;
        match action {
            Action::Connect => self.conn(conn).await.map(|_| ()),
            Action::ConnectServed(small) => {
                let deadline = tokio::time::Instant::now() + guard;
                let addr = self.addr(conn);
                loop {
                    let mut c = Conn::open(addr, *small, guard).await?;
                    c.send(b"PING\n", guard).await?;
                    let got = c.read(guard).await;
                    match &got {
                        Read::Line(l) if l == "OK PONG" => {
                            self.conns.insert(conn.to_owned(), c);
                            return Ok(());
                        }
                        Read::Line(l) if l.starts_with("ERR LIMIT ") => {}
                        _ => return Err(format!("connect served: PING answered {got}")),
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!("still refused after the guard: {got}"));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Action::ConnectSmall => {
                let addr = self.addr(conn);
                let c = Conn::open(addr, true, guard).await?;
                self.conns.insert(conn.to_owned(), c);
                Ok(())
            }
            Action::Close => {
                self.conns.remove(conn);
                Ok(())
            }
            Action::Reset => {
                if let Some(c) = self.conns.remove(conn) {
                    let _ = c.raw.try_reset();
                }
                Ok(())
            }
            Action::Shutdown => self
                .conn(conn)
                .await?
                .raw
                .try_shutdown_write()
                .await
                .map_err(|e| format!("shutdown: {e}")),
            Action::Eof | Action::Closed => {
                let got = self.conn(conn).await?.read(guard).await;
                match (&got, action) {
                    (Read::Eof, _) | (Read::Reset(_), Action::Closed) => {
                        self.conns.remove(conn);
                        Ok(())
                    }
                    _ => Err(format!("expected the server to close it; got {got}")),
                }
            }
            Action::Quiet => {
                let c = self.conn(conn).await?;
                c.send(b"PING\n", guard).await?;
                match c.read(guard).await {
                    Read::Line(l) if l == "OK PONG" => Ok(()),
                    got => Err(format!(
                        "expected nothing pending (PING answered next); got {got}"
                    )),
                }
            }
            Action::Silent => {
                let c = self.conn(conn).await?;
                match c.raw.peek_within(SILENT).await {
                    None => Ok(()),
                    Some(Ok(bytes)) if bytes.is_empty() => {
                        Err("expected silence; got end of stream".into())
                    }
                    Some(Ok(bytes)) => Err(format!(
                        "expected silence; got {:?}",
                        String::from_utf8_lossy(&bytes)
                    )),
                    Some(Err(e)) => Err(format!("expected silence; got connection error ({e})")),
                }
            }
            Action::SendRaw(text) => {
                let bytes = expand(text, &self.vars)?;
                self.conn(conn).await?.send(&bytes, guard).await
            }
            Action::TrySend(text) => {
                let bytes = expand(text, &self.vars)?;
                let _ = self.conn(conn).await?.send(&bytes, guard).await;
                Ok(())
            }
            Action::Drain => {
                let mut lines = 0usize;
                loop {
                    match self.conn(conn).await?.read(guard).await {
                        Read::Line(_) => lines += 1,
                        Read::Eof | Read::Reset(_) => {
                            self.note(format!("{conn}: drained {lines} lines to its end"));
                            self.conns.remove(conn);
                            return Ok(());
                        }
                        Read::Hang => {
                            return Err(format!("still open after {lines} lines and the guard"))
                        }
                    }
                }
            }
            Action::SkipUntil(pattern) => {
                let mut skipped = 0usize;
                loop {
                    let got = self.conn(conn).await?.read(guard).await;
                    match &got {
                        Read::Line(l) if matches(pattern, l, &mut self.vars) => {
                            self.note(format!("{conn}< {l} (after {skipped} skipped)"));
                            return Ok(());
                        }
                        Read::Line(_) => skipped += 1,
                        _ => {
                            return Err(format!(
                                "skipped {skipped} lines until: {pattern}\n  then:     {got}"
                            ))
                        }
                    }
                }
            }
        }
    }
}
