//! A wait's end, however it comes: its `wait=` running out (the write that takes its place
//! out, and what etcd's answer to it says), its connection going away, this front-end cut
//! off from etcd for longer than its etcd lease, its key gone without its grant; and the
//! clean-up of keys nobody waits on. A queued LOCK's own write is `enqueue.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use super::delivery::key_gone;
use super::rpc::{Txn, TxnOp};
use tokio::sync::oneshot;

use crate::backend::{now, BackendError, WaitResult};
use crate::locks::{WaitEnd, WaiterId};

use super::{guards, Cluster, Local};

impl Cluster {
    /// Ends the wait of `waiter` once its `wait=` runs out ([`Cluster::wait_over`]); `None`
    /// waits without bound. The timer is a task that ends early when the waiter leaves the
    /// queue otherwise (granted, gone, replaced): the waiter's record holds the other end of
    /// its stop channel.
    pub(super) fn end_wait_after(self: &Arc<Self>, waiter: WaiterId, wait: Option<Duration>) {
        let Some(wait) = wait else {
            return;
        };
        let (stop, stopped) = oneshot::channel();
        match self.guard().waiting.get_mut(&waiter) {
            Some(local) => local.timer = Some(stop),
            // Already granted or gone.
            None => return,
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = tokio::time::sleep(wait) => me.wait_over(waiter),
                _ = stopped => {}
            }
        });
    }

    /// A waiter's `wait=` ran out: it leaves the queue, and etcd's answer to the write that
    /// takes its place out says how its wait ends. etcd orders that write and any grant: a
    /// grant made first is the waiter's (`OK`, a moment after its `wait=`); `ERR TIMEOUT`
    /// only once its place is out. Told `ERR TIMEOUT` while holding a grant, a client has a
    /// lock that nobody uses, and that only this front-end would take back: were it to die
    /// first, the lock would sit out its ttl.
    ///
    /// If etcd does not answer within `--etcd-request-timeout`, the client is told
    /// `ERR UNAVAILABLE`, as for any LOCK whose answer was lost: the waiter has left (a grant
    /// shown later is taken back, unless the same LOCK sent again took it), and the write is
    /// tried on as any clean-up is.
    pub(super) fn wait_over(self: &Arc<Self>, waiter: WaiterId) {
        let txn = {
            let mut g = self.guard();
            let Some(local) = g.waiting.get_mut(&waiter) else {
                return;
            };
            if !local.phase.leave() {
                return;
            }
            let local = &*local;
            (self.leave_txn(local), self.local_keys(local), local.mod_rev)
        };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let (txn, keys, mod_rev) = txn;
            // Tried again for as long as one request may take: a write refused at once (an
            // endpoint down) need not end the wait without knowing.
            let started = now();
            let mut tries = 0;
            let answer = loop {
                tries += 1;
                match me.txn(txn.clone()).await {
                    Err(e)
                        if now().saturating_duration_since(started) < me.config.request_timeout =>
                    {
                        me.unhealthy(&me.cause_of(&e).sentence);
                        tokio::time::sleep(super::RETRY).await;
                    }
                    done => break done,
                }
            };
            let mut g = me.guard();
            let g = &mut *g;
            let resp = match answer {
                Ok(resp) => resp,
                // Whether a grant came first is not known: as any LOCK whose answer was
                // lost, the client may send it again (its grant, if there is one, is then
                // its own; else this front-end takes it back once it shows).
                Err(e) => {
                    if let Some(l) = g.leave(waiter) {
                        let _ = l.tx.send(WaitResult::Failed(me.unavailable(&e)));
                    }
                    me.forget_waiter_keys(keys, mod_rev);
                    return;
                }
            };
            let how = match left_how(&resp) {
                // Gone on a try after the first: the first one's delete, most likely.
                Left::Gone if tries > 1 => Left::Out,
                how => how,
            };
            match how {
                Left::Out => {
                    if let Some(l) = g.leave(waiter) {
                        let _ = l.tx.send(WaitResult::Ended(WaitEnd::TimedOut));
                    }
                }
                // The grant came first: its answer, the watch or its confirmation delivers
                // it; the same for a LOCK of its id that took its place over.
                Left::Granted | Left::TakenOver => {
                    if let Some(l) = g.waiting.get_mut(&waiter) {
                        l.phase.stays();
                    }
                }
                // Gone without a grant, before the write: why, as the watch would say.
                Left::Gone => {
                    if let Some(l) = g.waiting.remove(&waiter) {
                        g.by_uid.remove(&l.uid);
                        let why = key_gone(g, &l);
                        let _ = l.tx.send(why);
                    }
                }
            }
        });
    }

    /// The write of [`Cluster::wait_over`]: each waiter key of `local` out unless it changed
    /// since this front-end wrote it (one guarded part per key, as [`forget_txn`]), else read;
    /// and the holder key a grant to it would have made, read.
    fn leave_txn(&self, local: &Local) -> Txn {
        let parts = self
            .local_keys(local)
            .into_iter()
            .map(|k| TxnOp::txn(forget_one(&k, local.mod_rev).or_else([TxnOp::get(k, None)])));
        let holder = TxnOp::get(self.layout.holder(&local.name, &local.slot), None);
        Txn::new().and_then(parts.chain(std::iter::once(holder)).collect::<Vec<_>>())
    }

    /// Every waiter key of `local`: its own, or one per name of its set (same slot).
    pub(super) fn local_keys(&self, local: &Local) -> Vec<String> {
        if local.set.is_empty() {
            return vec![local.key.clone()];
        }
        local
            .set
            .iter()
            .map(|n| self.layout.waiter(n, &local.slot))
            .collect()
    }

    /// Takes a waiter's keys (one, or a set's) out of the queue in one write, retrying while
    /// etcd is away; each unless it changed since this front-end wrote it at `mod_rev`
    /// (another took its place over).
    pub(super) fn forget_waiter_keys(self: &Arc<Self>, keys: Vec<String>, mod_rev: i64) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.cleanup(forget_txn(&keys, mod_rev)).await;
            if let Some(first) = keys.first() {
                me.guard().forgetting.remove(first);
            }
        });
    }

    /// This front-end has heard from no etcd quorum for longer than its etcd lease: that
    /// lease, and its waiters' places with it, are gone or about to be, and no grant can
    /// reach them while the link is down. So its waiters are told `ERR UNAVAILABLE` now
    /// (proto.md: send the same LOCK again, through another front-end if there is one)
    /// rather than when the link is back; each leaves as a waiter whose connection went
    /// does, so a grant made for it meanwhile is taken back. Waiters whose own write, grant,
    /// confirmation or leaving is still out are left to the answer of that request.
    pub(super) fn end_waits_cut_off(self: &Arc<Self>, silent: Duration) {
        let ended: Vec<Local> = {
            let mut g = self.guard();
            let quiet: Vec<WaiterId> = g
                .waiting
                .iter()
                .filter(|(_, l)| l.phase.settled())
                .map(|(w, _)| *w)
                .collect();
            quiet.into_iter().filter_map(|w| g.leave(w)).collect()
        };
        if ended.is_empty() {
            return;
        }
        tracing::warn!(
            fe = self.fe,
            waiters = ended.len(),
            silent_ms = silent.as_millis() as u64,
            "no etcd quorum answer for longer than the front-end's etcd lease: its waiters are told ERR UNAVAILABLE"
        );
        for l in ended {
            let keys = self.local_keys(&l);
            let _ =
                l.tx.send(WaitResult::Failed(BackendError::Unavailable(format!(
                    "this front-end has not heard from etcd for {:.1}s, longer than its \
                 --etcd-lease-ttl: the wait ended (send the same LOCK again, through another \
                 front-end if you have one)",
                    silent.as_secs_f64()
                ))));
            self.forget_waiter_keys(keys, l.mod_rev);
        }
    }

    /// A waiting connection went away; a grant it never read is given back.
    pub fn abandon_wait(
        self: &Arc<Self>,
        name: &str,
        waiter: WaiterId,
        mut rx: oneshot::Receiver<WaitResult>,
    ) {
        rx.close();
        if let Ok(WaitResult::Granted {
            token, handover, ..
        }) = rx.try_recv()
        {
            let (me, name) = (Arc::clone(self), name.to_owned());
            tokio::spawn(async move { me.take_back(&name, token, handover).await });
        }
        let local = self.guard().leave(waiter);
        if let Some(local) = local {
            self.forget_waiter_keys(self.local_keys(&local), local.mod_rev);
        }
    }
}

