//! The etcd backend (`--etcd`): lockd front-ends that keep every lock in an etcd cluster.
//!
//! No consensus of our own: every change is one etcd transaction whose comparisons make it
//! safe whatever the other front-ends do at the same time (see [`keys`] for the layout). Each
//! front-end keeps a [`mirror::Mirror`] of the prefix from one watch stream and decides from
//! it; a decision made on a stale mirror fails its comparison, and is made again once the
//! mirror has caught up. So:
//! - a grant is "the marker of the name is as I saw it (no holder came or went), nobody is
//!   queued ahead of this waiter (or nobody at all, for a grant at once)": at most the holders
//!   the mode allows, FIFO across front-ends;
//! - a release grants the head waiter in the same write when it can (it fits and the mirror
//!   is current); otherwise it writes the marker and only the front-end of the head waiter
//!   acts on it. Either way one waiter is woken in the whole cluster. A grant to another
//!   front-end's waiter hangs on that front-end's etcd lease, which may be dying; a plain
//!   one is taken off it by that front-end before its client is told;
//! - a grant whose waiter left is taken back only as it was handed over (guarded by the
//!   holder key's mod revision at hand-over): a client told of it since keeps it;
//! - tokens are the base plus the revision of the granting transaction: strictly increasing
//!   in grant order across all names and front-ends;
//! - plain leases are keys without an etcd lease: they outlive their front-end, and any
//!   front-end renews, checks, releases or expires them. Session leases and waiters hang on
//!   their front-end's etcd lease, so they end within `--etcd-lease-ttl` of its death. The
//!   front-end keeps an index of the session leases it granted or bound, by connection
//!   (`sessions`), to end a connection's when it closes.
//!
//! # Map (one concept a file)
//! - `keys`: the key layout; `values` (holders, waiters) and `marks` (markers, broken-lease
//!   records, superseded marks): the records stored under it, as `words`; `mirror`: the
//!   prefix as the watch has shown it (`apply`: how its changes are applied; `holder_events`:
//!   the WATCH events they make); `view`: a mirrored name as the lock rules see it, and the LOCK
//!   decision ([`crate::locks::rules`] decides; nothing here checks a mode, id or limit);
//!   `guards`: every comparison a write is guarded by, built once from named parts.
//! - Requests: `grant` (LOCK at once or again), `sets` (a LOCK of several names: granted,
//!   queued and handed over whole), `waiters` (a queued LOCK and its end),
//!   `holders` (RENEW, CHECK, a closed connection's session leases), `release` (UNLOCK and
//!   every other end, granting the head waiter in the same write), `status`, `breaks`
//!   (BREAK: ends leases by `release`'s write, and keeps a record of each for its holder).
//! - Background: `watch` (keeps the mirror, starts the rest), `handover` (grants to this
//!   front-end's waiters, their confirmation and delivery), `lease` (this front-end's etcd
//!   lease), `expiry` (the timer), `sessions` (the index of session leases by connection),
//!   `quorum` (when a quorum last answered: readiness, and the probe that asks when nothing
//!   else did); `fresh` (how current the mirror is for one name), `log` (a change logged and
//!   counted, and its marker), `cause` (a failed request in one plain sentence) and `stats`
//!   (the `lockd_etcd_*` series) serve them all.
//! - `secure`: TLS and authentication toward etcd, and the start's first request; `refusal`:
//!   why etcd refused them for good, in one plain sentence.
//! - `model`: the LOCK decision over a name made from plain parts, for the model test.

mod apply;
mod breaks;
mod cause;
mod expiry;
mod fresh;
mod gap;
mod grant;
mod guards;
mod handover;
mod hashing;
mod holder_events;
mod holders;
mod keys;
mod lag;
mod lease;
mod log;
mod marks;
mod mirror;
#[doc(hidden)]
pub mod model;
mod phase;
mod quorum;
mod refusal;
mod release;
mod routing;
mod rpc;
mod secure;
mod sessions;
mod sets;
#[doc(hidden)]
pub mod sim;
mod slots;
mod stats;
mod status;
mod values;
mod view;
mod waiters;
mod watch;
mod words;

use hashing::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rpc::{Client, ConnectOptions, Txn, TxnOp};
use tokio::sync::{broadcast, oneshot, Notify};

use crate::auth::Gate;
use crate::locks::{ConnId, Limits, LockRequest, UserId, WaiterId, NO_USER};
use crate::metrics::Metrics;

