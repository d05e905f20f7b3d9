//! One client connection: read a line, parse it, run it against the backend, reply.
//!
//! Requests on a connection are answered in order, one at a time; a waiting LOCK holds the
//! connection until it is answered (later lines stay buffered, up to a bound). While it waits,
//! the handler keeps reading so it notices the client going away. End of input is a
//! half-close, not a departure: the client still gets every reply it asked for, a pending LOCK
//! included, unless that LOCK is tied to the connection (`session` or `detach`). A plain LOCK
//! granted after its client half-closed is watched for a short while: a dead client answers
//! the grant with a reset, and the grant is taken back (see `Handler::confirm_delivery`).
//!
//! Here: the connection's loop (framing, idle and unfinished-line timeouts, dispatch). In
//! [`lock`]: a LOCK's grant or wait and the delivery of a grant; in [`login`]: AUTH and
//! rights; in [`streams`]: the answers that stream (STATUS of every lock, WATCH).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::auth::Gate;
use crate::backend::{Backend, BackendError, PeerField};
use crate::busy_poll::BusyPoll;
use crate::connection::{Connection, Frame};
use crate::locks::{ConnId, LockRequest, Origin, TableError, Token};
use crate::metrics::TimeoutClose;
use crate::proto::{self, ErrorCode, ProtoError, Reply, Request, Subject};

mod lock;
mod login;
mod streams;

use login::{reloaded, Admit, LoginState};

/// Whether to keep reading requests.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// Per-connection limits, from the server's flags.
#[derive(Clone, Copy, Debug)]
pub struct HandlerLimits {
    /// Longest request line, in bytes.
    pub max_line: usize,
    /// Longest name or id, in bytes (at most [`proto::MAX_NAME_LEN`]).
    pub max_name: usize,
    /// Events a watcher may fall behind before it is disconnected.
    pub watch_buffer: usize,
    /// How long a grant to a client that half-closed while it waited is watched for a reset.
    pub half_close_probe: Duration,
    /// How long a connection with nothing going on may send no line; zero: no limit.
    pub idle_timeout: Duration,
    /// How long the start of a line may wait for its end; zero: no limit.
    pub line_timeout: Duration,
    /// Longest note a LOCK may carry, in bytes (`--max-note`).
    pub max_note: usize,
    /// Most names one LOCK may ask for (`--max-names`).
    pub max_names: usize,
}

/// One connection's state.
pub struct Handler {
    backend: Backend,
    conn: Connection,
    /// This connection's number, to which its session leases are bound (the backend knows
    /// which: [`Backend::closed`] ends them).
    number: ConnId,
    shutdown: CancellationToken,
    limits: HandlerLimits,
    /// With an auth file: who this connection is. `None` serves everyone as [`NO_USER`].
    login: Option<LoginState>,
    /// Since when the bytes of an unfinished line have been waiting for the rest of it.
    partial_since: Option<tokio::time::Instant>,
    /// The client's address, for the audit trail.
    peer: Option<SocketAddr>,
    /// Who this connection is (its user once authenticated, and `peer`): every holder and
    /// waiter it makes shares this one record, so the log can say who took a lease when the
    /// lease ends long after this connection did.
    origin: Origin,
    /// Told of every request, so that a worker keeps polling for the next (`--busy-poll`).
    busy: Option<Arc<BusyPoll>>,
}

/// What [`Handler::step`] made of a frame.
enum Step {
    /// The client is gone (end of input).
    Close,
    /// An admitted LOCK (boxed: see [`Handler::lock`]).
    Lock(Box<LockRequest>),
    /// Any other admitted request.
    Dispatch(Request),
    /// Refused (a frame or a request that does not parse): answer, then go on or close.
    Refuse(ProtoError, Flow),
    /// A request its user may not make: answer about it, then go on or close.
    RefuseAbout(Box<Request>, ProtoError, Flow),
}

/// What [`Handler::next_frame`] got.
enum Incoming {
    Frame(Frame),
    /// The server is shutting down.
    Shutdown,
    /// The connection outstayed `--idle-timeout` or `--line-timeout`: tell it and close.
    Expired(ProtoError, TimeoutClose),
    /// The auth file was reloaded: this connection's user may be gone.
    Reloaded,
}

