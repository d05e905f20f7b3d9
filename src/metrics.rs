//! Prometheus metrics: one registry, and handles to its series resolved once at start.
//!
//! The hot path (a grant, a release, a refusal) only bumps an atomic counter or observes a
//! histogram through a handle it already has: no label lookup, no allocation. Gauges that
//! describe the table as a whole (held locks, waiters) are not kept up to date on every
//! change at all: the scrape reads them from the table ([`Metrics::encode`]'s caller sets
//! them), so they cost nothing between scrapes. No series is labelled by lock name unless
//! the operator lists the names to track (`--metrics-names`): names are unbounded.
//!
//! In cluster mode every front-end sees the whole cluster's table through its etcd watch, so
//! the table's gauges are the same on every front-end: they are exported under other names
//! (`lockd_cluster_locks_held`, ...), which dashboards aggregate with `max()`, so that a
//! `sum()` over front-ends of `lockd_locks_held` can't count one lock three times. Counters
//! (grants, releases, refusals) count this front-end's own traffic in every mode, and add up.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::locks::{Event, EventKind};
use crate::proto::ErrorCode;

type Labels = [(&'static str, &'static str); 1];

/// How a lease ended, as the `kind` label of `lockd_releases_total`.
fn release_kind(kind: EventKind) -> Option<usize> {
    match kind {
        EventKind::Acquired => None,
        EventKind::Released => Some(0),
        EventKind::Expired => Some(1),
        EventKind::Dropped => Some(2),
        EventKind::Revoked => Some(3),
        EventKind::Broken => Some(4),
        // Not an end: that comes later, as its holder lets go or its time runs out.
        EventKind::Breaking => None,
    }
}
const RELEASE_KINDS: [&str; 5] = ["unlock", "expired", "session_end", "dropped", "broken"];

/// Where the locks live, as the `backend` label of `lockd_build_info`; in cluster mode the
/// table's gauges are the cluster's (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// In memory only (the default).
    Memory,
    /// In memory, journaled to `--data-dir`.
    DataDir,
    /// In etcd (`--etcd`), shared with the other front-ends.
    Etcd,
}

impl Deployment {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Deployment::Memory => "memory",
            Deployment::DataDir => "data-dir",
            Deployment::Etcd => "etcd",
        }
    }
}

/// Why the server closed a connection that did nothing wrong but wait, as the `reason` label
/// of `lockd_timeout_closes_total`. They are told `ERR LIMIT` but are not refusals: an idle
/// connection's client went quiet, and counting it with `--max-connections` refusals would
/// page operators of healthy fleets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutClose {
    /// `--idle-timeout`: no request for that long.
    Idle,
    /// `--line-timeout`: a request line left unfinished for that long.
    Line,
}
const TIMEOUT_CLOSES: [&str; 2] = ["idle", "line"];

/// Which protocol a connection speaks, as the `protocol` label of `lockd_connections`.
#[derive(Clone, Copy, Debug)]
pub enum Protocol {
    Line,
    Compat,
}

