//! One client connection: read a line, parse it, run it against the shared table, reply.
//!
//! Requests on a connection are answered in order, one at a time; a waiting LOCK holds the
//! connection until it is answered (later lines stay buffered, up to a bound). While it waits,
//! the session keeps reading so it notices the client going away. End of input is a
//! half-close, not a departure: the client still gets every reply it asked for, a pending LOCK
//! included, unless that LOCK is tied to the connection (`session` or `detach`). A plain LOCK
//! granted after its client half-closed is watched for a short while: a dead client answers
//! the grant with a reset, and the grant is taken back (see `Session::confirm_delivery`).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::auth::{Gate, Right, Users};
use crate::connection::{Connection, Frame, WRITE_CHUNK};
use crate::locks::{ConnId, LockRequest, TableError, Token, UserId, WaitEnd, WaiterId, NO_USER};
use crate::proto::{self, ProtoError, Reply, Request, Secret, Tie};
use crate::shared::{LockStart, Published, Shared, WaitResult};

/// Session leases a connection may track before it prunes the ended ones.
const SESSION_LEASES_PRUNE_AT: usize = 256;

/// Whether to keep reading requests.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// Per-connection limits, from the server's flags.
#[derive(Clone, Copy, Debug)]
pub struct SessionLimits {
    /// Longest request line, in bytes.
    pub max_line: usize,
    /// Longest name or id, in bytes (at most [`proto::MAX_NAME_LEN`]).
    pub max_name: usize,
    /// Events a watcher may fall behind before it is disconnected.
    pub watch_buffer: usize,
    /// How long a grant to a client that half-closed while it waited is watched for a reset.
    pub half_close_probe: Duration,
}

/// How often [`Session::confirm_delivery`] looks at the socket while it watches.
const PROBE_POLL: Duration = Duration::from_millis(10);

/// One connection's state.
pub struct Session {
    shared: Arc<Shared>,
    conn: Connection,
    /// This connection's number, to which its session leases are bound.
    number: ConnId,
    shutdown: CancellationToken,
    limits: SessionLimits,
    /// Session leases bound to this connection, by token (one connection may hold several
    /// slots of one semaphore): ended when it closes.
    leases: HashMap<Token, String>,
    /// With an auth file: who this connection is. `None` serves everyone as [`NO_USER`].
    login: Option<Login>,
}

/// A connection's standing on a server with an auth file.
struct Login {
    /// The users in force; a reload replaces them and wakes the session.
    users: watch::Receiver<Arc<Users>>,
    /// The user this connection authenticated as, and its name; `None` until AUTH.
    user: Option<(UserId, String)>,
    /// Wrong AUTHs so far.
    failures: u32,
}

/// Whether a request may run: what [`Session::admit`] decides before every command.
enum Admit {
    Yes,
    /// `ERR ...`, nothing changes, the connection stays.
    Refuse(ProtoError),
    /// `ERR ...`, and the connection is closed: its user was removed.
    Close(ProtoError),
}

impl Session {
    /// A session for `conn`; with a `gate`, its client must AUTH before anything but PING,
    /// HELP and QUIT, and may only do what its user's rights allow.
    pub fn new(
        shared: Arc<Shared>,
        conn: Connection,
        limits: SessionLimits,
        shutdown: CancellationToken,
        gate: Option<&Gate>,
    ) -> Self {
        let number = shared.connection_id();
        Session {
            shared,
            conn,
            number,
            shutdown,
            limits,
            leases: HashMap::new(),
            login: gate.map(|gate| Login {
                users: gate.subscribe(),
                user: None,
                failures: 0,
            }),
        }
    }

    /// Serves the connection until the client leaves, asks to, or the server shuts down.
    ///
    /// When the server ends the connection itself (QUIT, an over-long line, a lagging
    /// watcher, shutdown), the close is orderly: every reply is sent, then a FIN, then what
    /// the client still sends is read and discarded for a moment, so the close does not turn
    /// into a reset that destroys replies the client has not read yet. A connection that
    /// failed (reset, or a client that stopped reading for the write timeout) is just dropped.
    pub async fn run(mut self) {
        let closed = match self.serve().await {
            Ok(()) => self.conn.close_write().await,
            Err(e) => Err(e),
        };
        if let Err(e) = closed {
            tracing::debug!(conn = self.number, error = %e, "connection ended");
            return;
        }
        // The client was told everything: its session leases end now, not after the drain.
        self.release_sessions();
        if self.shutdown.is_cancelled() {
            // Stopping: don't keep the server up for clients that leave their side open.
            self.conn.drain_arrived();
        } else {
            self.conn.drain().await;
        }
    }