use super::{BackendError, EtcdConfig, Published, WaitResult};
use keys::Layout;
use mirror::Mirror;
use phase::Phase;
use values::WaiterValue;

/// A waiter of this front-end.
struct Local {
    name: String,
    uid: String,
    /// Its keys' slot (`slots.rs`): on its other names too, for a set.
    slot: String,
    key: String,
    /// Its key's create revision (its place in the queue), once known (from the put's
    /// answer or the watch).
    rev: i64,
    /// The revision of this front-end's write of its key: the key is still this waiter's
    /// only while its mod revision is that (another front-end may take the place over).
    mod_rev: i64,
    tx: oneshot::Sender<WaitResult>,
    req: LockRequest,
    value: WaiterValue,
    queued: Instant,
    /// Which request of it is out, and so what may be done to it now.
    phase: Phase,
    /// Every name of its set (`name` first), each with a key in `slot`; empty for one name.
    set: Vec<String>,
    /// Dropped with the waiter, however it leaves, which ends its `wait=` timer task (see
    /// `Cluster::end_wait_after`): no task outlives the wait it times.
    timer: Option<oneshot::Sender<()>>,
}

struct ClusterState {
    mirror: Mirror,
    waiting: HashMap<WaiterId, Local>,
    by_uid: HashMap<String, WaiterId>,
    /// Waiters of this front-end that left (timed out, went away, were replaced) while their
    /// key may still be granted, by this or another front-end: if their holder appears, the
    /// grant is taken back. Forgotten once their key is seen gone.
    left: HashSet<String>,
    /// Names this front-end wrote, at the revision of its last write (and whether that
    /// write emptied the name), until the mirror has seen it.
    written: HashMap<String, (i64, bool)>,
    /// Grants made at once by this front-end that the mirror has not shown yet (by name and
    /// create revision).
    fresh: HashMap<(String, i64), mirror::HolderRecord>,
    /// Holders an expiry transaction is out for, so the timer does not send it twice.
    expiring: HashSet<(String, i64)>,
    /// The session leases this front-end granted or bound, by connection.
    bound: sessions::BoundLeases,
    /// Waiters of this front-end (by uid) whose superseded mark the watch brought, until
    /// their gone key is answered: how the wait ends, told apart from a lost etcd lease.
    superseded: HashMap<String, crate::locks::WaitEnd>,
    /// The slots of this front-end's keys, free and taken.
    slots: slots::Slots,
    /// Waiter keys (a set's first) of no request of this front-end whose removal is out
    /// (`handover.rs::evaluate`): one write each, however often the name changes meanwhile.
    forgetting: HashSet<String>,
    /// Waiters (by uid) whose grant the watch delivered from their confirmation's own write
    /// while its answer was out (`handover.rs::on_grant`): that answer, when it comes, neither
    /// delivers nor takes the grant back.
    confirmed_by_watch: HashSet<String>,
}

impl ClusterState {
    /// The waiter of this front-end that waits under `uid`.
    fn waiting_mut(&mut self, uid: &str) -> Option<&mut Local> {
        let waiter = self.by_uid.get(uid)?;
        self.waiting.get_mut(waiter)
    }

    /// Whether a waiter of this front-end waits under `uid` on `name` (its own name, or one
    /// of its set's).
    fn waits_on(&self, uid: &str, name: &str) -> bool {
        self.by_uid
            .get(uid)
            .and_then(|w| self.waiting.get(w))
            .is_some_and(|l| l.name == name || l.set.iter().any(|n| n == name))
    }

    /// A waiter of this front-end leaves (its wait ran out, its connection went): out of the
    /// local tables, and remembered as gone in case its grant is being made right now.
    fn leave(&mut self, waiter: WaiterId) -> Option<Local> {
        let local = self.waiting.remove(&waiter)?;
        self.by_uid.remove(&local.uid);
        self.superseded.remove(&local.uid);
        self.left.insert(local.uid.clone());
        Some(local)
    }
}

