//! Keeps the route of this front-end's KV requests on etcd's leader, or on a member that
//! answers while the leader does not (the client's [`super::rpc::Client::find_leader`]):
//! chosen at start, again every [`CHECK`] (a leader that moved is still served through, one
//! hop longer, until then) and soon after a request to the chosen member failed (until then,
//! the balanced channel).

use std::sync::Arc;
use std::time::Duration;

use super::Cluster;

/// How often the leader is looked for while the route works.
const CHECK: Duration = Duration::from_secs(2);
/// The pause after a failed request dropped the route, before it is looked for again (so a
/// flapping member is not asked for its status at every request).
const AFTER_DROP: Duration = Duration::from_millis(100);

impl Cluster {
    /// Never returns (ends with [`Cluster::run`]); at once pending with one endpoint.
    pub(super) async fn route_loop(self: Arc<Self>) {
        if !self.client.routes() {
            return std::future::pending().await;
        }
        let timeout = self.config.request_timeout.min(Duration::from_secs(1));
        let mut was: Option<(String, bool)> = None;
        loop {
            let target = self.client.find_leader(timeout).await;
            if target != was {
                match &target {
                    Some((url, true)) => {
                        tracing::info!(member = url, "etcd: requests go to the leader")
                    }
                    Some((url, false)) => tracing::info!(
                        member = url,
                        "etcd: the leader does not answer, requests go through another member"
                    ),
                    None => tracing::info!(
                        "etcd: no member names a leader, requests go to any member that answers"
                    ),
                }
                was = target;
            }
            self.stats
                .routed(was.as_ref().is_some_and(|(_, leader)| *leader));
            tokio::select! {
                biased;
                _ = tokio::time::sleep(CHECK) => {}
                _ = self.client.route_dropped() => {
                    self.stats.routed(false);
                    tokio::time::sleep(AFTER_DROP).await;
                }
            }
        }
    }
}
