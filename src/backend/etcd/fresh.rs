//! How current the mirror is for one name: a linearizable read of it, and this front-end's
//! own writes the watch has not shown yet (a client's LOCK right after its UNLOCK is decided on
//! the state that UNLOCK left). The driver of `reads.rs`, which decides what a read and the
//! mirror say; this file sends the read and waits for the watch.

use super::rpc::{Txn, TxnOp, TxnOpResponse};

use crate::backend::{now, BackendError};

use super::mirror::NameState;
use super::{reads, Cluster};

impl Cluster {
    /// The name as etcd has it now (a linearizable read of its marker, holders and queue).
    pub(super) async fn read_name(&self, name: &str) -> Result<NameState, BackendError> {
        let mut read = self
            .read_names(std::slice::from_ref(&name.to_owned()))
            .await?;
        Ok(read.pop().unwrap_or_default())
    }

    /// [`Cluster::read_name`] for every name of a set, in one read (one revision), in the
    /// order given.
    pub(super) async fn read_names(
        &self,
        names: &[String],
    ) -> Result<Vec<NameState>, BackendError> {
        let ops: Vec<TxnOp> = names
            .iter()
            .flat_map(|name| self.name_reads(name))
            .collect();
        let txn = Txn::new().and_then(ops);
        let resp = self.txn(txn).await.map_err(|e| self.unavailable(&e))?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut states = self.states_read(&resp.op_responses(), rev, names);
        self.with_delays(names, &mut states, rev).await;
        Ok(states)
    }

    /// Adds to names read at `rev` the leases in their lock-delay that no read shows
    /// ([`reads::with_delays`]). Whether a holder the read misses went with its front-end's
    /// etcd lease or was released only the watch tells, so this waits (at most a request
    /// timeout; the watch is milliseconds behind) for the mirror to reach `rev` first.
    async fn with_delays(&self, names: &[String], states: &mut [NameState], rev: i64) {
        let until = tokio::time::Instant::now() + self.config.request_timeout;
        loop {
            let moved = self.moved.notified();
            if self.guard().mirror.rev >= rev {
                break;
            }
            if tokio::time::timeout_at(until, moved).await.is_err() {
                break;
            }
        }
        reads::with_delays(&self.guard().mirror, names, states, rev, now());
    }

    /// The reads of `name` a transaction carries ([`reads::name_reads`]).
    pub(super) fn name_reads(&self, name: &str) -> [TxnOp; 3] {
        reads::name_reads(&self.layout, name)
    }

    /// The state of each of `names` at revision `rev`, from the answers of their
    /// [`Cluster::name_reads`] among `ops` (other answers are passed over):
    /// [`reads::states_read`].
    pub(super) fn states_read(
        &self,
        ops: &[TxnOpResponse<'_>],
        rev: i64,
        names: &[String],
    ) -> Vec<NameState> {
        let mut changes = Vec::new();
        for op in ops {
            if let TxnOpResponse::Get(got) = op {
                changes.extend(got.kvs().iter().map(|kv| super::watch::change(kv, true)));
            }
        }
        let tokens = self.tokens();
        let seen = (now(), super::wall_ms());
        reads::states_read(&self.layout, tokens, &changes, rev, names, seen)
    }

    /// Waits (at most a request timeout) until the mirror shows this front-end's own last
    /// write to `name`: a client's LOCK right after its UNLOCK is decided on the state that
    /// UNLOCK left.
    pub(super) async fn own_writes_seen(&self, name: &str) {
        let until = tokio::time::Instant::now() + self.config.request_timeout;
        loop {
            let moved = self.moved.notified();
            if !reads::own_write_unseen(&self.guard(), name) {
                return;
            }
            if tokio::time::timeout_at(until, moved).await.is_err() {
                return;
            }
        }
    }

    /// Whether this front-end's last write to `name`, not yet in the mirror, emptied it.
    pub(super) fn emptied_by_own_write(&self, name: &str) -> bool {
        reads::emptied_by_own_write(&self.guard(), name)
    }
}
