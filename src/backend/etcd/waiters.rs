//! A wait's end, driven: its `wait=` running out (the timer, and the write that takes its
//! place out, tried again while etcd is away), its connection going away, this front-end
//! cut off from etcd for longer than its etcd lease; and the clean-up of keys nobody waits
//! on. What each of them decides (the writes, and what their answers mean) is the core's,
//! `leaving.rs`. A queued LOCK's own write is `enqueue.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::{now, BackendError, WaitResult};
use crate::locks::WaiterId;

use super::leaving::{
    abandoned, cut_off, forgotten, keys_of, leave_unanswered, leaving, left, timed, unread_grant,
    Leave,
};
// (Sent by `run.rs` too.)
pub(super) use super::leaving::forget_txn;
use super::{Cluster, Local};

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
        if !timed(&mut self.guard(), waiter, stop) {
            // Already granted or gone.
            return;
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
    /// takes its place out says how its wait ends ([`leaving`], [`left`]). Told
    /// `ERR TIMEOUT` while holding a grant, a client has a lock that nobody uses, and that
    /// only this front-end would take back: were it to die first, the lock would sit out its
    /// ttl.
    ///
    /// If etcd does not answer within `--etcd-request-timeout`, the client is told
    /// `ERR UNAVAILABLE`, as for any LOCK whose answer was lost: the waiter has left (a grant
    /// shown later is taken back, unless the same LOCK sent again took it), and the write is
    /// tried on as any clean-up is.
    pub(super) fn wait_over(self: &Arc<Self>, waiter: WaiterId) {
        let Some(leave) = leaving(&mut self.guard(), &self.layout, waiter) else {
            return;
        };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let Leave { txn, keys, mod_rev } = leave;
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
            match answer {
                Ok(resp) => {
                    left(&mut g, waiter, &resp, tries);
                }
                Err(e) => {
                    leave_unanswered(&mut g, waiter, me.unavailable(&e));
                    me.forget_waiter_keys(keys, mod_rev);
                }
            }
        });
    }

    /// Every waiter key of `local`: its own, or one per name of its set (same slot).
    pub(super) fn local_keys(&self, local: &Local) -> Vec<String> {
        keys_of(&self.layout, local)
    }

    /// Takes a waiter's keys (one, or a set's) out of the queue in one write, retrying while
    /// etcd is away; each unless it changed since this front-end wrote it at `mod_rev`
    /// (another took its place over).
    pub(super) fn forget_waiter_keys(self: &Arc<Self>, keys: Vec<String>, mod_rev: i64) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.cleanup(forget_txn(&keys, mod_rev)).await;
            forgotten(&mut me.guard(), &keys);
        });
    }

    /// This front-end has heard from no etcd quorum for longer than its etcd lease: that
    /// lease, and its waiters' places with it, are gone or about to be, and no grant can
    /// reach them while the link is down. So its waiters are told `ERR UNAVAILABLE` now
    /// (proto.md: send the same LOCK again, through another front-end if there is one)
    /// rather than when the link is back; which of them leave, and how, is the core's
    /// ([`cut_off`]).
    pub(super) fn end_waits_cut_off(self: &Arc<Self>, silent: Duration) {
        let ended = cut_off(&mut self.guard());
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
        rx: oneshot::Receiver<WaitResult>,
    ) {
        if let Some((keys, mod_rev)) = self.abandoned(name, waiter, rx) {
            self.forget_waiter_keys(keys, mod_rev);
        }
    }

    /// A queued LOCK whose write misread the name leaves the queue as a waiting connection
    /// that went does, and its key is out before the LOCK is decided again: left to the
    /// clean-up, the key stayed queued while the new decision took over the same id's older
    /// place, whose wait then ran out, and a release granted the leftover key after the
    /// client was told `TIMEOUT` (simulator seed 817871: the delete refused unapplied, tried
    /// again 250 ms later). Whether it is out; if etcd did not answer, the clean-up goes on
    /// alone (a grant to the key is taken back) and the LOCK is to be answered
    /// `ERR UNAVAILABLE`, its outcome unknown.
    pub(super) async fn leave_misread(
        self: &Arc<Self>,
        name: &str,
        waiter: WaiterId,
        rx: oneshot::Receiver<WaitResult>,
    ) -> bool {
        let Some((keys, mod_rev)) = self.abandoned(name, waiter, rx) else {
            return true;
        };
        match self.txn(forget_txn(&keys, mod_rev)).await {
            Ok(_) => true,
            Err(_) => {
                self.forget_waiter_keys(keys, mod_rev);
                false
            }
        }
    }

    /// `waiter` out of the tables, a grant it never read on `rx` taken back; its keys.
    fn abandoned(
        self: &Arc<Self>,
        name: &str,
        waiter: WaiterId,
        mut rx: oneshot::Receiver<WaitResult>,
    ) -> Option<(Vec<String>, i64)> {
        if let Some((token, handover)) = unread_grant(&mut rx) {
            let (me, name) = (Arc::clone(self), name.to_owned());
            tokio::spawn(async move { me.take_back(&name, token, handover).await });
        }
        abandoned(&mut self.guard(), &self.layout, waiter)
    }
}