/// The write that takes a waiter's keys out (each unless it changed since this front-end
/// wrote it at `mod_rev`): one transaction, each key its own guarded part, so that a key
/// taken over stays and the others still go.
pub(super) fn forget_txn(keys: &[String], mod_rev: i64) -> Txn {
    if let [key] = keys {
        return forget_one(key, mod_rev);
    }
    let parts: Vec<TxnOp> = keys
        .iter()
        .map(|k| TxnOp::txn(forget_one(k, mod_rev)))
        .collect();
    Txn::new().and_then(parts)
}

/// One waiter key out, unless it changed since this front-end wrote it at `mod_rev`.
fn forget_one(key: &str, mod_rev: i64) -> Txn {
    Txn::new()
        .when([guards::unchanged(key, mod_rev)])
        .and_then([TxnOp::delete(key.to_owned(), None)])
}

/// What the write of [`Cluster::wait_over`] found.
#[derive(Debug, PartialEq)]
enum Left {
    /// It took the waiter's place out (a set's, on at least one name: then no grant of the
    /// set can come, which takes every name at once).
    Out,
    /// The place was gone, and the grant it led to is there.
    Granted,
    /// The place was rewritten: a LOCK of the same id took it over.
    TakenOver,
    /// The place was gone, without a grant.
    Gone,
}

/// Reads the answer to [`Cluster::leave_txn`]: one part per key, then the holder read.
fn left_how(resp: &super::rpc::TxnResponse) -> Left {
    use super::rpc::TxnOpResponse;
    let ops = resp.op_responses();
    let Some((holder, parts)) = ops.split_last() else {
        return Left::Gone;
    };
    let parts: Vec<_> = parts
        .iter()
        .filter_map(|op| match op {
            TxnOpResponse::Txn(t) => Some(t),
            _ => None,
        })
        .collect();
    if parts.iter().any(|t| t.succeeded()) {
        return Left::Out;
    }
    let found = |op: &TxnOpResponse| matches!(op, TxnOpResponse::Get(got) if !got.kvs().is_empty());
    if found(holder) {
        Left::Granted
    } else if parts.iter().any(|t| t.op_responses().iter().any(found)) {
        Left::TakenOver
    } else {
        Left::Gone
    }
}
