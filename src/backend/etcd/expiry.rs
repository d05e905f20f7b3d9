//! The expiry timer: ends leases whose time ran out, from the mirror's index of when each
//! holder ends (a timer structure, not a sweep). The driver of `expiring.rs`, where the core
//! decides which and how, and of `expired.rs`, where it decides the writes and what their
//! answers mean.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::now;
use crate::locks::EventKind;

use super::expired;
use super::expiring::{delay_over, delaying, expiry, Ending, Expiry};
use super::Cluster;

impl Cluster {
    /// Ends leases as their deadlines pass: a timer on the mirror's deadline index, not a
    /// sweep. A front-end expires the holders it granted; a holder whose front-end is gone is
    /// expired by the live front-end with the smallest id, so one write ends it.
    pub(super) async fn expiry_loop(self: Arc<Self>) {
        loop {
            let moved = self.moved.notified();
            let Expiry {
                due,
                delays_over,
                next,
            } = expiry(&mut self.guard(), &self.fe, now(), self.wall_ms());
            for (name, rev) in delays_over {
                self.delay_over(&name, rev);
            }
            for (name, rev, holder, ending) in due {
                let me = Arc::clone(&self);
                tokio::spawn(async move {
                    match ending {
                        Ending::Delay(value) => me.write_delay(&name, &holder, &value).await,
                        Ending::End(kind, token) => me.expire(&name, token, kind, holder).await,
                    }
                    me.guard().expiring.remove(&(name, rev));
                });
            }
            let sleep = match next {
                Some(ends) => ends
                    .saturating_duration_since(now())
                    .max(Duration::from_millis(1)),
                // Nothing to expire: look again when the mirror moves (and now and then,
                // for a front-end that died while it owned leases).
                None => Duration::from_secs(1),
            };
            tokio::select! {
                biased;
                _ = tokio::time::sleep(sleep.min(Duration::from_secs(1))) => {}
                _ = moved => {}
            }
        }
    }

    /// `holder`'s time ran out (or its session ended: `kind`) without a release: it keeps its
    /// place for its lock-delay, over for its holder (a guarded rewrite, as a renewal's: a
    /// RENEW that came first wins), and ends as `kind` when the delay is over.
    pub(super) async fn start_delay(
        &self,
        name: &str,
        holder: &super::mirror::HolderRecord,
        kind: EventKind,
    ) {
        let value = delaying(holder, kind, self.wall_ms());
        self.write_delay(name, holder, &value).await;
    }

    /// Rewrites `holder` as `value`, its record in its lock-delay, unless it changed since
    /// ([`expired::delay_txn`]).
    async fn write_delay(
        &self,
        name: &str,
        holder: &super::mirror::HolderRecord,
        value: &super::values::HolderValue,
    ) {
        let txn = expired::delay_txn(&self.layout, holder, value);
        if let Some(resp) = self.cleanup(txn).await {
            expired::delay_written(&mut self.guard(), name, value, &resp);
        }
    }

    /// The lock-delay of a lease whose key went with its front-end's etcd lease is over
    /// ([`HolderRecord::keyless`]): it ends here (its end event now, as on one server), and
    /// the name is decided again.
    ///
    /// [`HolderRecord::keyless`]: super::mirror::HolderRecord::keyless
    fn delay_over(self: &Arc<Self>, name: &str, rev: i64) {
        {
            let mut g = self.guard();
            let Some(event) = delay_over(&mut g, name, rev, super::wall_ms()) else {
                return;
            };
            // Published under the guard, so watchers see one name's events in order.
            self.publish(std::slice::from_ref(&event));
        }
        self.evaluate(name);
    }

    /// Expires one holder unless it was renewed meanwhile; then removes the name's marker if
    /// nothing is left under it ([`expired::tidy`]).
    async fn expire(
        &self,
        name: &str,
        token: crate::locks::Token,
        kind: EventKind,
        holder: super::mirror::HolderRecord,
    ) {
        let ended = self.end_txn(name, kind, &holder, expired::not_renewed(&holder));
        let Some(resp) = self.cleanup(ended.txn.clone()).await else {
            return;
        };
        let was_ended = self.ended(name, token, kind, &holder, &ended, &resp);
        let tidy = expired::tidy(&self.layout, name, &holder, (&ended, &resp), was_ended);
        for txn in tidy {
            let _ = self.txn(txn).await;
        }
    }
}
