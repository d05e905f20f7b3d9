//! Grants to this front-end's waiters: the head waiter's own grant when a release left the
//! lock to it, and the delivery of a grant (made by any front-end) to the request waiting for
//! it: confirmed first when it hangs on this front-end's etcd lease, taken back when its
//! waiter left.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{Txn, TxnOp};

use crate::backend::{now, BackendError, HandOver, WaitResult};
use crate::locks::{rules, EventKind, Token, WaitEnd};

use super::keys::names_of;
use super::mirror::Granted;
use super::values::HolderValue;
use super::waiters::key_gone;
use super::RETRY;
use super::{guards, Cluster, ClusterState, Phase};

impl Cluster {
    /// Carries out what [`on_grant`] decided, off the guard.
    pub(super) fn after_grants(self: &Arc<Self>, next: Vec<GrantAction>) {
        for step in next {
            let me = Arc::clone(self);
            match step {
                GrantAction::Nothing => {}
                GrantAction::TakeBack(back) => {
                    tokio::spawn(async move {
                        me.take_back(&back.name, back.token, back.handover).await;
                    });
                }
                GrantAction::Confirm(gr) => {
                    tokio::spawn(async move { me.confirm(gr).await });
                }
            }
        }
    }

    /// Takes a plain lease that another front-end granted to a waiter of this one off this
    /// front-end's etcd lease, and then tells the waiter (see [`Granted::unconfirmed`]):
    /// from then on it outlives this front-end, as a plain lease does. A waiter that left
    /// meanwhile has its grant taken back instead; a grant that went before it was
    /// confirmed (this front-end's etcd lease ran out) is answered `ERR UNAVAILABLE`, one
    /// that a LOCK of the same id rewrote meanwhile (it took the grant over) `ERR REPLACED`.
    pub(super) async fn confirm(self: Arc<Self>, gr: Granted) {
        let holder = {
            let g = self.guard();
            g.mirror
                .name(&gr.name)
                .and_then(|ns| ns.holder_by_rev(gr.rev))
                .cloned()
        };
        let (resp, ours) = match holder {
            Some(h) => {
                let ours = h.value.encode();
                // What the watch tells this write by (`on_grant`).
                if let Some(l) = self.guard().waiting_mut(&gr.uid) {
                    l.phase.confirms_with(&ours);
                }
                let txn = Txn::new()
                    .when([guards::unchanged(&h.key, gr.mod_rev)])
                    .and_then([TxnOp::put(h.key.clone(), ours.clone(), None)])
                    .or_else([TxnOp::get(h.key.clone(), None)]);
                (self.cleanup(txn).await, ours)
            }
            None => (None, String::new()),
        };
        if let Some(r) = resp.as_ref().filter(|r| r.succeeded()) {
            self.wrote(&gr.name, r);
        }
        let outcome = confirmation(resp.as_ref(), gr.rev, ours.as_bytes());
        let rewritten = outcome == Confirmation::TakenOver;
        let confirmed = match outcome {
            Confirmation::Confirmed(rev) => Some(HandOver(rev)),
            Confirmation::TakenOver | Confirmation::Lost => None,
        };
        let back = {
            let mut g = self.guard();
            // Delivered (or taken back) already, from this write as the watch showed it.
            if g.confirmed_by_watch.remove(&gr.uid) {
                return;
            }
            match confirmed {
                Some(handover) if g.by_uid.contains_key(&gr.uid) || g.left.contains(&gr.uid) => {
                    deliver(&mut g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover)
                }
                // Nobody waits for it any more (the wait was lost with an etcd lease).
                Some(handover) => Some(TakeBack {
                    name: gr.name.clone(),
                    token: gr.token,
                    handover,
                }),
                None => {
                    g.left.remove(&gr.uid);
                    if let Some(waiter) = g.by_uid.remove(&gr.uid) {
                        if let Some(l) = g.waiting.remove(&waiter) {
                            let _ = l.tx.send(if rewritten {
                                WaitResult::Ended(WaitEnd::Replaced)
                            } else {
                                WaitResult::Failed(BackendError::Unavailable(
                                    "the grant could not be confirmed with etcd".into(),
                                ))
                            });
                        }
                    }
                    None
                }
            }
        };
        if let Some(back) = back {
            self.take_back(&back.name, back.token, back.handover).await;
        }
    }

