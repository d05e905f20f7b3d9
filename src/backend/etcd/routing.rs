//! Keeps the route of this front-end's KV requests on etcd's leader (the client's
//! [`super::rpc::Client::find_leader`]): found at start, looked for again every
//! [`CHECK`] (a leader that moved is still served through, one hop longer, until then) and
//! soon after a request to it failed (until then, the balanced channel).

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
        let mut was: Option<String> = None;
        loop {
            let leader = self.client.find_leader(timeout).await;
            if leader != was {
                match &leader {
                    Some(url) => tracing::info!(leader = url, "etcd: requests go to the leader"),
                    None => tracing::info!(
                        "etcd: leader not known, requests go to any member that answers"
                    ),
                }
                was = leader;
            }
            self.stats.routed(was.is_some());
            tokio::select! {
                _ = tokio::time::sleep(CHECK) => {}
                _ = self.client.route_dropped() => {
                    self.stats.routed(false);
                    tokio::time::sleep(AFTER_DROP).await;
                }
            }
        }
    }
}
