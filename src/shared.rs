//! The shell around the lock table: one mutex, one expiry timer, waiter hand-off, events.
//!
//! The table is behind a `std::sync::Mutex` because every operation on it is short and
//! synchronous: no method here awaits, so the guard can never be held across an `.await`.
//! Effects the table returns are carried out under the same guard (a waiter's oneshot is
//! filled while the table still says it was granted, so a hand-off can't race a disconnect);
//! logging and broadcasting happen after it is dropped.
//!
//! With a data directory, the table's changes are queued to the [`Journal`] under the same
//! guard (so the log's order is the table's order), and a session calls [`Shared::durable`]
//! before the `OK` that reports a change.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, oneshot, Notify};
use tokio_util::sync::CancellationToken;

use crate::locks::{
    Change, ConnId, Effect, Event, EventKind, Limits, LockOutcome, LockRequest, LockStatus, Locks,
    TableError, Token, WaitEnd, WaiterId,
};
use crate::store::{Journal, Recovered, Stopped};

/// How a queued LOCK ends.
#[derive(Debug)]
pub enum WaitResult {
    Granted { token: Token, deadline: Instant },
    Ended(WaitEnd),
}

/// What a RENEW did.
#[derive(Debug)]
pub struct Renewed {
    /// The lease's time left.
    pub left: Duration,
    /// A session lease in its grace is now bound to the renewing connection, which must end
    /// it (or start its grace again) when it closes.
    pub bound: bool,
}

/// What a LOCK did at once.
#[derive(Debug)]
pub enum LockStart {
    Granted {
        token: Token,
    },
    /// Queued: `rx` receives the outcome. Give it back through [`Shared::abandon_wait`] if the
    /// connection goes first.
    Waiting {
        waiter: WaiterId,
        rx: oneshot::Receiver<WaitResult>,
    },
}

/// An event as watchers see it: what happened and when (wall clock, for people).
#[derive(Debug)]
pub struct Published {
    pub event: Event,
    pub unix_ms: u64,
}

struct Inner {
    table: Locks,
    waiting: HashMap<WaiterId, oneshot::Sender<WaitResult>>,
    /// The deadline the timer task sleeps until, so others wake it only when it must.
    armed: Option<Instant>,
    scratch: Vec<Effect>,
    changes: Vec<Change>,
}

/// The lock table as every connection shares it.
pub struct Shared {
    inner: Mutex<Inner>,
    timer: Notify,
    events: broadcast::Sender<Arc<Published>>,
    next_conn: AtomicU64,
    /// Where changes go to be made durable; `None` keeps everything in memory.
    journal: Option<Journal>,
}