/// The etcd backend of one front-end.
pub struct Cluster {
    client: Client,
    layout: Layout,
    /// This front-end's id, unique per process.
    fe: String,
    lease: AtomicI64,
    state: Mutex<ClusterState>,
    events: broadcast::Sender<Arc<Published>>,
    /// The mirror moved: the expiry timer looks again.
    moved: Notify,
    next_conn: AtomicU64,
    next_uid: AtomicU64,
    limits: Limits,
    metrics: Arc<Metrics>,
    users: Option<Arc<Gate>>,
    /// Whether the last contact with etcd worked, so that an outage is logged once (readiness
    /// is [`Cluster::quorum`]'s).
    healthy: AtomicBool,
    /// When a quorum last answered.
    quorum: quorum::Quorum,
    stats: stats::EtcdStats,
    /// The newest revision etcd reported in any answer, and the last one the watch
    /// delivered (its header's): their difference is the mirror's lag.
    seen_rev: AtomicI64,
    watch_rev: AtomicI64,
    /// Whether etcd confirmed this front-end's etcd lease live at the last keep-alive: false
    /// while keep-alives go unanswered, and from the moment etcd says the lease is gone until
    /// a new one is taken (no session lease or wait can be had meanwhile).
    leased: AtomicBool,
    config: EtcdConfig,
    /// The BREAKs this front-end is making: (holder's create revision, its token, who
    /// sent it), for the marker and the log line of each (`breaks.rs`).
    breaking: Mutex<Vec<(i64, crate::locks::Token, crate::locks::Origin)>>,
    /// How far this front-end's wall clock is off the true time, in milliseconds: zero,
    /// except in the cluster simulator, which moves it (`sim::skew`).
    skew_ms: AtomicI64,
}

/// Wall-clock milliseconds: deadlines in etcd are wall clock, shared by every front-end.
pub(crate) fn wall_ms() -> u64 {
    crate::backend::unix_ms()
}

