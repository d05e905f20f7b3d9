//! LOCK on a connection: the grant at once or the wait for it, and a grant's delivery.

use std::io;
use std::time::{Duration, Instant};

use crate::auth::Right;
use crate::backend::{BackendError, HandOver, Locked, Wait, WaitResult};
use crate::locks::{LockRequest, TableError, Token, WaitEnd};
use crate::proto::{ErrorCode, ProtoError, Reply, Subject, Tie};

use super::{reloaded, Flow, Handler};

/// How often [`Handler::confirm_delivery`] looks at the socket while it watches.
const PROBE_POLL: Duration = Duration::from_millis(10);

impl Handler {
    pub(super) async fn lock(&mut self, req: LockRequest, tie: Tie) -> io::Result<Flow> {
        let (name, wait) = (req.name.clone(), req.wait);
        // The id only names the client in the log line of a refusal (at debug): no copy of it
        // on the hot path unless that line can be written.
        let id = if tracing::enabled!(tracing::Level::DEBUG) {
            req.id.clone()
        } else {
            String::new()
        };
        match self.backend.lock(req).await {
            Err(e) => {
                let about = Subject {
                    name: &name,
                    id: &id,
                    token: None,
                };
                let refusal = match &e {
                    // Boxed: the rare path adds nothing to every connection's task.
                    BackendError::Table(TableError::WouldBlock { .. })
                        if self.may(Right::Read, &name) =>
                    {
                        let plain = e.refusal(&name);
                        Box::pin(self.blocked_by(&name, None, plain)).await
                    }
                    _ => self.lock_refusal(&e, &name),
                };
                self.refuse_about(refusal, about).await?;
                Ok(flow_after(&e))
            }
            Ok(Locked::Granted { token, handover }) => {
                self.granted(name, token, handover, false).await
            }
            Ok(Locked::Waiting(pending)) => {
                let mut waiting = Waiting {
                    pending,
                    id,
                    tie,
                    wait,
                };
                self.wait_for_grant(&mut waiting).await
            }
        }
    }

    /// The refusal of a LOCK of `name`. Who stands in the way (the holder's id) is for a
    /// user who may read `name` only: `lock` alone lets a user take the lock, not learn who
    /// has it (STATUS would not tell it either). Everyone else gets the same code without it.
    fn lock_refusal(&self, e: &BackendError, name: &str) -> ProtoError {
        match e {
            BackendError::Table(TableError::WouldBlock { .. }) if !self.may(Right::Read, name) => {
                ProtoError::new(ErrorCode::Timeout, format!("{name}: held"))
            }
            _ => e.refusal(name),
        }
    }

    /// The refusal of a LOCK of `name` that found it held (`waited`: after its `wait=` ran
    /// out; `None`: `wait=0`), for a user who may read `name`: who holds it, for how long,
    /// with what note and how many wait, as STATUS would tell that user. The holder is looked
    /// up as the refusal is sent, so it is a snapshot; a name that became free (or that only
    /// waiters hold up) meanwhile gets `plain`, the refusal without those details.
    async fn blocked_by(
        &self,
        name: &str,
        waited: Option<Duration>,
        plain: ProtoError,
    ) -> ProtoError {
        let Ok(Some(detail)) = self.backend.status_detail(name, 0).await else {
            return plain;
        };
        let user = detail.holders.first().and_then(|h| h.origin.user());
        ProtoError::blocked_by(name, waited, &detail.status, user)
    }

    /// Sends a grant. `probe`: the client had closed its sending side while it waited, so
    /// it may be gone; see [`Handler::confirm_delivery`].
    pub(super) async fn granted(
        &mut self,
        name: String,
        token: Token,
        handover: HandOver,
        probe: bool,
    ) -> io::Result<Flow> {
        // The two rare paths are boxed, so that they add nothing to every waiting
        // connection's task (which is as large as its largest await point).
        if let Err(e) = self.conn.send(Reply::Token(token)).await {
            // The client can't have learned the token: give the lock to the next in line.
            Box::pin(self.backend.revoke(&name, token, handover)).await;
            return Err(e);
        }
        if probe && !self.limits.half_close_probe.is_zero() {
            Box::pin(self.confirm_delivery(&name, token, handover)).await;
        }
        Ok(Flow::Continue)
    }

