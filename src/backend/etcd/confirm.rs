//! Confirming a grant made to a waiter of this front-end on its etcd lease: the driver of
//! `confirmation.rs`, where the core decides the write and reads its answer; this file sends
//! it (tried again while etcd is away) and takes a grant back.

use std::sync::Arc;

use crate::backend::now;

use super::confirmation::{confirm_answered, confirm_write};
use super::mirror::Granted;
use super::Cluster;

impl Cluster {
    /// Takes a plain lease that another front-end granted to a waiter of this one off this
    /// front-end's etcd lease, and then tells the waiter (see [`Granted::unconfirmed`]):
    /// from then on it outlives this front-end, as a plain lease does.
    pub(super) async fn confirm(self: Arc<Self>, gr: Granted) {
        let write = confirm_write(&mut self.guard(), &gr);
        let (resp, ours) = match write {
            Some((txn, ours)) => (self.cleanup(txn).await, ours),
            None => (None, String::new()),
        };
        let back = confirm_answered(&mut self.guard(), &gr, resp.as_ref(), &ours, now());
        if let Some(back) = back {
            self.take_back(&back.name, back.token, back.handover).await;
        }
    }
}