    /// Keys of ours new in the queue that no request waits for (a write that reached etcd
    /// after this front-end gave up on it) leave it now, before they reach its head and are
    /// granted (simulator seed 7967): `new`, each a name and a waiter key's create revision,
    /// as the watch (or a read of every lock) showed them. Once each, at their arrival, not on
    /// every change of the name (a write out may take a while in an outage).
    pub(super) fn sweep_orphans(self: &Arc<Self>, g: &mut ClusterState, new: &[(String, i64)]) {
        for (name, rev) in new {
            let Some(orphan) = g.mirror.name(name).and_then(|ns| ns.queue.get(rev)) else {
                continue;
            };
            if orphan.value.fe != self.fe || g.by_uid.contains_key(&orphan.uid) {
                continue;
            }
            let keys: Vec<String> = names_of(name, &orphan.value.set)
                .into_iter()
                .map(|n| self.layout.waiter(n, &orphan.slot))
                .collect();
            if g.forgetting.insert(keys[0].clone()) {
                self.forget_waiter_keys(keys, orphan.mod_rev);
            }
        }
    }

    /// Grants the head waiter of `name` if it is ours and fits. Only the head: the others
    /// follow one by one as each grant shows up in the watch, which keeps FIFO exact.
    pub(super) fn evaluate(self: &Arc<Self>, name: &str) {
        let attempt = {
            let mut g = self.guard();
            let g = &mut *g;
            let Some(ns) = g.mirror.name(name) else {
                return;
            };
            let Some(head) = ns.queue.values().next() else {
                return;
            };
            if head.value.fe != self.fe {
                return;
            }
            let Some(&waiter) = g.by_uid.get(&head.uid) else {
                // Ours but no longer waited for (its clean-up write was lost): take it out,
                // or it would stop the queue for as long as this front-end lives.
                // (It only spawns the write: the guard may stay held.)
                let keys = names_of(name, &head.value.set)
                    .into_iter()
                    .map(|n| self.layout.waiter(n, &head.slot))
                    .collect();
                self.forget_waiter_keys(keys, head.mod_rev);
                return;
            };
            // Per name it waits on: the marker the grant depends on, and the name's last
            // change (a set is tried again once any of its names changed).
            let Some(places) = self.ready_places(&g.mirror, name, head) else {
                return;
            };
            if g.mirror.rev < head.rev {
                return;
            }
            let last_rev = places.iter().map(|p| p.2).max().unwrap_or(ns.last_rev);
            let (head_rev, head_mod) = (head.rev, head.mod_rev);
            let Some(local) = g.waiting.get_mut(&waiter) else {
                return;
            };
            // A request whose own write is not answered yet may be taking over an older
            // request's place: until the answer says which key is its own, a grant tried
            // now would use the wrong one, fail, and not be tried again before the name
            // changes. The answer evaluates the name again (`enqueue`).
            // A waiter on its way out is not granted: the answer to its leaving decides.
            if !local.phase.try_grant(last_rev) {
                return;
            }
            local.rev = head_rev;
            let waited = now().saturating_duration_since(local.queued);
            let mut value = local.value.holder(self.wall_ms());
            value.uid.clone_from(&local.uid);
            value.waited_ms = Some(waited.as_millis() as u64);
            let parts = if local.set.is_empty() {
                vec![(name.to_owned(), places[0].1, local.key.clone())]
            } else {
                places
                    .into_iter()
                    .map(|(n, marker_rev, _)| {
                        let key = self.layout.waiter(&n, &local.slot);
                        (n, marker_rev, key)
                    })
                    .collect()
            };
            Attempt {
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
            }
        };
        let me = Arc::clone(self);
        tokio::spawn(async move { me.try_grant(attempt).await });
    }