/// What a front-end starts with, besides its etcd client.
pub struct Settings {
    /// Where etcd is and how long to wait for it.
    pub config: EtcdConfig,
    /// The limits in force (`--max-locks`, `--max-ttl`, ...).
    pub limits: Limits,
    /// Events a WATCH may fall behind by (`--watch-buffer`).
    pub watch_buffer: usize,
    /// Users and rights (`--auth-file`), if any.
    pub users: Option<Arc<Gate>>,
    /// The counters it bumps.
    pub metrics: Arc<Metrics>,
}

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
    async fn start(
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
        let cluster = Arc::new(Cluster {
            client,
            layout,
            fe,
            lease: AtomicI64::new(0),
            state: Mutex::new(ClusterState {
                mirror: Mirror::default(),
                waiting: HashMap::default(),
                by_uid: HashMap::default(),
                left: Default::default(),
                written: HashMap::default(),
                fresh: HashMap::default(),
                expiring: Default::default(),
                bound: Default::default(),
                superseded: HashMap::default(),
                slots: slots::Slots::new(&fe_id),
                forgetting: HashSet::default(),
                confirmed_by_watch: HashSet::default(),
            }),
            events,
            moved: Notify::new(),
            next_conn: AtomicU64::new(1),
            next_uid: AtomicU64::new(1),
            limits,
            metrics: Arc::clone(&metrics),
            users,
            healthy: AtomicBool::new(false),
            quorum: quorum::Quorum::new(config.lease_ttl),
            stats: stats::EtcdStats::register(&metrics),
            seen_rev: AtomicI64::new(0),
            watch_rev: AtomicI64::new(0),
            leased: AtomicBool::new(false),
            config,
            breaking: Mutex::new(Vec::new()),
            skew_ms: AtomicI64::new(0),
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
    /// backend starts its tokens, so tokens keep growing across a move between backends).
    async fn load_base(&self) -> Result<(), BackendError> {
        let key = self.layout.base();
        let first = super::first_token().to_string();
        let txn = Txn::new()
            .when([guards::absent(&key)])
            .and_then([TxnOp::put(key.clone(), first, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        self.txn(txn).await.map_err(|e| self.unavailable(&e))?;
        let got = self
            .get(key, None)
            .await
            .map_err(|e| self.unavailable(&e))?;
        let base = got
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok()?.parse().ok())
            .ok_or_else(|| BackendError::Unavailable("etcd: no token base".into()))?;
        self.guard().mirror.base = base;
        Ok(())
    }

    /// This front-end's wall clock, in milliseconds: what it writes deadlines in.
    fn wall_ms(&self) -> u64 {
        wall_ms().saturating_add_signed(self.skew_ms.load(Ordering::Relaxed))
    }

    fn guard(&self) -> MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handles this backend's counters are bumped through.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn ready(&self) -> Result<(), std::borrow::Cow<'static, str>> {
        if let Some(why) = self.quorum.stale() {
            Err(why.into())
        } else if !self.leased.load(Ordering::Relaxed) {
            Err("this front-end's etcd lease is not confirmed live (keep-alive unanswered, or it ran out and a new one is being taken)".into())
        } else {
            Ok(())
        }
    }

    /// How old this front-end's view is: the age of its last quorum answer, and the bound
    /// past which it is not ready.
    pub fn freshness(&self) -> crate::proto::EtcdAge {
        crate::proto::EtcdAge {
            age: self.quorum.age(),
            bound: self.quorum.bound(),
        }
    }

    /// Sets the `lockd_etcd_*` gauges, for a scrape.
    pub fn scrape(&self) {
        let lag = self.seen_rev.load(Ordering::Relaxed) - self.watch_rev.load(Ordering::Relaxed);
        let slots = self.guard().slots.counts();
        self.stats
            .scrape(Some(self.quorum.age()), self.quorum.fresh(), lag, slots);
    }

    /// Why `e` failed, in one plain sentence.
    fn cause_of(&self, e: &rpc::Error) -> cause::Cause {
        let cx = cause::Context {
            endpoints: &self.config.endpoints,
            request_timeout: self.config.request_timeout,
        };
        cause::cause(e, &cx)
    }

    /// [`Cluster::cause_of`], with the client's own text on a debug line (once per failure:
    /// where it happened, the request wrappers and the watch).
    fn explain(&self, e: &rpc::Error) -> cause::Cause {
        let cause = self.cause_of(e);
        tracing::debug!(error = ?e, cause = cause.sentence, "etcd request failed");
        cause
    }

    /// `e` as the client is told it: `ERR UNAVAILABLE <sentence>; try again`.
    pub(super) fn unavailable(&self, e: &rpc::Error) -> BackendError {
        BackendError::Unavailable(self.cause_of(e).sentence)
    }

    /// An etcd request sent at `started` was answered by a quorum, at revision `rev`.
    pub(super) fn answered(&self, started: Instant, rev: i64) {
        self.stats
            .request(crate::backend::now().saturating_duration_since(started));
        self.seen_rev.fetch_max(rev, Ordering::Relaxed);
        if let Some(after) = self.quorum.answered() {
            tracing::info!(
                after = %humantime::format_duration(Duration::from_millis(after.as_millis() as u64)),
                "etcd quorum answers again"
            );
        }
        self.healthy.store(true, Ordering::Relaxed);
    }

    /// An etcd request sent at `started` failed with `e`: counted, remembered as the reason
    /// `/readyz` gives, and returned in one sentence.
    pub(super) fn request_failed(&self, started: Instant, e: &rpc::Error) -> String {
        self.stats
            .request(crate::backend::now().saturating_duration_since(started));
        let cause = self.explain(e);
        self.stats.error(cause.kind);
        self.quorum.failed(&cause.sentence);
        cause.sentence
    }

    /// Records the outcome of one etcd request sent at `started`.
    fn record<T>(
        &self,
        started: Instant,
        result: &Result<T, rpc::Error>,
        header: impl Fn(&T) -> Option<&rpc::ResponseHeader>,
    ) {
        match result {
            Ok(resp) => self.answered(started, header(resp).map_or(0, |h| h.revision())),
            Err(e) => {
                self.request_failed(started, e);
            }
        }
    }

    /// Held leases and queued waiters, as the mirror shows them.
    pub fn counts(&self) -> (usize, usize) {
        self.guard().mirror.counts()
    }

    /// A number for a new connection.
    pub fn connection_id(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits.clone()
    }

    /// STATUS copies are made per request from the mirror; nothing to bound beyond that.
    pub fn limit_status_copies(&self, _copies: usize) {}

    /// A receiver of every event from now on (WATCH).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Published>> {
        self.events.subscribe()
    }

    /// The name of `user`, as leases record their owner in etcd (every front-end numbers
    /// users its own way; names are what they share).
    fn user_name(&self, user: UserId) -> String {
        if user == NO_USER {
            return String::new();
        }
        self.users
            .as_ref()
            .and_then(|g| g.users().name(user).map(str::to_owned))
            .unwrap_or_else(|| "?".into())
    }

    /// A new request's uid, never used before: what this front-end's tables know it by.
    fn uid(&self) -> String {
        format!(
            "{}-{}",
            self.fe,
            self.next_uid.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A slot for the keys of a new request on `names` names (`slots.rs`).
    fn take_slot(&self, names: usize) -> String {
        self.guard().slots.take(names)
    }

    /// Whether an [`guards::in_empty_slot`] write of keys in `slot` on `names` was made.
    /// Refused, the slot is given back; a key found in it (a slot thought free by mistake,
    /// or a key this front-end can't read), it stays taken and the request takes another.
    fn slot_written<'a>(
        &self,
        slot: &str,
        names: impl IntoIterator<Item = &'a str> + Clone,
        resp: &rpc::TxnResponse,
    ) -> bool {
        match guards::slot_write(resp) {
            guards::SlotWrite::Done => true,
            guards::SlotWrite::Refused => {
                self.give_back(slot, names);
                false
            }
            guards::SlotWrite::Taken => {
                let names: Vec<&str> = names.into_iter().collect();
                tracing::warn!(
                    fe = self.fe,
                    slot,
                    names = names.join(" "),
                    "a key is in a slot this front-end thought free: it takes another"
                );
                self.guard().slots.give_back(slot, names.len());
                false
            }
        }
    }

    /// The write that would have created keys in `slot` on `names` failed its comparisons:
    /// the slot is free again, unless the mirror shows a key in it.
    fn give_back<'a>(&self, slot: &str, names: impl IntoIterator<Item = &'a str>) {
        let mut g = self.guard();
        let present = names
            .into_iter()
            .filter(|n| g.mirror.name(n).is_some_and(|ns| ns.uses_slot(slot)))
            .count();
        g.slots.give_back(slot, present);
    }

    fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }

    /// One transaction. A request that never reached a member (connection refused: that
    /// member is down) is sent again at once: the client spreads requests over every
    /// endpoint and may pick a dead one, and it has no fail-over of its own.
    pub(super) async fn txn(&self, txn: Txn) -> Result<rpc::TxnResponse, rpc::Error> {
        let mut client = self.client.clone();
        let mut tries = 0u64;
        loop {
            let started = crate::backend::now();
            let result = client.txn(txn.clone()).await;
            self.record(started, &result, |r| r.header());
            if matches!(&result, Ok(r) if !r.succeeded()) {
                self.stats.error(cause::Kind::Conflict);
            }
            match result {
                Err(e) if not_sent(&e) && tries < self.resends() => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                }
                done => return done,
            }
        }
    }

    /// One read, sent again like [`Cluster::txn`].
    pub(super) async fn get(
        &self,
        key: String,
        options: Option<rpc::GetOptions>,
    ) -> Result<rpc::GetResponse, rpc::Error> {
        let mut client = self.client.clone();
        let mut tries = 0u64;
        loop {
            let started = crate::backend::now();
            let result = client.get(key.clone(), options.clone()).await;
            self.record(started, &result, |r| r.header());
            match result {
                Err(e) if not_sent(&e) && tries < self.resends() => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                }
                done => return done,
            }
        }
    }

    /// Resends after "connection refused": enough to go round every endpoint twice.
    pub(super) fn resends(&self) -> u64 {
        2 * self.config.endpoints.len() as u64
    }

    /// A clean-up write (ending a lease, leaving the queue) that must happen even if etcd is
    /// away for a while: a waiter key left behind would stop its queue for as long as this
    /// front-end lives. Tried until etcd answers (the transaction's comparisons make a retry
    /// of a write that did land a no-op), or until [`CLEANUP_TRIES`] failures in a row.
    async fn cleanup(&self, txn: Txn) -> Option<rpc::TxnResponse> {
        for _ in 0..CLEANUP_TRIES {
            match self.txn(txn.clone()).await {
                Ok(resp) => return Some(resp),
                Err(e) => {
                    self.unhealthy(&self.cause_of(&e).sentence);
                    tokio::time::sleep(CLEANUP_PAUSE).await;
                }
            }
        }
        None
    }
}

/// Waits between attempts to reach etcd again.
const RETRY: Duration = Duration::from_millis(200);

/// A clean-up write is tried this many times, [`CLEANUP_PAUSE`] apart (each try waits up to
/// `--etcd-request-timeout`): about a minute and a half of etcd outage at the default.
const CLEANUP_TRIES: usize = 40;
const CLEANUP_PAUSE: Duration = Duration::from_millis(250);

/// Whether a request failed before any member saw it (its connection was refused), so that
/// sending it again can't apply it twice. The client reports this as a transport error, or
/// as an `Unavailable` status whose message is the connector's.
pub(super) fn not_sent(e: &rpc::Error) -> bool {
    match e {
        rpc::Error::TransportError(_) => true,
        rpc::Error::GRpcStatus(status) => status.message().contains("connect error"),
        _ => false,
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
