//! STATUS: one name, its detail, and every held lock, from the mirror.

use std::time::Duration;

use crate::backend::{now, BackendError, Detail, StatusView};
use crate::locks::{LockStatus, WaiterStatus};

use super::mirror::{HolderRecord, NameState};
use super::tokens::Tokens;
use super::Cluster;

impl Cluster {
    pub(super) fn tokens(&self) -> Tokens {
        self.guard().mirror.tokens
    }

    /// STATUS of one name, as this front-end's watch has seen it (milliseconds behind).
    pub async fn status(&self, name: &str) -> Result<Option<LockStatus>, BackendError> {
        let tokens = self.tokens();
        let g = self.guard();
        Ok(g.mirror
            .name(name)
            .and_then(|ns| Self::status_with(tokens, name, ns)))
    }

    fn status_with(tokens: Tokens, name: &str, ns: &NameState) -> Option<LockStatus> {
        let first = ns.holders.values().next()?;
        Some(holder_status(tokens, name, first, ns))
    }

    /// `STATUS <name> detail` from the mirror, with at most `max` waiters; `None` while free.
    pub async fn status_detail(
        &self,
        name: &str,
        max: usize,
    ) -> Result<Option<Detail>, BackendError> {
        let tokens = self.tokens();
        let g = self.guard();
        let Some(ns) = g.mirror.name(name) else {
            return Ok(None);
        };
        let Some(status) = Self::status_with(tokens, name, ns) else {
            return Ok(None);
        };
        let at = self.wall_ms();
        Ok(Some(Detail {
            status,
            holders: ns
                .holders
                .values()
                .map(|h| LockStatus {
                    origin: h.value.origin(),
                    ..holder_status(tokens, name, h, ns)
                })
                .collect(),
            queue: ns
                .queue
                .values()
                .take(max)
                .map(|w| WaiterStatus {
                    id: w.value.id.as_str().into(),
                    waited: Duration::from_millis(at.saturating_sub(w.value.queued_ms)),
                    session: w.value.session_ms.is_some(),
                    mode: w.value.mode,
                    set: set_of(&w.value.set),
                })
                .collect(),
        }))
    }

    /// Every lock, for `STATUS` without a name, from the mirror.
    pub async fn status_snapshot(&self) -> Result<StatusView, BackendError> {
        let tokens = self.tokens();
        let locks = {
            let g = self.guard();
            g.mirror
                .names
                .iter()
                .filter_map(|(name, ns)| Self::status_with(tokens, name, ns))
                .collect()
        };
        Ok(StatusView::of(locks))
    }
}

fn holder_status(tokens: Tokens, name: &str, h: &HolderRecord, ns: &NameState) -> LockStatus {
    let at = super::wall_ms();
    LockStatus {
        name: name.into(),
        holder: h.value.id.as_str().into(),
        token: tokens.of(h.rev, &h.slot),
        left: h.left(now()),
        held: Duration::from_millis(at.saturating_sub(h.value.granted_ms)),
        session: h.value.session_ms.is_some(),
        waiters: ns.queue.len(),
        holders: ns.holders.len(),
        mode: h.value.mode,
        // Only the HOLDER lines of a detail show who took it (see `status_detail`): a STATUS
        // of every lock does not pay for a copy of each holder's user and address.
        origin: Default::default(),
        granted_unix_ms: h.value.granted_ms,
        note: h.value.note(),
        set: set_of(&h.value.set),
        lingering: h.value.lingering(),
    }
}

/// A record's set (every name, in the LOCK's order; empty for one name) as STATUS shows it.
fn set_of(names: &[String]) -> Box<[std::sync::Arc<str>]> {
    names.iter().map(|n| n.as_str().into()).collect()
}
