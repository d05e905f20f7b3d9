//! The head of a queue, when it is this front-end's waiter: granted by this front-end once
//! it fits (one write: holder in, waiter out, marker written, on every name of a set), one
//! head at a time so that FIFO holds across front-ends; and keys of ours that no request
//! waits for, taken out before they reach the head.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{Txn, TxnOp};

use crate::backend::{now, HandOver};
use crate::locks::{rules, EventKind};

use super::handover::deliver;
use super::keys::names_of;
use super::values::HolderValue;
use super::waiters::key_gone;
use super::RETRY;
use super::{guards, Cluster, ClusterState, Phase};

impl Cluster {
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
