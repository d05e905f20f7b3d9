//! The embedded backend, lockd's default: the lock table in this process behind one mutex,
//! one expiry timer, waiter hand-off, events, and with `--data-dir` the journal.
//!
//! The table is behind a `std::sync::Mutex` because every operation on it is short and
//! synchronous: no method here awaits, so the guard can never be held across an `.await`.
//! Effects the table returns are carried out under the same guard (a waiter's oneshot is
//! filled while the table still says it was granted, so a hand-off can't race a disconnect);
//! logging and broadcasting happen after it is dropped.
//!
//! With a data directory, the table's changes are queued to the [`Journal`] under the same
//! guard (so the log's order is the table's order); the seam waits for
//! [`Embedded::durable`] before a change it made returns (see [`super::Backend::lock`]).
//!
//! Which session leases are bound to which connection, the table itself knows (an index of
//! them by open connection): [`Embedded::closed`] ends a closed connection's.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot, Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::auth::Gate;
use crate::locks::{
    Change, ConnId, Effect, Event, Limits, LockOutcome, LockRequest, LockStatus, Locks, Origin,
    RenewRequest, TableError, Token, UserId, WaiterId, GONE_USER,
};
use crate::metrics::Metrics;
use crate::store::{Journal, Recovered, Seq};

use super::{
    now, unix_ms, BackendError, Detail, HandOver, Health, LockStart, Published, Renewed,
    StatusSnapshot, StatusView, WaitResult,
};

struct TableState {
    table: Locks,
    waiting: HashMap<WaiterId, oneshot::Sender<WaitResult>>,
    /// The deadline the timer task sleeps until, so others wake it only when it must.
    armed: Option<Instant>,
    scratch: Vec<Effect>,
    changes: Vec<Change>,
    /// Counts the settles that may have changed the table: a STATUS snapshot taken at one
    /// generation is still exact while it has not moved.
    generation: u64,
}

/// The lock table as every connection of this process shares it.
pub struct Embedded {
    inner: Mutex<TableState>,
    timer: Notify,
    events: broadcast::Sender<Arc<Published>>,
    next_conn: AtomicU64,
    /// Where changes go to be made durable; `None` keeps everything in memory.
    journal: Option<Journal>,
    /// The users of `--auth-file`, to name the users of grants in the journal.
    users: Option<Arc<Gate>>,
    metrics: Arc<Metrics>,
    /// The last STATUS snapshot, shared by every STATUS made while the table is unchanged;
    /// the async lock makes concurrent STATUS requests wait for one copy, not make many.
    status_cache: tokio::sync::Mutex<Option<Arc<StatusSnapshot>>>,
    /// One permit per copy of the table that STATUS answers may hold at once.
    status_copies: Arc<Semaphore>,
    status_copies_max: AtomicUsize,
}

/// A `NotHeld` refusal of `token` on `name`, told as a BREAK's while the table remembers
/// one (the holder hears who broke it); any other refusal as it is.
fn why_not_held(
    table: &mut Locks,
    at: Instant,
    name: &str,
    token: Token,
    e: TableError,
) -> TableError {
    match e {
        TableError::NotHeld => table.broken(at, name, token),
        e => e,
    }
}

/// Above this many held locks, a STATUS snapshot is sorted on a blocking thread, so it does
/// not hold up the connections served by the same worker.
const SORT_ASIDE: usize = 4096;

thread_local! {
    /// [`Embedded::settle`]'s list of events, kept between calls on each thread: a LOCK and an
    /// UNLOCK make one event each, and a new list per call was an allocation per request. (A
    /// call that finds it taken, were settle ever re-entered, starts an empty one.)
    static EVENTS: Cell<Vec<Event>> = const { Cell::new(Vec::new()) };
}

/// The most events [`EVENTS`] keeps room for: after a burst (thousands of leases expiring at
/// once) the list is dropped rather than kept at its size.
const EVENTS_KEPT: usize = 64;

