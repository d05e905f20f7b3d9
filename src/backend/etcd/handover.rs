//! Carrying out what the core decided about a grant to a waiter of this front-end
//! (`delivery.rs`): its confirmation, or its take-back, each a task of its own.

use std::sync::Arc;

use crate::backend::now;

use super::delivery::GrantAction;
use super::Cluster;

impl Cluster {
    /// Carries out what [`super::delivery::on_grant`] decided, off the guard.
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

    /// A grant at once under `uid` whose write's outcome is unknown (its answer was lost, or
    /// the write reaches etcd after this front-end gave up on it): if it shows up, it is
    /// taken back, unless a LOCK of its id claims it first ([`Cluster::lock_again`]). Without
    /// this, such a grant sat out its ttl (the simulator's "late write" findings).
    pub(super) fn given_up(self: &Arc<Self>, name: &str, uid: &str) {
        let shown = {
            let mut g = self.guard();
            g.left.insert(uid.to_owned());
            let tokens = g.mirror.tokens;
            let holder = g
                .mirror
                .name(name)
                .and_then(|ns| ns.holders.values().find(|h| h.uid == uid && !h.keyless));
            holder.map(|h| super::mirror::Granted::of(tokens, name, h))
        };
        // Shown by the watch before the answer failed: decided now, as the watch would have.
        if let Some(gr) = shown {
            let action = super::delivery::on_grant(&mut self.guard(), &gr, now());
            self.after_grants(vec![action]);
        }
    }
}
