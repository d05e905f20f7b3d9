//! The lock table: a pure state machine, and the only place that decides who holds a lock.
//!
//! It owns no sockets, spawns nothing and never reads a clock: every call takes `now`, and
//! everything that should happen elsewhere (a waiter to wake, a waiter to fail, an event for
//! watchers) comes back as an [`Effect`] queued for the caller to drain. That is what lets the
//! model test drive it through millions of random histories with exact time.
//!
//! Invariants (checked by `tests/model.rs`):
//! - a name has at most one holder; an entry exists only while it has one;
//! - tokens come from one counter that only grows, so they never repeat for any name;
//! - waiters are granted in the order they queued (by ticket), and a waiter that left (timed out,
//!   replaced, cancelled) is never granted;
//! - a lease is live iff `now < deadline`; every public call first processes what is due.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fencing token: grows with every grant, for every name.
pub type Token = u64;
/// The server's number for one client connection.
pub type ConnId = u64;
/// The table's number for one waiting LOCK request.
pub type WaiterId = u64;

/// Limits the table enforces; the server fills them from its flags.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Lease length when a LOCK names no ttl.
    pub default_ttl: Duration,
    /// Longest lease a LOCK or RENEW may ask for.
    pub max_ttl: Duration,
    /// Most names that may be held at once (memory bound).
    pub max_locks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_ttl: crate::DEFAULT_TTL,
            max_ttl: crate::DEFAULT_MAX_TTL,
            max_locks: crate::DEFAULT_MAX_LOCKS,
        }
    }
}

/// One LOCK request, as the table needs it.
#[derive(Clone, Debug)]
pub struct LockRequest {
    pub name: String,
    pub id: String,
    pub ttl: Option<Duration>,
    /// `None` waits without bound; `Some(ZERO)` tries once.
    pub wait: Option<Duration>,
    /// The lease ends when `conn` closes.
    pub session: bool,
    pub conn: ConnId,
}

/// What a LOCK did at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockOutcome {
    /// Granted now (also a repeat LOCK by the holder's own id, with the same token).
    Granted { token: Token, deadline: Instant },
    /// Queued: the answer comes later as [`Effect::Granted`] or [`Effect::WaitEnded`].
    Queued { waiter: WaiterId },
}

/// Why a request changed nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableError {
    /// ttl is zero or above the maximum.
    BadTtl { max: Duration },
    /// `wait=0` and the lock is held by someone else.
    WouldBlock { holder: Arc<str> },
    /// The token is not the live lease of that name.
    NotHeld,
    /// The id holds the name through a session lease bound to another open connection.
    Conflict,
    /// `max_locks` names are already held.
    TooManyLocks { max: usize },
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::BadTtl { max } => write!(
                f,
                "ttl must be more than 0 and at most {}",
                humantime::format_duration(*max)
            ),
            TableError::WouldBlock { holder } => write!(f, "held by {holder}"),
            TableError::NotHeld => f.write_str("token is not the current holder's live lease"),
            TableError::Conflict => {
                f.write_str("this id holds the lock with a session lease on another connection")
            }
            TableError::TooManyLocks { max } => write!(f, "too many locks held (max {max})"),
        }
    }
}

/// Why a waiter stopped waiting without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    /// Its `wait=` ran out.
    TimedOut,
    /// A newer LOCK with the same id took its place in the queue.
    Replaced,
}

/// What happened to a lock, for watchers and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Acquired,
    Released,
    Expired,
    /// A session lease ended because its connection closed.
    Dropped,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Acquired => "acquired",
            EventKind::Released => "released",
            EventKind::Expired => "expired",
            EventKind::Dropped => "dropped",
        }
    }
}

/// A change of holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub name: Arc<str>,
    pub id: Arc<str>,
    pub token: Token,
}

/// Work for the caller, in the order it must happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Wake this waiter with its grant.
    Granted {
        waiter: WaiterId,
        name: Arc<str>,
        token: Token,
        deadline: Instant,
    },
    /// Fail this waiter.
    WaitEnded {
        waiter: WaiterId,
        why: WaitEnd,
    },
    Event(Event),
}

