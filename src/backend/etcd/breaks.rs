//! BREAK in cluster mode. A record of the broken lease (`P b/<name>/<token>`, on an etcd
//! lease of its own) tells its holder, through any front-end, who broke it. Then each lease
//! is either marked broken in its own key (a guarded rewrite: it keeps its place on the name,
//! unrenewable, until its holder's UNLOCK or its deadline ends it as any lease ends), or with
//! `force` ended by the write a release makes (`release.rs`: guarded like it, granting the
//! head waiter in the same write when it can), with the marker saying `broken` and who sent
//! it.

use super::rpc::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::backend::{now, BackendError};
use crate::locks::{rules, EventKind, Origin, TableError, Token};

use super::holders::created;
use super::holding;
use super::marks::BrokenValue;
use super::mirror::HolderRecord;
use super::requests::CLEANUP_TRIES;
use super::Cluster;

impl Cluster {
    /// BREAK by `by` (its right checked before): ends every live lease of `name`, or only
    /// `token`'s, as [`rules::breaks`] says over the name as etcd has it now. Returns how
    /// many it ended.
    pub async fn break_bound(
        &self,
        name: &str,
        token: Option<Token>,
        by: &Origin,
        force: bool,
    ) -> Result<usize, BackendError> {
        let result = self.break_leases(name, token, by, force).await;
        match token {
            Some(token) => self.explained(name, token, result).await,
            None => result,
        }
    }

    /// [`Cluster::break_bound`], its refusals as they come.
    async fn break_leases(
        &self,
        name: &str,
        token: Option<Token>,
        by: &Origin,
        force: bool,
    ) -> Result<usize, BackendError> {
        // A linearizable read: a grant made through another front-end a moment ago counts;
        // a lease whose time is up is not one to break.
        let mut ns = self.read_name(name).await?;
        let at = now();
        ns.holders.retain(|_, h| !h.left(at).is_zero());
        let only = match token {
            Some(token) => Some(
                self.guard()
                    .mirror
                    .rev_of(token)
                    .ok_or(BackendError::Table(TableError::NotHeld))?,
            ),
            None => None,
        };
        let revs = rules::breaks(&ns.view(&self.fe), only.as_ref())?;
        let mut ended = 0;
        for rev in revs {
            let Some(holder) = ns.holders.get(&rev) else {
                continue;
            };
            if self.break_one(name, holder, by, force).await? {
                ended += 1;
            }
        }
        if ended == 0 {
            return Err(TableError::NotHeld.into());
        }
        Ok(ended)
    }

    /// Breaks one holder: its record first (so that its holder, renewing at once, is told who
    /// broke it), then the write that marks it broken, or with `force` ends it. Whether it
    /// did (a lease already marked broken counts: a BREAK sent again).
    async fn break_one(
        &self,
        name: &str,
        holder: &HolderRecord,
        by: &Origin,
        force: bool,
    ) -> Result<bool, BackendError> {
        let token = self.guard().mirror.token(holder.rev);
        if holder.value.broken_by.is_some() && !force {
            return Ok(true);
        }
        let record = BrokenValue {
            by: by.who(),
            at_ms: self.wall_ms(),
            deadline_ms: holder.value.ends_ms(),
        };
        // A set is one lease: its holder is told on whichever of its names it asks.
        let keys: Vec<String> = super::keys::names_of(name, &holder.value.set)
            .into_iter()
            .map(|n| self.layout.broken(n, token))
            .collect();
        // Its own etcd lease, so that etcd forgets it about when the lease would have ended
        // (a deadline checked on read covers what etcd's rounding adds).
        let left_s = record
            .deadline_ms
            .saturating_sub(record.at_ms)
            .div_ceil(1000);
        let ttl = i64::try_from(left_s.saturating_add(1)).unwrap_or(i64::MAX);
        let lease = {
            let mut client = self.client.clone();
            client
                .lease_grant(ttl, None)
                .await
                .map_err(|e| self.unavailable(&e))?
                .id()
        };
        let encoded = record.encode();
        let put = Txn::new().and_then(
            keys.iter()
                .map(|k| {
                    TxnOp::put(
                        k.clone(),
                        encoded.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                })
                .collect::<Vec<_>>(),
        );
        let put = self.txn(put).await.map_err(|e| self.unavailable(&e))?;
        let written = put.header().map_or(0, |h| h.revision());

        self.breaking_guard().push((holder.rev, token, by.clone()));
        let resp = if force || holder.value.broken_by.is_some() {
            let ended = self.end_txn(name, EventKind::Broken, holder, created(holder));
            let resp = self.txn(ended.txn.clone()).await;
            resp.map(|r| {
                (
                    self.ended(name, token, EventKind::Broken, holder, &ended, &r),
                    r,
                )
            })
        } else {
            self.mark_broken(name, token, holder, by).await
        };
        let done = resp.as_ref().is_ok_and(|(done, _)| *done);
        self.breaking_guard()
            .retain(|(rev, _, _)| *rev != holder.rev);
        if !done {
            // It was not ended by this BREAK (it ended meanwhile): no record of a break,
            // unless another BREAK has written its own since.
            for key in keys {
                let ours = Compare::mod_revision(key.clone(), CompareOp::Equal, written);
                let _ = self
                    .txn(Txn::new().when([ours]).and_then([TxnOp::delete(key, None)]))
                    .await;
            }
        }
        match resp {
            Ok(_) => Ok(done),
            Err(e) => Err(self.unavailable(&e)),
        }
    }

    /// Writes `holder` as broken by `by` unless it changed since it was read; one that was
    /// renewed meanwhile is read again and marked then. Whether it was marked (then logged
    /// and counted as a lease's end: for its holder, it is one).
    async fn mark_broken(
        &self,
        name: &str,
        token: Token,
        holder: &HolderRecord,
        by: &Origin,
    ) -> Result<(bool, super::rpc::TxnResponse), super::rpc::Error> {
        let mut holder = holder.clone();
        let mut tries = 0;
        loop {
            tries += 1;
            let mut value = holder.value.clone();
            value.broken_by = Some(by.clone());
            let resp = self
                .txn(holding::rewrite_in_place(&self.layout, &holder, &value))
                .await?;
            if resp.succeeded() {
                self.wrote_lease(name, &value, &resp);
                let held = self.wall_ms().saturating_sub(value.granted_ms);
                for each in super::keys::names_of(name, &value.set) {
                    let held = std::time::Duration::from_millis(held);
                    self.ended_log(
                        each,
                        &value.id,
                        token,
                        EventKind::Breaking,
                        held,
                        &value.origin(),
                    );
                }
                return Ok((true, resp));
            }
            // Renewed (or its grace started) meanwhile: read it again; gone, or broken by
            // another BREAK meanwhile, is no lease of this BREAK's to mark.
            match self.read_holder(name, holder.rev).await {
                Ok(again) if again.value.broken_by.is_none() && tries < CLEANUP_TRIES => {
                    holder = again;
                }
                _ => return Ok((false, resp)),
            }
        }
    }
}
