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
//! - This file: [`Cluster`]; `start`: its start; `state`: what it keeps under its one lock (each
//!   waiter of its own a `Local`, whose `phase` says which of its requests is out);
//!   `requests`: the etcd requests every part sends through (`txn`, `get`, `cleanup`) and
//!   what each answer or failure tells, over `rpc`, the crate `lockd_etcd`; `commit`: group
//!   commit, the transactions that come while others are in flight sent as one.
//! - `keys`: the key layout; `values` (holders, waiters) and `marks` (markers, broken-lease
//!   records, superseded marks): the records stored under it, as `words`; `mirror`: the
//!   prefix as the watch has shown it (`apply`: how its changes are applied; `holder_events`:
//!   the WATCH events they make); `view`: a mirrored name as the lock rules see it, and the
//!   LOCK decision ([`crate::locks::rules`] decides; nothing here checks a mode, id or
//!   limit); `guards`: every comparison a write is guarded by, built once from named parts.
//! - The core, without I/O or clock (ARCHITECTURE.md has its table): `planning` (what a LOCK
//!   does), `at_once` and `set_at_once` (a grant at once), `queued`, `set_queued`, `supersede`
//!   and `waits` (a queued LOCK), `leaving` (a wait's end), `head` (a queue head's grant),
//!   `end` (a lease's end, and the grant in its write), `holding` and `renewal` (a token's
//!   record; RENEW, CHECK, the same LOCK again), `breaking` (BREAK), `expiring` and `expired`
//!   (the timer fired; a lock-delay's write), `watched` (a watch batch taken in), `delivery`
//!   (what a waiter is told), `confirmation`, `reads` and `resynced` (what a read says; a
//!   re-read after a compaction), `slots` and `slot_answers`, `footprints` (what group commit
//!   keeps apart); over `state` (with `bound`, the
//!   mirror and the records). Stepped by hand against the in-memory etcd in their `_tests`
//!   files on `stepping`'s stage; `core_tests` lists the core's files and checks they do no
//!   I/O, read no clock and import no driver; `shape_tests` checks that no file or function
//!   is too long and that neither the files' imports nor `Cluster`'s methods form a cycle.
//! - Their drivers, the requests: `grant` (LOCK), `again` (the same LOCK again), `enqueue`
//!   (a queued LOCK's write), `sets` and `set_queue` (a LOCK of several names), `queueing`
//!   (what every queueing write shares), `waiters` (a wait's end), `holders` (RENEW, CHECK),
//!   `sessions` (a closed connection's session leases), `release` (UNLOCK and every other
//!   end), `status`, `breaks` and `broken` (BREAK, and what is known of breaks).
//! - Background: `run` (starts the rest, and ends them), `watch` (keeps the mirror; `resync`
//!   reads it whole again), `queue_head`, `handover` and `confirm` (a grant's way to its
//!   waiter), `lease` (this front-end's etcd lease), `expiry` (the timer), `quorum` (when a
//!   quorum last answered); `fresh` (how current the mirror is for one name), `slot_writes`,
//!   `log` (a change logged and counted, and its marker), `notify` (what watchers are told),
//!   `cause` (a failed request in one plain sentence) and `stats` serve them all.
//! - `secure`: TLS and authentication toward etcd, and the start's first request; `refusal`:
//!   why etcd refused them for good, in one plain sentence.
//! - `model`: the LOCK decision over a name made from plain parts, for the model test.