/// A change to a lease, for a durable store to record in the order the table made it.
///
/// Only produced after [`Locks::journal_changes`]. Expiries produce none: the deadline is in
/// the `Grant` or `Renew` that set it, so a store can tell on its own when a lease has ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `id` holds `name` with `token` until `deadline` (a new grant, or a repeat LOCK by the
    /// holder that restarted the lease).
    Grant {
        name: Arc<str>,
        id: Arc<str>,
        token: Token,
        ttl: Duration,
        deadline: Instant,
    },
    /// The lease `token` of `name` now ends at `deadline`.
    Renew {
        name: Arc<str>,
        token: Token,
        ttl: Duration,
        deadline: Instant,
    },
    /// The lease `token` of `name` ended before its deadline (UNLOCK, or its session closed).
    Release { name: Arc<str>, token: Token },
}

/// A lease read back from a durable store after a restart.
#[derive(Clone, Debug)]
pub struct RestoredLease {
    pub name: String,
    pub id: String,
    pub token: Token,
    pub ttl: Duration,
    pub deadline: Instant,
}

/// A snapshot of one lock, for STATUS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockStatus {
    pub name: Arc<str>,
    pub holder: Arc<str>,
    pub token: Token,
    pub remaining: Duration,
    pub session: bool,
    pub waiters: usize,
}

#[derive(Debug)]
struct Holder {
    id: Arc<str>,
    token: Token,
    ttl: Duration,
    deadline: Instant,
    session: Option<ConnId>,
}

#[derive(Debug)]
struct Waiter {
    waiter: WaiterId,
    id: Arc<str>,
    ttl: Duration,
    session: bool,
    conn: ConnId,
    deadline: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    holder: Holder,
    /// FIFO by ticket; a replacing request keeps the ticket of the one it replaced.
    queue: BTreeMap<u64, Waiter>,
}

/// What a timer is for. `Wait` sorts before `Lease`, so a waiter whose patience ends at the
/// same instant as the lease it waits for gives up rather than being granted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Wait(WaiterId),
    Lease(Token, Arc<str>),
}

/// The lock table.
#[derive(Debug)]
pub struct Locks {
    limits: Limits,
    entries: HashMap<Arc<str>, Entry>,
    /// Every lease deadline and wait deadline, soonest first: expiry never scans.
    timers: BTreeSet<(Instant, Timer)>,
    /// Where each waiter stands: its name and ticket.
    waiters: HashMap<WaiterId, (Arc<str>, u64)>,
    next_token: Token,
    next_waiter: WaiterId,
    next_ticket: u64,
    effects: Vec<Effect>,
    /// Whether to record [`Change`]s; off for a table that lives only in memory.
    journal: bool,
    changes: Vec<Change>,
}

impl Locks {
    /// A table whose first token is `first_token` (at least 1).
    pub fn new(limits: Limits, first_token: Token) -> Self {
        Locks {
            limits,
            entries: HashMap::new(),
            timers: BTreeSet::new(),
            waiters: HashMap::new(),
            next_token: first_token.max(1),
            next_waiter: 1,
            next_ticket: 1,
            effects: Vec::new(),
            journal: false,
            changes: Vec::new(),
        }
    }

    /// From now on, record every [`Change`] for [`Locks::drain_changes_into`].
    pub fn journal_changes(&mut self) {
        self.journal = true;
    }

    /// Appends the recorded changes to `out`, oldest first.
    pub fn drain_changes_into(&mut self, out: &mut Vec<Change>) {
        out.append(&mut self.changes);
    }

    /// Puts back a lease a previous run granted, as a plain (non-session) lease: its
    /// connection did not survive the restart. Does nothing if it already ended by `now` or
    /// the name is taken. Later tokens are above its token.
    pub fn restore(&mut self, now: Instant, lease: RestoredLease) {
        self.raise_next_token(lease.token.saturating_add(1));
        if lease.deadline <= now || self.entries.contains_key(lease.name.as_str()) {
            return;
        }
        let name: Arc<str> = lease.name.into();
        let holder = Holder {
            id: lease.id.into(),
            token: lease.token,
            ttl: lease.ttl.min(self.limits.max_ttl),
            deadline: lease.deadline,
            session: None,
        };
        self.timers
            .insert((lease.deadline, Timer::Lease(lease.token, Arc::clone(&name))));
        self.entries.insert(
            name,
            Entry {
                holder,
                queue: BTreeMap::new(),
            },
        );
    }

