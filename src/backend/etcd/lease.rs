//! This front-end's etcd lease: kept alive, and taken anew when etcd says it is gone.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{BackendError, WaitResult};

use super::rpc::{PutOptions, Txn, TxnOp};

use super::requests::not_sent;
use super::{Cluster, RETRY};

impl Cluster {
    /// Grants this front-end's etcd lease and announces the front-end on it.
    pub(super) async fn take_lease(&self) -> Result<(), BackendError> {
        let ttl = self.config.lease_ttl.as_secs().max(1) as i64;
        let mut client = self.client.clone();
        let mut tries = 0u64;
        let lease = loop {
            let started = crate::backend::now();
            let result = client.lease_grant(ttl, None).await;
            self.record(started, &result, |r| r.header());
            match result {
                Err(e) if not_sent(&e) && tries < self.resends() => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                }
                granted => break granted.map_err(|e| self.unavailable(&e))?,
            }
        };
        self.lease.store(lease.id(), Ordering::Relaxed);
        self.announce(lease.id()).await?;
        self.leased.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Puts this front-end's registration key on etcd lease `lease`: other front-ends take
    /// a front-end whose key they don't see for dead.
    async fn announce(&self, lease: i64) -> Result<(), BackendError> {
        let opts = PutOptions::new().with_lease(lease);
        let announce = Txn::new().and_then([TxnOp::put(
            self.layout.front_end(&self.fe),
            super::mirror::FRONT_END_VALUE,
            Some(opts),
        )]);
        let put = self.txn(announce).await.map_err(|e| self.unavailable(&e))?;
        let rev = put.header().map_or(0, |h| h.revision());
        self.announced.fetch_max(rev, Ordering::Relaxed);
        Ok(())
    }

    /// Puts the registration key again if the mirror, caught up with its last put, no
    /// longer shows it. It can go while this front-end's etcd lease lives: a put sent
    /// before, answered lost, lands late on an etcd lease given up on since, and goes with
    /// it (simulator seed 43119: every front-end's key gone, so each took the others for
    /// dead). Called at each keep-alive answered; the put runs apart, so that keep-alives
    /// never wait on it.
    fn keep_announced(self: &Arc<Self>) {
        let announced = self.announced.load(Ordering::Relaxed);
        if !self.guard().mirror.registration_gone(&self.fe, announced) {
            return;
        }
        if self.announcing.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            fe = self.fe,
            "this front-end's registration key went while its etcd lease lives; putting it again"
        );
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let lease = me.lease_id();
            if let Err(e) = me.announce(lease).await {
                me.unhealthy(&e.to_string());
            }
            me.announcing.store(false, Ordering::Relaxed);
        });
    }

    /// Keeps this front-end's etcd lease alive. If it lapses (etcd unreachable for longer
    /// than the lease), the session leases and waiters on it are gone: waiters are told,
    /// and a new lease is taken.
    pub(super) async fn keep_alive_loop(self: Arc<Self>) {
        let period = (self.config.lease_ttl / 3).max(Duration::from_millis(100));
        loop {
            let mut client = self.client.clone();
            let id = self.lease_id();
            let opened = crate::backend::now();
            let (mut keeper, mut stream) = match client.lease_keep_alive(id).await {
                Ok(pair) => pair,
                Err(e) if lease_gone(&e) => {
                    self.lease_lost().await;
                    continue;
                }
                Err(e) => {
                    self.leased.store(false, Ordering::Relaxed);
                    let why = self.request_failed(opened, &e);
                    self.unhealthy(&why);
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            loop {
                let started = crate::backend::now();
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match tokio::time::timeout(self.config.request_timeout, stream.message()).await {
                    // Answered by the leader: a quorum answer, as a linearizable read is.
                    Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                        self.answered(started, resp.header().map_or(0, |h| h.revision()));
                        self.leased.store(true, Ordering::Relaxed);
                        self.keep_announced();
                    }
                    Ok(Ok(Some(_))) => {
                        self.lease_lost().await;
                        break;
                    }
                    Ok(Err(e)) if lease_gone(&e) => {
                        self.lease_lost().await;
                        break;
                    }
                    Ok(Err(e)) => {
                        self.leased.store(false, Ordering::Relaxed);
                        let why = self.request_failed(started, &e);
                        self.unhealthy(&why);
                        break;
                    }
                    Ok(Ok(None)) | Err(_) => {
                        self.leased.store(false, Ordering::Relaxed);
                        let why = format!(
                            "etcd did not answer the lease keep-alive within {}",
                            humantime::format_duration(self.config.request_timeout)
                        );
                        self.quorum.failed(&why);
                        self.stats.error(super::cause::Kind::Timeout);
                        self.unhealthy(&why);
                        break;
                    }
                }
                tokio::time::sleep(period).await;
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn lease_lost(self: &Arc<Self>) {
        self.leased.store(false, Ordering::Relaxed);
        tracing::warn!(
            fe = self.fe,
            "this front-end's etcd lease lapsed: its session leases and waiters are gone"
        );
        let lost: Vec<_> = {
            let mut g = self.guard();
            g.by_uid.clear();
            let lost: Vec<_> = g.waiting.drain().map(|(_, l)| l).collect();
            // A grant confirmed for one of them (off the lapsed lease, so it outlived it) is
            // taken back when it shows up, unless a LOCK of its id claims it first
            // (simulator seed 13953).
            for l in &lost {
                g.left.insert(l.uid.clone());
            }
            lost
        };
        for l in lost {
            let _ = l.tx.send(WaitResult::Failed(BackendError::Unavailable(
                "this front-end lost etcd for longer than its lease; the wait ended".into(),
            )));
        }
        while let Err(e) = self.take_lease().await {
            self.unhealthy(&e.to_string());
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// Whether etcd says the lease kept alive no longer exists (it ran out while this front-end
/// could not reach etcd): then only a new lease helps, retrying the old one never does.
fn lease_gone(e: &super::rpc::Error) -> bool {
    match e {
        super::rpc::Error::LeaseKeepAliveError(why) => why.contains("not found"),
        super::rpc::Error::GRpcStatus(status) => status.message().contains("lease not found"),
        _ => false,
    }
}
