//! The expiry timer's writes, as the front-end's core decides them (which leases end, and
//! how, is `expiring.rs`'s): a lease's record rewritten into its lock-delay, a lease ended
//! unless it was renewed meanwhile, and the marker of a name that its end left empty removed.
//! Pure: `expiry.rs` is its driver (it sends the writes, tries them again while etcd is
//! away), and `expired_tests.rs` steps it by hand.

use super::rpc::{Compare, Txn, TxnOp, TxnResponse};

use super::end::Ended;
use super::holding::{rewrite_plain, wrote_lease};
use super::keys::{names_of, Layout};
use super::mirror::HolderRecord;
use super::values::HolderValue;
use super::{guards, ClusterState};

/// Rewrites `holder` as `value`, its record in its lock-delay (`expiring::delaying`), unless
/// it changed since. On no etcd lease, as a plain lease: over for its holder, it ends by its
/// deadline, through whichever front-end is alive then (on this one's etcd lease, it went
/// with this front-end).
pub(super) fn delay_txn(layout: &Layout, holder: &HolderRecord, value: &HolderValue) -> Txn {
    rewrite_plain(layout, holder, value)
}

/// Steps the core with the answer `resp` to [`delay_txn`]'s write of `value` on `name`: the
/// lease's names are remembered as written if it was made (a RENEW that came first wins).
pub(super) fn delay_written(
    g: &mut ClusterState,
    name: &str,
    value: &HolderValue,
    resp: &TxnResponse,
) {
    if resp.succeeded() {
        wrote_lease(g, name, value, resp.header().map_or(0, |h| h.revision()));
    }
}

/// The guard of an expiry's end of `holder`: unless renewed meanwhile (a renewal rewrites
/// the key).
pub(super) fn not_renewed(holder: &HolderRecord) -> Compare {
    guards::unchanged(&holder.key, holder.mod_rev)
}

/// After an expiry's end `ended` of `holder` of `name`, answered `resp` (`was_ended`: the
/// core found it ended the holder): the writes that remove the marker of each name left
/// with no holder and no waiter, each on its own (one name of a set may be left to others,
/// another empty). None when it did not end the holder, or ended it by granting the next
/// waiter: nothing to tidy.
pub(super) fn tidy(
    layout: &Layout,
    name: &str,
    holder: &HolderRecord,
    (ended, resp): (&Ended, &TxnResponse),
    was_ended: bool,
) -> Vec<Txn> {
    let granted = ended.head.is_some() && resp.succeeded();
    if !was_ended || granted {
        return Vec::new();
    }
    let rev = resp.header().map_or(0, |h| h.revision());
    names_of(name, &holder.value.set)
        .into_iter()
        .map(|name| {
            Txn::new()
                .when([
                    guards::marker_at(layout, name, rev),
                    guards::nobody_holds(layout, name),
                    guards::nobody_waits(layout, name),
                ])
                .and_then([TxnOp::delete(layout.marker(name), None)])
        })
        .collect()
}
