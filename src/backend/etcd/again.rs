//! A LOCK by the id that already holds the name (a retry after a lost reply): the same token,
//! a new lease, written over the holder's record.

use std::time::Duration;

use crate::backend::{BackendError, HandOver, LockStart};
use crate::locks::{rules, LockRequest};

use super::mirror::HolderRecord;
use super::Cluster;

impl Cluster {
    /// A LOCK by a holder's own id (a retry after a lost reply): the same token, a new lease.
    pub(super) async fn lock_again(
        &self,
        req: &LockRequest,
        holder: HolderRecord,
        ttl: Duration,
    ) -> Result<Option<LockStart>, BackendError> {
        let mut value = holder.value.clone();
        let at = self.wall_ms();
        value.ttl_ms = ttl.as_millis() as u64;
        value.deadline_ms = at + value.ttl_ms;
        value.at_ms = at;
        value.session_ms = req.session().map(|g| g.as_millis() as u64);
        value.fe = self.fe.clone();
        value.conn = req.conn;
        value.cut_ms = 0;
        // As on the embedded table: the grant's time stays, the client that asked last shows.
        if let Some(peer) = req.origin.peer() {
            value.peer = peer.to_string();
        }
        let had = Some(value.note.as_str()).filter(|n| !n.is_empty());
        let note = rules::note_again(had, req.note.as_deref()).unwrap_or_default();
        value.note = note.to_owned();
        let txn = self.rewrite(&holder, &value);
        // This LOCK claims the grant: if it was made for an earlier request of this id that
        // this front-end gave up on (remembered as left, to be taken back), it is not taken
        // back any more, also when the watch shows the rewrite before its answer comes
        // (simulator seed 2361). Given up on again if the rewrite fails.
        let claimed = self.guard().left.remove(&holder.uid);
        let resp = self.txn(txn).await;
        let resp = match resp {
            Ok(resp) if resp.succeeded() => resp,
            failed => {
                if claimed {
                    self.guard().left.insert(holder.uid.clone());
                }
                match failed {
                    // Renewed, released or expired meanwhile: decide again.
                    Ok(_) => return Ok(None),
                    Err(e) => return Err(self.unavailable(&e)),
                }
            }
        };
        self.wrote_lease(&req.name, &value, &resp);
        let token = self.guard().mirror.token(holder.rev);
        // This rewrite is the hand-over: a take-back of an older one now fails.
        let handover = HandOver(resp.header().map_or(0, |h| h.revision()));
        Ok(Some(LockStart::Granted { token, handover }))
    }
}