impl Handler {
    /// A session for `conn`; with a `gate`, its client must AUTH before anything but PING,
    /// HELP and QUIT, and may only do what its user's rights allow.
    pub fn new(
        backend: Backend,
        conn: Connection,
        limits: HandlerLimits,
        shutdown: CancellationToken,
        gate: Option<&Gate>,
    ) -> Self {
        let number = backend.connection_id();
        let peer = conn.tcp().peer_addr().ok();
        let login = gate.map(|gate| {
            let cns = crate::tls::client_cns(conn.stream());
            LoginState::new(gate, cns, number, peer)
        });
        let user = login.as_ref().and_then(|l| l.user.as_ref());
        let mut origin = Origin::new(user.map(|(_, name)| name.as_str()), peer);
        if gate.is_none() {
            // Mutual TLS without users: the certificate's one common name says who took a
            // lease (STATUS detail's user=, the audit lines), though it grants nothing.
            if let Some([cn]) = crate::tls::client_cns(conn.stream()).as_deref() {
                tracing::info!(conn = number, cn = cn.as_str(), peer = %PeerField(peer), "client certificate");
                origin = Origin::new(Some(cn), peer);
            }
        }
        Handler {
            backend,
            conn,
            number,
            shutdown,
            limits,
            login,
            partial_since: None,
            peer,
            origin,
            busy: None,
        }
    }

    /// Tells `busy` of every request this connection makes (see [`crate::busy_poll`]).
    pub fn busy_poll(mut self, busy: Option<Arc<BusyPoll>>) -> Self {
        self.busy = busy;
        self
    }