    /// A grant whose client left the queue (closed a tied wait, or reset) in the instant it
    /// was made: it was never delivered, so it is taken back and the next waiter granted.
    pub(super) async fn pending_grant_gone(
        &mut self,
        name: &str,
        token: Token,
        handover: HandOver,
    ) {
        if self.backend.revoke(name, token, handover).await {
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
    pub(super) async fn confirm_delivery(&mut self, name: &str, token: Token, handover: HandOver) {
        let until = Instant::now() + self.limits.half_close_probe;
        loop {
            if self.conn.peer_reset() {
                if self.backend.revoke(name, token, handover).await {
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
    pub(super) async fn wait_for_grant(&mut self, waiting: &mut Waiting) -> io::Result<Flow> {
        let Waiting {
            pending,
            id,
            tie,
            wait,
        } = waiting;
        let (id, tie, wait) = (id.as_str(), *tie, *wait);
        self.conn.flush().await?;
        self.conn.release_input();
        loop {
            // Keep reading to notice a close, but don't buffer without bound.
            let can_read = !self.conn.is_eof() && self.conn.buffered() <= 2 * self.limits.max_line;
            tokio::select! {
                result = pending.result() => {
                    let name = pending.name().to_owned();
                    return match result {
                        WaitResult::Granted { token, handover, .. } => {
                            // The grant and the client's close may have come in the same
                            // instant, and this select! may have picked the grant first:
                            // look at what has arrived before deciding who holds the lock.
                            let arrived = self.conn.fill_arrived();
                            if arrived.is_err() || (self.conn.is_eof() && tie.wait_ends_on_close()) {
                                self.pending_grant_gone(&name, token, handover).await;
                                arrived?;
                                return Ok(Flow::Close);
                            }
                            let probe = self.conn.is_eof();
                            self.granted(name, token, handover, probe).await
                        }
                        WaitResult::Ended(WaitEnd::TimedOut) => {
                            let waited = wait.unwrap_or_default();
                            let about = Subject { name: &name, id, token: None };
                            let mut e = ProtoError::wait_over(&name, waited);
                            if self.may(Right::Read, &name) {
                                e = Box::pin(self.blocked_by(&name, Some(waited), e)).await;
                            }
                            self.refuse_about(e, about).await?;
                            Ok(Flow::Continue)
                        }
                        WaitResult::Failed(e) => {
                            let about = Subject { name: &name, id, token: None };
                            self.refuse_about(self.lock_refusal(&e, &name), about).await?;
                            Ok(flow_after(&e))
                        }
                        WaitResult::Ended(WaitEnd::Replaced) => {
                            let about = Subject { name: &name, id, token: None };
                            self.refuse_about(ProtoError::replaced(&name), about).await?;
                            Ok(Flow::Continue)
                        }
                        WaitResult::Ended(WaitEnd::Superseded { by }) => {
                            let about = Subject { name: &name, id, token: None };
                            self.refuse_about(ProtoError::superseded(&name, &by), about).await?;
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
                    if !self.may(Right::Lock, pending.name()) {
                        let user = self.login.as_ref().and_then(|l| l.user.as_ref());
                        let user = user.map_or("", |(_, name)| name.as_str());
                        let e = ProtoError::denied(user, Right::Lock.as_str(), pending.name());
                        self.refuse(e).await?;
                        return Ok(Flow::Continue);
                    }
                }
            }
        }
    }
}

/// A queued LOCK, for [`Handler::wait_for_grant`]: by reference, in the caller's frame,
/// because an async fn keeps two copies of what it takes by value for as long as it runs, and
/// a waiting LOCK runs for as long as it waits, in every waiting connection's task.
pub(super) struct Waiting {
    pending: Wait,
    /// Names the client in the log line if the wait ends in a refusal.
    id: String,
    tie: Tie,
    wait: Option<Duration>,
}

/// Whether to keep serving after answering refusal `e`: a change that can never be made
/// durable closes the connection (the server is stopping).
pub(super) fn flow_after(e: &BackendError) -> Flow {
    if e.ends_connection() {
        Flow::Close
    } else {
        Flow::Continue
    }
}
