//! The etcd series, exported in cluster mode only (a registry of their own, attached to the
//! process's metrics once the backend exists: [`crate::metrics::Metrics::attach`]). Their
//! names are fixed: dashboards and alerts are written against them.
//!
//! - `lockd_etcd_up`: 1 while this front-end's last answer from an etcd quorum is within the
//!   readiness bound (what `/readyz` says), else 0;
//! - `lockd_etcd_confirmed_age_seconds`: the age of that answer;
//! - `lockd_etcd_request_duration_seconds`: every etcd request of this front-end (each try);
//! - `lockd_etcd_errors_total{kind}`: failed requests by [`Kind`]; `conflict` counts guarded
//!   transactions that failed their comparison (another front-end got there first: normal
//!   under contention, a storm of them is not);
//! - `lockd_etcd_watch_lag_revisions`: the newest revision etcd reported in any answer minus
//!   the last one the watch has delivered (the mirror's lag);
//! - `lockd_etcd_leader_routed`: 1 while this front-end's reads and transactions go straight
//!   to etcd's leader, 0 while they go to any member (one endpoint, or no leader known).
//! - `lockd_etcd_key_slots{state}`: this front-end's key slots (`slots.rs`), `taken` (by a
//!   request, or by keys still in etcd) and `made` (ever): `made` grows with the most
//!   requests the front-end had at once, not with their number.
//!
//! The gauges are set at the scrape ([`EtcdStats::scrape`]), so they cost nothing between.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::Metrics;

use super::cause::Kind;
use super::Cluster;

/// The handles of the etcd series.
pub struct EtcdStats {
    up: Gauge,
    confirmed_age: Gauge<f64, AtomicU64>,
    requests: Histogram,
    errors: [Counter; Kind::ALL.len()],
    watch_lag: Gauge,
    routed: Gauge,
    slots_taken: Gauge,
    slots_made: Gauge,
}

impl EtcdStats {
    /// Makes the series and attaches them to `metrics` (a second cluster in one process,
    /// as some tests start, keeps its handles but is not exported).
    pub fn register(metrics: &Metrics) -> EtcdStats {
        let mut registry = Registry::with_prefix("lockd");
        let up = Gauge::default();
        registry.register(
            "etcd_up",
            "1 while the last answer from an etcd quorum is within the readiness bound",
            up.clone(),
        );
        let confirmed_age = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "etcd_confirmed_age",
            "Age of this front-end's last answer from an etcd quorum",
            Unit::Seconds,
            confirmed_age.clone(),
        );
        // 0.5 ms to about 8 s.
        let requests = Histogram::new(exponential_buckets(0.0005, 2.0, 15));
        registry.register_with_unit(
            "etcd_request_duration",
            "This front-end's etcd requests, each try",
            Unit::Seconds,
            requests.clone(),
        );
        let family = Family::<[(&'static str, &'static str); 1], Counter>::default();
        registry.register(
            "etcd_errors",
            "Failed etcd requests, by kind",
            family.clone(),
        );
        let watch_lag = Gauge::default();
        registry.register(
            "etcd_watch_lag_revisions",
            "Newest etcd revision seen in any answer minus the last one the watch delivered",
            watch_lag.clone(),
        );
        let routed = Gauge::default();
        registry.register(
            "etcd_leader_routed",
            "1 while reads and transactions go straight to etcd's leader, 0 while to any member",
            routed.clone(),
        );
        let slots = Family::<[(&'static str, &'static str); 1], Gauge>::default();
        registry.register(
            "etcd_key_slots",
            "This front-end's key slots: taken now, and made since it started",
            slots.clone(),
        );
        let slots_taken = slots.get_or_create(&[("state", "taken")]).clone();
        let slots_made = slots.get_or_create(&[("state", "made")]).clone();
        let errors = Kind::ALL.map(|k| family.get_or_create(&[("kind", k.label())]).clone());
        metrics.attach(registry);
        EtcdStats {
            up,
            confirmed_age,
            requests,
            errors,
            watch_lag,
            routed,
            slots_taken,
            slots_made,
        }
    }

    /// Whether reads and transactions go straight to the leader.
    pub fn routed(&self, routed: bool) {
        self.routed.set(i64::from(routed));
    }

    /// One etcd request took `took` (answered or not).
    pub fn request(&self, took: Duration) {
        self.requests.observe(took.as_secs_f64());
    }

    /// One etcd request failed.
    pub fn error(&self, kind: Kind) {
        if let Some(i) = Kind::ALL.iter().position(|k| *k == kind) {
            self.errors[i].inc();
        }
    }

    /// Sets the gauges: `age` of the last quorum answer (`None`: never), whether it is
    /// within the readiness bound, the watch's lag in revisions, and the key slots taken
    /// and made.
    pub fn scrape(&self, age: Option<Duration>, up: bool, lag: i64, slots: (usize, u64)) {
        self.up.set(i64::from(up));
        self.slots_taken
            .set(i64::try_from(slots.0).unwrap_or(i64::MAX));
        self.slots_made
            .set(i64::try_from(slots.1).unwrap_or(i64::MAX));
        self.confirmed_age
            .set(age.map_or(f64::INFINITY, |a| a.as_secs_f64()));
        self.watch_lag.set(lag.max(0));
    }
}

impl Cluster {
    /// Sets the `lockd_etcd_*` gauges, for a scrape.
    pub fn scrape(&self) {
        let lag = self.seen_rev.load(Ordering::Relaxed) - self.watch_rev.load(Ordering::Relaxed);
        let slots = self.guard().slots.counts();
        self.stats
            .scrape(Some(self.quorum.age()), self.quorum.fresh(), lag, slots);
    }
}
