//! Carrying out what the core decided about a grant to a waiter of this front-end
//! (`delivery.rs`): its confirmation, or its take-back, each a task of its own.

use std::sync::Arc;

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
}