/// The current time as the table counts it. Tokio's clock, so paused-time tests drive leases.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Where tokens start: wall-clock microseconds, so a restarted server continues above the
/// tokens it granted before (as long as it granted fewer than a million a second on average
/// and the clock did not step back).
pub fn first_token() -> Token {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as Token)
        .unwrap_or(1)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Shared {
    /// A table with these limits; watchers may fall `watch_buffer` events behind.
    pub fn new(limits: Limits, first_token: Token, watch_buffer: usize) -> Arc<Self> {
        Self::build(Locks::new(limits, first_token), watch_buffer, None)
    }

    /// Like [`Shared::new`], on the state a data directory held, recording every change to
    /// `journal`. Restored leases are plain (non-session) leases: their connections are gone.
    pub fn new_durable(
        limits: Limits,
        first_token: Token,
        watch_buffer: usize,
        journal: Journal,
        recovered: &Recovered,
    ) -> Arc<Self> {
        let mut table = Locks::new(limits, first_token);
        table.raise_next_token(recovered.next_token);
        let at = now();
        for lease in recovered.leases(at) {
            table.restore(at, lease);
        }
        table.journal_changes();
        Self::build(table, watch_buffer, Some(journal))
    }

    fn build(table: Locks, watch_buffer: usize, journal: Option<Journal>) -> Arc<Self> {
        let (events, _) = broadcast::channel(watch_buffer.max(1));
        Arc::new(Shared {
            inner: Mutex::new(Inner {
                table,
                waiting: HashMap::new(),
                armed: None,
                scratch: Vec::new(),
                changes: Vec::new(),
            }),
            timer: Notify::new(),
            events,
            next_conn: AtomicU64::new(1),
            journal,
        })
    }

    /// Waits until every change made so far is on disk: call it after a change and before
    /// the `OK` that reports it. `None` when there is nothing to wait for (no data directory),
    /// so the in-memory path pays one branch. `Err` means it never will be: the server is
    /// stopping.
    pub fn durable(&self) -> Option<impl Future<Output = Result<(), Stopped>> + '_> {
        let journal = self.journal.as_ref()?;
        Some(journal.durable(journal.appended()))
    }

    /// Queues the table's changes for the disk, in the table's order.
    fn record(&self, g: &mut Inner) {
        if let Some(journal) = &self.journal {
            g.table.drain_changes_into(&mut g.changes);
            if !g.changes.is_empty() {
                journal.append(&mut g.changes, now());
            }
        }
    }

    /// A number for a new connection.
    pub fn connection_id(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub fn limits(&self) -> Limits {
        self.guard().table.limits().clone()
    }

    fn guard(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the guard can't leave the table half-changed in a way a
        // second panic would fix; keep serving rather than poisoning every connection.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// LOCK.
    pub fn lock(&self, req: LockRequest) -> Result<LockStart, TableError> {
        let mut g = self.guard();
        let start = match g.table.lock(now(), req)? {
            LockOutcome::Granted { token, .. } => LockStart::Granted { token },
            LockOutcome::Queued { waiter } => {
                let (tx, rx) = oneshot::channel();
                g.waiting.insert(waiter, tx);
                LockStart::Waiting { waiter, rx }
            }
        };
        self.settle(g);
        Ok(start)
    }

    /// UNLOCK.
    pub fn unlock(&self, name: &str, token: Token) -> Result<(), TableError> {
        let mut g = self.guard();
        let result = g.table.unlock(now(), name, token);
        self.settle(g);
        result
    }

    /// RENEW on connection `conn`.
    pub fn renew(
        &self,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        conn: ConnId,
    ) -> Result<Renewed, TableError> {
        let mut g = self.guard();
        let at = now();
        let result = g.table.renew(at, name, token, ttl, conn);
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
        self.settle(g);
        result.map(|deadline| deadline.saturating_duration_since(at))
    }

    pub fn status(&self, name: &str) -> Option<LockStatus> {
        let mut g = self.guard();
        let status = g.table.status(now(), name);
        self.settle(g);
        status
    }

    /// Every held lock, sorted by name (sorted after the guard is dropped: a large table
    /// shouldn't stall everyone for the sort).
    pub fn status_all(&self) -> Vec<LockStatus> {
        let mut g = self.guard();
        let mut all = g.table.status_all(now());
        self.settle(g);
        all.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        all
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

    /// Ends the session leases a closing connection still holds.
    pub fn drop_sessions(&self, conn: ConnId, leases: &HashMap<String, Token>) {
        if leases.is_empty() {
            return;
        }
        let mut g = self.guard();
        let at = now();
        for (name, token) in leases {
            g.table.drop_session(at, name, *token, conn);
        }
        self.settle(g);
    }

    /// Keeps only the session leases that are still live, so a long-lived connection's list
    /// stays as small as what it holds.
    pub fn retain_live(&self, leases: &mut HashMap<String, Token>) {
        let mut g = self.guard();
        let at = now();
        leases.retain(|name, token| g.table.check(at, name, *token).is_ok());
        self.settle(g);
    }

    /// Events from now on; a receiver more than `watch_buffer` behind gets `Lagged`.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Published>> {
        self.events.subscribe()
    }

    /// Carries out the table's effects and publishes their events, then releases the guard,
    /// logs, and wakes the timer if the next deadline moved earlier.
    fn settle(&self, mut g: MutexGuard<'_, Inner>) {
        let mut effects = std::mem::take(&mut g.scratch);
        let mut events = Vec::new();
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
                            tx.send(WaitResult::Granted { token, deadline }).is_ok()
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
            log_event(event);
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

fn log_event(e: &Event) {
    let (name, id, token) = (&*e.name, &*e.id, e.token);
    match e.kind {
        EventKind::Acquired => tracing::info!(name, id, token, "granted"),
        EventKind::Released => tracing::info!(name, id, token, "released"),
        EventKind::Expired => tracing::info!(name, id, token, "lease expired"),
        EventKind::Dropped => tracing::info!(name, id, token, "session closed, released"),
    }
}
