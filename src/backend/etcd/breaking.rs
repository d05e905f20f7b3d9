//! BREAK, as the front-end's core decides it: which leases of a name a BREAK ends, the record
//! of each broken lease (`P b/<name>/<token>`, which tells its holder, through any front-end,
//! who broke it), the guarded rewrite that marks a lease broken, the removal of a record
//! whose BREAK ended nothing, and what a record read back says to a holder who asks. Pure:
//! `breaks.rs` (and `broken.rs`, for the holder's question) is its driver, which sends the
//! writes, logs, and holds the list of BREAKs under way; `breaking_tests.rs` steps it by
//! hand.

use std::time::Instant;

use super::rpc::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnResponse};

use crate::locks::{rules, Origin, TableError, Token};

use super::head::Me;
use super::holding::{rewrite_in_place, wrote_lease};
use super::keys::{names_of, Layout};
use super::marks::BrokenValue;
use super::mirror::{HolderRecord, NameState};
use super::values::HolderValue;
use super::ClusterState;

/// The leases of `name` (`ns`, as a linearizable read found it) that a BREAK at `now` ends:
/// every live one, or only `token`'s, as [`rules::breaks`] says. A lease whose time is up is
/// not one to break.
pub(super) fn to_break(
    g: &ClusterState,
    me: &Me<'_>,
    mut ns: NameState,
    token: Option<Token>,
    now: Instant,
) -> Result<Vec<HolderRecord>, TableError> {
    ns.holders.retain(|_, h| !h.left(now).is_zero());
    let only = match token {
        Some(token) => {
            let rev = g.mirror.rev_of(token).ok_or(TableError::NotHeld)?;
            // (A dense revision's other tokens are other names' holders.)
            if ns
                .holders
                .get(&rev)
                .is_some_and(|h| !g.mirror.is_token_of(token, h))
            {
                return Err(TableError::NotHeld);
            }
            Some(rev)
        }
        None => None,
    };
    let revs = rules::breaks(&ns.view(me.fe), only.as_ref())?;
    Ok(revs
        .into_iter()
        .filter_map(|rev| ns.holders.get(&rev).cloned())
        .collect())
}

/// What a BREAK tells its sender, having ended `ended` leases.
pub(super) fn broke(ended: usize) -> Result<usize, TableError> {
    if ended == 0 {
        return Err(TableError::NotHeld);
    }
    Ok(ended)
}

/// What breaking one lease takes.
pub(super) enum BreakOne {
    /// Nothing: it is marked broken already (a BREAK sent again). It counts as broken.
    Done,
    /// Its record written, then the lease marked broken or ended.
    Write(Box<Break>),
}

/// One lease being broken.
pub(super) struct Break {
    pub(super) token: Token,
    pub(super) record: BrokenValue,
    /// The record's keys: one per name of the lease (a set is one lease: its holder is told
    /// on whichever of its names it asks).
    pub(super) keys: Vec<String>,
    /// The ttl, in seconds, of the record's own etcd lease: etcd forgets the record about
    /// when the lease would have ended (a deadline checked on read covers what etcd's
    /// rounding adds).
    pub(super) lease_ttl: i64,
    /// Ended by the write a release makes (`force`, or a BREAK with `force` of a lease
    /// marked broken before), rather than marked broken.
    pub(super) ends: bool,
}

/// Breaking `holder` of `name` by `by` (`wall_ms`: this front-end's wall clock, which the
/// record says when in): its record first (so that its holder, renewing at once, is told who
/// broke it), then the write that marks it broken, or with `force` ends it.
pub(super) fn break_one(
    g: &ClusterState,
    layout: &Layout,
    (name, holder): (&str, &HolderRecord),
    (by, force): (&Origin, bool),
    wall_ms: u64,
) -> BreakOne {
    let token = g.mirror.token(holder.rev, &holder.slot);
    if holder.value.broken_by.is_some() && !force {
        return BreakOne::Done;
    }
    let record = BrokenValue {
        by: by.who(),
        at_ms: wall_ms,
        deadline_ms: holder.value.ends_ms(),
    };
    let keys = names_of(name, &holder.value.set)
        .into_iter()
        .map(|n| layout.broken(n, token))
        .collect();
    let left_s = record
        .deadline_ms
        .saturating_sub(record.at_ms)
        .div_ceil(1000);
    let lease_ttl = i64::try_from(left_s.saturating_add(1)).unwrap_or(i64::MAX);
    BreakOne::Write(Box::new(Break {
        token,
        record,
        keys,
        lease_ttl,
        ends: force || holder.value.broken_by.is_some(),
    }))
}

impl Break {
    /// The write of its record, on etcd lease `lease` (granted for [`Break::lease_ttl`]).
    pub(super) fn record_txn(&self, lease: i64) -> Txn {
        let encoded = self.record.encode();
        Txn::new().and_then(
            self.keys
                .iter()
                .map(|k| {
                    TxnOp::put(
                        k.clone(),
                        encoded.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )
                })
                .collect::<Vec<_>>(),
        )
    }

    /// It did not end the lease (it ended meanwhile): the writes that remove its record,
    /// written at revision `written`, unless another BREAK has written its own since.
    pub(super) fn unrecord(self, written: i64) -> Vec<Txn> {
        self.keys
            .into_iter()
            .map(|key| {
                let ours = Compare::mod_revision(key.clone(), CompareOp::Equal, written);
                Txn::new().when([ours]).and_then([TxnOp::delete(key, None)])
            })
            .collect()
    }
}

/// A lease being marked broken: its record as it will read, and the rewrite.
pub(super) struct Mark {
    pub(super) value: HolderValue,
    pub(super) txn: Txn,
}

/// Marks `holder` broken by `by`, unless it changed since it was read; its keys stay on the
/// etcd lease they hang on ([`rewrite_in_place`]). The mark says which version it marked
/// ([`HolderValue::broken_over`]).
pub(super) fn mark(layout: &Layout, holder: &HolderRecord, by: &Origin) -> Mark {
    let mut value = holder.value.clone();
    value.broken_by = Some(by.clone());
    value.broken_over = holder.mod_rev;
    let txn = rewrite_in_place(layout, holder, &value);
    Mark { value, txn }
}

/// Steps the core with the answer `resp` to mark `m` of a lease of `name`: whether it was
/// marked (then its names are remembered as written).
pub(super) fn marked(g: &mut ClusterState, name: &str, m: &Mark, resp: &TxnResponse) -> bool {
    if !resp.succeeded() {
        return false;
    }
    wrote_lease(g, name, &m.value, resp.header().map_or(0, |h| h.revision()));
    true
}

/// Whether a lease whose mark failed (renewed, or its grace started, meanwhile), read again
/// as `again`, is still one to mark: not if broken by another BREAK meanwhile.
pub(super) fn mark_again(again: &HolderRecord) -> bool {
    again.value.broken_by.is_none()
}

/// The record of a BREAK of a lease, read from etcd (`kvs`) at `wall_ms`, while it says why
/// the lease is not held (up to the lease's deadline): the BREAK may have come through
/// another front-end. `None`: the lease is simply not held.
pub(super) fn broken_record(kvs: &[KeyValue], wall_ms: u64) -> Option<BrokenValue> {
    kvs.first()
        .and_then(|kv| BrokenValue::decode(kv.value()))
        .filter(|b| b.deadline_ms > wall_ms)
}
