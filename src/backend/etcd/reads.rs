//! A name as a read of etcd shows it, and how current the mirror is for it, as the
//! front-end's core decides them: the reads a transaction carries for a name, the states
//! their answers make, the holders in their lock-delay that no read can show (kept from the
//! mirror), and whether this front-end's own last write to a name is in the mirror yet (a
//! client's LOCK right after its UNLOCK is decided on the state that UNLOCK left). Pure:
//! `fresh.rs` is its driver (it sends the read and waits for the watch).

use std::time::Instant;

use super::rpc::{GetOptions, TxnOp};

use super::tokens::Tokens;

use super::keys::Layout;
use super::mirror::{KeyChange, Mirror, NameState};
use super::ClusterState;

/// The reads of `name` a transaction carries: its marker, holders and queue (what
/// [`states_read`] makes a [`NameState`] of).
pub(super) fn name_reads(layout: &Layout, name: &str) -> [TxnOp; 3] {
    let prefix = || Some(GetOptions::new().with_prefix());
    [
        TxnOp::get(layout.marker(name), None),
        TxnOp::get(layout.holders(name), prefix()),
        TxnOp::get(layout.waiters(name), prefix()),
    ]
}

/// The state of each of `names` at revision `rev`, from the keys their [`name_reads`]
/// found (`changes`: each a put), taken in at `now` and `wall_ms` with `tokens`.
pub(super) fn states_read(
    layout: &Layout,
    tokens: Tokens,
    changes: &[KeyChange],
    rev: i64,
    names: &[String],
    (now, wall_ms): (Instant, u64),
) -> Vec<NameState> {
    let mut all = Mirror {
        tokens,
        ..Mirror::default()
    };
    all.apply(layout, changes, rev, now, wall_ms);
    names
        .iter()
        .map(|name| all.names.remove(name).unwrap_or_default())
        .collect()
}

/// Adds to `states`, `names` as read at `rev`, the leases in their lock-delay that `mirror`
/// shows and the read does not: those whose key went with their front-end's etcd lease
/// ([`HolderRecord::keyless`]), which no read shows, and, if the mirror did not reach `rev`,
/// every holder it still shows that the read misses, taken to be in its delay if it has one
/// at `now` (the safe side: whether it went that way or was released only the watch tells).
/// A decision made without them would grant the name within the delay.
///
/// [`HolderRecord::keyless`]: super::mirror::HolderRecord::keyless
pub(super) fn with_delays(
    mirror: &Mirror,
    names: &[String],
    states: &mut [NameState],
    rev: i64,
    now: Instant,
) {
    let behind = mirror.rev < rev;
    for (name, read) in names.iter().zip(states.iter_mut()) {
        let Some(ns) = mirror.name(name) else {
            continue;
        };
        for h in ns.holders.values() {
            if read.holders.contains_key(&h.rev) {
                continue;
            }
            let kept = match h.keyless {
                true => Some(h.clone()),
                // (A mirror that did not reach `rev` still shows it; one past `rev`
                // shows holders granted since, which are no concern of this read.)
                false if behind && h.rev <= rev => h.delayed(now),
                false => None,
            };
            if let Some(kept) = kept {
                read.holders.insert(kept.rev, kept);
            }
        }
    }
}

/// Whether this front-end's last write to `name` is not in the mirror yet.
pub(super) fn own_write_unseen(g: &ClusterState, name: &str) -> bool {
    g.written
        .get(name)
        .is_some_and(|(rev, _)| *rev > g.mirror.rev)
}

/// Whether this front-end's last write to `name`, not yet in the mirror, emptied it.
pub(super) fn emptied_by_own_write(g: &ClusterState, name: &str) -> bool {
    g.written
        .get(name)
        .is_some_and(|(rev, emptied)| *emptied && *rev > g.mirror.rev)
}
