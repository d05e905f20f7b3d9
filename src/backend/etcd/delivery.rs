//! What this front-end's waiters are told, as its core decides it: a grant (made by any
//! front-end, shown by the watch, a read or its own write's answer) delivered to the request
//! waiting for it, once, whichever comes first; confirmed first when it hangs on this
//! front-end's etcd lease (`confirmation.rs`); taken back, only as it was handed over, when
//! its waiter left; a place taken over by a LOCK of the same id; a wait whose key went. Pure:
//! `handover.rs` carries out what it returns.

use std::time::{Duration, Instant};

use crate::backend::{BackendError, HandOver, WaitResult};
use crate::locks::{Token, WaitEnd};

use super::mirror::{Granted, HolderRecord};
use super::state::Local;
use super::{ClusterState, Phase};

/// A grant to take back: it was handed over as `handover` to a waiter that had left.
pub(super) struct TakeBack {
    pub(super) name: String,
    pub(super) token: Token,
    pub(super) handover: HandOver,
}

/// The version (mod revision) a take-back of `holder`, handed over as `handover`, requires
/// its key to be at: as it was handed over (a client told of it since, by a RENEW, a LOCK of its id or a confirmation,
/// rewrote it, and keeps it), or as a BREAK marked that very version since: after the mark
/// nobody is told of it, so the mark alone does not make it a grant a client knows of
/// (simulator seed 140536: a grant to a waiter that had left, broken before its take-back,
/// sat out its ttl and lock-delay).
pub(super) fn take_back_at(holder: &HolderRecord, handover: HandOver) -> i64 {
    let marked = holder.value.broken_by.is_some() && holder.value.broken_over == handover.0;
    if marked {
        holder.mod_rev
    } else {
        handover.0
    }
}

/// What to do with a grant to a waiter of this front-end.
pub(super) enum GrantAction {
    Nothing,
    TakeBack(TakeBack),
    Confirm(Granted),
}

/// A waiter of this front-end whose key another front-end rewrote for a LOCK of the same id
/// (its place taken over): its request is answered `ERR REPLACED`, as on one server.
pub(super) fn taken_over(g: &mut ClusterState, uid: &str) {
    let Some(&waiter) = g.by_uid.get(uid) else {
        g.left.remove(uid);
        return;
    };
    // A request of ours whose own write (taking the place over) is not answered yet: the
    // record seen is the one it replaces.
    if g.waiting
        .get(&waiter)
        .is_some_and(|l| l.phase == Phase::Writing)
    {
        return;
    }
    g.left.remove(uid);
    g.by_uid.remove(uid);
    if let Some(l) = g.waiting.remove(&waiter) {
        let _ = l.tx.send(WaitResult::Ended(WaitEnd::Replaced));
    }
}

/// Decides what a grant to waiter `gr.uid` of this front-end, just shown by the watch or a
/// read, leads to: delivered to its waiter now, confirmed first (a plain lease on this
/// front-end's etcd lease), or taken back (its waiter left; only as it was handed over).
pub(super) fn on_grant(g: &mut ClusterState, gr: &Granted, now: Instant) -> GrantAction {
    let handover = HandOver(gr.mod_rev);
    // What a confirmation of this grant writes: the holder as shown, on no etcd lease.
    let shown = g
        .mirror
        .name(&gr.name)
        .and_then(|ns| ns.holder_by_rev(gr.rev))
        .map(|h| h.value.encode());
    if gr.unconfirmed() {
        let waiter = g.by_uid.get(&gr.uid).copied();
        return match waiter.and_then(|w| g.waiting.get_mut(&w)) {
            Some(l) if l.phase.confirming().is_some() => GrantAction::Nothing,
            Some(l) => {
                l.phase.confirm(shown.unwrap_or_default());
                GrantAction::Confirm(gr.clone())
            }
            // Its waiter left, or nobody waits for it here any more (the wait was lost
            // with an etcd lease): never told, so taken back.
            None => {
                g.left.remove(&gr.uid);
                GrantAction::TakeBack(TakeBack {
                    name: gr.name.clone(),
                    token: gr.token,
                    handover,
                })
            }
        };
    }
    // A grant being confirmed is delivered by its confirmation ([`Cluster::confirm`]), whose
    // write the watch may show before its answer comes, or instead of it when answers are
    // lost, for as long as etcd is hard to reach (seconds: the lease then sat out its ttl
    // with its waiter told nothing, simulator seed 45109). The watch delivers it when it shows
    // that very write (the value the confirmation writes, on no etcd lease), and the
    // confirmation's answer then changes nothing: were it to deliver again, it would find
    // nobody waiting and take back a grant its client was told of (seed 525). Any other
    // rewrite (a RENEW, a claim by a LOCK of its id, a lock-delay) is the confirmation's to
    // judge.
    // So is one whose waiter left while it was confirmed: the watch takes it back when it
    // shows that write, as the answer would (the front-end may die before the answer comes,
    // and the grant would then sit out its ttl; simulator seed 194622).
    let confirming = g.by_uid.get(&gr.uid).and_then(|w| g.waiting.get(w));
    let writes = confirming
        .and_then(|l| l.phase.confirming())
        .or_else(|| g.left_confirming.get(&gr.uid).map(String::as_str))
        .map(str::to_owned);
    if let Some(writes) = writes {
        let own_write = !gr.session && gr.lease == 0 && shown.as_deref() == Some(&*writes);
        if !own_write {
            return GrantAction::Nothing;
        }
        g.left_confirming.remove(&gr.uid);
        g.confirmed_by_watch.insert(gr.uid.clone());
        return match deliver(g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover, now) {
            Some(back) => GrantAction::TakeBack(back),
            None => GrantAction::Nothing,
        };
    }
    // A grant rewritten since it was made, and not for a request waiting here, was claimed:
    // renewed, or taken by a LOCK of the same id, through any front-end (a confirmation's
    // rewrite is its waiter's, and [`Cluster::confirm`] decides about it). Its client was
    // told of it: never taken back, even if the request it was made for left (simulator
    // seed 13041).
    let confirming = g.by_uid.get(&gr.uid).and_then(|w| g.waiting.get(w));
    if gr.mod_rev != gr.rev && confirming.is_none() {
        g.left.remove(&gr.uid);
        return GrantAction::Nothing;
    }
    match deliver(g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover, now) {
        Some(back) => GrantAction::TakeBack(back),
        None => GrantAction::Nothing,
    }
}

