//! A change this front-end made, logged and counted as one server would, and the marker that
//! tells the other front-ends what it was.

use std::time::Duration;

use crate::locks::{EventKind, Origin, Token};

use super::marks::MarkerValue;
use super::Cluster;

impl Cluster {
    pub(super) fn marker(&self, kind: EventKind, rev: i64) -> String {
        // A BREAK in progress through this front-end says who sent it (`breaks.rs`).
        let by = match kind {
            EventKind::Broken => self.breaker(rev),
            _ => Origin::default(),
        };
        MarkerValue {
            kind,
            rev,
            fe: self.fe.clone(),
            by_user: by.user().unwrap_or_default().to_owned(),
            by_peer: by.peer().map(|p| p.to_string()).unwrap_or_default(),
        }
        .encode()
    }

    /// Logs and counts a grant this front-end made to `origin`.
    pub(super) fn granted_log(
        &self,
        name: &str,
        id: &str,
        token: Token,
        waited: Option<Duration>,
        origin: &Origin,
    ) {
        let event = crate::locks::Event {
            kind: EventKind::Acquired,
            name: name.into(),
            id: id.into(),
            token,
            held: Duration::ZERO,
            waited,
            origin: origin.clone(),
            note: None,
            broken_by: Origin::default(),
        };
        crate::backend::log_event(&event);
        self.metrics.lease_event(&event);
    }

    pub(super) fn ended_log(
        &self,
        name: &str,
        id: &str,
        token: Token,
        kind: EventKind,
        held: Duration,
        origin: &Origin,
    ) {
        let event = crate::locks::Event {
            kind,
            name: name.into(),
            id: id.into(),
            token,
            held,
            waited: None,
            origin: origin.clone(),
            note: None,
            broken_by: match kind {
                EventKind::Broken | EventKind::Breaking => self.breaker_of(token),
                _ => Origin::default(),
            },
        };
        crate::backend::log_event(&event);
        self.metrics.lease_event(&event);
    }
}