    async fn serve(&mut self) -> io::Result<()> {
        loop {
            if !self.conn.has_frame() {
                self.conn.flush().await?;
            }
            let frame = tokio::select! {
                frame = self.conn.read_frame() => frame?,
                _ = self.shutdown.cancelled() => return Ok(()),
                () = reloaded(&mut self.login) => {
                    if let Some(e) = self.removed() {
                        self.refuse(e).await?;
                        return Ok(());
                    }
                    continue;
                }
            };
            let flow = match frame {
                Frame::Eof => return Ok(()),
                Frame::TooLong => {
                    self.refuse(ProtoError::too_long(self.limits.max_line))
                        .await?;
                    Flow::Close
                }
                Frame::BadUtf8 => {
                    self.refuse(ProtoError::bad_utf8()).await?;
                    Flow::Continue
                }
                Frame::Line(line) => match proto::parse(&line)
                    .and_then(|r| r.check_name_len(self.limits.max_name).map(|()| r))
                {
                    Ok(request) => match self.admit(&request) {
                        Admit::Yes => self.dispatch(request).await?,
                        Admit::Refuse(e) => {
                            self.refuse(e).await?;
                            Flow::Continue
                        }
                        Admit::Close(e) => {
                            self.refuse(e).await?;
                            Flow::Close
                        }
                    },
                    Err(e) => {
                        self.refuse(e).await?;
                        Flow::Continue
                    }
                },
            };
            if flow == Flow::Close {
                return Ok(());
            }
        }
    }

    /// Answers `ERR ...`: every refusal goes through here, to be counted.
    async fn refuse(&mut self, e: ProtoError) -> io::Result<()> {
        self.shared.metrics().refused(e.code);
        tracing::debug!(conn = self.number, code = %e.code, message = %e.message, "refused");
        self.conn.queue(Reply::Error(&e)).await
    }

    /// [`Session::refuse`] for loops that write from their output buffer themselves.
    fn push_refusal(&mut self, e: ProtoError) {
        self.shared.metrics().refused(e.code);
        tracing::debug!(conn = self.number, code = %e.code, message = %e.message, "refused");
        self.conn.push(Reply::Error(&e));
    }

    async fn dispatch(&mut self, request: Request) -> io::Result<Flow> {
        let shared = Arc::clone(&self.shared);
        match request {
            Request::Lock {
                name,
                id,
                ttl,
                wait,
                tie,
                mode,
            } => {
                let req = LockRequest {
                    name,
                    id,
                    ttl,
                    wait,
                    session: tie.session(),
                    conn: self.number,
                    mode,
                    user: self.user(),
                };
                return self.lock(req, tie).await;
            }
            Request::Unlock { name, token } => {
                let result = shared.unlock(&name, token, self.user());
                if result.is_ok() {
                    self.leases.remove(&token);
                    if !self.durable().await? {
                        return Ok(Flow::Close);
                    }
                }
                self.reply(&name, result.map(|()| Reply::Done)).await?;
            }
            Request::Renew { name, token, ttl } => {
                let result = shared.renew(&name, token, ttl, self.number, self.user());
                if let Ok(renewed) = &result {
                    if renewed.bound {
                        self.track_session_lease(&name, token);
                    }
                    if !self.durable().await? {
                        return Ok(Flow::Close);
                    }
                }
                self.reply(&name, result.map(|r| Reply::Lease(r.left)))
                    .await?;
            }
            Request::Check { name, token } => {
                let result = shared.check(&name, token).map(Reply::Lease);
                self.reply(&name, result).await?;
            }
            Request::Status { name: Some(name) } => {
                let status = shared.status(&name);
                self.conn
                    .queue(Reply::Status(&name, status.as_ref()))
                    .await?;
            }
            Request::StatusDetail { name } => {
                let detail = shared.status_detail(&name, proto::DETAIL_WAITERS);
                if let Some(detail) = &detail {
                    for holder in &detail.holders {
                        self.conn.queue(Reply::Holder(holder)).await?;
                    }
                    for (i, waiter) in detail.queue.iter().enumerate() {
                        self.conn.queue(Reply::Waiter(&name, i + 1, waiter)).await?;
                    }
                }
                let status = detail.as_ref().map(|d| &d.status);
                self.conn.queue(Reply::Status(&name, status)).await?;
            }
            Request::Status { name: None } => return self.status_all().await,
            Request::Watch { name } => return self.watch(name).await,
            Request::Auth { user, secret } => return self.auth(user, secret).await,
            Request::Ping => self.conn.queue(Reply::Pong).await?,
            Request::Help => self.conn.queue(Reply::Help).await?,
            Request::Quit => {
                self.conn.queue(Reply::Bye).await?;
                return Ok(Flow::Close);
            }
        }
        Ok(Flow::Continue)
    }

