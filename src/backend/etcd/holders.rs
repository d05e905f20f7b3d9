//! One holder of a name: found by its token, owned by its user, renewed, checked. The driver
//! of `holding.rs` (which record, what a read says, the rewrites) and of `renewal.rs` (RENEW
//! and CHECK): this file reads and writes etcd.

use std::time::Duration;

use super::rpc::{Compare, GetOptions, PutOptions, Txn};

use crate::backend::{now, BackendError, Renewed};
use crate::locks::{ConnId, LockRequest, TableError, Token, UserId};

use super::holding::{self, Asker, Known};
use super::mirror::HolderRecord;
use super::renewal::{self, Renew};
use super::values::{delay_ms, set_names, HolderValue};
use super::{guards, Cluster};

impl Cluster {
    /// The holder of `name` with `token`: from the mirror, or read from etcd if the mirror
    /// has not seen it yet (a grant made through another front-end a moment ago).
    pub(super) async fn find_holder(
        &self,
        name: &str,
        token: Token,
    ) -> Result<HolderRecord, BackendError> {
        let known = holding::known_holder(&self.guard(), name, token)?;
        match known {
            Known::Here(holder) => Ok(*holder),
            Known::Read(rev) => {
                let holder = self.read_holder(name, rev).await?;
                Ok(holding::with_token(&self.guard(), token, holder)?)
            }
        }
    }

    /// A linearizable read of one holder ([`holding::holder_read`]).
    pub(super) async fn read_holder(
        &self,
        name: &str,
        rev: i64,
    ) -> Result<HolderRecord, BackendError> {
        let resp = self
            .get(
                self.layout.holders(name),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| self.unavailable(&e))?;
        Ok(holding::holder_read(
            &self.guard(),
            name,
            rev,
            resp.kvs(),
            now(),
        )?)
    }

    /// Whether `user` may act on `holder` ([`holding::owned`]).
    pub(super) fn owned_by(&self, holder: &HolderRecord, user: UserId) -> Result<(), BackendError> {
        let name = self.user_name(user);
        Ok(holding::owned(holder, &self.asker(user, &name), now())?)
    }

    /// `user` (named `name`) as records name owners.
    fn asker<'a>(&self, user: UserId, name: &'a str) -> Asker<'a> {
        if user != crate::locks::NO_USER {
            Asker::User(name)
        } else if self.users.is_some() {
            Asker::Nobody
        } else {
            Asker::Anyone
        }
    }

    /// [`holding::rewrite`], onto this front-end's etcd lease for a session lease.
    pub(super) fn rewrite(&self, holder: &HolderRecord, value: &HolderValue) -> Txn {
        holding::rewrite(&self.layout, holder, value, self.lease_id())
    }

    /// RENEW ([`renewal::renewal`]), and with `detach` a session lease becomes a plain one.
    pub(super) async fn renew_as(
        &self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        (conn, user): (ConnId, UserId),
        detach: bool,
    ) -> Result<Renewed, BackendError> {
        if ttl.is_some() {
            self.limits.ttl(ttl)?;
        }
        let mut holder = self.find_holder(name, token).await?;
        for _ in 0..2 {
            let user_name = self.user_name(user);
            let ask = Renew {
                ttl,
                conn,
                asker: self.asker(user, &user_name),
                detach,
                lease: self.lease_id(),
            };
            let r = renewal::renewal(&self.me(), &holder, &ask, now(), self.wall_ms())?;
            let resp = self
                .txn(r.txn.clone())
                .await
                .map_err(|e| self.unavailable(&e))?;
            let renewed = renewal::renewed(&mut self.guard(), name, &r, &resp);
            if let Some(renewed) = renewed {
                return Ok(renewed);
            }
            // Changed meanwhile (renewed elsewhere, its grace started): read it and try again.
            holder = self.read_holder(name, holder.rev).await?;
        }
        Err(TableError::NotHeld.into())
    }

    /// CHECK: read from etcd itself, not the mirror, so it is never behind
    /// ([`renewal::time_left`]).
    pub async fn check(&self, name: &str, token: Token) -> Result<Duration, BackendError> {
        let left = self.time_left(name, token).await;
        self.explained(name, token, left).await
    }

    /// [`Cluster::check`], its refusals as they come.
    async fn time_left(&self, name: &str, token: Token) -> Result<Duration, BackendError> {
        let rev = self
            .guard()
            .mirror
            .rev_of(token)
            .ok_or(BackendError::Table(TableError::NotHeld))?;
        let holder = self.read_holder(name, rev).await?;
        let g = self.guard();
        let holder = holding::with_token(&g, token, holder)?;
        Ok(renewal::time_left(
            &g,
            name,
            &holder,
            now(),
            self.wall_ms(),
        )?)
    }

    /// The record of a grant made at once to `req`, known as `uid`.
    pub(super) fn holder_value(
        &self,
        uid: &str,
        req: &LockRequest,
        user: &str,
        ttl: Duration,
    ) -> HolderValue {
        let at = self.wall_ms();
        HolderValue {
            uid: uid.to_owned(),
            id: req.id.clone(),
            user: user.to_owned(),
            mode: req.mode,
            ttl_ms: ttl.as_millis() as u64,
            deadline_ms: at + ttl.as_millis() as u64,
            session_ms: req.session().map(|g| g.as_millis() as u64),
            fe: self.fe.clone(),
            conn: req.conn,
            cut_ms: 0,
            granted_ms: at,
            waited_ms: None,
            at_ms: at,
            peer: req.origin.peer().map(|p| p.to_string()).unwrap_or_default(),
            note: req.note.as_deref().unwrap_or_default().to_owned(),
            set: set_names(req),
            broken_by: None,
            broken_over: 0,
            delay_ms: delay_ms(req),
            delaying: None,
        }
    }

    /// Put options for a holder: a session lease hangs on this front-end's etcd lease.
    pub(super) fn holder_put(&self, session: bool) -> Option<PutOptions> {
        session.then(|| PutOptions::new().with_lease(self.lease_id()))
    }
}

/// "It is still this grant" (a renewal does not change it).
pub(super) fn created(holder: &HolderRecord) -> Compare {
    guards::same_key(&holder.key, holder.rev)
}
