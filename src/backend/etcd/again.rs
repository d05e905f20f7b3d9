//! A LOCK by the id that already holds the name (a retry after a lost reply): the same token,
//! a new lease, written over the holder's record. The driver of `renewal.rs`'s
//! [`renewal::lock_again`], where the core decides the rewrite and what its answer means.

use std::time::Duration;

use crate::backend::{BackendError, LockStart};
use crate::locks::LockRequest;

use super::mirror::HolderRecord;
use super::renewal;
use super::Cluster;

impl Cluster {
    /// A LOCK by a holder's own id (a retry after a lost reply): the same token, a new lease.
    /// `None`: renewed, released or expired meanwhile, to be decided again.
    pub(super) async fn lock_again(
        &self,
        req: &LockRequest,
        holder: HolderRecord,
        ttl: Duration,
    ) -> Result<Option<LockStart>, BackendError> {
        let wall_ms = self.wall_ms();
        let lease = self.lease_id();
        let again = renewal::lock_again(
            &mut self.guard(),
            &self.me(),
            (req, lease),
            &holder,
            ttl,
            wall_ms,
        );
        let resp = self.txn(again.txn.clone()).await;
        let answer = resp.as_ref().ok();
        let start = renewal::again_answered(&mut self.guard(), &req.name, &holder, &again, answer);
        match (start, resp) {
            (Some(start), _) => Ok(Some(start)),
            (None, Ok(_)) => Ok(None),
            (None, Err(e)) => Err(self.unavailable(&e)),
        }
    }
}
