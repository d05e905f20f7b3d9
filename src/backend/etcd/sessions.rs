//! The session leases this front-end granted or bound, by connection: a closing connection's
//! are ended (or start their grace) by the backend, not handed back by the connection handler.
//!
//! The holder keys in etcd say which front-end and connection a session lease is bound to;
//! this index finds a connection's without a scan of the mirror, and covers the grants the
//! watch has not shown yet. An entry is added when a grant of a session lease is answered
//! (at once, or delivered to a waiter) or a RENEW binds one, and leaves when the lease ends
//! (an UNLOCK through this front-end, or the watch showing its end) or its connection
//! closes. An entry that went stale otherwise (the lease rebound through another connection
//! or front-end) does no harm: a close checks the holder key is still bound to it.

use std::sync::Arc;

use crate::backend::{now, BackendError, Health, LockStart, Renewed};
use crate::locks::{ConnId, EventKind, LockRequest, RenewRequest, Token, UserId};
use crate::store::Seq;

use super::Cluster;

impl Cluster {
    /// LOCK; a session lease granted at once is bound to the request's connection.
    pub async fn lock_bound(self: &Arc<Self>, req: LockRequest) -> Result<LockStart, BackendError> {
        let bind = req.session().map(|_| (req.conn, req.name.clone()));
        let start = self.lock(req).await?;
        if let (Some((conn, name)), LockStart::Granted { token, .. }) = (bind, &start) {
            self.guard().bound.add(conn, *token, &name);
        }
        Ok(start)
    }

    /// UNLOCK; the lease is no longer bound to any connection.
    pub async fn unlock_bound(
        &self,
        name: &str,
        token: Token,
        user: UserId,
    ) -> Result<(), BackendError> {
        let result = self.unlock(name, token, user).await;
        self.explained(name, token, result).await?;
        self.guard().bound.ended(token);
        Ok(())
    }

    /// RENEW: a session lease in its grace is bound to `conn` from now on; with `detach`,
    /// the lease is plain from now on, bound to no connection.
    pub async fn renew(
        &self,
        req: &RenewRequest,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewed, BackendError> {
        let (name, token) = (req.name.as_str(), req.token);
        let renewed = self
            .renew_as(name, token, req.ttl, (conn, user), req.detach)
            .await;
        let renewed = self.explained(name, token, renewed).await?;
        if req.detach {
            self.guard().bound.ended(token);
        } else if renewed.bound {
            self.guard().bound.add(conn, token, name);
        }
        Ok(renewed)
    }

    /// Connection `conn` closed: its session leases end (or start their grace), on a task
    /// of their own (each is a write to etcd).
    pub fn closed(self: &Arc<Self>, conn: ConnId) {
        let leases = {
            let mut g = self.guard();
            let mut leases = g.bound.take(conn);
            leases.retain(|token, name| g.live(*token, name));
            leases
        };
        if leases.is_empty() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            for (token, name) in leases {
                me.session_closed(&name, token, conn).await;
            }
        });
    }

    /// Whether a live session lease is bound to `conn` (as the mirror has it).
    pub fn holds_sessions(&self, conn: ConnId) -> bool {
        let mut g = self.guard();
        let Some(leases) = g.bound.of(conn) else {
            return false;
        };
        let gone: Vec<Token> = leases
            .iter()
            .filter(|(token, name)| !g.live(**token, name))
            .map(|(token, _)| *token)
            .collect();
        for token in gone {
            g.bound.ended(token);
        }
        g.bound.of(conn).is_some()
    }

    /// Ready to grant (a quorum answered within the bound, this front-end's lease live); no
    /// journal of its own: a change is durable once etcd answered it.
    pub fn health(&self) -> Health {
        Health {
            ready: self.ready(),
            journal_backlog: None,
            confirmed: Some(self.freshness()),
        }
    }

    /// Nothing to wait for: etcd answers a write once its quorum has it.
    pub fn durable_mark(&self) -> Option<Seq> {
        None
    }

    /// Durable already (see [`Cluster::durable_mark`]).
    pub async fn durable(&self, _mark: Seq) -> Result<(), BackendError> {
        Ok(())
    }

    /// Connection `conn`, to which session lease `token` was bound, closed: the lease ends
    /// now, or starts its grace, if it is still bound to it.
    pub(super) async fn session_closed(&self, name: &str, token: Token, conn: ConnId) {
        let Ok(holder) = self.find_holder(name, token).await else {
            return;
        };
        let v = &holder.value;
        if v.fe != self.fe || v.conn != conn || v.cut_ms > 0 || v.delaying.is_some() {
            return;
        }
        match v.session_ms {
            None => {}
            Some(0) if v.delay_ms > 0 => {
                self.start_delay(name, &holder, EventKind::Dropped).await;
            }
            Some(0) => {
                self.end_holder(name, token, EventKind::Dropped, holder)
                    .await;
            }
            Some(grace) => {
                // Both ends on this front-end's clock, so that the time left stays right
                // whoever wrote the deadline.
                let mut value = v.clone();
                value.at_ms = self.wall_ms();
                value.deadline_ms = value.at_ms + holder.left(now()).as_millis() as u64;
                value.cut_ms = value.at_ms + grace;
                let txn = self.rewrite(&holder, &value);
                self.cleanup(txn).await;
            }
        }
    }
}

impl super::ClusterState {
    /// Whether lease `token` of `name` is still held, as the mirror has it. A grant the watch
    /// has not shown yet is live too: forgetting it would leave its session lease behind when
    /// the connection closes.
    fn live(&self, token: Token, name: &str) -> bool {
        self.mirror.rev_of(token).is_some_and(|rev| {
            rev > self.mirror.rev
                || self.mirror.name(name).is_some_and(|ns| {
                    ns.holder_by_rev(rev)
                        .is_some_and(|h| self.mirror.is_token_of(token, h))
                })
        })
    }
}
