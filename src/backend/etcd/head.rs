//! The grant of a queue's head, as the front-end's core decides it: which head waiter of
//! this front-end is granted, the one transaction that grants it, and what that
//! transaction's answer leads to. Pure: stepped by the mirror's state, the time and the
//! answer; it sends nothing and reads no clock. `queue_head.rs` is its driver (it sends the
//! transaction, sleeps before a retry, logs, and takes a grant back), and `head_tests.rs`
//! steps it by hand.

use std::time::{Duration, Instant};

use super::rpc::{Error, PutOptions, Txn, TxnOp, TxnResponse};

use crate::backend::HandOver;
use crate::locks::{rules, Token, WaiterId};

use super::delivery::{deliver, key_gone, TakeBack};
use super::keys::{names_of, Layout};
use super::mirror::{Mirror, NameState, WaiterRecord};
use super::values::HolderValue;
use super::{guards, ClusterState};

/// Who this front-end is, as the core needs it to decide and to write.
pub(super) struct Me<'a> {
    /// The front-end's id, as its waiter keys record it.
    pub(super) fe: &'a str,
    pub(super) layout: &'a Layout,
}

/// What looking at a name's head waiter leads to.
pub(super) enum HeadStep {
    /// Nothing now: the head is another front-end's, does not fit yet, or its own request
    /// decides (its write, its grant or its leaving is out).
    Wait,
    /// Ours, but no request waits for it (its clean-up write was lost): its keys (every
    /// name of a set) go, as long as they are as written at `mod_rev`, or it would stop the
    /// queue for as long as this front-end lives.
    Forget { keys: Vec<String>, mod_rev: i64 },
    /// Its grant is tried.
    Try(Box<Attempt>),
}

/// A grant being tried for a head waiter.
pub(super) struct Attempt {
    pub(super) waiter: WaiterId,
    pub(super) name: String,
    pub(super) id: String,
    /// Per name granted (one, or every name of a set): the name, the marker's revision the
    /// grant depends on, and the waiter's key on it.
    pub(super) parts: Vec<(String, i64, String)>,
    pub(super) uid: String,
    pub(super) slot: String,
    /// The waiter key's create revision (its place) and mod revision (its writer's).
    pub(super) rev: i64,
    pub(super) mod_rev: i64,
    pub(super) value: HolderValue,
    pub(super) waited: Duration,
}

/// Grants the head waiter of `name` if it is ours and fits; `wall_ms`: this front-end's
/// wall clock, which the holder's deadline is written in. Only the head: the others follow
/// one by one as each grant shows up in the watch, which keeps FIFO exact.
pub(super) fn head_step(
    g: &mut ClusterState,
    me: &Me<'_>,
    name: &str,
    now: Instant,
    wall_ms: u64,
) -> HeadStep {
    let Some(ns) = g.mirror.name(name) else {
        return HeadStep::Wait;
    };
    let Some(head) = ns.queue.values().next() else {
        return HeadStep::Wait;
    };
    if head.value.fe != me.fe {
        return HeadStep::Wait;
    }
    let Some(&waiter) = g.by_uid.get(&head.uid) else {
        let keys = names_of(name, &head.value.set)
            .into_iter()
            .map(|n| me.layout.waiter(n, &head.slot))
            .collect();
        return HeadStep::Forget {
            keys,
            mod_rev: head.mod_rev,
        };
    };
    // Per name it waits on: the marker the grant depends on, and the name's last change (a
    // set is tried again once any of its names changed).
    let Some(places) = ready_places(&g.mirror, me.fe, name, head) else {
        return HeadStep::Wait;
    };
    if g.mirror.rev < head.rev {
        return HeadStep::Wait;
    }
    let last_rev = places.iter().map(|p| p.2).max().unwrap_or(ns.last_rev);
    let (head_rev, head_mod) = (head.rev, head.mod_rev);
    let Some(local) = g.waiting.get_mut(&waiter) else {
        return HeadStep::Wait;
    };
    // A request whose own write is not answered yet may be taking over an older request's
    // place: until the answer says which key is its own, a grant tried now would use the
    // wrong one, fail, and not be tried again before the name changes. The answer evaluates
    // the name again (`enqueue`). A waiter on its way out is not granted: the answer to its
    // leaving decides.
    if !local.phase.try_grant(last_rev) {
        return HeadStep::Wait;
    }
    local.rev = head_rev;
    let waited = now.saturating_duration_since(local.queued);
    let mut value = local.value.holder(wall_ms);
    value.uid.clone_from(&local.uid);
    value.waited_ms = Some(waited.as_millis() as u64);
    let parts = if local.set.is_empty() {
        vec![(name.to_owned(), places[0].1, local.key.clone())]
    } else {
        places
            .into_iter()
            .map(|(n, marker_rev, _)| {
                let key = me.layout.waiter(&n, &local.slot);
                (n, marker_rev, key)
            })
            .collect()
    };
    HeadStep::Try(Box::new(Attempt {
        waiter,
        name: name.to_owned(),
        id: local.req.id.clone(),
        parts,
        uid: local.uid.clone(),
        slot: local.slot.clone(),
        rev: head_rev,
        mod_rev: head_mod,
        value,
        waited,
    }))
}

