//! One holder of a name, as the front-end's core decides about it: which record a token
//! stands for (the mirror's, a fresh grant's, or one to read from etcd), what a read of it
//! from etcd says, whether the asker owns it, and the guarded rewrites of its record that
//! RENEW, the same LOCK again, BREAK and the lock-delay make. Pure: `holders.rs` is its
//! driver (it reads and writes etcd), and `holding_tests.rs` steps it by hand.

use std::time::{Duration, Instant};

use super::rpc::{KeyValue, PutOptions, Txn, TxnOp};

use crate::locks::{TableError, Token};

use super::end::lease_keys;
use super::keys::{names_of, Layout};
use super::mirror::{uid_of, HolderRecord};
use super::values::HolderValue;
use super::{guards, ClusterState};

/// Where the holder a token stands for is to be found.
pub(super) enum Known {
    /// In this front-end's mirror, or a grant of its own the mirror has not shown yet.
    Here(Box<HolderRecord>),
    /// Only in etcd: written after the mirror's revision (a grant through another
    /// front-end a moment ago), read at its create revision.
    Read(i64),
}

/// The holder of `name` with `token`, as this front-end knows it.
pub(super) fn known_holder(
    g: &ClusterState,
    name: &str,
    token: Token,
) -> Result<Known, TableError> {
    let Some(rev) = g.mirror.rev_of(token) else {
        return Err(TableError::NotHeld);
    };
    if let Some(h) = g.mirror.name(name).and_then(|ns| ns.holder_by_rev(rev)) {
        // (One whose key went with its front-end's etcd lease is no lease of anyone's
        // any more: it runs its lock-delay.)
        if h.keyless {
            return Err(TableError::NotHeld);
        }
        return Ok(Known::Here(Box::new(with_token(g, token, h.clone())?)));
    }
    if let Some(h) = g.fresh.get(&(name.to_owned(), rev)) {
        return Ok(Known::Here(Box::new(with_token(g, token, h.clone())?)));
    }
    if g.mirror.rev >= rev {
        return Err(TableError::NotHeld);
    }
    Ok(Known::Read(rev))
}

/// `holder`, if `token` is its: a dense revision's other tokens are other holders' (of other
/// names, granted by the same write; `tokens.rs`).
pub(super) fn with_token(
    g: &ClusterState,
    token: Token,
    holder: HolderRecord,
) -> Result<HolderRecord, TableError> {
    if g.mirror.is_token_of(token, &holder) {
        Ok(holder)
    } else {
        Err(TableError::NotHeld)
    }
}

/// The holder of `name` created at `rev` among `kvs`, a linearizable read of the name's
/// holder keys at `now`.
///
/// Not seen being written: counted as if written now. A write the mirror saw with the same
/// time in it (a confirmation's rewrite) is counted from when it was seen, as the expiry
/// timer counts it. No wall clock enters: the writer's may be seconds behind this one's, and
/// the lease is live while its key is (only a guarded write ends it), so a RENEW of it must
/// not be refused (simulator seeds 120939, 141739: a RENEW refused within the ttl). CHECK
/// adds this front-end's wall clock itself.
pub(super) fn holder_read(
    g: &ClusterState,
    name: &str,
    rev: i64,
    kvs: &[KeyValue],
    now: Instant,
) -> Result<HolderRecord, TableError> {
    let Some(kv) = kvs.iter().find(|kv| kv.create_revision() == rev) else {
        return Err(TableError::NotHeld);
    };
    let value = HolderValue::decode(kv.value()).ok_or(TableError::NotHeld)?;
    let key = String::from_utf8_lossy(kv.key()).into_owned();
    let slot = key.rsplit('/').next().and_then(super::keys::decode);
    let slot = slot.unwrap_or_default();
    let left = value.left_ms();
    let seen = g.mirror.name(name).and_then(|ns| {
        let h = ns.holder_by_rev(rev)?;
        let same =
            !h.keyless && h.value.at_ms == value.at_ms && h.value.ends_ms() == value.ends_ms();
        same.then_some(h.ends_at)
    });
    let ends_at = seen.unwrap_or_else(|| now + Duration::from_millis(left));
    Ok(HolderRecord {
        uid: uid_of(&value.uid, &slot),
        slot,
        key,
        rev,
        mod_rev: kv.mod_revision(),
        lease: kv.lease(),
        ends_at,
        keyless: false,
        value,
    })
}

/// Who asks about a lease, as records name their owners.
pub(super) enum Asker<'a> {
    /// A user, by name: owns the leases recorded as that user's.
    User(&'a str),
    /// No user, where users are known: owns only a lease taken by no user.
    Nobody,
    /// No user, where there are no users: owns any lease.
    Anyone,
}

/// Whether `asker` may act on `holder` at `now`: it is live, and the asker's.
pub(super) fn owned(
    holder: &HolderRecord,
    asker: &Asker<'_>,
    now: Instant,
) -> Result<(), TableError> {
    if holder.left(now).is_zero() {
        return Err(TableError::NotHeld);
    }
    let theirs = match asker {
        Asker::User(user) => holder.value.user == *user,
        Asker::Nobody => holder.value.user.is_empty(),
        Asker::Anyone => true,
    };
    if !theirs {
        return Err(TableError::NotOwner);
    }
    Ok(())
}

/// Writes `value` over `holder` unless it changed since it was read (renewed, ended, its
/// grace started): the token stays (the key's create revision does not move). A set's every
/// key is written alike, in the same write: they are one lease. A session lease's keys go
/// onto this front-end's etcd lease `lease`: a RENEW or a LOCK again binds it to the
/// connection it came on.
pub(super) fn rewrite(
    layout: &Layout,
    holder: &HolderRecord,
    value: &HolderValue,
    lease: i64,
) -> Txn {
    let put = value
        .session_ms
        .is_some()
        .then(|| PutOptions::new().with_lease(lease));
    rewrite_with(layout, holder, value, put)
}

/// [`rewrite`], the keys left on the etcd lease they hang on: a BREAK through another
/// front-end must not move a session lease onto the breaker's etcd lease, to end with that
/// front-end (simulator seed 4957).
pub(super) fn rewrite_in_place(layout: &Layout, holder: &HolderRecord, value: &HolderValue) -> Txn {
    let put = (holder.lease != 0).then(|| PutOptions::new().with_lease(holder.lease));
    rewrite_with(layout, holder, value, put)
}

/// [`rewrite`] on no etcd lease (a lease in its lock-delay).
pub(super) fn rewrite_plain(layout: &Layout, holder: &HolderRecord, value: &HolderValue) -> Txn {
    rewrite_with(layout, holder, value, None)
}

fn rewrite_with(
    layout: &Layout,
    holder: &HolderRecord,
    value: &HolderValue,
    put: Option<PutOptions>,
) -> Txn {
    let keys = lease_keys(layout, holder);
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

/// Steps the core with a rewrite of the lease `value` records applied at revision `rev`:
/// every name of it (`name`'s set, or `name` alone) is remembered as written.
pub(super) fn wrote_lease(g: &mut ClusterState, name: &str, value: &HolderValue, rev: i64) {
    for n in names_of(name, &value.set) {
        g.wrote(n, rev, false);
    }
}
