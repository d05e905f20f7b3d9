//! How current the mirror is for one name: a linearizable read of it, and this front-end's
//! own writes the watch has not shown yet (a client's LOCK right after its UNLOCK is decided on
//! the state that UNLOCK left).

use super::rpc::{GetOptions, Txn, TxnOp, TxnOpResponse};

use crate::backend::{now, BackendError};

use super::mirror::{Mirror, NameState};
use super::Cluster;

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

    /// Adds to names read at `rev` the leases in their lock-delay whose key went with their
    /// front-end's etcd lease ([`HolderRecord::keyless`]): no read shows them, and a decision
    /// made without them would grant the name within the delay. Whether a holder the read
    /// misses went that way (no marker) or was released only the watch tells, so this waits
    /// (at most a request timeout; the watch is milliseconds behind) for the mirror to reach
    /// `rev`. A mirror that does not still shows such holders: each is taken to be in its
    /// delay (the safe side).
    ///
    /// [`HolderRecord::keyless`]: super::mirror::HolderRecord::keyless
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
        let g = self.guard();
        let behind = g.mirror.rev < rev;
        let at = now();
        for (name, read) in names.iter().zip(states.iter_mut()) {
            let Some(ns) = g.mirror.name(name) else {
                continue;
            };
            for h in ns.holders.values() {
                if read.holders.contains_key(&h.rev) {
                    continue;
                }
                let kept = match h.keyless {
                    true => Some(h.clone()),
                    // (A mirror that did not reach `rev` still shows it; one past `rev`
                    // shows holders granted since, which are no concern of this read.)
                    false if behind && h.rev <= rev => h.delayed(at),
                    false => None,
                };
                if let Some(kept) = kept {
                    read.holders.insert(kept.rev, kept);
                }
            }
        }
    }

    /// The reads of `name` a transaction carries: its marker, holders and queue (what
    /// [`Cluster::states_read`] makes a [`NameState`] of).
    pub(super) fn name_reads(&self, name: &str) -> [TxnOp; 3] {
        let prefix = || Some(GetOptions::new().with_prefix());
        [
            TxnOp::get(self.layout.marker(name), None),
            TxnOp::get(self.layout.holders(name), prefix()),
            TxnOp::get(self.layout.waiters(name), prefix()),
        ]
    }

    /// The state of each of `names` at revision `rev`, from the answers of their
    /// [`Cluster::name_reads`] among `ops` (other answers are passed over).
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
        let mut all = Mirror {
            base: self.base_token(),
            ..Mirror::default()
        };
        all.apply(&self.layout, &changes, rev, now(), super::wall_ms());
        names
            .iter()
            .map(|name| all.names.remove(name).unwrap_or_default())
            .collect()
    }

    /// Waits (at most a request timeout) until the mirror shows this front-end's own last
    /// write to `name`: a client's LOCK right after its UNLOCK is decided on the state that
    /// UNLOCK left.
    pub(super) async fn own_writes_seen(&self, name: &str) {
        let until = tokio::time::Instant::now() + self.config.request_timeout;
        loop {
            let moved = self.moved.notified();
            {
                let g = self.guard();
                match g.written.get(name) {
                    Some((rev, _)) if *rev > g.mirror.rev => {}
                    _ => return,
                }
            }
            if tokio::time::timeout_at(until, moved).await.is_err() {
                return;
            }
        }
    }

    /// Remembers that this front-end wrote `name` at `rev` (see [`Cluster::own_writes_seen`]).
    pub(super) fn wrote(&self, name: &str, resp: &super::rpc::TxnResponse) {
        self.wrote_as(name, resp, false);
    }

    /// [`Cluster::wrote`]; `emptied`: the write left the name with no holder, waiter or
    /// marker.
    pub(super) fn wrote_as(&self, name: &str, resp: &super::rpc::TxnResponse, emptied: bool) {
        let rev = resp.header().map_or(0, |h| h.revision());
        self.guard().wrote(name, rev, emptied);
    }

    /// Whether this front-end's last write to `name`, not yet in the mirror, emptied it.
    pub(super) fn emptied_by_own_write(&self, name: &str) -> bool {
        let g = self.guard();
        g.written
            .get(name)
            .is_some_and(|(rev, emptied)| *emptied && *rev > g.mirror.rev)
    }
}
