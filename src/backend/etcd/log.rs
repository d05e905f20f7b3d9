//! A change this front-end made, logged and counted as one server would, and the marker that
//! tells the other front-ends what it was.

use std::time::Duration;

use crate::locks::{EventKind, Origin, Token};

use super::keys::MarkerValue;
use super::Cluster;

impl Cluster {
    pub(super) fn marker(&self, kind: EventKind, rev: i64) -> String {
        MarkerValue {
            kind,
            rev,
            fe: self.fe.clone(),
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
        };
        crate::backend::log_event(&event);
        self.metrics.lease_event(&event);
    }
}