    /// Makes every later token at least `token`: tokens never go backwards across a restart.
    pub fn raise_next_token(&mut self, token: Token) {
        self.next_token = self.next_token.max(token);
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The token the next grant will get.
    pub fn next_token(&self) -> Token {
        self.next_token
    }

    /// Takes the effects queued by the calls so far, oldest first.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Appends the queued effects to `out`, keeping this table's buffer for reuse.
    pub fn drain_effects_into(&mut self, out: &mut Vec<Effect>) {
        out.append(&mut self.effects);
    }

    /// When the next lease or wait ends, if any: the caller's timer sleeps until then.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// LOCK: grant now, queue, or refuse.
    pub fn lock(&mut self, now: Instant, req: LockRequest) -> Result<LockOutcome, TableError> {
        self.expire(now);
        let ttl = self.check_ttl(req.ttl)?;
        let deadline = now.checked_add(ttl).ok_or(TableError::BadTtl {
            max: self.limits.max_ttl,
        })?;
        let Some(name) = self.name_arc(&req.name) else {
            if self.entries.len() >= self.limits.max_locks {
                return Err(TableError::TooManyLocks {
                    max: self.limits.max_locks,
                });
            }
            let holder = Holder {
                id: req.id.into(),
                token: 0,
                ttl,
                deadline,
                session: req.session.then_some(req.conn),
            };
            let token = self.install(req.name.into(), holder, BTreeMap::new());
            return Ok(LockOutcome::Granted { token, deadline });
        };
        let Locks {
            entries,
            timers,
            waiters,
            effects,
            next_waiter,
            next_ticket,
            journal,
            changes,
            ..
        } = self;
        let Some(entry) = entries.get_mut(&name) else {
            return Err(TableError::NotHeld);
        };

        if *entry.holder.id == *req.id {
            // A repeat by the holder (typically a retry after a lost reply): same grant, new
            // lease. Two processes can't share it through one id while the first one's session
            // connection is open: that is refused.
            let holder = &mut entry.holder;
            if matches!(holder.session, Some(c) if c != req.conn) {
                return Err(TableError::Conflict);
            }
            let key = Timer::Lease(holder.token, Arc::clone(&name));
            timers.remove(&(holder.deadline, key.clone()));
            holder.ttl = ttl;
            holder.deadline = deadline;
            holder.session = req.session.then_some(req.conn);
            timers.insert((deadline, key));
            if *journal {
                changes.push(Change::Grant {
                    name: Arc::clone(&name),
                    id: Arc::clone(&holder.id),
                    token: holder.token,
                    ttl,
                    deadline,
                });
            }
            return Ok(LockOutcome::Granted {
                token: holder.token,
                deadline,
            });
        }

        let wait_deadline = match req.wait {
            None => None,
            Some(w) if w.is_zero() => {
                return Err(TableError::WouldBlock {
                    holder: Arc::clone(&entry.holder.id),
                })
            }
            Some(w) => now.checked_add(w),
        };

        // A LOCK by an id that already waits takes over that place; the older request fails.
        let replaced = entry
            .queue
            .iter()
            .find(|(_, w)| *w.id == *req.id)
            .map(|(ticket, w)| (*ticket, w.waiter, w.deadline));
        let ticket = match replaced {
            Some((ticket, old, old_deadline)) => {
                entry.queue.remove(&ticket);
                waiters.remove(&old);
                if let Some(at) = old_deadline {
                    timers.remove(&(at, Timer::Wait(old)));
                }
                effects.push(Effect::WaitEnded {
                    waiter: old,
                    why: WaitEnd::Replaced,
                });
                ticket
            }
            None => {
                *next_ticket += 1;
                *next_ticket - 1
            }
        };
        let waiter = *next_waiter;
        *next_waiter += 1;
        entry.queue.insert(
            ticket,
            Waiter {
                waiter,
                id: req.id.into(),
                ttl,
                session: req.session,
                conn: req.conn,
                deadline: wait_deadline,
            },
        );
        if let Some(at) = wait_deadline {
            timers.insert((at, Timer::Wait(waiter)));
        }
        waiters.insert(waiter, (name, ticket));
        Ok(LockOutcome::Queued { waiter })
    }

    /// UNLOCK: release if `token` is the live lease; the next waiter is granted at once.
    pub fn unlock(&mut self, now: Instant, name: &str, token: Token) -> Result<(), TableError> {
        self.expire(now);
        self.end_lease(now, name, token, EventKind::Released, None)
    }

    /// Ends a session lease because connection `conn` closed; a no-op if the lease already
    /// ended or changed hands.
    pub fn drop_session(&mut self, now: Instant, name: &str, token: Token, conn: ConnId) {
        self.expire(now);
        let _ = self.end_lease(now, name, token, EventKind::Dropped, Some(conn));
    }

    /// RENEW: a new deadline `ttl` (or the lease's own ttl) from now.
    pub fn renew(
        &mut self,
        now: Instant,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
    ) -> Result<Instant, TableError> {
        self.expire(now);
        let ttl = match ttl {
            Some(_) => Some(self.check_ttl(ttl)?),
            None => None,
        };
        let name = self.name_arc(name).ok_or(TableError::NotHeld)?;
        let Some(holder) = self
            .entries
            .get_mut(&name)
            .map(|e| &mut e.holder)
            .filter(|h| h.token == token)
        else {
            return Err(TableError::NotHeld);
        };
        let ttl = ttl.unwrap_or(holder.ttl);
        let deadline = now.checked_add(ttl).ok_or(TableError::BadTtl {
            max: self.limits.max_ttl,
        })?;
        let key = Timer::Lease(token, Arc::clone(&name));
        self.timers.remove(&(holder.deadline, key.clone()));
        holder.ttl = ttl;
        holder.deadline = deadline;
        self.timers.insert((deadline, key));
        if self.journal {
            self.changes.push(Change::Renew {
                name,
                token,
                ttl,
                deadline,
            });
        }
        Ok(deadline)
    }

    /// CHECK: the deadline of `token`'s lease on `name`, if it is live.
    pub fn check(&mut self, now: Instant, name: &str, token: Token) -> Result<Instant, TableError> {
        self.expire(now);
        self.entries
            .get(name)
            .filter(|e| e.holder.token == token)
            .map(|e| e.holder.deadline)
            .ok_or(TableError::NotHeld)
    }

    /// Removes a waiter that left (its connection closed). Returns false if it was no longer
    /// waiting: it was granted or ended already, and the caller owns what the effects said.
    pub fn cancel_wait(&mut self, now: Instant, waiter: WaiterId) -> bool {
        self.expire(now);
        self.remove_waiter(waiter).is_some()
    }

    /// STATUS of one name; `None` when it is free.
    pub fn status(&mut self, now: Instant, name: &str) -> Option<LockStatus> {
        self.expire(now);
        let (name, entry) = self.entries.get_key_value(name)?;
        Some(status_of(now, name, entry))
    }

    /// STATUS of every held name, in no particular order.
    pub fn status_all(&mut self, now: Instant) -> Vec<LockStatus> {
        self.expire(now);
        self.entries
            .iter()
            .map(|(name, entry)| status_of(now, name, entry))
            .collect()
    }

    /// Ends every lease and wait whose deadline is at or before `now`, in deadline order.
    pub fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            let Some((_, timer)) = self.timers.pop_first() else {
                break;
            };
            match timer {
                Timer::Wait(waiter) => {
                    if self.remove_waiter(waiter).is_some() {
                        self.effects.push(Effect::WaitEnded {
                            waiter,
                            why: WaitEnd::TimedOut,
                        });
                    }
                }
                Timer::Lease(token, name) => {
                    let live = self
                        .entries
                        .get(&name)
                        .is_some_and(|e| e.holder.token == token);
                    if live {
                        self.release_and_hand_over(now, &name, EventKind::Expired);
                    }
                }
            }
        }
    }

    fn check_ttl(&self, ttl: Option<Duration>) -> Result<Duration, TableError> {
        let ttl = ttl.unwrap_or(self.limits.default_ttl);
        if ttl.is_zero() || ttl > self.limits.max_ttl {
            return Err(TableError::BadTtl {
                max: self.limits.max_ttl,
            });
        }
        Ok(ttl)
    }

    /// Puts a new holder in place with the next token; returns the token.
    fn install(
        &mut self,
        name: Arc<str>,
        mut holder: Holder,
        queue: BTreeMap<u64, Waiter>,
    ) -> Token {
        let token = self.next_token;
        self.next_token += 1;
        holder.token = token;
        if self.journal {
            self.changes.push(Change::Grant {
                name: Arc::clone(&name),
                id: Arc::clone(&holder.id),
                token,
                ttl: holder.ttl,
                deadline: holder.deadline,
            });
        }
        self.timers
            .insert((holder.deadline, Timer::Lease(token, Arc::clone(&name))));
        self.effects.push(Effect::Event(Event {
            kind: EventKind::Acquired,
            name: Arc::clone(&name),
            id: Arc::clone(&holder.id),
            token,
        }));
        self.entries.insert(name, Entry { holder, queue });
        token
    }

    fn end_lease(
        &mut self,
        now: Instant,
        name: &str,
        token: Token,
        kind: EventKind,
        only_conn: Option<ConnId>,
    ) -> Result<(), TableError> {
        let entry = self
            .entries
            .get(name)
            .filter(|e| e.holder.token == token)
            .ok_or(TableError::NotHeld)?;
        if only_conn.is_some() && entry.holder.session != only_conn {
            return Err(TableError::NotHeld);
        }
        let deadline = entry.holder.deadline;
        let Some(name) = self.name_arc(name) else {
            return Err(TableError::NotHeld);
        };
        self.timers
            .remove(&(deadline, Timer::Lease(token, Arc::clone(&name))));
        if self.journal {
            self.changes.push(Change::Release {
                name: Arc::clone(&name),
                token,
            });
        }
        self.release_and_hand_over(now, &name, kind);
        Ok(())
    }

    /// Removes the holder of `name` (its timer is already gone) and grants the head of the
    /// queue, if any: one effect for one waiter, no scan.
    fn release_and_hand_over(&mut self, now: Instant, name: &Arc<str>, kind: EventKind) {
        let Some(Entry { holder, mut queue }) = self.entries.remove(name) else {
            return;
        };
        self.effects.push(Effect::Event(Event {
            kind,
            name: Arc::clone(name),
            id: holder.id,
            token: holder.token,
        }));
        let Some((_, next)) = queue.pop_first() else {
            return;
        };
        self.waiters.remove(&next.waiter);
        if let Some(at) = next.deadline {
            self.timers.remove(&(at, Timer::Wait(next.waiter)));
        }
        // A ttl accepted at enqueue time always fits: it was checked against the same maximum.
        let deadline = now.checked_add(next.ttl).unwrap_or(now);
        let holder = Holder {
            id: next.id,
            token: 0,
            ttl: next.ttl,
            deadline,
            session: next.session.then_some(next.conn),
        };
        let token = self.install(Arc::clone(name), holder, queue);
        // The grant goes before the Acquired event, so a watcher never sees a holder whose
        // client has not been told.
        let acquired = self.effects.pop();
        self.effects.push(Effect::Granted {
            waiter: next.waiter,
            name: Arc::clone(name),
            token,
            deadline,
        });
        self.effects.extend(acquired);
    }

    /// The table's own `Arc` for a held name, so timers and events share one allocation.
    fn name_arc(&self, name: &str) -> Option<Arc<str>> {
        self.entries.get_key_value(name).map(|(k, _)| Arc::clone(k))
    }

    fn remove_waiter(&mut self, waiter: WaiterId) -> Option<Waiter> {
        let (name, ticket) = self.waiters.remove(&waiter)?;
        let w = self.entries.get_mut(&name)?.queue.remove(&ticket)?;
        if let Some(at) = w.deadline {
            self.timers.remove(&(at, Timer::Wait(waiter)));
        }
        Some(w)
    }
}

fn status_of(now: Instant, name: &Arc<str>, entry: &Entry) -> LockStatus {
    LockStatus {
        name: Arc::clone(name),
        holder: Arc::clone(&entry.holder.id),
        token: entry.holder.token,
        remaining: entry.holder.deadline.saturating_duration_since(now),
        session: entry.holder.session.is_some(),
        waiters: entry.queue.len(),
    }
}
