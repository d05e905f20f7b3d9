//! The cluster simulator's way in (`tests/sim`): front-ends over a simulated etcd
//! ([`lockd_etcd::sim`], whose `Net`, `Faults` and `Rng` the simulator takes from there), on
//! the caller's thread and tokio's paused clock.

use std::sync::Arc;

use super::{Cluster, Settings};
use crate::backend::{Backend, EtcdConfig};
use crate::locks::Limits;
use crate::metrics::Metrics;

use super::rpc::sim::Net;

/// Makes this thread's runs repeatable: its wall clock follows tokio's (from `epoch_ms`),
/// and the etcd backend's hash maps made on it iterate in the same order every run. Call
/// it first on the simulation's thread, inside its runtime.
pub fn pin_thread(epoch_ms: u64) {
    crate::backend::simulate_wall(epoch_ms);
    super::hashing::fix_keys();
}

/// Front-end number `fe` of `net`, started (its etcd lease taken, its mirror loaded) as
/// `Cluster::connect` starts one; its background work is [`Backend::run`]'s.
pub async fn front_end(
    net: &Net,
    fe: usize,
    config: EtcdConfig,
    limits: Limits,
) -> Result<Backend, Box<dyn std::error::Error + Send + Sync>> {
    let settings = Settings {
        config,
        limits,
        watch_buffer: 1024,
        users: None,
        metrics: Arc::new(Metrics::new(crate::metrics::Deployment::Etcd)),
    };
    start(net, fe, settings).await
}

/// Front-end number `fe` of `net` with the settings `config` gives (its limits,
/// `--watch-buffer`, users), as `lockd --etcd` makes its front-end from them
/// (`server::run`): for [`crate::daemon::run_simulated`].
pub(crate) async fn front_end_of(
    net: &Net,
    fe: usize,
    etcd: EtcdConfig,
    config: &crate::server::Config,
) -> Result<Backend, Box<dyn std::error::Error + Send + Sync>> {
    start(net, fe, config.cluster_settings(etcd)).await
}

async fn start(
    net: &Net,
    fe: usize,
    settings: Settings,
) -> Result<Backend, Box<dyn std::error::Error + Send + Sync>> {
    let client = super::rpc::Client::simulated(net.link(fe));
    let cluster = Cluster::start(client, format!("fe{fe}"), settings).await?;
    Ok(Backend::Etcd(cluster))
}

/// Moves front-end `front`'s wall clock `ms` milliseconds off the true time (ahead when
/// positive); a backend that is not a cluster front-end is left alone.
pub fn skew(front: &Backend, ms: i64) {
    if let Backend::Etcd(cluster) = front {
        cluster
            .skew_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The etcd create revision a token of front-end `front`'s cluster stands for (the token
/// less the cluster's base), if it can be one; `None` for a backend that is no front-end.
pub fn revision_of(front: &Backend, token: crate::locks::Token) -> Option<i64> {
    match front {
        Backend::Etcd(cluster) => cluster.guard().mirror.rev_of(token),
        _ => None,
    }
}

/// A front-end's mirror of every queue (the simulator checks it against etcd's keys once it
/// has caught up).
pub struct QueuedKeys {
    /// Every change up to this revision is applied.
    pub rev: i64,
    /// The prefix every waiter key is under.
    pub under: String,
    /// Each waiter key with its create revision, in key order.
    pub keys: Vec<(String, i64)>,
}

/// Front-end `front`'s mirror of every queue; `None` for a backend that is no front-end.
pub fn queued_keys(front: &Backend) -> Option<QueuedKeys> {
    let Backend::Etcd(cluster) = front else {
        return None;
    };
    let under = format!("{}q/", cluster.layout.prefix());
    let state = cluster.guard();
    let mut keys: Vec<(String, i64)> = state
        .mirror
        .names
        .values()
        .flat_map(|n| n.queue.values().map(|w| (w.key.clone(), w.rev)))
        .collect();
    keys.sort();
    Some(QueuedKeys {
        rev: state.mirror.rev,
        under,
        keys,
    })
}
