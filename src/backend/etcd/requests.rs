//! The etcd requests every part of the backend sends through: one transaction or read, sent
//! again when it never reached a member; a clean-up write tried until etcd answers; and what
//! each answer or failure tells (the quorum's age, the `lockd_etcd_*` series, a failure in
//! one plain sentence for the client and the log, an outage logged once).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::footprints::{footprint, join_of};
use super::rpc::{self, Txn};

use super::{cause, BackendError, Cluster};

impl Cluster {
    /// Why `e` failed, in one plain sentence.
    pub(super) fn cause_of(&self, e: &rpc::Error) -> cause::Cause {
        let cx = cause::Context {
            endpoints: &self.config.endpoints,
            request_timeout: self.config.request_timeout,
        };
        cause::cause(e, &cx)
    }

    /// [`Cluster::cause_of`], with the client's own text on a debug line (once per failure:
    /// where it happened, the request wrappers and the watch).
    pub(super) fn explain(&self, e: &rpc::Error) -> cause::Cause {
        let cause = self.cause_of(e);
        tracing::debug!(error = ?e, cause = cause.sentence, "etcd request failed");
        cause
    }

    /// `e` as the client is told it: `ERR UNAVAILABLE <sentence>; try again`.
    pub(super) fn unavailable(&self, e: &rpc::Error) -> BackendError {
        BackendError::Unavailable(self.cause_of(e).sentence)
    }

    /// An etcd request sent at `started` was answered by a quorum, at revision `rev`.
    pub(super) fn answered(&self, started: Instant, rev: i64) {
        self.stats
            .request(crate::backend::now().saturating_duration_since(started));
        self.seen_rev.fetch_max(rev, Ordering::Relaxed);
        if let Some(after) = self.quorum.answered() {
            tracing::info!(
                after = %humantime::format_duration(Duration::from_millis(after.as_millis() as u64)),
                "etcd quorum answers again"
            );
        }
        self.heard_from_etcd();
    }

    /// etcd answered (a request, or the watch): if it had been away, what waits for it to
    /// come back goes now.
    pub(super) fn heard_from_etcd(&self) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            self.reachable_again.notify_waiters();
        }
    }

    /// An etcd request sent at `started` failed with `e`: counted, remembered as the reason
    /// `/readyz` gives, and returned in one sentence.
    pub(super) fn request_failed(&self, started: Instant, e: &rpc::Error) -> String {
        self.stats
            .request(crate::backend::now().saturating_duration_since(started));
        let cause = self.explain(e);
        self.stats.error(cause.kind);
        self.quorum.failed(&cause.sentence);
        cause.sentence
    }

    /// Records the outcome of one etcd request sent at `started`.
    pub(super) fn record<T>(
        &self,
        started: Instant,
        result: &Result<T, rpc::Error>,
        header: impl Fn(&T) -> Option<&rpc::ResponseHeader>,
    ) {
        match result {
            Ok(resp) => self.answered(started, header(resp).map_or(0, |h| h.revision())),
            Err(e) => {
                self.request_failed(started, e);
            }
        }
    }

    /// One transaction. A request that never reached a member (connection refused: that
    /// member is down) is sent again at once: the client spreads requests over every
    /// endpoint and may pick a dead one, and it has no fail-over of its own.
    pub(super) async fn txn(&self, txn: Txn) -> Result<rpc::TxnResponse, rpc::Error> {
        let footprint = footprint(&self.layout, self.tokens(), &txn);
        // A join behind a holder of this front-end waits a moment for that holder's release.
        let hold = footprint.is_last()
            && join_of(&self.layout, &txn)
                .is_some_and(|name| self.guard().holds_here(&name, &self.fe));
        let mut tries = 0u64;
        loop {
            let started = crate::backend::now();
            let footprint = footprint.clone();
            let result = self
                .commit
                .txn(txn.clone(), footprint, self.lease_id(), hold)
                .await;
            self.record(started, &result, |r| r.header());
            if matches!(&result, Ok(r) if !r.succeeded()) {
                self.stats.error(cause::Kind::Conflict);
            }
            match result {
                Err(e) if not_sent(&e) && tries < self.resends() => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                }
                done => return done,
            }
        }
    }

    /// One read, sent again like [`Cluster::txn`].
    pub(super) async fn get(
        &self,
        key: String,
        options: Option<rpc::GetOptions>,
    ) -> Result<rpc::GetResponse, rpc::Error> {
        let mut client = self.client.clone();
        let mut tries = 0u64;
        loop {
            let started = crate::backend::now();
            let result = client.get(key.clone(), options.clone()).await;
            self.record(started, &result, |r| r.header());
            match result {
                Err(e) if not_sent(&e) && tries < self.resends() => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                }
                done => return done,
            }
        }
    }

    /// Resends after "connection refused": enough to go round every endpoint twice.
    pub(super) fn resends(&self) -> u64 {
        2 * self.config.endpoints.len() as u64
    }

    /// A clean-up write (ending a lease, leaving the queue) that must happen even if etcd is
    /// away for a while: a waiter key left behind would stop its queue for as long as this
    /// front-end lives. Tried until etcd answers (the transaction's comparisons make a retry
    /// of a write that did land a no-op), or until [`CLEANUP_TRIES`] failures in a row.
    pub(super) async fn cleanup(&self, txn: Txn) -> Option<rpc::TxnResponse> {
        for _ in 0..CLEANUP_TRIES {
            // A try sent while etcd is away is most likely lost: it would wait out the
            // request timeout even if the front-end reached etcd again meanwhile, and a cut
            // that lets it through for less than that between tries never saw it (simulator
            // seed 63724: a take-back's tries fell into the cut each time, and the grant
            // sat out its ttl). So it is sent again the moment etcd answers anything again;
            // like any try whose answer was not heard, the first may still apply (every
            // clean-up write is guarded, so applying twice changes nothing).
            let back = self.reachable_again.notified();
            tokio::pin!(back);
            back.as_mut().enable();
            let away = !self.healthy.load(Ordering::Relaxed);
            let answer = tokio::select! {
                answer = self.txn(txn.clone()) => answer,
                () = back, if away => continue,
            };
            match answer {
                Ok(resp) => return Some(resp),
                Err(e) => {
                    self.unhealthy(&self.cause_of(&e).sentence);
                    tokio::time::sleep(CLEANUP_PAUSE).await;
                }
            }
        }
        None
    }

    /// Logs the start of an outage once (`why`: one plain sentence).
    pub(super) fn unhealthy(&self, why: &str) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(cause = why, "etcd unreachable or without quorum");
        }
    }
}

/// A clean-up write is tried this many times, [`CLEANUP_PAUSE`] apart (each try waits up to
/// `--etcd-request-timeout`): about a minute and a half of etcd outage at the default.
pub(super) const CLEANUP_TRIES: usize = 40;
pub(super) const CLEANUP_PAUSE: Duration = Duration::from_millis(250);

/// Whether a request failed before any member saw it (its connection was refused), so that
/// sending it again can't apply it twice. The client reports this as a transport error, or
/// as an `Unavailable` status whose message is the connector's.
pub(super) fn not_sent(e: &rpc::Error) -> bool {
    match e {
        rpc::Error::TransportError(_) => true,
        rpc::Error::GRpcStatus(status) => status.message().contains("connect error"),
        _ => false,
    }
}