    /// Who this connection acts as in the table: its user, or [`NO_USER`] without an auth
    /// file.
    fn user(&self) -> UserId {
        self.login
            .as_ref()
            .and_then(|l| l.user.as_ref())
            .map_or(NO_USER, |(number, _)| *number)
    }

    /// Whether this connection's user has `right` on `name` under the users in force now
    /// (always, without an auth file).
    fn may(&self, right: Right, name: &str) -> bool {
        let Some(login) = &self.login else {
            return true;
        };
        login
            .user
            .as_ref()
            .is_some_and(|(user, _)| login.users.borrow().may(*user, right, name))
    }

    /// The refusal that closes this connection if its user is gone from the users in force.
    fn removed(&self) -> Option<ProtoError> {
        let login = self.login.as_ref()?;
        let (user, name) = login.user.as_ref()?;
        let gone = login.users.borrow().name(*user).is_none();
        gone.then(|| ProtoError::user_removed(name))
    }

    /// Decides, before a command runs, whether this connection may send it: before AUTH only
    /// PING, HELP, QUIT and AUTH; after it, what its user's rights allow on the name. STATUS
    /// and WATCH without a name pass, and show only what the user may read.
    fn admit(&self, request: &Request) -> Admit {
        let Some(login) = &self.login else {
            return Admit::Yes;
        };
        let (right, name) = match request {
            Request::Auth { .. } | Request::Ping | Request::Help | Request::Quit => {
                return Admit::Yes
            }
            Request::Lock { name, .. }
            | Request::Unlock { name, .. }
            | Request::Renew { name, .. } => (Right::Lock, Some(name)),
            Request::Check { name, .. }
            | Request::StatusDetail { name }
            | Request::Status { name: Some(name) }
            | Request::Watch { name: Some(name) } => (Right::Read, Some(name)),
            Request::Status { name: None } | Request::Watch { name: None } => (Right::Read, None),
        };
        let Some((_, user)) = &login.user else {
            return Admit::Refuse(ProtoError::no_auth());
        };
        if let Some(e) = self.removed() {
            return Admit::Close(e);
        }
        match name {
            Some(name) if !self.may(right, name) => {
                Admit::Refuse(ProtoError::denied(user, right.as_str(), name))
            }
            _ => Admit::Yes,
        }
    }

    /// AUTH. A wrong one is answered after [`crate::AUTH_FAILURE_DELAY`], and the
    /// [`crate::AUTH_FAILURES`]th closes the connection.
    async fn auth(&mut self, name: String, secret: Secret) -> io::Result<Flow> {
        let Some(login) = self.login.as_mut() else {
            self.refuse(ProtoError::auth_off()).await?;
            return Ok(Flow::Continue);
        };
        if let Some((_, current)) = &login.user {
            let e = ProtoError::already_authenticated(current);
            self.refuse(e).await?;
            return Ok(Flow::Continue);
        }
        let found = login.users.borrow().authenticate(&name, secret.expose());
        if let Some(user) = found {
            tracing::info!(conn = self.number, user = %name, "authenticated");
            self.conn.queue(Reply::Authenticated(&name)).await?;
            login.user = Some((user, name));
            return Ok(Flow::Continue);
        }
        login.failures += 1;
        let failures = login.failures;
        let closing = failures >= crate::AUTH_FAILURES;
        tracing::warn!(conn = self.number, user = %name, failures, "authentication failed");
        self.conn.flush().await?;
        tokio::select! {
            _ = tokio::time::sleep(crate::AUTH_FAILURE_DELAY) => {}
            _ = self.shutdown.cancelled() => {
                self.refuse(ProtoError::shutdown()).await?;
                return Ok(Flow::Close);
            }
        }
        self.refuse(ProtoError::bad_auth(closing)).await?;
        Ok(if closing { Flow::Close } else { Flow::Continue })
    }

