//! A front-end's background life: its tasks (the watch, the keep-alive, the expiry timer,
//! the quorum probe, the route to etcd's leader) until shutdown, and what it takes out of
//! etcd then.

use std::collections::BTreeMap;
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
        // hang on this front-end's etcd lease anyway). Besides its waiters, the keys the
        // mirror shows of waiters of this front-end that left (their connection closed as it
        // stopped) while their own delete may still wait for its turn in group commit, which
        // would not come once this front-end is gone.
        let mut keys: BTreeMap<String, i64> = BTreeMap::new();
        {
            let g = self.guard();
            for l in g.waiting.values() {
                keys.extend(self.local_keys(l).into_iter().map(|k| (k, l.mod_rev)));
            }
            let left = g.mirror.names.values().flat_map(|ns| ns.queue.values());
            for w in left.filter(|w| w.value.fe == self.fe) {
                keys.entry(w.key.clone()).or_insert(w.mod_rev);
            }
        }
        let mut ops: Vec<TxnOp> = keys
            .into_iter()
            .map(|(k, rev)| TxnOp::txn(super::waiters::forget_txn(&[k], rev)))
            .collect();
        ops.push(TxnOp::delete(self.layout.front_end(&self.fe), None));
        // etcd takes at most 128 operations per transaction by default (nested ones count).
        for chunk in ops.chunks(50) {
            let txn = Txn::new().and_then(chunk.to_vec());
            let _ = tokio::time::timeout(self.config.request_timeout, self.txn(txn)).await;
        }
    }
}