/// Whether the head waiter `head` of `name` is granted now, as [`rules::set_ready`] says
/// over every name it waits on (one name: just `name`): then, per name, the name, its
/// marker's revision and its last change.
fn ready_places(
    mirror: &Mirror,
    fe: &str,
    name: &str,
    head: &WaiterRecord,
) -> Option<Vec<(String, i64, i64)>> {
    let names = names_of(name, &head.value.set);
    let states: Vec<&NameState> = names
        .iter()
        .map(|n| mirror.name(n))
        .collect::<Option<_>>()?;
    let views: Vec<_> = states.iter().map(|ns| ns.view(fe)).collect();
    let ready = rules::set_ready(views.iter().map(|v| (v, &head.rev)), head.value.mode);
    ready.then(|| {
        names
            .iter()
            .zip(&states)
            .map(|(n, ns)| ((*n).to_owned(), ns.marker_rev, ns.last_rev))
            .collect()
    })
}

/// The grant of a head waiter: "the marker is as I saw it, my key is there, nobody is ahead
/// of me" -> holder in, waiter out, marker written (`marker`: its value); for a set, on
/// every one of its names in the same write. `holder_put`: the holder's etcd lease, for a
/// session lease.
pub(super) fn grant_txn(
    layout: &Layout,
    a: &Attempt,
    marker: &str,
    holder_put: Option<PutOptions>,
) -> Txn {
    let encoded = a.value.encode();
    let mut when = Vec::new();
    let mut ops = Vec::new();
    for (name, marker_rev, key) in &a.parts {
        when.extend(guards::head_grant(
            layout,
            name,
            *marker_rev,
            (key, a.rev, a.mod_rev),
        ));
        ops.extend([
            TxnOp::put(layout.marker(name), marker.to_owned(), None),
            TxnOp::put(
                layout.holder(name, &a.slot),
                encoded.clone(),
                holder_put.clone(),
            ),
            TxnOp::delete(key.clone(), None),
        ]);
    }
    Txn::new().when(when).and_then(ops)
}

/// What the answer to a head grant leads to, for the driver to carry out.
pub(super) enum HeadAfter {
    /// Granted at `token`, and delivered to its waiter unless a grant to take back is given
    /// (the waiter left meanwhile). The driver logs the grant.
    Granted {
        token: Token,
        back: Option<TakeBack>,
    },
    /// Not granted: look at the name again now (`retry`), after a pause (`pause`: etcd did
    /// not answer), or not before it changes (neither).
    NotGranted { retry: bool, pause: bool },
}

/// Steps the core with the answer to attempt `a`'s transaction (`Err`: etcd did not answer,
/// or refused it without applying it).
pub(super) fn head_answered(
    g: &mut ClusterState,
    a: &Attempt,
    answer: &Result<TxnResponse, Error>,
    now: Instant,
) -> HeadAfter {
    if let Some(resp) = answer.as_ref().ok().filter(|r| r.succeeded()) {
        let rev = resp.header().map_or(0, |h| h.revision());
        for (name, _, _) in &a.parts {
            g.wrote(name, rev, false);
        }
        // The waiter hears of it now, or from the watch if that saw it first (the watch also
        // delivers a grant whose answer was lost on the way back).
        let token = g.mirror.token(rev, &a.slot);
        let back = deliver(
            g,
            &a.uid,
            &a.name,
            token,
            a.value.ttl_ms,
            HandOver(rev),
            now,
        );
        return HeadAfter::Granted { token, back };
    }
    let unreachable = answer.is_err();
    let last = g.mirror.name(&a.name).map_or(0, |ns| ns.last_rev);
    let still_queued = g
        .mirror
        .name(&a.name)
        .is_some_and(|ns| ns.queue.contains_key(&a.rev));
    // (Confirming a grant made meanwhile, or leaving: that answer decides.)
    let settled = g
        .waiting
        .get(&a.waiter)
        .is_some_and(|l| !matches!(l.phase, super::Phase::Granting { .. }));
    if !unreachable && !still_queued && g.mirror.rev >= a.rev && !settled {
        // Its key went while the grant was tried (a newer LOCK of its id).
        if let Some(l) = g.waiting.remove(&a.waiter) {
            g.by_uid.remove(&l.uid);
            let why = key_gone(g, &l);
            let _ = l.tx.send(why);
        }
    }
    let retry = g
        .waiting
        .get_mut(&a.waiter)
        .is_some_and(|local| local.phase.grant_failed(unreachable, last));
    HeadAfter::NotGranted {
        retry: retry || unreachable,
        pause: unreachable,
    }
}

/// Keys of ours new in the queue that no request waits for (a write that reached etcd after
/// this front-end gave up on it) leave it now, before they reach its head and are granted
/// (simulator seed 7967): `new`, each a name and a waiter key's create revision, as the watch
/// (or a read of every lock) showed them. Once each, at their arrival, not on every change of
/// the name (a write out may take a while in an outage). Returns the writes to send, as
/// [`HeadStep::Forget`] says; each is remembered in `g.forgetting` until it is answered.
pub(super) fn orphans(
    g: &mut ClusterState,
    me: &Me<'_>,
    new: &[(String, i64)],
) -> Vec<(Vec<String>, i64)> {
    let mut forget = Vec::new();
    for (name, rev) in new {
        let Some(orphan) = g.mirror.name(name).and_then(|ns| ns.queue.get(rev)) else {
            continue;
        };
        if orphan.value.fe != me.fe || g.by_uid.contains_key(&orphan.uid) {
            continue;
        }
        let keys: Vec<String> = names_of(name, &orphan.value.set)
            .into_iter()
            .map(|n| me.layout.waiter(n, &orphan.slot))
            .collect();
        let mod_rev = orphan.mod_rev;
        if g.forgetting.insert(keys[0].clone()) {
            forget.push((keys, mod_rev));
        }
    }
    forget
}