impl Embedded {
    /// A table with these limits; watchers may fall `watch_buffer` events behind.
    pub fn new(
        limits: Limits,
        first_token: Token,
        watch_buffer: usize,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Self::build(
            Locks::new(limits, first_token),
            watch_buffer,
            None,
            None,
            metrics,
        )
    }

    /// Like [`Embedded::new`], on the state a data directory held, recording every change to
    /// `journal`. Restored leases are plain (non-session) leases: their connections are gone.
    pub fn new_durable(
        limits: Limits,
        first_token: Token,
        watch_buffer: usize,
        journal: Journal,
        recovered: &Recovered,
        users: Option<Arc<Gate>>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let mut table = Locks::new(limits, first_token);
        table.raise_next_token(recovered.next_token);
        let at = now();
        // Restored leases count their hold time from their grant, by this wall clock.
        table.wall_clock(unix_ms());
        // A lease keeps its user across the restart; a user no longer in the file is gone.
        let known = users.as_ref().map(|gate| gate.users());
        let user = |name: &str| {
            known
                .as_ref()
                .and_then(|users| users.find(name))
                .unwrap_or(GONE_USER)
        };
        for lease in recovered.leases(at, user) {
            table.restore(at, lease);
        }
        for (token, names) in recovered.sets() {
            table.restore_set(*token, names);
        }
        for broken in recovered.breaks(at) {
            table.restore_break(at, broken);
        }
        table.journal_changes();
        Self::build(table, watch_buffer, Some(journal), users, metrics)
    }

    fn build(
        table: Locks,
        watch_buffer: usize,
        journal: Option<Journal>,
        users: Option<Arc<Gate>>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let (events, _) = broadcast::channel(watch_buffer.max(1));
        Arc::new(Embedded {
            inner: Mutex::new(TableState {
                table,
                waiting: HashMap::new(),
                armed: None,
                scratch: Vec::new(),
                changes: Vec::new(),
                generation: 0,
            }),
            timer: Notify::new(),
            events,
            next_conn: AtomicU64::new(1),
            journal,
            users,
            metrics,
            status_cache: tokio::sync::Mutex::new(None),
            status_copies: Arc::new(Semaphore::new(crate::DEFAULT_STATUS_COPIES)),
            status_copies_max: AtomicUsize::new(crate::DEFAULT_STATUS_COPIES),
        })
    }

    /// The handles this backend's counters are bumped through.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Ready to grant: with a data directory, its writer has not failed. And how long the
    /// oldest change not yet on disk has waited (`None` without a data directory or when
    /// nothing waits).
    pub fn health(&self) -> Health {
        let ready = match &self.journal {
            Some(journal) if journal.is_failed() => {
                Err("the data directory cannot be written".into())
            }
            _ => Ok(()),
        };
        let journal_backlog = self.journal.as_ref().and_then(Journal::oldest_pending);
        Health {
            ready,
            journal_backlog,
            confirmed: None,
        }
    }

    /// Held locks and queued waiters, for the metrics scrape.
    pub fn counts(&self) -> (usize, usize) {
        let g = self.guard();
        (g.table.len(), g.waiting.len())
    }

    /// The journal's mark of every change made so far, to wait for with
    /// [`Embedded::durable`]; `None` without a data directory (nothing to wait for, so the
    /// in-memory path pays one branch).
    pub fn durable_mark(&self) -> Option<Seq> {
        self.journal.as_ref().map(Journal::appended)
    }

    /// Waits until every change up to `mark` is on disk. `NotDurable`: it never will be,
    /// the server is stopping.
    pub async fn durable(&self, mark: Seq) -> Result<(), BackendError> {
        match &self.journal {
            Some(journal) => journal
                .durable(mark)
                .await
                .map_err(|_| BackendError::NotDurable),
            None => Ok(()),
        }
    }

