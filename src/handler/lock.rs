//! LOCK on a connection: the grant at once or the wait for it, and a grant's delivery.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::Right;
use crate::backend::{BackendError, HandOver, Locked, Wait, WaitResult};
use crate::locks::{LockRequest, TableError, Token, WaitEnd};
use crate::proto::{ErrorCode, ProtoError, Reply, Subject, Tie};

use super::{reloaded, Flow, Handler};

/// How often [`Handler::confirm_delivery`] looks at the socket while it watches.
const PROBE_POLL: Duration = Duration::from_millis(10);

impl Handler {
    /// LOCK: granted at once, refused, or queued and waited for.
    ///
    /// The request comes boxed, and the wait is awaited after the `match` that finds it, not
    /// inside it: a waiting connection's task is as large as this frame's largest await
    /// point, and an argument taken by value, or a scrutinee a `match` arm awaits inside,
    /// stays in it for the whole wait (together about 550 bytes of every waiting
    /// connection's task in a release build). One small allocation per LOCK is the price.
    pub(super) async fn lock(&mut self, req: Box<LockRequest>) -> io::Result<Flow> {
        let (name, wait, tie) = (req.name.clone(), req.wait, req.tie);
        let others = SetNames::of(&req.and);
        // The id only names the client in the log line of a refusal (at debug): no copy of it
        // on the hot path unless that line can be written.
        let id = if tracing::enabled!(tracing::Level::DEBUG) {
            req.id.clone()
        } else {
            String::new()
        };
        let pending = match self.backend.lock(*req).await {
            Err(e) => {
                let about = Subject {
                    name: &name,
                    id: &id,
                    token: None,
                };
                let refusal = match &e {
                    // Boxed: the rare path adds nothing to every connection's task.
                    BackendError::Table(TableError::WouldBlock { .. }) => {
                        let plain = self.lock_refusal(&e, &name);
                        Box::pin(self.blocked_by(&name, &others, None, plain)).await
                    }
                    _ => self.lock_refusal(&e, &name),
                };
                self.refuse_about(refusal, about).await?;
                return Ok(flow_after(&e));
            }
            Ok(Locked::Granted { token, handover }) => {
                let names = others.count();
                return self.granted(name, (token, names), handover, false).await;
            }
            Ok(Locked::Waiting(pending)) => pending,
        };
        let mut waiting = Waiting {
            pending,
            id,
            tie,
            wait,
            others,
        };
        self.wait_for_grant(&mut waiting).await
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

    /// The refusal of a LOCK of `name` (and of a set's `others`) that found it held
    /// (`waited`: after its `wait=` ran out; `None`: `wait=0`), about the first of its names
    /// that is held, for a user who may read that name: who holds it, for how long, with
    /// what note and how many wait, as STATUS would tell that user. The holder is looked up
    /// as the refusal is sent, so it is a snapshot; if no name is held any more (or only
    /// waiters hold the set up), `plain`, the refusal without those details. A user who may
    /// not read the name that blocks hears only that it is held.
    async fn blocked_by(
        &self,
        name: &str,
        others: &SetNames,
        waited: Option<Duration>,
        plain: ProtoError,
    ) -> ProtoError {
        for name in std::iter::once(name).chain(others.iter()) {
            let Ok(Some(detail)) = self.backend.status_detail(name, 0).await else {
                continue;
            };
            if !self.may(Right::Read, name) {
                return match waited {
                    Some(waited) => ProtoError::wait_over(name, waited),
                    None => ProtoError::new(ErrorCode::Timeout, format!("{name}: held")),
                };
            }
            let user = detail.holders.first().and_then(|h| h.origin.user());
            return ProtoError::blocked_by(name, waited, &detail.status, user);
        }
        plain
    }

    /// Sends a grant of `token` on `names` names (a set's token is one per name: `OK t t`).
    /// `probe`: the client had closed its sending side while it waited, so it may be gone;
    /// see [`Handler::confirm_delivery`].
    pub(super) async fn granted(
        &mut self,
        name: Arc<str>,
        (token, names): (Token, u32),
        handover: HandOver,
        probe: bool,
    ) -> io::Result<Flow> {
        // The rare paths are boxed, so that they add nothing to every waiting connection's
        // task (which is as large as its largest await point).
        let sent = if names <= 1 {
            self.conn.send(Reply::Token(token)).await
        } else {
            Box::pin(self.send_tokens(token, names)).await
        };
        if let Err(e) = sent {
            // The client can't have learned the token: give the lock to the next in line.
            Box::pin(self.backend.revoke(&name, token, handover)).await;
            return Err(e);
        }
        if probe && !self.limits.half_close_probe.is_zero() {
            Box::pin(self.confirm_delivery(&name, token, handover)).await;
        }
        Ok(Flow::Continue)
    }

    /// `OK <token> <token> ...`: a set's grant, its token once per name, in the request's
    /// order (one lease: the same token on every name).
    async fn send_tokens(&mut self, token: Token, names: u32) -> io::Result<()> {
        let tokens = vec![token; names as usize];
        self.conn.send(Reply::Tokens(&tokens)).await
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
            others,
        } = waiting;
        let (id, tie, wait) = (id.as_str(), *tie, *wait);
        self.conn.flush().await?;
        self.conn.release_input();
        loop {
            // Keep reading to notice a close, but don't buffer without bound.
            let can_read = !self.conn.is_eof() && self.conn.buffered() <= 2 * self.limits.max_line;
            tokio::select! {
                result = pending.result() => {
                    let name = Arc::clone(pending.name());
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
                            self.granted(name, (token, others.count()), handover, probe).await
                        }
                        WaitResult::Ended(WaitEnd::TimedOut) => {
                            let waited = wait.unwrap_or_default();
                            let about = Subject { name: &name, id, token: None };
                            let mut e = ProtoError::wait_over(&name, waited);
                            e = Box::pin(self.blocked_by(&name, others, Some(waited), e)).await;
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
                    // A set waits on every name: the right to lock any one of them is needed.
                    let names = std::iter::once(&**pending.name()).chain(others.iter());
                    let lost = names.into_iter().find(|n| !self.may(Right::Lock, n));
                    if let Some(lost) = lost {
                        let user = self.login.as_ref().and_then(|l| l.user.as_ref());
                        let user = user.map_or("", |(_, name)| name.as_str());
                        let e = ProtoError::denied(user, Right::Lock.as_str(), lost);
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
    /// A set's further names (for the reload check, the refusal and the reply's count).
    others: SetNames,
}

/// A LOCK's further names (`and=`), kept by the handler while the LOCK runs: a thin pointer,
/// null for a single name (most LOCKs), so a waiting connection's task grows by 8 bytes and
/// a single-name LOCK allocates nothing.
#[allow(clippy::redundant_allocation)]
pub(super) struct SetNames(Option<Box<Box<[String]>>>);

impl SetNames {
    fn of(and: &[String]) -> SetNames {
        SetNames((!and.is_empty()).then(|| Box::new(and.into())))
    }

    /// How many names the LOCK asked for, the first one included.
    fn count(&self) -> u32 {
        let others = self.0.as_ref().map_or(0, |and| and.len());
        u32::try_from(others).map_or(u32::MAX, |n| n.saturating_add(1))
    }

    /// The further names, in the request's order.
    fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().flat_map(|and| and.iter().map(String::as_str))
    }
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