    async fn reply(&mut self, name: &str, result: Result<Reply<'_>, TableError>) -> io::Result<()> {
        match result {
            Ok(reply) => self.conn.queue(reply).await,
            Err(e) => self.refuse(ProtoError::table(name, &e)).await,
        }
    }

    async fn lock(&mut self, req: LockRequest, tie: Tie) -> io::Result<Flow> {
        let (name, wait) = (req.name.clone(), req.wait);
        match self.shared.lock(req) {
            Err(e) => {
                self.refuse(ProtoError::table(&name, &e)).await?;
                Ok(Flow::Continue)
            }
            Ok(LockStart::Granted { token }) => self.granted(name, tie, token, false).await,
            Ok(LockStart::Waiting { waiter, rx }) => {
                let pending = Pending {
                    shared: Arc::clone(&self.shared),
                    name,
                    waiter,
                    rx: Some(rx),
                };
                self.wait_for_grant(pending, tie, wait).await
            }
        }
    }

    /// Waits until the changes made so far are on disk (at once without a data directory).
    /// Before an `OK` that reports a change; false (after an `ERR SHUTDOWN` reply) if they
    /// never will be, because the store failed and the server is stopping.
    async fn durable(&mut self) -> io::Result<bool> {
        let Some(wait) = self.shared.durable() else {
            return Ok(true);
        };
        if wait.await.is_ok() {
            return Ok(true);
        }
        self.refuse(ProtoError::not_durable()).await?;
        Ok(false)
    }

    /// Remembers a session lease bound to this connection, to end it when the connection
    /// closes.
    fn track_session_lease(&mut self, name: &str, token: Token) {
        if self.leases.len() >= SESSION_LEASES_PRUNE_AT {
            self.shared.retain_live(&mut self.leases);
        }
        self.leases.insert(token, name.to_owned());
    }

    /// Sends a grant. `probe`: the client had closed its sending side while it waited, so
    /// it may be gone; see [`Session::confirm_delivery`].
    async fn granted(
        &mut self,
        name: String,
        tie: Tie,
        token: Token,
        probe: bool,
    ) -> io::Result<Flow> {
        if tie.session().is_some() {
            self.track_session_lease(&name, token);
        }
        if !self.durable().await? {
            return Ok(Flow::Close);
        }
        if let Err(e) = self.conn.send(Reply::Token(token)).await {
            // The client can't have learned the token: give the lock to the next in line.
            self.shared.revoke(&name, token);
            return Err(e);
        }
        if probe && !self.limits.half_close_probe.is_zero() {
            self.confirm_delivery(&name, token).await;
        }
        Ok(Flow::Continue)
    }

    /// A grant whose client left the queue (closed a tied wait, or reset) in the instant it
    /// was made: it was never delivered, so it is taken back and the next waiter granted.
    fn pending_grant_gone(&mut self, name: &str, token: Token) {
        if self.shared.revoke(name, token) {
            tracing::info!(
                name,
                token,
                conn = self.number,
                "grant undelivered: the waiter had left; taken back"
            );
        }
    }

