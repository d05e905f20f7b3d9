//! A front-end's background life: its tasks (the watch, the keep-alive, the expiry timer,
//! the quorum probe, the route to etcd's leader) until shutdown, and what it takes out of
//! etcd then.

use std::sync::Arc;

use super::rpc::{Txn, TxnOp};
use tokio_util::sync::CancellationToken;

use super::Cluster;

impl Cluster {
    /// Runs the watch, the keep-alive, the expiry timer, the quorum probe and the route to
    /// etcd's leader until `shutdown`. Then this
    /// front-end's waiters leave the queue and it says it is gone (another front-end takes
    /// over expiring its plain leases), but its etcd lease is left to run out rather than
    /// revoked: a session lease's holder has until then to reconnect to another front-end
    /// and RENEW, as it would ride out the restart of a single server.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::select! {
            biased;
            _ = Arc::clone(&self).watch_loop() => {}
            _ = Arc::clone(&self).keep_alive_loop() => {}
            _ = Arc::clone(&self).expiry_loop() => {}
            _ = Arc::clone(&self).probe_loop() => {}
            _ = Arc::clone(&self).route_loop() => {}
            _ = Arc::clone(&self).take_back_loop() => {}
            _ = shutdown.cancelled() => {}
        }
        // Each waiter key only if it is still this front-end's write (not taken over); a
        // set's keys one by one, so that the chunks below stay within etcd's bound (they
        // hang on this front-end's etcd lease anyway).
        let mut ops: Vec<TxnOp> = {
            let g = self.guard();
            g.waiting
                .values()
                .flat_map(|l| {
                    self.local_keys(l)
                        .into_iter()
                        .map(|k| TxnOp::txn(super::waiters::forget_txn(&[k], l.mod_rev)))
                })
                .collect()
        };
        ops.push(TxnOp::delete(self.layout.front_end(&self.fe), None));
        // etcd takes at most 128 operations per transaction by default (nested ones count).
        for chunk in ops.chunks(50) {
            let txn = Txn::new().and_then(chunk.to_vec());
            let _ = tokio::time::timeout(self.config.request_timeout, self.txn(txn)).await;
        }
    }
}
