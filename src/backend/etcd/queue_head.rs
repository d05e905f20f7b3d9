//! The head of a queue, when it is this front-end's waiter: the driver of the core's
//! hand-over (`head.rs` decides which head is granted and what the answer leads to; this file
//! sends the write, waits, logs and takes a grant back).

use std::sync::Arc;

use crate::backend::now;
use crate::locks::EventKind;

use super::head::{grant_txn, head_answered, head_step, Attempt, HeadAfter, HeadStep};
use super::{Cluster, RETRY};

impl Cluster {
    /// Grants the head waiter of `name` if it is ours and fits, as the core decides
    /// ([`head_step`]); this is its driver.
    pub(super) fn evaluate(self: &Arc<Self>, name: &str) {
        let me = self.me();
        let step = head_step(&mut self.guard(), &me, name, now(), self.wall_ms());
        match step {
            HeadStep::Wait => {}
            HeadStep::Forget { keys, mod_rev } => self.forget_waiter_keys(keys, mod_rev),
            HeadStep::Try(attempt) => {
                let me = Arc::clone(self);
                tokio::spawn(async move { me.try_grant(*attempt).await });
            }
        }
    }

    /// Sends attempt `a`'s grant and carries out what its answer leads to
    /// ([`head_answered`]).
    async fn try_grant(self: Arc<Self>, a: Attempt) {
        let marker = self.marker(EventKind::Acquired, 0);
        let put = self.holder_put(a.value.session_ms.is_some());
        let answer = self.txn(grant_txn(&self.layout, &a, &marker, put)).await;
        let after = head_answered(&mut self.guard(), &a, &answer, now());
        match after {
            HeadAfter::Granted { token, back } => {
                for (name, _, _) in &a.parts {
                    self.granted_log(name, &a.id, token, Some(a.waited), &a.value.origin());
                }
                if let Some(back) = back {
                    self.take_back(&back.name, back.token, back.handover).await;
                }
            }
            HeadAfter::NotGranted { retry, pause } => {
                if pause {
                    tokio::time::sleep(RETRY).await;
                }
                if retry {
                    self.evaluate(&a.name);
                }
            }
        }
    }
}
