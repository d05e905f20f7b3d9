//! One holder of a name: found by its token, owned by its user, renewed, checked, and its
//! session lease ended (or its grace started) when its connection closes.

use std::time::Duration;

use super::rpc::{Compare, GetOptions, PutOptions, Txn, TxnOp};

use crate::backend::{now, BackendError, Renewed};
use crate::locks::{ConnId, LockRequest, TableError, Token, UserId};

use super::mirror::HolderRecord;
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
        let rev = {
            let g = self.guard();
            let Some(rev) = g.mirror.rev_of(token) else {
                return Err(TableError::NotHeld.into());
            };
            if let Some(h) = g.mirror.name(name).and_then(|ns| ns.holder_by_rev(rev)) {
                // (One whose key went with its front-end's etcd lease is no lease of anyone's
                // any more: it runs its lock-delay.)
                if h.keyless {
                    return Err(TableError::NotHeld.into());
                }
                return Ok(h.clone());
            }
            if let Some(h) = g.fresh.get(&(name.to_owned(), rev)) {
                return Ok(h.clone());
            }
            if g.mirror.rev >= rev {
                return Err(TableError::NotHeld.into());
            }
            rev
        };
        self.read_holder(name, rev).await
    }

    /// A linearizable read of one holder.
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
        for kv in resp.kvs() {
            if kv.create_revision() == rev {
                let value = HolderValue::decode(kv.value())
                    .ok_or(BackendError::Table(TableError::NotHeld))?;
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let slot = key.rsplit('/').next().and_then(super::keys::decode);
                let slot = slot.unwrap_or_default();
                // Not seen being written: counted as if written now. A write the mirror saw
                // with the same time in it (a confirmation's rewrite) is counted from when it
                // was seen, as the expiry timer counts it. No wall clock enters: the writer's
                // may be seconds behind this one's, and the lease is live while its key is
                // (only a guarded write ends it), so a RENEW of it must not be refused
                // (simulator seeds 120939, 141739: a RENEW refused within the ttl). CHECK
                // adds this front-end's wall clock itself.
                let left = value.left_ms();
                let seen = self.guard().mirror.name(name).and_then(|ns| {
                    let h = ns.holder_by_rev(rev)?;
                    let same = !h.keyless
                        && h.value.at_ms == value.at_ms
                        && h.value.ends_ms() == value.ends_ms();
                    same.then_some(h.ends_at)
                });
                let ends_at = seen.unwrap_or_else(|| now() + Duration::from_millis(left));
                return Ok(HolderRecord {
                    uid: super::mirror::uid_of(&value.uid, &slot),
                    slot,
                    key,
                    rev,
                    mod_rev: kv.mod_revision(),
                    lease: kv.lease(),
                    ends_at,
                    keyless: false,
                    value,
                });
            }
        }
        Err(TableError::NotHeld.into())
    }

    pub(super) fn owned_by(&self, holder: &HolderRecord, user: UserId) -> Result<(), BackendError> {
        if holder.left(now()).is_zero() {
            return Err(TableError::NotHeld.into());
        }
        if user != crate::locks::NO_USER && holder.value.user != self.user_name(user) {
            return Err(TableError::NotOwner.into());
        }
        if user == crate::locks::NO_USER && !holder.value.user.is_empty() && self.users.is_some() {
            return Err(TableError::NotOwner.into());
        }
        Ok(())
    }

    /// Writes `value` over `holder` unless it changed since it was read (renewed, ended,
    /// its grace started): the token stays (the key's create revision does not move). A
    /// set's every key is written alike, in the same write: they are one lease.
    /// A session lease's keys go onto this front-end's etcd lease: a RENEW or a LOCK again
    /// binds it to the connection it came on.
    pub(super) fn rewrite(&self, holder: &HolderRecord, value: &HolderValue) -> Txn {
        let put = self.holder_put(value.session_ms.is_some());
        self.rewrite_with(holder, value, put)
    }

    /// [`Cluster::rewrite`], the keys left on the etcd lease they hang on: a BREAK through
    /// another front-end must not move a session lease onto the breaker's etcd lease, to end
    /// with that front-end (simulator seed 4957).
    pub(super) fn rewrite_in_place(&self, holder: &HolderRecord, value: &HolderValue) -> Txn {
        let put = (holder.lease != 0).then(|| PutOptions::new().with_lease(holder.lease));
        self.rewrite_with(holder, value, put)
    }

    /// [`Cluster::rewrite`] on no etcd lease (a lease in its lock-delay).
    pub(super) fn rewrite_plain(&self, holder: &HolderRecord, value: &HolderValue) -> Txn {
        self.rewrite_with(holder, value, None)
    }

    fn rewrite_with(
        &self,
        holder: &HolderRecord,
        value: &HolderValue,
        put: Option<PutOptions>,
    ) -> Txn {
        let keys = self.lease_keys(holder);
        let encoded = value.encode();
        Txn::new()
            .when(
                keys.iter()
                    .map(|k| guards::unchanged(k, holder.mod_rev))
                    .collect::<Vec<_>>(),
            )
            .and_then(
                keys.iter()
                    .map(|k| TxnOp::put(k.clone(), encoded.clone(), put.clone()))
                    .collect::<Vec<_>>(),
            )
    }

    /// Every key of `holder`'s lease: its own, and for a set the key of each further name
    /// (same slot, same create revision and, written together always, same mod revision).
    pub(super) fn lease_keys(&self, holder: &HolderRecord) -> Vec<String> {
        super::end::lease_keys(&self.layout, holder)
    }

    /// [`Cluster::wrote`] for every name of the lease `value` records (`name`'s set, or
    /// `name` alone).
    pub(super) fn wrote_lease(
        &self,
        name: &str,
        value: &HolderValue,
        resp: &super::rpc::TxnResponse,
    ) {
        for n in super::keys::names_of(name, &value.set) {
            self.wrote(n, resp);
        }
    }

    /// RENEW, and with `detach` a session lease becomes a plain one: its record says so and
    /// its key no longer hangs on any front-end's etcd lease, so it outlives its connection
    /// and its front-end.
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
            self.owned_by(&holder, user)?;
            if holder.value.lingering() {
                // Broken (its holder is told by whom: `Backend::renew`), or in its lock-delay.
                return Err(TableError::NotHeld.into());
            }
            let mut value = holder.value.clone();
            if let Some(ttl) = ttl {
                value.ttl_ms = ttl.as_millis() as u64;
            }
            value.at_ms = self.wall_ms();
            value.deadline_ms = value.at_ms + value.ttl_ms;
            let session = value.session_ms.is_some();
            let bound = session && (value.cut_ms > 0 || value.fe != self.fe || value.conn != conn);
            if session {
                value.cut_ms = 0;
                value.fe = self.fe.clone();
                value.conn = conn;
            }
            if detach {
                value.session_ms = None;
            }
            let bound = bound && !detach;
            let txn = self.rewrite(&holder, &value);
            let resp = self.txn(txn).await.map_err(|e| self.unavailable(&e))?;
            if resp.succeeded() {
                self.wrote_lease(name, &value, &resp);
                return Ok(Renewed {
                    left: Duration::from_millis(value.ttl_ms),
                    bound,
                });
            }
            // Changed meanwhile (renewed elsewhere, its grace started): read it and try again.
            holder = self.read_holder(name, holder.rev).await?;
        }
        Err(TableError::NotHeld.into())
    }

    /// CHECK: read from etcd itself, not the mirror, so it is never behind. The time left
    /// is the least of what the record says on this front-end's wall clock and, when the
    /// mirror has seen this very write, the time until this front-end would end it (which no
    /// wall clock moves).
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
        if holder.value.lingering() {
            return Err(TableError::NotHeld.into());
        }
        let at = now();
        let by_wall = holder.value.ends_ms().saturating_sub(self.wall_ms());
        let mut left = holder.left(at).min(Duration::from_millis(by_wall));
        if let Some(seen) = self
            .guard()
            .mirror
            .name(name)
            .and_then(|ns| ns.holder_by_rev(rev))
            .filter(|h| h.mod_rev == holder.mod_rev)
        {
            left = left.min(seen.left(at));
        }
        if left.is_zero() {
            return Err(TableError::NotHeld.into());
        }
        Ok(left)
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