    /// Queues the table's changes for the disk, in the table's order.
    fn record(&self, g: &mut TableState) {
        if let Some(journal) = &self.journal {
            g.table.drain_changes_into(&mut g.changes);
            if !g.changes.is_empty() {
                let users = self.users.as_ref().map(|gate| gate.users());
                let name = |user| Some(users.as_ref()?.name(user)?.to_owned());
                journal.append(&mut g.changes, now(), name);
            }
        }
    }

    /// A number for a new connection.
    /// A number for a new connection.
    pub fn connection_id(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.guard().table.limits().clone()
    }

    fn guard(&self) -> MutexGuard<'_, TableState> {
        // A panic while holding the guard can't leave the table half-changed in a way a
        // second panic would fix; keep serving rather than poisoning every connection.
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // The table reads no clock: grants made under this guard record this wall time.
        g.table.wall_clock(unix_ms());
        g
    }

    /// LOCK.
    pub fn lock(&self, req: LockRequest) -> Result<LockStart, TableError> {
        let mut g = self.guard();
        let start = match g.table.lock(now(), req)? {
            LockOutcome::Granted { token, .. } => LockStart::Granted {
                token,
                handover: HandOver::default(),
            },
            LockOutcome::Queued { waiter } => {
                let (tx, rx) = oneshot::channel();
                g.waiting.insert(waiter, tx);
                LockStart::Waiting { waiter, rx }
            }
        };
        self.settle(g);
        Ok(start)
    }

    /// UNLOCK by `user`.
    pub fn unlock(&self, name: &str, token: Token, user: UserId) -> Result<(), TableError> {
        let mut g = self.guard();
        let at = now();
        let result = g.table.unlock(at, name, token, user);
        let result = result.map_err(|e| why_not_held(&mut g.table, at, name, token, e));
        self.settle(g);
        result
    }

    /// BREAK by `by` (its right is checked before): breaks every lease of `name`, or only
    /// `token`'s ([`Locks::break_lock`]); returns how many.
    pub fn break_lock(
        &self,
        name: &str,
        token: Option<Token>,
        by: &Origin,
        force: bool,
    ) -> Result<usize, TableError> {
        let mut g = self.guard();
        let at = now();
        let result = g.table.break_lock(at, name, token, by, force);
        let result = match (result, token) {
            (Err(e), Some(token)) => Err(why_not_held(&mut g.table, at, name, token, e)),
            (result, _) => result,
        };
        self.settle(g);
        result.map(|ended| ended.len())
    }

    /// RENEW by `user` on connection `conn` (with `detach`: a plain lease from now).
    pub fn renew(
        &self,
        req: &RenewRequest,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewed, TableError> {
        let mut g = self.guard();
        let at = now();
        let RenewRequest {
            name,
            token,
            ttl,
            detach,
        } = req;
        let result = g.table.renew(at, name, *token, (*ttl, *detach), conn, user);
        let result = result.map_err(|e| why_not_held(&mut g.table, at, name, *token, e));
        self.settle(g);
        result.map(|r| Renewed {
            left: r.deadline.saturating_duration_since(at),
            bound: r.bound,
        })
    }

    /// Takes back a grant whose client is gone before it could read it (event `dropped`);
    /// the next waiter is granted. False if `token` was no longer the live lease.
    pub fn revoke(&self, name: &str, token: Token) -> bool {
        let mut g = self.guard();
        let revoked = g.table.revoke(now(), name, token).is_ok();
        self.settle(g);
        revoked
    }

    /// CHECK; returns the lease's time left.
    pub fn check(&self, name: &str, token: Token) -> Result<Duration, TableError> {
        let mut g = self.guard();
        let at = now();
        let result = g.table.check(at, name, token);
        let result = result.map_err(|e| why_not_held(&mut g.table, at, name, token, e));
        self.settle(g);
        result.map(|deadline| deadline.saturating_duration_since(at))
    }

    /// At most `copies` copies of the table are held by STATUS answers at once (see
    /// [`Embedded::status_snapshot`]); at least 1. Call it before serving.
    pub fn limit_status_copies(&self, copies: usize) {
        let copies = copies.max(1);
        let old = self.status_copies_max.swap(copies, Ordering::Relaxed);
        if copies > old {
            self.status_copies.add_permits(copies - old);
        } else {
            self.status_copies.forget_permits(old - copies);
        }
    }

    /// The table brought up to now for a read, and that now. It settles (and so counts as a
    /// change) only when expiry did something: reads alone leave the generation as it was.
    fn read_guard(&self) -> (MutexGuard<'_, TableState>, Instant) {
        loop {
            let mut g = self.guard();
            let at = now();
            g.table.expire(at);
            if !g.table.has_effects() {
                return (g, at);
            }
            self.settle(g);
        }
    }

    /// `STATUS <name>`: `None` while it is free.
    pub fn status(&self, name: &str) -> Option<LockStatus> {
        let (mut g, at) = self.read_guard();
        g.table.status(at, name)
    }

    /// One lock, its holders, and the first `max` of its queue, for `STATUS <name> detail`.
    pub fn status_detail(&self, name: &str, max: usize) -> Option<Detail> {
        let mut g = self.guard();
        let at = now();
        let detail = g.table.status(at, name).map(|status| Detail {
            status,
            holders: g.table.holders(at, name),
            queue: g.table.queue(at, name, max),
        });
        self.settle(g);
        detail
    }

    /// Every held lock, sorted by name (sorted after the guard is dropped: a large table
    /// shouldn't stall everyone for the sort).
    pub fn status_all(&self) -> Vec<LockStatus> {
        let mut all = {
            let (mut g, at) = self.read_guard();
            g.table.status_all(at)
        };
        all.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Every held lock, sorted by name, as of now. While the table does not change, every
    /// STATUS shares one snapshot, so a client that asks and never reads costs a reference,
    /// not a copy. When it has changed, a new copy is taken; at most
    /// [`Embedded::limit_status_copies`] of them exist at once, and past that this waits until
    /// an answer still being streamed from an older one is done (or its client is
    /// disconnected for not reading).
    pub async fn status_snapshot(&self) -> StatusView {
        let mut cache = self.status_cache.lock().await;
        let (generation, at) = {
            let (g, at) = self.read_guard();
            (g.generation, at)
        };
        if let Some(snapshot) = cache.as_ref().filter(|s| s.generation == generation) {
            let snapshot = Arc::clone(snapshot);
            return StatusView { snapshot, at };
        }
        // Let the cached copy go first, so its permit comes back unless a client holds it.
        *cache = None;
        let copy = Arc::clone(&self.status_copies).acquire_owned().await.ok();
        let (generation, taken, mut locks) = {
            let (mut g, at) = self.read_guard();
            (g.generation, at, g.table.status_all(at))
        };
        let by_name = |a: &LockStatus, b: &LockStatus| a.name.cmp(&b.name);
        if locks.len() > SORT_ASIDE {
            let sorted = tokio::task::spawn_blocking(move || {
                locks.sort_unstable_by(by_name);
                locks
            });
            // It only fails if the runtime is shutting down, and then so is this session.
            let Ok(sorted) = sorted.await else {
                return std::future::pending().await;
            };
            locks = sorted;
        } else {
            locks.sort_unstable_by(by_name);
        }
        let snapshot = Arc::new(StatusSnapshot {
            generation,
            taken,
            locks: locks.into_boxed_slice(),
            _copy: copy,
        });
        *cache = Some(Arc::clone(&snapshot));
        StatusView {
            snapshot,
            at: taken,
        }
    }

    /// A waiting connection is going away. If it was granted in the meantime (the grant sits
    /// unread in `rx`), its client never learned the token, so the lock is released at once.
    pub fn abandon_wait(
        &self,
        name: &str,
        waiter: WaiterId,
        mut rx: oneshot::Receiver<WaitResult>,
    ) {
        let mut g = self.guard();
        let at = now();
        if !g.table.cancel_wait(at, waiter) {
            if let Ok(WaitResult::Granted { token, .. }) = rx.try_recv() {
                let _ = g.table.revoke(at, name, token);
            }
        }
        g.waiting.remove(&waiter);
        self.settle(g);
    }

    /// Connection `conn` closed: the session leases still bound to it end, or start their
    /// grace (the table finds them by its index, without a scan).
    pub fn closed(&self, conn: ConnId) {
        let mut g = self.guard();
        if !g.table.holds_sessions(conn) {
            return;
        }
        g.table.close_connection(now(), conn);
        self.settle(g);
    }

    /// Whether a session lease is still bound to connection `conn`.
    pub fn holds_sessions(&self, conn: ConnId) -> bool {
        let (g, _) = self.read_guard();
        g.table.holds_sessions(conn)
    }

    /// Events from now on; a receiver more than `watch_buffer` behind gets `Lagged`.
    /// A receiver of every event from now on (WATCH).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Published>> {
        self.events.subscribe()
    }

    /// Carries out the table's effects and publishes their events, then releases the guard,
    /// logs, and wakes the timer if the next deadline moved earlier.
    fn settle(&self, mut g: MutexGuard<'_, TableState>) {
        g.generation = g.generation.wrapping_add(1);
        let mut effects = std::mem::take(&mut g.scratch);
        let mut events = EVENTS.take();
        loop {
            // Before the effects: a waiter is told of its grant only once the grant is queued.
            self.record(&mut g);
            g.table.drain_effects_into(&mut effects);
            if effects.is_empty() {
                break;
            }
            for effect in effects.drain(..) {
                match effect {
                    Effect::Granted {
                        waiter,
                        name,
                        token,
                        deadline,
                    } => {
                        let delivered = g.waiting.remove(&waiter).is_some_and(|tx| {
                            tx.send(WaitResult::Granted {
                                token,
                                deadline,
                                handover: HandOver::default(),
                            })
                            .is_ok()
                        });
                        if !delivered {
                            // The waiter is gone: hand the lock straight on. The table queues
                            // the release and the next grant; the outer loop carries them out.
                            let _ = g.table.revoke(now(), &name, token);
                        }
                    }
                    Effect::WaitEnded { waiter, why } => {
                        if let Some(tx) = g.waiting.remove(&waiter) {
                            let _ = tx.send(WaitResult::Ended(why));
                        }
                    }
                    Effect::Event(event) => events.push(event),
                }
            }
        }
        g.scratch = effects;
        let next = g.table.next_deadline();
        let wake = match (next, g.armed) {
            (Some(next), Some(armed)) => next < armed,
            (Some(_), None) => true,
            (None, _) => false,
        };
        // Published under the guard: two settles racing to publish after it is dropped
        // could show watchers one lock's events out of order. A send never blocks.
        if !events.is_empty() && self.events.receiver_count() > 0 {
            let unix_ms = unix_ms();
            for event in &events {
                // A watcher that left between the count and the send is fine.
                let _ = self.events.send(Arc::new(Published {
                    event: event.clone(),
                    unix_ms,
                }));
            }
        }
        drop(g);
        if wake {
            self.timer.notify_one();
        }
        for event in &events {
            super::log_event(event);
            self.metrics.lease_event(event);
        }
        events.clear();
        if events.capacity() <= EVENTS_KEPT {
            EVENTS.set(events);
        }
    }

    /// Ends leases and waits as their deadlines pass, sleeping until the soonest one: a timer,
    /// not a sweep. Runs until `shutdown`.
    pub async fn run_timer(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let next = {
                let mut g = self.guard();
                g.table.expire(now());
                let next = g.table.next_deadline();
                g.armed = next;
                self.settle(g);
                next
            };
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = sleep => {}
                _ = self.timer.notified() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