    /// Serves the connection until the client leaves, asks to, or the server shuts down.
    ///
    /// When the server ends the connection itself (QUIT, an over-long line, a lagging
    /// watcher, shutdown), the close is orderly: every reply is sent, then a FIN, then what
    /// the client still sends is read and discarded for a moment, so the close does not turn
    /// into a reset that destroys replies the client has not read yet. A connection that
    /// failed (reset, or a client that stopped reading for the write timeout) is just dropped.
    ///
    /// By `&mut self`, not by value: a future that owns the handler keeps two copies of
    /// it for its whole life (its argument and the moved value), ~400 bytes per connection.
    pub async fn run(&mut self) {
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
            let frame = match self.next_frame().await? {
                Incoming::Frame(frame) => frame,
                Incoming::Shutdown => return Ok(()),
                Incoming::Expired(e, why) => {
                    // Told ERR LIMIT, but not a refusal: counted apart (`lockd_timeout_closes_total`).
                    self.backend.metrics().timeout_close(why);
                    tracing::debug!(conn = self.number, reason = %e.message, "closed");
                    return self.conn.queue(Reply::Error(&e)).await;
                }
                Incoming::Reloaded => {
                    if let Some(e) = self.removed() {
                        self.refuse(e).await?;
                        return Ok(());
                    }
                    continue;
                }
            };
            // What the frame asks is worked out by a plain function, and a LOCK is awaited
            // after this `match`, not inside it: every connection's task is as large as its
            // largest await point, a LOCK's wait is where a connection spends its life, and
            // a value a `match` arm awaits inside stays in the task for as long as it waits.
            let req = match self.step(frame) {
                Step::Lock(req) => req,
                Step::Close => return Ok(()),
                Step::Dispatch(request) => {
                    if self.dispatch(request).await? == Flow::Close {
                        return Ok(());
                    }
                    continue;
                }
                Step::Refuse(e, flow) => {
                    self.refuse(e).await?;
                    if flow == Flow::Close {
                        return Ok(());
                    }
                    continue;
                }
                Step::RefuseAbout(request, e, flow) => {
                    self.refuse_about(e, request.subject()).await?;
                    if flow == Flow::Close {
                        return Ok(());
                    }
                    continue;
                }
            };
            let flow = self.lock(req).await?;
            if flow == Flow::Close {
                return Ok(());
            }
        }
    }

    /// What to do with a frame: the request it parses to, once admitted, or the refusal.
    fn step(&self, frame: Frame) -> Step {
        let line = match frame {
            Frame::Eof => return Step::Close,
            Frame::TooLong => {
                return Step::Refuse(ProtoError::too_long(self.limits.max_line), Flow::Close)
            }
            Frame::BadUtf8 => return Step::Refuse(ProtoError::bad_utf8(), Flow::Continue),
            Frame::Line(line) => line,
        };
        let parsed = proto::parse(&line)
            .and_then(|r| r.check_name_len(self.limits.max_name).map(|()| r))
            .and_then(|r| r.check_note_len(self.limits.max_note).map(|()| r))
            .and_then(|r| r.check_names(self.limits.max_names).map(|()| r));
        let request = match parsed {
            Ok(request) => request,
            Err(e) => return Step::Refuse(e, Flow::Continue),
        };
        match self.admit(&request) {
            // LOCK is awaited in `serve` rather than inside `dispatch`: waiting for a lock
            // is what a connection does longest, and every level of futures it waits under
            // adds its frame to the connection's task for its whole life (about 900 bytes
            // for `dispatch`'s).
            Admit::Yes => match request {
                Request::Lock(req) => Step::Lock(self.sent_here(req)),
                request => Step::Dispatch(request),
            },
            Admit::Refuse(e) => Step::RefuseAbout(Box::new(request), e, Flow::Continue),
            Admit::Close(e) => Step::RefuseAbout(Box::new(request), e, Flow::Close),
        }
    }

    /// Reads the next frame, unless the server stops first or the connection outstays a
    /// timeout: `--line-timeout` while the bytes of an unfinished line wait for the rest
    /// (a client trickling a line must not keep a connection forever), `--idle-timeout` while
    /// no line comes at all and the connection holds no session lease (waiting and watching
    /// happen elsewhere: they never get here). Idle time counts from the call, that is from
    /// the end of the previous request, however long that took.
    async fn next_frame(&mut self) -> io::Result<Incoming> {
        let mut idle_since = tokio::time::Instant::now();
        loop {
            if let Some(frame) = self.conn.next_frame() {
                self.partial_since = None;
                if let Some(busy) = &self.busy {
                    busy.request();
                }
                return Ok(Incoming::Frame(frame));
            }
            if self.conn.buffered() > 0 {
                self.partial_since
                    .get_or_insert_with(tokio::time::Instant::now);
            }
            let line_due = self
                .partial_since
                .filter(|_| !self.limits.line_timeout.is_zero())
                .map(|since| since + self.limits.line_timeout);
            let idle_due = (!self.limits.idle_timeout.is_zero())
                .then(|| idle_since + self.limits.idle_timeout);
            let due = line_due.into_iter().chain(idle_due).min();
            tokio::select! {
                read = self.conn.fill() => read?,
                _ = self.shutdown.cancelled() => return Ok(Incoming::Shutdown),
                () = reloaded(&mut self.login) => return Ok(Incoming::Reloaded),
                _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)),
                    if due.is_some() => {
                    // The rest may have come in the same instant.
                    self.conn.fill_arrived()?;
                    if self.conn.has_frame() {
                        continue;
                    }
                    let now = tokio::time::Instant::now();
                    if line_due.is_some_and(|at| at <= now) {
                        let e = ProtoError::line_not_finished(self.limits.line_timeout);
                        return Ok(Incoming::Expired(e, TimeoutClose::Line));
                    }
                    if self.backend.holds_sessions(self.number) {
                        // Its client must keep it open; look again an idle period later.
                        idle_since = now;
                        continue;
                    }
                    let e = ProtoError::idle(self.limits.idle_timeout);
                    return Ok(Incoming::Expired(e, TimeoutClose::Idle));
                }
            }
        }
    }

    /// Answers `ERR ...`: every refusal goes through here, to be counted.
    async fn refuse(&mut self, e: ProtoError) -> io::Result<()> {
        self.refuse_about(e, Subject::default()).await
    }

    /// [`Handler::refuse`] for a request about a lock: the log line names it.
    async fn refuse_about(&mut self, e: ProtoError, about: Subject<'_>) -> io::Result<()> {
        self.count_refusal(&e, about);
        self.conn.queue(Reply::Error(&e)).await
    }

    /// [`Handler::refuse`] for loops that write from their output buffer themselves.
    fn push_refusal(&mut self, e: ProtoError) {
        self.count_refusal(&e, Subject::default());
        self.conn.push(Reply::Error(&e));
    }

    /// Every refusal is counted and logged (at debug: refusals are the clients' business,
    /// and a flood of them must not flood the log at the default level). A denial (rights,
    /// another user's lease) and a request before AUTH are the audit trail's business too:
    /// those say who and from where, at info.
    fn count_refusal(&self, e: &ProtoError, about: Subject<'_>) {
        self.backend.metrics().refused(e.code);
        let Subject { name, id, token } = about;
        let token = token.unwrap_or(0);
        let conn = self.number;
        let peer = PeerField(self.peer);
        let user = self.origin.user().unwrap_or("-");
        match e.code {
            // About a lock: a right the user lacks, another user's lease. (A wrong AUTH is
            // DENIED too, and logs its own line.)
            ErrorCode::Denied if !name.is_empty() => {
                tracing::info!(conn, name, id, token, user, %peer, reason = %e.message, "denied")
            }
            ErrorCode::NoAuth => tracing::info!(conn, %peer, "refused before AUTH"),
            _ => {
                tracing::debug!(conn, code = %e.code, name, id, token, reason = %e.message, "refused")
            }
        }
    }

    /// A LOCK as the parser read it, from this connection: its number, user and origin.
    fn sent_here(&self, mut req: Box<LockRequest>) -> Box<LockRequest> {
        req.conn = self.number;
        req.user = self.user();
        req.origin = self.origin.clone();
        req
    }

    /// Carries out an admitted request (LOCK is `serve`'s own: see there).
    async fn dispatch(&mut self, request: Request) -> io::Result<Flow> {
        let backend = self.backend.clone();
        match request {
            // Not sent here by `serve`; boxed so that it adds nothing to this frame.
            Request::Lock(req) => {
                let req = self.sent_here(req);
                return Box::pin(self.lock(req)).await;
            }
            Request::Unlock { name, token } => {
                let result = backend.unlock(&name, token, self.user()).await;
                return self.reply(&name, token, result.map(|()| Reply::Done)).await;
            }
            Request::Renew(req) => {
                let result = backend.renew(&req, self.number, self.user()).await;
                let result = result.map(|r| Reply::Lease(r.left));
                return self.reply(&req.name, req.token, result).await;
            }
            Request::Check { name, token } => {
                let result = backend.check(&name, token).await.map(Reply::Lease);
                return self.reply(&name, token, result).await;
            }
            Request::Break { name, token, force } => {
                let result = backend.break_lock(&name, token, &self.origin, force).await;
                if token.is_none()
                    && matches!(result, Err(BackendError::Table(TableError::NotHeld)))
                {
                    let about = Subject {
                        name: &name,
                        id: "",
                        token: None,
                    };
                    let e = ProtoError::nothing_to_break(&name);
                    self.refuse_about(e, about).await?;
                    return Ok(Flow::Continue);
                }
                let result = result.map(Reply::Broken);
                return self.reply(&name, token.unwrap_or(0), result).await;
            }
            Request::Ping => self.conn.queue(Reply::Pong).await?,
            Request::Help => self.conn.queue(Reply::Help).await?,
            Request::Quit => {
                self.conn.queue(Reply::Bye).await?;
                return Ok(Flow::Close);
            }
            // Boxed, off this frame: a connection's task is as large as its largest await
            // point, so these less frequent requests would size every connection's task.
            other => return Box::pin(self.dispatch_reads(other)).await,
        }
        Ok(Flow::Continue)
    }

    /// STATUS in its forms, WATCH and AUTH (see `dispatch`).
    async fn dispatch_reads(&mut self, request: Request) -> io::Result<Flow> {
        let backend = self.backend.clone();
        match request {
            Request::Status { name }
                if name
                    .as_deref()
                    .is_none_or(|n| proto::prefix_of(n).is_some()) =>
            {
                return self.status_all(name).await
            }
            Request::Status { name: Some(name) } => match backend.status(&name).await {
                Ok(status) => {
                    let confirmed = backend.view_age();
                    self.conn
                        .queue(Reply::status(&name, status.as_ref(), confirmed))
                        .await?
                }
                Err(e) => self.refuse(e.refusal(&name)).await?,
            },
            Request::StatusDetail { name } => {
                let detail = match backend.status_detail(&name, proto::DETAIL_WAITERS).await {
                    Ok(detail) => detail,
                    Err(e) => {
                        self.refuse(e.refusal(&name)).await?;
                        return Ok(Flow::Continue);
                    }
                };
                if let Some(detail) = &detail {
                    for holder in &detail.holders {
                        self.conn.queue(Reply::Holder(holder)).await?;
                    }
                    for (i, waiter) in detail.queue.iter().enumerate() {
                        self.conn.queue(Reply::Waiter(&name, i + 1, waiter)).await?;
                    }
                }
                let status = detail.as_ref().map(|d| &d.status);
                let confirmed = backend.view_age();
                self.conn
                    .queue(Reply::status(&name, status, confirmed))
                    .await?;
            }
            Request::Watch { name } => return self.watch(name).await,
            Request::Auth { user, secret } => return self.auth(user, secret).await,
            // `dispatch`'s own.
            request => return Box::pin(self.dispatch(request)).await,
        }
        Ok(Flow::Continue)
    }

    /// The reply to UNLOCK, RENEW or CHECK of `token` on `name`.
    async fn reply(
        &mut self,
        name: &str,
        token: Token,
        result: Result<Reply<'_>, BackendError>,
    ) -> io::Result<Flow> {
        match result {
            Ok(reply) => self.conn.queue(reply).await?,
            Err(e) => {
                let about = Subject {
                    name,
                    id: "",
                    token: Some(token),
                };
                self.refuse_about(e.refusal(name), about).await?;
                return Ok(lock::flow_after(&e));
            }
        }
        Ok(Flow::Continue)
    }

    /// Ends the session leases still bound to this connection: its client is gone. Not when
    /// the server itself is shutting down: the session leases stay (with --data-dir they
    /// come back as plain leases after the restart, so a holder such as `lockctl run` renews
    /// and carries on).
    fn release_sessions(&mut self) {
        if !self.shutdown.is_cancelled() {
            self.backend.closed(self.number);
        }
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        self.release_sessions();
    }
}