    /// Whether the head waiter `head` of `name` is granted now, as [`rules::set_ready`]
    /// says over every name it waits on (one name: just `name`): then, per name, the
    /// name, its marker's revision and its last change.
    fn ready_places(
        &self,
        mirror: &super::mirror::Mirror,
        name: &str,
        head: &super::mirror::WaiterRecord,
    ) -> Option<Vec<(String, i64, i64)>> {
        let names = names_of(name, &head.value.set);
        let states: Vec<&super::mirror::NameState> = names
            .iter()
            .map(|n| mirror.name(n))
            .collect::<Option<_>>()?;
        let views: Vec<_> = states.iter().map(|ns| ns.view(&self.fe)).collect();
        let ready = rules::set_ready(views.iter().map(|v| (v, &head.rev)), head.value.mode);
        ready.then(|| {
            names
                .iter()
                .zip(&states)
                .map(|(n, ns)| ((*n).to_owned(), ns.marker_rev, ns.last_rev))
                .collect()
        })
    }

    /// The grant of a head waiter: "the marker is as I saw it, my key is there, nobody is
    /// ahead of me" -> holder in, waiter out, marker written; for a set, on every one of
    /// its names in the same write.
    async fn try_grant(self: Arc<Self>, a: Attempt) {
        let encoded = a.value.encode();
        let mut when = Vec::new();
        let mut ops = Vec::new();
        for (name, marker_rev, key) in &a.parts {
            let holder = self.layout.holder(name, &a.slot);
            when.extend(guards::head_grant(
                &self.layout,
                name,
                *marker_rev,
                (key, a.rev, a.mod_rev),
            ));
            ops.extend([
                TxnOp::put(
                    self.layout.marker(name),
                    self.marker(EventKind::Acquired, 0),
                    None,
                ),
                TxnOp::put(
                    holder,
                    encoded.clone(),
                    self.holder_put(a.value.session_ms.is_some()),
                ),
                TxnOp::delete(key.clone(), None),
            ]);
        }
        let txn = Txn::new().when(when).and_then(ops);
        let result = self.txn(txn).await;
        let granted = match &result {
            Ok(resp) if resp.succeeded() => {
                for (name, _, _) in &a.parts {
                    self.wrote(name, resp);
                }
                resp.header().map(|h| h.revision())
            }
            _ => None,
        };
        let Some(rev) = granted else {
            let retry_now = {
                let mut g = self.guard();
                let last = g.mirror.name(&a.name).map_or(0, |ns| ns.last_rev);
                let still_queued = g
                    .mirror
                    .name(&a.name)
                    .is_some_and(|ns| ns.queue.contains_key(&a.rev));
                // (Confirming a grant made meanwhile, or leaving: that answer decides.)
                let settled = g
                    .waiting
                    .get(&a.waiter)
                    .is_some_and(|l| !matches!(l.phase, Phase::Granting { .. }));
                if result.is_ok() && !still_queued && g.mirror.rev >= a.rev && !settled {
                    // Its key went while the grant was tried (a newer LOCK of its id).
                    if let Some(l) = g.waiting.remove(&a.waiter) {
                        g.by_uid.remove(&l.uid);
                        let why = key_gone(&mut g, &l);
                        let _ = l.tx.send(why);
                    }
                }
                // (etcd unreachable: tried again after a pause.)
                g.waiting
                    .get_mut(&a.waiter)
                    .is_some_and(|local| local.phase.grant_failed(result.is_err(), last))
            };
            if result.is_err() {
                tokio::time::sleep(RETRY).await;
            }
            if retry_now || result.is_err() {
                self.evaluate(&a.name);
            }
            return;
        };
        // The waiter hears of it now, or from the watch if that saw it first (the watch also
        // delivers a grant whose answer was lost on the way back).
        let (token, back) = {
            let mut g = self.guard();
            let token = g.mirror.token(rev);
            let handover = HandOver(rev);
            let back = deliver(&mut g, &a.uid, &a.name, token, a.value.ttl_ms, handover);
            (token, back)
        };
        for (name, _, _) in &a.parts {
            self.granted_log(name, &a.id, token, Some(a.waited), &a.value.origin());
        }
        if let Some(back) = back {
            self.take_back(&back.name, back.token, back.handover).await;
        }
    }
}

