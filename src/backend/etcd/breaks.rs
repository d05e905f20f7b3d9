//! BREAK in cluster mode. A record of the broken lease (`P b/<name>/<token>`, on an etcd
//! lease of its own) tells its holder, through any front-end, who broke it. Then each lease
//! is either marked broken in its own key (a guarded rewrite: it keeps its place on the name,
//! unrenewable, until its holder's UNLOCK or its deadline ends it as any lease ends), or with
//! `force` ended by the write a release makes (`release.rs`: guarded like it, granting the
//! head waiter in the same write when it can), with the marker saying `broken` and who sent
//! it. The driver of `breaking.rs`, where the core decides which leases, which writes and
//! what their answers mean: this file sends them, logs, and keeps the BREAKs under way.

use crate::backend::{now, BackendError};
use crate::locks::{EventKind, Origin, Token};

use super::breaking::{self, BreakOne};
use super::holders::created;
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

    /// [`Cluster::break_bound`], its refusals as they come ([`breaking::to_break`]).
    async fn break_leases(
        &self,
        name: &str,
        token: Option<Token>,
        by: &Origin,
        force: bool,
    ) -> Result<usize, BackendError> {
        // A linearizable read: a grant made through another front-end a moment ago counts.
        let ns = self.read_name(name).await?;
        let holders = breaking::to_break(&self.guard(), &self.me(), ns, token, now())?;
        let mut ended = 0;
        for holder in &holders {
            if self.break_one(name, holder, by, force).await? {
                ended += 1;
            }
        }
        Ok(breaking::broke(ended)?)
    }

    /// Breaks one holder ([`breaking::break_one`]): its record, then the write that marks it
    /// broken, or with `force` ends it. Whether it did (a lease already marked broken
    /// counts: a BREAK sent again).
    async fn break_one(
        &self,
        name: &str,
        holder: &HolderRecord,
        by: &Origin,
        force: bool,
    ) -> Result<bool, BackendError> {
        let one = breaking::break_one(
            &self.guard(),
            &self.layout,
            (name, holder),
            (by, force),
            self.wall_ms(),
        );
        let BreakOne::Write(one) = one else {
            return Ok(true);
        };
        let token = one.token;
        let lease = {
            let mut client = self.client.clone();
            client
                .lease_grant(one.lease_ttl, None)
                .await
                .map_err(|e| self.unavailable(&e))?
                .id()
        };
        let put = self
            .txn(one.record_txn(lease))
            .await
            .map_err(|e| self.unavailable(&e))?;
        let written = put.header().map_or(0, |h| h.revision());

        self.breaking_guard().push((holder.rev, token, by.clone()));
        let resp = if one.ends {
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
            for txn in one.unrecord(written) {
                let _ = self.txn(txn).await;
            }
        }
        match resp {
            Ok(_) => Ok(done),
            Err(e) => Err(self.unavailable(&e)),
        }
    }

    /// Marks `holder` broken by `by` ([`breaking::mark`]); one that was renewed meanwhile is
    /// read again and marked then. Whether it was marked (then logged and counted as a
    /// lease's end: for its holder, it is one).
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
            let mark = breaking::mark(&self.layout, &holder, by);
            let resp = self.txn(mark.txn.clone()).await?;
            if breaking::marked(&mut self.guard(), name, &mark, &resp) {
                let value = &mark.value;
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
            // Gone, or broken by another BREAK meanwhile, is no lease of this BREAK's to mark.
            match self.read_holder(name, holder.rev).await {
                Ok(again) if breaking::mark_again(&again) && tries < CLEANUP_TRIES => {
                    holder = again;
                }
                _ => return Ok((false, resp)),
            }
        }
    }
}