/// Hands a grant made for waiter `uid` to it, once (from the grant's answer or from the watch,
/// whichever comes first). A waiter that left meanwhile never learns of it: the grant to take
/// back is returned. A request waiting under `uid` comes first: one that took over the place
/// of a request of its id that left (the same LOCK again) is the one the grant is for, and
/// the older one's leaving no longer counts (taking the grant back after handing it over
/// would leave a client told it holds a lock that passed on).
pub(super) fn deliver(
    g: &mut ClusterState,
    uid: &str,
    name: &str,
    token: Token,
    ttl_ms: u64,
    handover: HandOver,
    now: Instant,
) -> Option<TakeBack> {
    let back = || TakeBack {
        name: name.to_owned(),
        token,
        handover,
    };
    let waiting = g
        .by_uid
        .get(uid)
        .copied()
        .filter(|w| g.waiting.contains_key(w));
    let Some(waiter) = waiting else {
        // Left: taken back. Else not waited for here (another front-end's, or delivered
        // already): nothing to do.
        return g.left.remove(uid).then(back);
    };
    g.left.remove(uid);
    g.by_uid.remove(uid);
    let local = g.waiting.remove(&waiter)?;
    let deadline = now + Duration::from_millis(ttl_ms);
    let sent = local.tx.send(WaitResult::Granted {
        token,
        deadline,
        handover,
    });
    if sent.is_ok() && local.req.session().is_some() {
        // The backend ends it when its connection closes.
        g.bound.add(local.req.conn, token, name);
    }
    sent.is_err().then(back)
}

/// A grant that this front-end's own release made, in the same write, for a waiter of this
/// front-end: delivered from the write's answer, as a grant this front-end tries itself is
/// (`queue_head.rs`), not only once the watch shows it. The watch may be seconds behind, or
/// cut off, or compacted past it: the waiter's `wait=` ran out meanwhile and the grant sat
/// out its ttl, held by nobody, while others waited (simulator seed 650274). A waiter whose
/// own write is still out is the watch's to decide, as before. A grant to a waiter that left
/// (or whose client is gone before it could be told) is returned, to be taken back now: left
/// to the watch, which may be seconds behind, it sat out its ttl when the front-end died
/// first (simulator seed 345844). The watch takes it back too, if this has not yet.
pub(super) fn deliver_own(
    g: &mut ClusterState,
    uid: &str,
    name: &str,
    token: Token,
    ttl_ms: u64,
    handover: HandOver,
    now: Instant,
) -> Option<TakeBack> {
    let waiting = g.by_uid.get(uid).and_then(|w| g.waiting.get(w));
    match waiting {
        Some(l) if l.phase == Phase::Writing => None,
        Some(_) => {
            let back = deliver(g, uid, name, token, ttl_ms, handover, now)?;
            g.left.insert(uid.to_owned());
            Some(back)
        }
        None if g.left.contains(uid) => Some(TakeBack {
            name: name.to_owned(),
            token,
            handover,
        }),
        None => None,
    }
}

/// How the wait of `l` ends when its key is gone without its grant: a `supersede` LOCK took
/// the queue (its mark came first), a newer LOCK of its id (and user) took its place, in the
/// same write, or else its front-end's etcd lease ran out.
pub(super) fn key_gone(g: &mut ClusterState, l: &Local) -> WaitResult {
    if let Some(why) = g.superseded.remove(&l.uid) {
        return WaitResult::Ended(why);
    }
    let replaced = g.mirror.name(&l.name).is_some_and(|ns| {
        let (id, user) = (&l.value.id, l.value.user.as_str());
        crate::locks::rules::replaced_by_own_id(&ns.view(&l.value.fe), id, user)
    });
    if replaced {
        WaitResult::Ended(WaitEnd::Replaced)
    } else {
        WaitResult::Failed(BackendError::Unavailable(
            "the wait was lost: this front-end's etcd lease ran out".into(),
        ))
    }
}
