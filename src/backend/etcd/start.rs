//! A front-end's start: connected to etcd (`secure.rs`), its etcd lease taken, the token base
//! read or chosen, and the mirror loaded, each tried again while etcd has no quorum yet.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, Notify};

use super::rpc::{Client, ConnectOptions, Txn, TxnOp};
use super::tokens::Tokens;
use super::{
    commit, guards, quorum, secure, stats, wall_ms, Cluster, ClusterState, Layout, Settings, RETRY,
};
use crate::backend::BackendError;

impl Cluster {
    /// Connects, takes this front-end's etcd lease, reads (or chooses) the token base and
    /// loads the mirror. Fails if etcd can't be reached within the connect timeout, or at
    /// once, as a [`super::EtcdRefused`], if etcd refuses its certificates, user or rights.
    pub async fn connect(
        settings: Settings,
    ) -> Result<Arc<Cluster>, Box<dyn std::error::Error + Send + Sync>> {
        let config = &settings.config;
        let options = ConnectOptions::new()
            .with_timeout(config.request_timeout)
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(Duration::from_secs(5), config.request_timeout)
            .with_require_leader(true);
        // TLS, the user, and a first request that proves the rights on the prefix.
        let client = secure::connect(config, options).await?;
        let fe = format!(
            "{}-{}-{:x}",
            hostname(),
            std::process::id(),
            wall_ms() & 0xffff_ffff
        );
        Cluster::start(client, fe, settings).await
    }

    /// A front-end named `fe` over `client`: takes its etcd lease, reads (or chooses) the
    /// token base and loads the mirror.
    pub(super) async fn start(
        client: Client,
        fe: String,
        settings: Settings,
    ) -> Result<Arc<Cluster>, Box<dyn std::error::Error + Send + Sync>> {
        let Settings {
            config,
            limits,
            watch_buffer,
            users,
            metrics,
        } = settings;
        let endpoints = config.endpoints.join(",");
        let layout = Layout::new(&config.prefix);
        let (events, _) = broadcast::channel(watch_buffer.max(1));
        let fe_id = fe.clone();
        // A take-back each: rare (a waiter leaving as its grant is written); past this many
        // at once, the watch takes them back.
        let (take_backs, take_backs_queue) = tokio::sync::mpsc::channel(256);
        let waits = (config.batch_wait, config.join_wait);
        let commit = commit::GroupCommit::start(client.clone(), config.batch, waits);
        let cluster = Arc::new(Cluster {
            client,
            layout,
            fe,
            lease: AtomicI64::new(0),
            state: Mutex::new(ClusterState::new(&fe_id)),
            events,
            moved: Notify::new(),
            next_conn: AtomicU64::new(1),
            next_uid: AtomicU64::new(1),
            limits,
            metrics: Arc::clone(&metrics),
            users,
            healthy: AtomicBool::new(false),
            reachable_again: Notify::new(),
            quorum: quorum::Quorum::new(config.lease_ttl),
            stats: stats::EtcdStats::register(&metrics),
            seen_rev: AtomicI64::new(0),
            watch_rev: AtomicI64::new(0),
            leased: AtomicBool::new(false),
            announced: AtomicI64::new(0),
            announcing: AtomicBool::new(false),
            config,
            breaking: Mutex::new(Vec::new()),
            skew_ms: AtomicI64::new(0),
            take_backs,
            take_backs_queue: Mutex::new(Some(take_backs_queue)),
            commit,
        });
        // Each step is tried again while etcd answers "unavailable" (a cluster electing its
        // leader as this front-end starts says "no leader"), until the connect timeout.
        let last = Mutex::new(None::<String>);
        let startup = async {
            loop {
                let step = async {
                    if !cluster.leased.load(Ordering::Relaxed) {
                        cluster.take_lease().await?;
                    }
                    cluster.load_base().await?;
                    cluster.resync().await
                };
                match step.await {
                    Err(BackendError::Unavailable(why)) => {
                        *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                        tokio::time::sleep(RETRY).await;
                    }
                    done => return done,
                }
            }
        };
        let started = tokio::time::timeout(cluster.config.connect_timeout, startup).await;
        let Ok(started) = started else {
            let last = last.lock().unwrap_or_else(|p| p.into_inner()).take();
            let why = last.map_or_else(String::new, |why| format!(": {why}"));
            return Err(format!("etcd at {endpoints}: no quorum (timed out){why}").into());
        };
        started.map_err(|e| format!("etcd at {endpoints}: {e}"))?;
        cluster.healthy.store(true, Ordering::Relaxed);
        tracing::info!(
            fe = cluster.fe,
            endpoints,
            prefix = cluster.layout.prefix(),
            "cluster mode: front-end of etcd"
        );
        Ok(cluster)
    }

    /// The token base: chosen once per prefix (wall-clock microseconds, as the embedded
    /// backend starts its tokens, so tokens keep growing across a move between backends),
    /// dense on a prefix this front-end starts (`tokens.rs`).
    async fn load_base(&self) -> Result<(), BackendError> {
        let key = self.layout.base();
        let first = Tokens::fresh_value(crate::backend::first_token());
        let txn = Txn::new()
            .when([guards::absent(&key)])
            .and_then([TxnOp::put(key.clone(), first, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        self.txn(txn).await.map_err(|e| self.unavailable(&e))?;
        let got = self
            .get(key, None)
            .await
            .map_err(|e| self.unavailable(&e))?;
        let tokens = got
            .kvs()
            .first()
            .and_then(|kv| Tokens::parse(kv.value(), kv.mod_revision()))
            .ok_or_else(|| BackendError::Unavailable("etcd: no token base".into()))?;
        self.guard().mirror.tokens = tokens;
        Ok(())
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer it is given.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|b| *b == 0).unwrap_or(0);
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "lockd".into()
    }
}