/// Every series lockd exports.
pub struct Metrics {
    registry: Registry,
    grants_immediate: Counter,
    grants_queued: Counter,
    releases: [Counter; 5],
    refusals: [Counter; ErrorCode::ALL.len()],
    timeout_closes: [Counter; 2],
    wait: Histogram,
    hold: Histogram,
    connections: [Gauge; 2],
    watchers: Gauge,
    watchers_lagged: Counter,
    journal_flush: Histogram,
    journal_batch: Histogram,
    /// Set by the scrape from the journal: the age of the oldest change not yet on disk.
    pub journal_backlog: Gauge<f64, AtomicU64>,
    /// Set by the scrape from the table (the cluster's, in cluster mode).
    pub held: Gauge,
    /// Set by the scrape from the table (the cluster's, in cluster mode).
    pub waiters: Gauge,
    /// Set by the scrape: 1 while a listener serves the network without authentication
    /// (`--insecure-open`), for an alert.
    pub open_without_auth: Gauge,
    /// Per tracked name (`--metrics-names`), set by the scrape: its holders.
    pub name_held: Family<[(&'static str, String); 1], Gauge>,
    /// Per tracked name, set by the scrape: the queue's length.
    pub name_waiters: Family<[(&'static str, String); 1], Gauge>,
    /// Per tracked name, set by the scrape: how long the current holder has held it.
    pub name_held_seconds: Family<[(&'static str, String); 1], Gauge<f64, AtomicU64>>,
    /// A backend's own series, registered once it exists (the etcd backend's `lockd_etcd_*`,
    /// only in cluster mode): exported after these.
    attached: std::sync::OnceLock<Registry>,
    /// Leases ended by a BREAK (also counted in `lockd_releases_total{kind="broken"}`).
    breaks: Counter,
    busy_poll: BusyPollSeries,
}

/// The busy poller's series (`--busy-poll`), which its task keeps up to date itself.
#[derive(Debug, Clone, Default)]
pub struct BusyPollSeries {
    /// Each time polling went to rest because it did not pay.
    pub rests: Counter,
    /// 1 while it rests, 0 while it polls.
    pub resting: Gauge,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Deployment::Memory)
    }
}

/// The commit lockd was built from (`build.rs`: `git`, or `LOCKD_COMMIT` for a build from a
/// source tarball), "unknown" without either.
const COMMIT: &str = env!("LOCKD_COMMIT");

impl Metrics {
    /// The series of a server whose locks live as `deployment` says.
    pub fn new(deployment: Deployment) -> Self {
        let mut registry = Registry::with_prefix("lockd");
        // The table's gauges: this server's, or the cluster's under names of their own.
        let (table, whose, aggregate) = match deployment {
            Deployment::Etcd => (
                "cluster_",
                "in the whole cluster, as this front-end's etcd watch sees it",
                " (the same on every front-end: aggregate with max(), not sum())",
            ),
            Deployment::Memory | Deployment::DataDir => ("", "on this server", ""),
        };
        let grants = Family::<Labels, Counter>::default();
        registry.register(
            "grants",
            "Locks granted, by whether the request waited in the queue first",
            grants.clone(),
        );
        let releases = Family::<Labels, Counter>::default();
        registry.register(
            "releases",
            "Leases ended, by kind: unlock, expired, session_end (a session lease's connection \
             closed), dropped (a grant taken back: its waiter was gone), broken (a BREAK)",
            releases.clone(),
        );
        let refusals = Family::<Labels, Counter>::default();
        registry.register(
            "refusals",
            "Requests answered ERR, by code (not the idle and unfinished-line closes: \
             lockd_timeout_closes_total)",
            refusals.clone(),
        );
        let timeout_closes = Family::<Labels, Counter>::default();
        registry.register(
            "timeout_closes",
            "Connections closed for waiting too long, by reason: idle (--idle-timeout), \
             line (--line-timeout); told ERR LIMIT, but not refusals",
            timeout_closes.clone(),
        );
        // 1 ms to about 70 minutes: "why did my job wait 20 minutes" must fall in a bucket.
        let wait = Histogram::new(exponential_buckets(0.001, 4.0, 12));
        registry.register_with_unit(
            "wait",
            "Time a granted LOCK waited in the queue",
            Unit::Seconds,
            wait.clone(),
        );
        // 10 ms to about 12 hours.
        let hold = Histogram::new(exponential_buckets(0.01, 4.0, 12));
        registry.register_with_unit(
            "hold",
            "Time a lease was held, from its grant to its end",
            Unit::Seconds,
            hold.clone(),
        );
        let connections = Family::<Labels, Gauge>::default();
        registry.register(
            "connections",
            "Open client connections, by protocol",
            connections.clone(),
        );
        let watchers = Gauge::default();
        registry.register("watchers", "Connections in WATCH", watchers.clone());
        let watchers_lagged = Counter::default();
        registry.register(
            "watchers_lagged",
            "Watchers disconnected for falling behind",
            watchers_lagged.clone(),
        );
        // 100 µs to about 1.6 s.
        let journal_flush = Histogram::new(exponential_buckets(0.0001, 2.0, 15));
        registry.register_with_unit(
            "journal_flush",
            "Time to write and sync one batch of changes to --data-dir",
            Unit::Seconds,
            journal_flush.clone(),
        );
        let journal_batch = Histogram::new(exponential_buckets(1.0, 2.0, 13));
        registry.register(
            "journal_batch_records",
            "Changes made durable by one sync",
            journal_batch.clone(),
        );
        let journal_backlog = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "journal_oldest_pending",
            "Age of the oldest change not yet on disk (0 when none waits; with --data-dir)",
            Unit::Seconds,
            journal_backlog.clone(),
        );
        let held = Gauge::default();
        registry.register(
            format!("{table}locks_held"),
            format!("Locks held now {whose}{aggregate}"),
            held.clone(),
        );
        let waiters = Gauge::default();
        registry.register(
            format!("{table}waiters"),
            format!("LOCK requests waiting now {whose}{aggregate}"),
            waiters.clone(),
        );
        let open_without_auth = Gauge::default();
        registry.register(
            "open_without_auth",
            "1 while a listener serves the network without authentication (--insecure-open)",
            open_without_auth.clone(),
        );
        let name_held = Family::default();
        registry.register(
            format!("{table}lock_holders"),
            format!(
                "Holders of the tracked lock (--metrics-names) {whose}: 0 or 1, more for a \
                 shared lock or a semaphore{aggregate}"
            ),
            name_held.clone(),
        );
        let name_waiters = Family::default();
        registry.register(
            format!("{table}lock_waiters"),
            format!("Queue length of the tracked lock (--metrics-names) {whose}{aggregate}"),
            name_waiters.clone(),
        );
        let name_held_seconds = Family::default();
        registry.register_with_unit(
            format!("{table}lock_held"),
            format!(
                "How long the tracked lock's holder has held it (--metrics-names), \
                 {whose}{aggregate}"
            ),
            Unit::Seconds,
            name_held_seconds.clone(),
        );
        registry.register(
            "build",
            "lockd's version, the commit it was built from, and where its locks live \
             (memory, data-dir, etcd)",
            Info::new([
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", COMMIT),
                ("backend", deployment.as_str()),
            ]),
        );

        let breaks = Counter::default();
        registry.register(
            "breaks",
            "Leases ended by BREAK (an operator's force-release), one per lease",
            breaks.clone(),
        );

        let busy_poll = BusyPollSeries::default();
        registry.register(
            "busy_poll_rests",
            "Times busy polling (--busy-poll) went to rest (the workers sleep between requests) \
             because it caught fewer than one request per window it spun idle",
            busy_poll.rests.clone(),
        );
        registry.register(
            "busy_poll_resting",
            "1 while busy polling rests, 0 while it polls or is off",
            busy_poll.resting.clone(),
        );

        let series = |family: &Family<Labels, Counter>, key, value| {
            family.get_or_create(&[(key, value)]).clone()
        };
        Metrics {
            grants_immediate: series(&grants, "wait", "immediate"),
            grants_queued: series(&grants, "wait", "queued"),
            releases: RELEASE_KINDS.map(|kind| series(&releases, "kind", kind)),
            refusals: ErrorCode::ALL.map(|code| series(&refusals, "code", code.as_str())),
            timeout_closes: TIMEOUT_CLOSES.map(|why| series(&timeout_closes, "reason", why)),
            wait,
            hold,
            connections: ["line", "compat"]
                .map(|p| connections.get_or_create(&[("protocol", p)]).clone()),
            watchers,
            watchers_lagged,
            journal_flush,
            journal_batch,
            journal_backlog,
            held,
            waiters,
            open_without_auth,
            name_held,
            name_waiters,
            name_held_seconds,
            attached: std::sync::OnceLock::new(),
            breaks,
            busy_poll,
            registry,
        }
    }

    /// The busy poller's series, for its task to keep.
    pub fn busy_poll(&self) -> BusyPollSeries {
        self.busy_poll.clone()
    }

    /// A lease began (a grant, at once or after waiting) or ended (after being held).
    pub fn lease_event(&self, event: &Event) {
        if matches!(event.kind, EventKind::Broken | EventKind::Breaking) {
            self.breaks.inc();
        }
        if event.kind == EventKind::Breaking {
            return;
        }
        match (release_kind(event.kind), event.waited) {
            (Some(i), _) => {
                self.releases[i].inc();
                self.hold.observe(event.held.as_secs_f64());
            }
            (None, None) => {
                self.grants_immediate.inc();
            }
            (None, Some(waited)) => {
                self.grants_queued.inc();
                self.wait.observe(waited.as_secs_f64());
            }
        }
    }

    /// A request was answered `ERR <code>`.
    pub fn refused(&self, code: ErrorCode) {
        if let Some(i) = ErrorCode::ALL.iter().position(|c| *c == code) {
            self.refusals[i].inc();
        }
    }

    /// A connection was told `ERR LIMIT` and closed for waiting too long.
    pub fn timeout_close(&self, why: TimeoutClose) {
        self.timeout_closes[why as usize].inc();
    }

    /// A connection opened; the returned guard counts it until dropped.
    pub fn connection(&self, protocol: Protocol) -> GaugeGuard {
        GaugeGuard::new(&self.connections[protocol as usize])
    }

    /// A connection started watching; the guard counts it until dropped.
    pub fn watcher(&self) -> GaugeGuard {
        GaugeGuard::new(&self.watchers)
    }

    pub fn watcher_lagged(&self) {
        self.watchers_lagged.inc();
    }

    /// One journal sync of `records` changes took `took`.
    pub fn journal_flushed(&self, records: usize, took: Duration) {
        self.journal_flush.observe(took.as_secs_f64());
        self.journal_batch.observe(records as f64);
    }

    /// The exposition in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        encode_registry(&mut out, &self.registry)?;
        if let Some(attached) = self.attached.get() {
            encode_registry(&mut out, attached)?;
        }
        encode_eof(&mut out)?;
        Ok(out)
    }

    /// Exports `registry`'s series too (the hook for a backend's own; one per process: a
    /// second is ignored, and false).
    pub fn attach(&self, registry: Registry) -> bool {
        self.attached.set(registry).is_ok()
    }
}

/// Counts one open thing (a connection, a watcher) in a gauge while it lives.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