    /// Watches a grant just written to a client that had half-closed while it waited.
    ///
    /// TCP can't tell a client that half-closed on purpose and still reads
    /// (`printf 'LOCK x me' | nc -N`) from one whose process was killed while it waited: both
    /// only sent FIN. They differ once data arrives: a socket nobody holds any more answers
    /// with a reset. So the grant is written, and for `half_close_probe` the socket is checked
    /// for that reset; on one, the grant is taken back (event `dropped`) and the next waiter
    /// is granted, instead of the lock sitting with nobody for a whole ttl. Silence means the
    /// client is alive and keeps its lease. Polling, rather than awaiting readiness, because
    /// the read side has already ended and is always ready; this runs only for the rare grant
    /// to a half-closed waiter, so a few cheap syscalls per grant are nothing.
    async fn confirm_delivery(&mut self, name: &str, token: Token) {
        let until = Instant::now() + self.limits.half_close_probe;
        loop {
            if self.conn.peer_reset() {
                if self.shared.revoke(name, token) {
                    tracing::info!(
                        name,
                        token,
                        conn = self.number,
                        "grant unread: the waiter was gone; taken back"
                    );
                }
                return;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(left.min(PROBE_POLL)) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Waits for a queued LOCK's turn while watching the connection and the server.
    async fn wait_for_grant(
        &mut self,
        mut pending: Pending,
        tie: Tie,
        wait: Option<Duration>,
    ) -> io::Result<Flow> {
        self.conn.flush().await?;
        loop {
            // Keep reading to notice a close, but don't buffer without bound.
            let can_read = !self.conn.is_eof() && self.conn.buffered() <= 2 * self.limits.max_line;
            tokio::select! {
                result = pending.recv() => {
                    let name = std::mem::take(&mut pending.name);
                    return match result {
                        WaitResult::Granted { token, .. } => {
                            // The grant and the client's close may have come in the same
                            // instant, and this select! may have picked the grant first:
                            // look at what has arrived before deciding who holds the lock.
                            let arrived = self.conn.fill_arrived();
                            if arrived.is_err() || (self.conn.is_eof() && tie.wait_ends_on_close()) {
                                self.pending_grant_gone(&name, token);
                                arrived?;
                                return Ok(Flow::Close);
                            }
                            let probe = self.conn.is_eof();
                            self.granted(name, tie, token, probe).await
                        }
                        WaitResult::Ended(WaitEnd::TimedOut) => {
                            let waited = wait.unwrap_or_default();
                            self.refuse(ProtoError::wait_over(&name, waited)).await?;
                            Ok(Flow::Continue)
                        }
                        WaitResult::Ended(WaitEnd::Replaced) => {
                            self.refuse(ProtoError::replaced(&name)).await?;
                            Ok(Flow::Continue)
                        }
                    };
                }
                read = self.conn.fill(), if can_read => {
                    read?;
                    if self.conn.is_eof() && tie.wait_ends_on_close() {
                        tracing::debug!(conn = self.number, "waiter closed; leaving the queue");
                        return Ok(Flow::Close);
                    }
                }
                _ = self.shutdown.cancelled() => {
                    self.refuse(ProtoError::shutdown()).await?;
                    return Ok(Flow::Close);
                }
                () = reloaded(&mut self.login) => {
                    // Reloaded users: a waiter whose user is gone, or lost the right, leaves.
                    if let Some(e) = self.removed() {
                        self.refuse(e).await?;
                        return Ok(Flow::Close);
                    }
                    if !self.may(Right::Lock, &pending.name) {
                        let user = self.login.as_ref().and_then(|l| l.user.as_ref());
                        let user = user.map_or("", |(_, name)| name.as_str());
                        let e = ProtoError::denied(user, Right::Lock.as_str(), &pending.name);
                        self.refuse(e).await?;
                        return Ok(Flow::Continue);
                    }
                }
            }
        }
    }

    /// STATUS of every lock: streamed from a snapshot shared with other STATUS requests, a
    /// [`WRITE_CHUNK`] at a time, so a client that does not read holds a reference to the
    /// snapshot and a bounded buffer, never a copy of its own.
    async fn status_all(&mut self) -> io::Result<Flow> {
        let shared = Arc::clone(&self.shared);
        let view = tokio::select! {
            view = shared.status_snapshot() => view,
            _ = self.shutdown.cancelled() => {
                self.refuse(ProtoError::shutdown()).await?;
                return Ok(Flow::Close);
            }
        };
        // With an auth file, only the names the user may read: filtered as they are sent, so
        // the snapshot stays shared.
        let mut shown = 0;
        for status in view.iter() {
            if self.may(Right::Read, &status.name) {
                self.conn.queue(Reply::Info(&status)).await?;
                shown += 1;
            }
        }
        self.conn.queue(Reply::Count(shown)).await?;
        Ok(Flow::Continue)
    }

    /// Streams events until the client or the server ends it.
    ///
    /// Events are taken from the broadcast as they come, whether or not the client reads, so
    /// falling behind is noticed while a write is stuck: more than `--watch-buffer` events not
    /// yet handed to the connection is `ERR LAGGED` and the end of the connection. Meanwhile
    /// at most a [`WRITE_CHUNK`] is formatted ahead, and the write timeout applies.
    async fn watch(&mut self, name: Option<String>) -> io::Result<Flow> {
        let mut events = self.shared.subscribe();
        let _counted = self.shared.metrics().watcher();
        self.conn.push(Reply::Watching(name.as_deref()));
        let mut behind: VecDeque<Arc<Published>> = VecDeque::new();
        loop {
            while self.conn.unsent() < WRITE_CHUNK {
                let Some(p) = behind.pop_front() else { break };
                self.conn.push(Reply::Event(&p.event, p.unix_ms));
            }
            let lag = tokio::select! {
                event = events.recv() => match event {
                    Ok(p) => {
                        // Rights as they are now: a reload may have changed them.
                        if name.as_deref().is_none_or(|n| n == &*p.event.name)
                            && self.may(Right::Read, &p.event.name)
                        {
                            behind.push_back(p);
                        }
                        (behind.len() > self.limits.watch_buffer).then_some(behind.len() as u64)
                    }
                    Err(RecvError::Lagged(missed)) => Some(behind.len() as u64 + missed),
                    Err(RecvError::Closed) => return Ok(Flow::Close),
                },
                pumped = self.conn.pump(true) => {
                    pumped?;
                    // A watch connection only streams; QUIT (or a bad line) ends it.
                    while let Some(frame) = self.conn.next_frame() {
                        match frame {
                            Frame::Eof => break,
                            Frame::Line(line) if line.trim().eq_ignore_ascii_case("quit") => {
                                self.conn.push(Reply::Bye);
                                return Ok(Flow::Close);
                            }
                            Frame::TooLong => {
                                self.push_refusal(ProtoError::too_long(self.limits.max_line));
                                return Ok(Flow::Close);
                            }
                            Frame::Line(_) | Frame::BadUtf8 => {}
                        }
                    }
                    None
                }
                _ = self.shutdown.cancelled() => {
                    self.push_refusal(ProtoError::shutdown());
                    return Ok(Flow::Close);
                }
                () = reloaded(&mut self.login) => {
                    if let Some(e) = self.removed() {
                        self.push_refusal(e);
                        return Ok(Flow::Close);
                    }
                    None
                }
            };
            if let Some(behind) = lag {
                self.shared.metrics().watcher_lagged();
                self.push_refusal(ProtoError::lagged(behind));
                return Ok(Flow::Close);
            }
        }
    }

    /// Ends the session leases this connection still holds: its client is gone. Not when
    /// the server itself is shutting down: the session leases stay (with --data-dir they
    /// come back as plain leases after the restart, so a holder such as `lockctl run` renews
    /// and carries on).
    fn release_sessions(&mut self) {
        if !self.shutdown.is_cancelled() {
            self.shared.drop_sessions(self.number, &self.leases);
        }
        self.leases.clear();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release_sessions();
    }
}

/// Resolves when the users in force are replaced (a reload); never without an auth file, or
/// before this connection has a user (a reload changes nothing for it until then).
async fn reloaded(login: &mut Option<Login>) {
    match login {
        Some(login) if login.user.is_some() => {
            if login.users.changed().await.is_err() {
                // The gate is gone: the server is stopping.
                std::future::pending::<()>().await;
            }
        }
        _ => std::future::pending().await,
    }
}

/// A queued LOCK. Dropping it (the connection went, the task was cancelled) takes the waiter
/// out of the queue, or releases the grant its client never saw.
struct Pending {
    shared: Arc<Shared>,
    name: String,
    waiter: WaiterId,
    rx: Option<oneshot::Receiver<WaitResult>>,
}

impl Pending {
    /// Cancel-safe: the receiver stays in place until a value arrives.
    async fn recv(&mut self) -> WaitResult {
        let result = match self.rx.as_mut() {
            Some(rx) => rx.await,
            None => std::future::pending().await,
        };
        self.rx = None;
        // The sender is only dropped unused when the server is going away.
        result.unwrap_or(WaitResult::Ended(WaitEnd::TimedOut))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            self.shared.abandon_wait(&self.name, self.waiter, rx);
        }
    }
}