mod again;
mod apply;
mod at_once;
#[cfg(test)]
mod at_once_tests;
mod bound;
mod breaking;
#[cfg(test)]
mod breaking_tests;
mod breaks;
mod broken;
mod cause;
mod commit;
#[cfg(test)]
mod commit_tests;
mod confirm;
mod confirmation;
#[cfg(test)]
mod core_tests;
mod delivery;
mod end;
#[cfg(test)]
mod end_tests;
mod enqueue;
mod expired;
#[cfg(test)]
mod expired_tests;
mod expiring;
#[cfg(test)]
mod expiring_tests;
mod expiry;
mod footprints;
mod fresh;
mod gap;
mod grant;
mod guards;
mod handover;
mod hashing;
mod head;
#[cfg(test)]
mod head_tests;
mod holder_events;
mod holders;
mod holding;
#[cfg(test)]
mod holding_tests;
mod keys;
mod lag;
mod lease;
mod leaving;
#[cfg(test)]
mod leaving_tests;
mod log;
mod marks;
mod mirror;
#[doc(hidden)]
pub mod model;
mod notify;
mod phase;
mod planning;
#[cfg(test)]
mod planning_tests;
mod queue_head;
mod queued;
#[cfg(test)]
mod queued_tests;
mod queueing;
mod quorum;
mod reads;
#[cfg(test)]
mod reads_tests;
mod refusal;
mod release;
mod renewal;
#[cfg(test)]
mod renewal_tests;
mod requests;
mod resync;
mod resynced;
#[cfg(test)]
mod resynced_tests;
mod routing;
mod run;
mod secure;
mod sessions;
mod set_at_once;
#[cfg(test)]
mod set_at_once_tests;
mod set_queue;
mod set_queued;
#[cfg(test)]
mod set_queued_tests;
mod sets;
#[cfg(test)]
mod shape_tests;
#[doc(hidden)]
pub mod sim;
mod slot_answers;
#[cfg(test)]
mod slot_answers_tests;
mod slot_writes;
mod slots;
mod start;
mod state;
#[cfg(test)]
mod state_tests;
mod stats;
mod status;
#[cfg(test)]
mod stepping;
mod supersede;
mod tokens;
mod values;
mod view;
mod waiters;
mod waits;
mod watch;
mod watched;
#[cfg(test)]
mod watched_tests;
mod words;

// lockd's etcd client (crates/lockd-etcd), under the name the backend's files use.
use lockd_etcd as rpc;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rpc::Client;
use tokio::sync::{broadcast, Notify};

use crate::auth::Gate;
use crate::locks::{ConnId, Limits, UserId, NO_USER};
use crate::metrics::Metrics;

use super::{BackendError, EtcdConfig, Published};
use keys::Layout;
use phase::Phase;
use state::{ClusterState, Local};

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
    /// etcd answered again after an outage (`healthy` went back to true): a clean-up write
    /// sent while it was away is sent again at once ([`Cluster::cleanup`]).
    reachable_again: Notify,
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
    /// The revision at which this front-end's registration key was last put (0 before the
    /// first), and whether a put of it is on its way (`lease.rs::keep_announced`).
    announced: AtomicI64,
    announcing: AtomicBool,
    config: EtcdConfig,
    /// The BREAKs this front-end is making: (holder's create revision, its token, who
    /// sent it), for the marker and the log line of each (`breaks.rs`).
    breaking: Mutex<Vec<(i64, crate::locks::Token, crate::locks::Origin)>>,
    /// How far this front-end's wall clock is off the true time, in milliseconds: zero,
    /// except in the cluster simulator, which moves it (`sim::skew`).
    skew_ms: AtomicI64,
    /// Grants to take back that a write's answer found (`release.rs::take_back_loop`), and
    /// the queue's end that loop takes once.
    take_backs: tokio::sync::mpsc::Sender<delivery::TakeBack>,
    take_backs_queue: Mutex<Option<tokio::sync::mpsc::Receiver<delivery::TakeBack>>>,
    /// Every transaction goes through it (`commit.rs`).
    commit: commit::GroupCommit,
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
    /// This front-end's wall clock, in milliseconds: what it writes deadlines in.
    fn wall_ms(&self) -> u64 {
        wall_ms().saturating_add_signed(self.skew_ms.load(Ordering::Relaxed))
    }

    /// Who this front-end is, as its core needs it.
    fn me(&self) -> head::Me<'_> {
        head::Me {
            fe: &self.fe,
            layout: &self.layout,
        }
    }

    fn guard(&self) -> MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handles this backend's counters are bumped through.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
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

    fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }
}

/// Waits between attempts to reach etcd again.
const RETRY: Duration = Duration::from_millis(200);