/// What the answer to [`Cluster::confirm`]'s write says of the grant.
#[derive(Debug, PartialEq)]
enum Confirmation {
    /// It hangs on no etcd lease any more, since the write at this revision.
    Confirmed(i64),
    /// A LOCK of the same id rewrote it first: that request took the grant over.
    TakenOver,
    /// It is gone (the front-end's etcd lease ran out), or etcd never answered.
    Lost,
}

/// Reads the answer to a confirmation: the rewrite of the holder created at `rev` with
/// `ours` and no etcd lease, else a read of it. The write is tried again when an answer is
/// lost, and the lost one may have been applied: then the read finds the holder exactly as
/// this confirmation writes it, which is confirmed, not taken over (taken for a takeover, the
/// client was told `ERR REPLACED` while the grant sat out its ttl).
fn confirmation(resp: Option<&super::rpc::TxnResponse>, rev: i64, ours: &[u8]) -> Confirmation {
    use super::rpc::TxnOpResponse;
    let Some(resp) = resp else {
        return Confirmation::Lost;
    };
    if resp.succeeded() {
        return Confirmation::Confirmed(resp.header().map_or(0, |h| h.revision()));
    }
    let found = resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(got) => got.kvs().iter().find(|kv| kv.create_revision() == rev),
        _ => None,
    });
    match found {
        Some(kv) if kv.lease() == 0 && kv.value() == ours => {
            Confirmation::Confirmed(kv.mod_revision())
        }
        // Over for its holder before it could be told (its ttl ran out into its lock-delay,
        // or it was broken): not taken over by anyone, and nothing to deliver.
        Some(kv) if HolderValue::decode(kv.value()).is_some_and(|v| v.lingering()) => {
            Confirmation::Lost
        }
        Some(_) => Confirmation::TakenOver,
        None => Confirmation::Lost,
    }
}

/// A grant being tried for a head waiter.
struct Attempt {
    waiter: crate::locks::WaiterId,
    name: String,
    id: String,
    /// Per name granted (one, or every name of a set): the name, the marker's revision the
    /// grant depends on, and the waiter's key on it.
    parts: Vec<(String, i64, String)>,
    uid: String,
    slot: String,
    rev: i64,
    mod_rev: i64,
    value: HolderValue,
    waited: Duration,
}

/// A grant to take back: it was handed over as `handover` to a waiter that had left.
pub(super) struct TakeBack {
    name: String,
    token: Token,
    handover: HandOver,
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
pub(super) fn on_grant(g: &mut ClusterState, gr: &Granted) -> GrantAction {
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
    let confirming = g.by_uid.get(&gr.uid).and_then(|w| g.waiting.get(w));
    if let Some(writes) = confirming.and_then(|l| l.phase.confirming()) {
        let own_write = !gr.session && gr.lease == 0 && shown.as_deref() == Some(writes);
        if !own_write {
            return GrantAction::Nothing;
        }
        g.confirmed_by_watch.insert(gr.uid.clone());
        return match deliver(g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover) {
            Some(back) => GrantAction::TakeBack(back),
            None => GrantAction::Nothing,
        };
    }
    // A grant rewritten since it was made, and not for a request waiting here, was claimed:
    // renewed, or taken by a LOCK of the same id, through any front-end (a confirmation's
    // rewrite is its waiter's, and [`Cluster::confirm`] decides about it). Its client was
    // told of it: never taken back, even if the request it was made for left (simulator
    // seed 13041).
    if gr.mod_rev != gr.rev && confirming.is_none() {
        g.left.remove(&gr.uid);
        return GrantAction::Nothing;
    }
    match deliver(g, &gr.uid, &gr.name, gr.token, gr.ttl_ms, handover) {
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
fn deliver(
    g: &mut ClusterState,
    uid: &str,
    name: &str,
    token: Token,
    ttl_ms: u64,
    handover: HandOver,
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
    let deadline = now() + Duration::from_millis(ttl_ms);
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

#[cfg(test)]
#[path = "handover_tests.rs"]
mod tests;
