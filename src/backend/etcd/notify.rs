//! What a front-end tells beside its answers: watchers their events, the operator an older
//! front-end sharing the prefix.

use std::sync::Arc;

use crate::backend::{unix_ms, Published};

use super::Cluster;

impl Cluster {
    /// Says that a front-end of an older lockd shares this prefix, as its key shows up.
    pub(super) fn warn_older(&self, applied: &super::apply::Applied) {
        for fe in &applied.older_front_ends {
            tracing::warn!(
                fe = self.fe,
                older = fe,
                prefix = self.layout.prefix(),
                "a front-end of an older lockd shares this prefix: a grant it makes to a \
                 waiter of this one is taken back, and the wait fails; stop the older \
                 front-ends before starting new ones"
            );
        }
    }

    /// Tells watchers `events` (called under the guard, so they see one name's in order).
    pub(super) fn publish(&self, events: &[crate::locks::Event]) {
        if events.is_empty() || self.events.receiver_count() == 0 {
            return;
        }
        let unix_ms = unix_ms();
        for event in events {
            let _ = self.events.send(Arc::new(Published {
                event: event.clone(),
                unix_ms,
            }));
        }
    }
}
