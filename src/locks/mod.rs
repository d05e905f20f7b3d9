//! The lock table: a pure state machine, and the only place that decides who holds a lock.
//!
//! It owns no sockets, spawns nothing and never reads a clock: every call takes `now`, and
//! everything that should happen elsewhere (a waiter to wake, a waiter to fail, an event for
//! watchers) comes back as an [`Effect`] queued for the caller to drain. That is what lets the
//! model test drive it through millions of random histories with exact time.
//!
//! Invariants (checked by `tests/props/model.rs`):
//! - a name has at most one holder; an entry exists only while it has one;
//! - tokens come from one counter that only grows, so they never repeat for any name;
//! - waiters are granted in the order they queued (by ticket), and a waiter that left (timed out,
//!   replaced, cancelled) is never granted;
//! - a lease is live iff `now < deadline`; every public call first processes what is due;
//! - a lease of a user ([`UserId`]) is renewed or released only by that user, and one user's
//!   id never stands for another's (the same-id rules hold within one user).
//!
//! # Layout: memory per held lock
//! A server may hold a million locks, so the table is laid out to cost under 256 bytes of heap
//! per held lock with 16-byte names (`tests/memory.rs` measures it; about 226 B at 200,000
//! locks, against 290 B for a `HashMap<Arc<str>, Entry>`; 234 B since holders keep a note):
//! - the entries live in a `Slab` of 120-byte slots (88 until holders recorded their user, 96
//!   until they recorded who took them and when: an [`Origin`] pointer shared by all of a
//!   connection's records, and the grant's wall clock; 112 until they kept a note, a thin
//!   pointer),
//!   grown 4096 slots at a time and reused once freed; a `HashMap<Arc<str>, u32>` (24-byte
//!   buckets) maps a name to its slot. A hash map of whole entries would pay its spare buckets
//!   (up to half the table) at entry size.
//! - the name is one `Arc<str>`, shared by the index key, the entry and every event;
//! - holder and waiter ids are interned: one `Arc<str>` per distinct id, whatever number of
//!   locks it holds or how often it locks again (`Locks::intern`);
//! - deadlines and ttls are `u64` nanoseconds (`Clock` ticks) since the first `now` the
//!   table was given, exact both ways, so every `Instant` the API returns is the one it would
//!   have computed;
//! - timers are `(ticks, Timer)` pairs of 24 bytes that name a slot, not a name; a waiter is
//!   known by its slot and ticket; a lock nobody waits for has no queue allocated.
//!
//! When the table empties after having been large, it hands its slab, index and unused ids
//! back to the allocator.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod layout;
pub mod rules;
mod sessions;
mod types;

use layout::{nanos, Bond, Clock, Entry, Holder, Slab, TableView, Timer, Waiter, WaiterPlace};
use rules::{Ask, Decision};
pub use types::*;

/// The lock table.
#[derive(Debug)]
pub struct Locks {
    limits: Limits,
    clock: Clock,
    /// Held name -> slot in `slab`.
    index: HashMap<Arc<str>, u32>,
    slab: Slab,
    /// One `Arc` per distinct holder or waiter id; see [`Locks::intern`].
    ids: HashSet<Arc<str>>,
    /// Interns and releases since the last sweep of `ids`: what pays for the next one.
    id_ops: usize,
    /// Every lease deadline and wait deadline in ticks, soonest first: expiry never scans.
    timers: BTreeSet<(u64, Timer)>,
    /// Where each waiter stands: its entry's slot and its ticket.
    waiters: HashMap<WaiterId, (u32, u64)>,
    /// The session leases bound to each open connection, for [`Locks::close_connection`].
    bound: sessions::Bound,
    next_token: Token,
    /// Leases held, over all names (a semaphore's holders count one each).
    leases: usize,
    next_waiter: WaiterId,
    next_ticket: u64,
    effects: Vec<Effect>,
    /// Whether to record [`Change`]s; off for a table that lives only in memory.
    journal: bool,
    changes: Vec<Change>,
    /// The wall clock the caller last told ([`Locks::wall_clock`]), in Unix milliseconds:
    /// what a grant records as its time for people. 0 until told.
    wall_ms: u64,
    /// The leases a BREAK ended, by token, until the deadline each had then: their holder's
    /// RENEW or CHECK is told who broke it.
    broken: HashMap<Token, Broken>,
    /// When each record of `broken` ends, soonest first: its timers, apart from `timers` so
    /// that they wake nobody (a record past its deadline goes at the next call, unseen,
    /// and [`Locks::next_deadline`] stays the next lease's or wait's end).
    broken_timers: BTreeSet<(u64, Token)>,
    /// The tokens of `broken`, oldest break first: past [`Limits::max_locks`] records the
    /// oldest is forgotten (its holder then hears a plain `NotHeld`).
    broken_order: VecDeque<Token>,
}

/// What the table remembers of a broken lease.
#[derive(Debug)]
struct Broken {
    name: Arc<str>,
    by: Arc<str>,
    at_unix_ms: u64,
    /// The lease's deadline when it was broken, in [`Clock`] ticks.
    deadline: u64,
}

impl Locks {
    /// A table whose first token is `first_token` (at least 1).
    pub fn new(limits: Limits, first_token: Token) -> Self {
        Locks {
            limits,
            clock: Clock::default(),
            index: HashMap::new(),
            slab: Slab::default(),
            ids: HashSet::new(),
            id_ops: 0,
            timers: BTreeSet::new(),
            waiters: HashMap::new(),
            bound: sessions::Bound::default(),
            next_token: first_token.max(1),
            leases: 0,
            next_waiter: 1,
            next_ticket: 1,
            effects: Vec::new(),
            journal: false,
            changes: Vec::new(),
            wall_ms: 0,
            broken: HashMap::new(),
            broken_order: VecDeque::new(),
            broken_timers: BTreeSet::new(),
        }
    }

    /// The wall clock at the `now` of the calls that follow, in Unix milliseconds: each
    /// grant records it (STATUS shows it as `granted=`). The table reads no clock, so the
    /// caller tells it, as it passes `now`; a table never told records 0, "not known".
    pub fn wall_clock(&mut self, unix_ms: u64) {
        self.wall_ms = unix_ms;
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
    /// connection did not survive the restart. Does nothing if it already ended by `now`, or
    /// the name is held in a mode it can't join (or a semaphore's slots are all restored).
    /// Later tokens are above its token. Restore a name's holders in grant order.
    pub fn restore(&mut self, now: Instant, lease: RestoredLease) {
        self.raise_next_token(lease.token.saturating_add(1));
        self.clock.start(now);
        if lease.deadline <= now {
            return;
        }
        let mut holder = Holder::new(
            self.intern(&lease.id),
            nanos(lease.ttl.min(self.limits.max_ttl)),
            // Past 584 years from now: as good as never.
            self.clock.ticks(lease.deadline).unwrap_or(u64::MAX),
            (self.clock.ticks(now).unwrap_or(0), lease.granted_unix_ms),
            lease.user,
            lease.origin,
        );
        holder.token = lease.token;
        holder.set_note(lease.note);
        let deadline = holder.deadline;
        let slot = match self.index.get(lease.name.as_str()) {
            None => self.add_entry(lease.name.into(), holder, lease.mode),
            Some(&slot) => self.slab.get_mut(slot).and_then(|entry| {
                let joins = entry.mode() == lease.mode
                    && match lease.mode {
                        Mode::Shared => true,
                        Mode::Limit(n) => entry.holder_count() < n as usize,
                        Mode::Exclusive => false,
                    };
                joins.then(|| entry.more_mut().others.push(holder))?;
                Some(slot)
            }),
        };
        if let Some(slot) = slot {
            self.leases += 1;
            self.timers
                .insert((deadline, Timer::Lease(lease.token, slot)));
        }
    }

    /// Makes every later token at least `token`: tokens never go backwards across a restart.
    pub fn raise_next_token(&mut self, token: Token) {
        self.next_token = self.next_token.max(token);
    }

    /// The limits it enforces.
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

    /// Whether effects are queued: after [`Locks::expire`], whether it changed anything.
    pub fn has_effects(&self) -> bool {
        !self.effects.is_empty()
    }

    /// Appends the queued effects to `out`, keeping this table's buffer for reuse.
    pub fn drain_effects_into(&mut self, out: &mut Vec<Effect>) {
        out.append(&mut self.effects);
    }

    /// When the next lease or wait ends, if any: the caller's timer sleeps until then.
    pub fn next_deadline(&self) -> Option<Instant> {
        let (at, _) = self.timers.first()?;
        self.clock.instant(*at)
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no name is held.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// LOCK: grant now, queue, or refuse, as [`rules::decide`] says.
    pub fn lock(&mut self, now: Instant, req: LockRequest) -> Result<LockOutcome, TableError> {
        self.expire(now);
        let ttl = self.check_ttl(req.ttl)?;
        self.limits.grace(req.session)?;
        let bad_ttl = TableError::BadTtl {
            max: self.limits.max_ttl,
        };
        let (deadline, deadline_ticks) = self.clock.after(now, ttl).ok_or(bad_ttl)?;
        let slot = self.index.get(req.name.as_str()).copied();
        let ask = Ask {
            id: &req.id,
            user: &req.user,
            mode: req.mode,
            conn: req.conn,
            wait: req.wait,
            supersede: req.supersede,
        };
        let view = TableView(slot.and_then(|slot| self.slab.get(slot)));
        let decision = rules::decide(&view, &ask, &self.limits, self.leases)?;
        let too_many = TableError::TooManyLocks {
            max: self.limits.max_locks,
        };
        let Some(slot) = slot else {
            // A free name: the only decision the rules make for it is a grant.
            let holder = self.new_holder(now, &req, ttl, deadline_ticks);
            let slot = self
                .add_entry(req.name.into(), holder, req.mode)
                .ok_or(too_many)?;
            let token = self.start_lease(slot, None, deadline, None);
            return Ok(LockOutcome::Granted { token, deadline });
        };
        match decision {
            Decision::Grant => {
                let holder = self.new_holder(now, &req, ttl, deadline_ticks);
                let token = self.start_lease(slot, Some(holder), deadline, None);
                Ok(LockOutcome::Granted { token, deadline })
            }
            Decision::Again(token) => {
                self.grant_again(slot, token, &req, ttl, (deadline, deadline_ticks))?;
                Ok(LockOutcome::Granted { token, deadline })
            }
            Decision::Queue {
                replaces,
                superseded,
            } => {
                self.supersede(slot, &req.id, superseded);
                let waiter = self.enqueue(now, slot, req, ttl, replaces)?;
                Ok(LockOutcome::Queued { waiter })
            }
        }
    }

    /// The same grant again for a holder's repeated LOCK: a new lease, bound as it asks.
    fn grant_again(
        &mut self,
        slot: u32,
        token: Token,
        req: &LockRequest,
        ttl: Duration,
        (deadline, deadline_ticks): (Instant, u64),
    ) -> Result<(), TableError> {
        let Some(entry) = self.slab.get_mut(slot) else {
            return Err(TableError::NotHeld);
        };
        let (name, mode) = (Arc::clone(&entry.name), entry.mode());
        let Some(existing) = entry.holder_mut(token) else {
            return Err(TableError::NotHeld);
        };
        let timer = Timer::Lease(token, slot);
        self.timers.remove(&(existing.deadline, timer));
        existing.ttl = nanos(ttl);
        existing.deadline = deadline_ticks;
        let was = existing.bind(req.session, req.conn);
        // The client that asked last holds it now: its address is the one to show.
        existing.origin = req.origin.clone();
        let note = rules::note_again(existing.note.as_deref(), req.note.as_ref()).cloned();
        existing.set_note(note);
        self.bound.moved(token, slot, was, existing.open_conn());
        self.timers.insert((deadline_ticks, timer));
        if self.journal {
            self.changes.push(Change::Grant {
                name,
                id: Arc::clone(&existing.id),
                token,
                ttl,
                deadline,
                mode,
                user: existing.user,
                origin: existing.origin.clone(),
                granted_unix_ms: existing.granted_unix_ms,
                note: existing.note(),
            });
        }
        Ok(())
    }

    /// Queues `req` on `slot`, in the place of the same id's older request if it `replaces`
    /// one (that request ends `Replaced`).
    fn enqueue(
        &mut self,
        now: Instant,
        slot: u32,
        req: LockRequest,
        ttl: Duration,
        replaces: Option<WaiterPlace>,
    ) -> Result<WaiterId, TableError> {
        let wait_deadline = match req.wait {
            None => None,
            // Past 584 years from now: as good as without bound.
            Some(w) => self.clock.after(now, w).map(|(_, ticks)| ticks),
        };
        let Some(entry) = self.slab.get_mut(slot) else {
            return Err(TableError::NotHeld);
        };
        let mut note = req.note;
        let ticket = match replaces {
            Some((ticket, old, old_deadline)) => {
                let replaced = entry.more_mut().queue.remove(&ticket);
                let had = replaced.as_ref().and_then(|w| w.note.as_ref());
                note = rules::note_again(had, note.as_ref()).cloned();
                self.waiters.remove(&old);
                if let Some(at) = old_deadline {
                    self.timers.remove(&(at, Timer::Wait(old)));
                }
                self.effects.push(Effect::WaitEnded {
                    waiter: old,
                    why: WaitEnd::Replaced,
                });
                ticket
            }
            None => {
                self.next_ticket += 1;
                self.next_ticket - 1
            }
        };
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        let id = self.intern(&req.id);
        let Some(entry) = self.slab.get_mut(slot) else {
            return Err(TableError::NotHeld);
        };
        entry.more_mut().queue.insert(
            ticket,
            Waiter {
                waiter,
                id,
                ttl,
                session: req.session,
                conn: req.conn,
                deadline: wait_deadline,
                queued: self.clock.ticks(now).unwrap_or(0),
                mode: req.mode,
                user: req.user,
                origin: req.origin,
                note,
            },
        );
        if let Some(at) = wait_deadline {
            self.timers.insert((at, Timer::Wait(waiter)));
        }
        self.waiters.insert(waiter, (slot, ticket));
        // A replacing request in another mode may fit where the one it replaced did not.
        self.grant_fitting(now, slot);
        Ok(waiter)
    }

    /// Ends the waits of `superseded` (waiters of `slot`) with [`WaitEnd::Superseded`] by
    /// `by`: a `supersede` LOCK takes the queue. The caller queues that LOCK next, so nobody
    /// behind them is granted meanwhile.
    fn supersede(&mut self, slot: u32, by: &str, superseded: Vec<WaiterPlace>) {
        if superseded.is_empty() {
            return;
        }
        let by: Arc<str> = self.intern(by);
        for (ticket, waiter, deadline) in superseded {
            let Some(entry) = self.slab.get_mut(slot) else {
                return;
            };
            entry.more_mut().queue.remove(&ticket);
            self.waiters.remove(&waiter);
            if let Some(at) = deadline {
                self.timers.remove(&(at, Timer::Wait(waiter)));
            }
            self.effects.push(Effect::WaitEnded {
                waiter,
                why: WaitEnd::Superseded {
                    by: Arc::clone(&by),
                },
            });
        }
    }

    /// UNLOCK by `user`: release if `token` is the live lease and `user` may (see
    /// [`owned_by`]); the next waiter is granted at once.
    pub fn unlock(
        &mut self,
        now: Instant,
        name: &str,
        token: Token,
        user: UserId,
    ) -> Result<(), TableError> {
        self.expire(now);
        let slot = *self.index.get(name).ok_or(TableError::NotHeld)?;
        let holder = self
            .slab
            .get(slot)
            .and_then(|e| e.holder(token))
            .ok_or(TableError::NotHeld)?;
        owned_by(holder, user)?;
        self.end_lease(now, name, token, EventKind::Released, None)
    }

    /// BREAK (an operator's force-release): ends every lease of `name`, or only `token`'s,
    /// as [`rules::breaks`] says, whoever holds them; `by` sent it. Each ends as by a
    /// release (event `broken`, the queue moves on at once), and is remembered until the
    /// deadline it had, so that its holder's RENEW or CHECK is told who broke it
    /// ([`Locks::broken`]). Returns the tokens it ended, in grant order. Who may break a
    /// name is the caller's business (the `admin` right).
    pub fn break_lock(
        &mut self,
        now: Instant,
        name: &str,
        token: Option<Token>,
        by: &Origin,
    ) -> Result<Vec<Token>, TableError> {
        self.expire(now);
        let slot = self.index.get(name).copied();
        let view = TableView(slot.and_then(|slot| self.slab.get(slot)));
        let ended = rules::breaks(&view, token.as_ref())?;
        let slot = slot.ok_or(TableError::NotHeld)?;
        let who: Arc<str> = by.who().into();
        for &token in &ended {
            let Some(entry) = self.slab.get(slot) else {
                break;
            };
            let entry_name = Arc::clone(&entry.name);
            let Some(deadline) = entry.holder(token).map(|h| h.deadline) else {
                continue;
            };
            if self.journal {
                self.changes.push(Change::Break {
                    name: Arc::clone(&entry_name),
                    token,
                    by: Arc::clone(&who),
                    at_unix_ms: self.wall_ms,
                    deadline: self.clock.instant(deadline).unwrap_or(now),
                });
            }
            self.remember_break(entry_name, token, Arc::clone(&who), self.wall_ms, deadline);
            let mark = self.effects.len();
            self.end_lease(now, name, token, EventKind::Broken, None)?;
            for effect in &mut self.effects[mark..] {
                if let Effect::Event(e) = effect {
                    if e.kind == EventKind::Broken && e.token == token {
                        e.broken_by = by.clone();
                    }
                }
            }
        }
        Ok(ended)
    }

    /// Why `token` is not a live lease of `name`: `Broken` while the table remembers a
    /// BREAK of it, else `NotHeld`. A backend asks after a RENEW, CHECK or UNLOCK was
    /// refused `NotHeld`.
    pub fn broken(&mut self, now: Instant, name: &str, token: Token) -> TableError {
        self.expire(now);
        match self.broken.get(&token) {
            Some(b) if &*b.name == name => TableError::Broken {
                token,
                by: Arc::clone(&b.by),
                at_unix_ms: b.at_unix_ms,
            },
            _ => TableError::NotHeld,
        }
    }

    /// Puts back what a previous run remembered of a broken lease (nothing once its
    /// deadline has passed).
    pub fn restore_break(&mut self, now: Instant, lease: BrokenLease) {
        self.raise_next_token(lease.token.saturating_add(1));
        self.clock.start(now);
        if lease.deadline <= now {
            return;
        }
        let deadline = self.clock.ticks(lease.deadline).unwrap_or(u64::MAX);
        self.remember_break(
            lease.name,
            lease.token,
            lease.by,
            lease.at_unix_ms,
            deadline,
        );
    }

    /// Records a broken lease until `deadline` (ticks), forgetting the oldest record past
    /// [`Limits::max_locks`] of them: the memory is bounded like the leases it outlives.
    fn remember_break(
        &mut self,
        name: Arc<str>,
        token: Token,
        by: Arc<str>,
        at_unix_ms: u64,
        deadline: u64,
    ) {
        while self.broken.len() >= self.limits.max_locks.max(1) {
            let Some(oldest) = self.broken_order.pop_front() else {
                break;
            };
            if let Some(old) = self.broken.remove(&oldest) {
                self.broken_timers.remove(&(old.deadline, oldest));
            }
        }
        let record = Broken {
            name,
            by,
            at_unix_ms,
            deadline,
        };
        if let Some(old) = self.broken.insert(token, record) {
            self.broken_timers.remove(&(old.deadline, token));
        } else {
            self.broken_order.push_back(token);
        }
        self.broken_timers.insert((deadline, token));
    }

    /// Connection `conn`, to which the session lease `token` is bound, closed. Without a
    /// grace the lease ends now (event `dropped`); with one, it ends `grace` from now (or at
    /// its own deadline, if sooner) unless a RENEW binds it to another connection first. A
    /// no-op if the lease already ended, changed hands or is bound elsewhere.
    pub fn drop_session(&mut self, now: Instant, name: &str, token: Token, conn: ConnId) {
        self.expire(now);
        let Some(slot) = self.index.get(name).copied() else {
            return;
        };
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        let entry_name = Arc::clone(&entry.name);
        let Some(holder) = entry.holder_mut(token) else {
            return;
        };
        if holder.open_conn() != Some(conn) {
            return;
        }
        if holder.grace_ms == 0 {
            let _ = self.end_lease(now, name, token, EventKind::Dropped, Some(conn));
            return;
        }
        let grace = Duration::from_millis(u64::from(holder.grace_ms));
        let cut = self
            .clock
            .after(now, grace)
            .filter(|(_, ticks)| *ticks < holder.deadline);
        holder.bond = Bond::Orphan { cut: cut.is_some() };
        holder.conn = 0;
        self.bound.remove(conn, token);
        if let Some((deadline, ticks)) = cut {
            let timer = Timer::Lease(token, slot);
            self.timers.remove(&(holder.deadline, timer));
            holder.deadline = ticks;
            self.timers.insert((ticks, timer));
            if self.journal {
                self.changes.push(Change::Renew {
                    name: entry_name,
                    token,
                    ttl: Duration::from_nanos(holder.ttl),
                    deadline,
                });
            }
        }
    }

    /// Connection `conn` closed: every session lease still bound to it ends (event `dropped`)
    /// or starts its grace, as [`Locks::drop_session`] does for one. Found through an index of
    /// the session leases by connection, not a scan of the table.
    pub fn close_connection(&mut self, now: Instant, conn: ConnId) {
        self.expire(now);
        for (token, slot) in self.bound.take(conn) {
            let Some(name) = self.slab.get(slot).map(|e| Arc::clone(&e.name)) else {
                continue;
            };
            self.drop_session(now, &name, token, conn);
        }
    }

    /// Whether a session lease is bound to connection `conn` (as of the last call that was
    /// given a `now`: one that expired since still counts until then).
    pub fn holds_sessions(&self, conn: ConnId) -> bool {
        self.bound.holds(conn)
    }

    /// Takes back a grant whose client is known to be gone (its connection was reset before
    /// it could read the token): the lease ends now with event `dropped` and the next waiter
    /// is granted. `NotHeld` if `token` is not the live lease.
    pub fn revoke(&mut self, now: Instant, name: &str, token: Token) -> Result<(), TableError> {
        self.expire(now);
        self.end_lease(now, name, token, EventKind::Revoked, None)
    }

    /// RENEW by `user` on connection `conn`: a new deadline `ttl` (or the lease's own ttl)
    /// from now. A session lease in its grace is bound to `conn` from now on. Only the
    /// lease's own user may (see [`owned_by`]).
    pub fn renew(
        &mut self,
        now: Instant,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewal, TableError> {
        self.expire(now);
        let ttl = match ttl {
            Some(_) => Some(self.check_ttl(ttl)?),
            None => None,
        };
        let slot = *self.index.get(name).ok_or(TableError::NotHeld)?;
        let Some(entry) = self.slab.get_mut(slot) else {
            return Err(TableError::NotHeld);
        };
        let entry_name = Arc::clone(&entry.name);
        let holder = entry.holder_mut(token).ok_or(TableError::NotHeld)?;
        owned_by(holder, user)?;
        let ttl = ttl.unwrap_or(Duration::from_nanos(holder.ttl));
        let (deadline, deadline_ticks) = self.clock.after(now, ttl).ok_or(TableError::BadTtl {
            max: self.limits.max_ttl,
        })?;
        let timer = Timer::Lease(token, slot);
        self.timers.remove(&(holder.deadline, timer));
        holder.ttl = nanos(ttl);
        holder.deadline = deadline_ticks;
        self.timers.insert((deadline_ticks, timer));
        let bound = matches!(holder.bond, Bond::Orphan { .. });
        if bound {
            holder.bond = Bond::Open;
            holder.conn = conn;
            self.bound.add(conn, token, slot);
        }
        if self.journal {
            self.changes.push(Change::Renew {
                name: entry_name,
                token,
                ttl,
                deadline,
            });
        }
        Ok(Renewal { deadline, bound })
    }

    /// RENEW ... detach: [`Locks::renew`], then a session lease becomes a plain one: it is
    /// bound to no connection and lasts until UNLOCK or its deadline (a grace it was in is
    /// over: the renewal set its deadline). A plain lease only gets its new deadline. The
    /// journal needs nothing more: it keeps no session flag (a restart restores every lease
    /// as a plain one).
    pub fn renew_detach(
        &mut self,
        now: Instant,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewal, TableError> {
        let renewal = self.renew(now, name, token, ttl, conn, user)?;
        let holder = self
            .index
            .get(name)
            .copied()
            .and_then(|slot| self.slab.get_mut(slot))
            .and_then(|entry| entry.holder_mut(token));
        if let Some(holder) = holder {
            let was = holder.bind(None, conn);
            if let Some(c) = was {
                self.bound.remove(c, token);
            }
        }
        Ok(Renewal {
            bound: false,
            ..renewal
        })
    }

    /// CHECK: the deadline of `token`'s lease on `name`, if it is live.
    pub fn check(&mut self, now: Instant, name: &str, token: Token) -> Result<Instant, TableError> {
        self.expire(now);
        self.entry(name)
            .and_then(|e| e.holder(token))
            .and_then(|h| self.clock.instant(h.deadline))
            .ok_or(TableError::NotHeld)
    }

    /// Removes a waiter that left (its connection closed). Returns false if it was no longer
    /// waiting: it was granted or ended already, and the caller owns what the effects said.
    pub fn cancel_wait(&mut self, now: Instant, waiter: WaiterId) -> bool {
        self.expire(now);
        let Some((_, slot)) = self.remove_waiter(waiter) else {
            return false;
        };
        self.grant_fitting(now, slot);
        true
    }

    /// STATUS of one name; `None` when it is free.
    pub fn status(&mut self, now: Instant, name: &str) -> Option<LockStatus> {
        self.expire(now);
        let entry = self.entry(name)?;
        Some(status_of(self.clock, now, entry))
    }

    /// The first `max` waiters of `name`, in the order they will be granted.
    pub fn queue(&mut self, now: Instant, name: &str, max: usize) -> Vec<WaiterStatus> {
        self.expire(now);
        let Some(queue) = self.entry(name).and_then(|e| e.queue()) else {
            return Vec::new();
        };
        queue
            .values()
            .take(max)
            .map(|w| WaiterStatus {
                id: Arc::clone(&w.id),
                waited: self.clock.held(now, w.queued),
                session: w.session.is_some(),
                mode: w.mode,
            })
            .collect()
    }

    /// Every holder of `name`, in the order they were granted.
    pub fn holders(&mut self, now: Instant, name: &str) -> Vec<LockStatus> {
        self.expire(now);
        let Some(entry) = self.entry(name) else {
            return Vec::new();
        };
        entry
            .holders()
            .map(|h| holder_status(self.clock, now, entry, h))
            .collect()
    }

    /// STATUS of every held name, in no particular order.
    pub fn status_all(&mut self, now: Instant) -> Vec<LockStatus> {
        self.expire(now);
        self.slab
            .iter()
            .map(|entry| status_of(self.clock, now, entry))
            .collect()
    }

    /// Ends every lease and wait whose deadline is at or before `now`, in deadline order.
    pub fn expire(&mut self, now: Instant) {
        self.clock.start(now);
        let now_ticks = self.clock.ticks(now).unwrap_or(u64::MAX);
        while let Some((at, _)) = self.timers.first() {
            if *at > now_ticks {
                break;
            }
            let Some((_, timer)) = self.timers.pop_first() else {
                break;
            };
            match timer {
                Timer::Wait(waiter) => {
                    if let Some((_, slot)) = self.remove_waiter(waiter) {
                        self.effects.push(Effect::WaitEnded {
                            waiter,
                            why: WaitEnd::TimedOut,
                        });
                        self.grant_fitting(now, slot);
                    }
                }
                Timer::Lease(token, slot) => {
                    let ended = self.slab.get(slot).and_then(|e| e.holder(token));
                    if let Some(holder) = ended {
                        let kind = match holder.bond {
                            Bond::Orphan { cut: true } => EventKind::Dropped,
                            _ => EventKind::Expired,
                        };
                        self.release_and_hand_over(now, slot, token, kind);
                    }
                }
            }
        }
        self.forget_breaks(now_ticks);
    }

    /// Forgets the broken leases whose deadline is at or before `now_ticks`.
    fn forget_breaks(&mut self, now_ticks: u64) {
        while let Some(&(at, token)) = self.broken_timers.first() {
            if at > now_ticks {
                break;
            }
            self.broken_timers.pop_first();
            self.broken.remove(&token);
            // Its place in `broken_order` goes lazily: the order is compacted once it is
            // over twice the records, so each expiry pays a constant share.
            if self.broken_order.front() == Some(&token) {
                self.broken_order.pop_front();
            } else if self.broken_order.len() > 2 * self.broken.len() + 64 {
                let broken = &self.broken;
                self.broken_order.retain(|t| broken.contains_key(t));
            }
        }
    }

    fn check_ttl(&self, ttl: Option<Duration>) -> Result<Duration, TableError> {
        self.limits.ttl(ttl)
    }

    /// A holder for a LOCK that is granted now.
    fn new_holder(
        &mut self,
        now: Instant,
        req: &LockRequest,
        ttl: Duration,
        deadline_ticks: u64,
    ) -> Holder {
        let granted = self.clock.ticks(now).unwrap_or(0);
        let id = self.intern(&req.id);
        let mut holder = Holder::new(
            id,
            nanos(ttl),
            deadline_ticks,
            (granted, self.wall_ms),
            req.user,
            req.origin.clone(),
        );
        holder.set_note(req.note.clone());
        holder.bind(req.session, req.conn);
        holder
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        let slot = *self.index.get(name)?;
        self.slab.get(slot)
    }

    /// Puts a new entry for `name` in a free slot (its lease timer is the caller's); `None`
    /// when all 2^32 slots are taken.
    fn add_entry(&mut self, name: Arc<str>, holder: Holder, mode: Mode) -> Option<u32> {
        let mut entry = Entry {
            name: Arc::clone(&name),
            holder,
            more: None,
        };
        if mode != Mode::Exclusive {
            entry.more_mut().mode = mode;
        }
        let slot = self.slab.insert(entry)?;
        self.index.insert(name, slot);
        Some(slot)
    }

    /// Takes the entry out of `slot` and frees the slot.
    fn remove_entry(&mut self, slot: u32) -> Option<Entry> {
        let entry = self.slab.remove(slot)?;
        self.index.remove(&entry.name);
        if self.index.is_empty() {
            self.on_empty();
        }
        self.sweep_ids_if_due();
        Some(entry)
    }

    /// Nothing is held (so nobody waits and no timer points into the slab): start the slab
    /// over, and after a large table hand its memory back.
    fn on_empty(&mut self) {
        self.slab.free.clear();
        if let [first] = self.slab.chunks.as_mut_slice() {
            first.clear();
        } else {
            self.slab = Slab::default();
            self.index = HashMap::new();
            self.ids.retain(|id| Arc::strong_count(id) > 1);
            self.ids.shrink_to_fit();
            self.id_ops = 0;
        }
    }

    /// Gives a holder of `slot` the next token and starts its lease (timer, journal, Acquired
    /// event, which says how long it `waited` in the queue); returns the token. The holder is
    /// `added` beside those holding, or is the entry's own `holder` (just put in place).
    fn start_lease(
        &mut self,
        slot: u32,
        added: Option<Holder>,
        deadline: Instant,
        waited: Option<Duration>,
    ) -> Token {
        let token = self.next_token;
        let Some(entry) = self.slab.get_mut(slot) else {
            return token;
        };
        self.next_token += 1;
        self.leases += 1;
        let mode = entry.mode();
        let name = Arc::clone(&entry.name);
        let holder = match added {
            Some(mut added) => {
                added.token = token;
                let others = &mut entry.more_mut().others;
                others.push(added);
                others.last_mut()
            }
            None => {
                entry.holder.token = token;
                Some(&mut entry.holder)
            }
        };
        let Some(holder) = holder else {
            return token;
        };
        if let Some(conn) = holder.open_conn() {
            self.bound.add(conn, token, slot);
        }
        if self.journal {
            self.changes.push(Change::Grant {
                name: Arc::clone(&name),
                id: Arc::clone(&holder.id),
                token,
                ttl: Duration::from_nanos(holder.ttl),
                deadline,
                mode,
                user: holder.user,
                origin: holder.origin.clone(),
                granted_unix_ms: holder.granted_unix_ms,
                note: holder.note(),
            });
        }
        self.timers
            .insert((holder.deadline, Timer::Lease(token, slot)));
        self.effects.push(Effect::Event(Event {
            kind: EventKind::Acquired,
            name,
            id: Arc::clone(&holder.id),
            token,
            held: Duration::ZERO,
            waited,
            origin: holder.origin.clone(),
            note: holder.note(),
            broken_by: Origin::default(),
        }));
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
        let slot = *self.index.get(name).ok_or(TableError::NotHeld)?;
        let entry = self.slab.get(slot).ok_or(TableError::NotHeld)?;
        let holder = entry.holder(token).ok_or(TableError::NotHeld)?;
        if only_conn.is_some() && holder.open_conn() != only_conn {
            return Err(TableError::NotHeld);
        }
        self.timers
            .remove(&(holder.deadline, Timer::Lease(token, slot)));
        if self.journal {
            self.changes.push(Change::Release {
                name: Arc::clone(&entry.name),
                token,
            });
        }
        self.release_and_hand_over(now, slot, token, kind);
        Ok(())
    }

    /// Removes the holder `token` of `slot` (its timer is already gone), then grants every
    /// waiter at the head of the queue that now fits, in order: for an exclusive lock, one
    /// effect for one waiter, no scan.
    fn release_and_hand_over(&mut self, now: Instant, slot: u32, token: Token, kind: EventKind) {
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        if let Some(conn) = entry.holder(token).and_then(Holder::open_conn) {
            self.bound.remove(conn, token);
        }
        let old = if entry.holder.token == token {
            let next = entry
                .more
                .as_mut()
                .and_then(|m| (!m.others.is_empty()).then(|| m.others.remove(0)));
            match next {
                Some(next) => std::mem::replace(&mut entry.holder, next),
                None => match pop_first_waiter(entry) {
                    // Nobody else holds it: the head of the queue takes the holder's place.
                    Some(next) => {
                        if let Some(more) = entry.more.as_mut() {
                            more.mode = next.mode;
                        }
                        self.leases -= 1;
                        self.replace_holder(now, slot, next, kind);
                        self.grant_fitting(now, slot);
                        self.sweep_ids_if_due();
                        return;
                    }
                    None => {
                        self.leases -= 1;
                        if let Some(Entry { name, holder, .. }) = self.remove_entry(slot) {
                            let held = self.clock.held(now, holder.granted);
                            self.effects.push(Effect::Event(Event {
                                kind,
                                name,
                                id: holder.id,
                                token: holder.token,
                                held,
                                waited: None,
                                origin: holder.origin,
                                note: None,
                                broken_by: Origin::default(),
                            }));
                        }
                        return;
                    }
                },
            }
        } else {
            let Some(more) = entry.more.as_mut() else {
                return;
            };
            let Some(i) = more.others.iter().position(|h| h.token == token) else {
                return;
            };
            more.others.remove(i)
        };
        self.leases -= 1;
        let name = Arc::clone(&entry.name);
        self.effects.push(Effect::Event(Event {
            kind,
            name,
            id: old.id,
            token: old.token,
            held: self.clock.held(now, old.granted),
            waited: None,
            origin: old.origin,
            note: None,
            broken_by: Origin::default(),
        }));
        self.grant_fitting(now, slot);
        self.sweep_ids_if_due();
    }

    /// Puts waiter `next` in the place of the entry's only holder, which ended with `kind`.
    fn replace_holder(&mut self, now: Instant, slot: u32, next: Waiter, kind: EventKind) {
        let (deadline, holder) = self.waiter_holder(now, &next);
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        let old = std::mem::replace(&mut entry.holder, holder);
        entry.tidy();
        self.effects.push(Effect::Event(Event {
            kind,
            name: Arc::clone(&entry.name),
            id: Arc::clone(&old.id),
            token: old.token,
            held: self.clock.held(now, old.granted),
            waited: None,
            origin: old.origin,
            note: None,
            broken_by: Origin::default(),
        }));
        self.grant_waiter(now, slot, next, None, deadline);
    }

    /// The holder a granted waiter becomes, and its lease's deadline.
    fn waiter_holder(&self, now: Instant, next: &Waiter) -> (Instant, Holder) {
        // A ttl accepted at enqueue time fits, short of a deadline 584 years out.
        let (deadline, deadline_ticks) = self
            .clock
            .after(now, next.ttl)
            .unwrap_or((now, self.clock.ticks(now).unwrap_or(u64::MAX)));
        let granted = self.clock.ticks(now).unwrap_or(0);
        let mut holder = Holder::new(
            Arc::clone(&next.id),
            nanos(next.ttl),
            deadline_ticks,
            (granted, self.wall_ms),
            next.user,
            next.origin.clone(),
        );
        holder.set_note(next.note.clone());
        holder.bind(next.session, next.conn);
        (deadline, holder)
    }

    /// Starts the lease of waiter `next`, already out of the queue and in place (`added` is
    /// `Some` for a holder beside others), and tells it: the grant goes before the Acquired
    /// event, so a watcher never sees a holder whose client has not been told.
    fn grant_waiter(
        &mut self,
        now: Instant,
        slot: u32,
        next: Waiter,
        added: Option<Holder>,
        deadline: Instant,
    ) {
        self.waiters.remove(&next.waiter);
        if let Some(at) = next.deadline {
            self.timers.remove(&(at, Timer::Wait(next.waiter)));
        }
        let waited = self.clock.held(now, next.queued);
        let token = self.start_lease(slot, added, deadline, Some(waited));
        let Some(name) = self.slab.get(slot).map(|e| Arc::clone(&e.name)) else {
            return;
        };
        let acquired = self.effects.pop();
        self.effects.push(Effect::Granted {
            waiter: next.waiter,
            name,
            token,
            deadline,
        });
        self.effects.extend(acquired);
    }

    /// Grants, in queue order, every waiter at the head that fits beside those holding: all
    /// the shared ones up to the next exclusive one, a semaphore's free slots. For an
    /// exclusive lock it looks at the head and stops.
    fn grant_fitting(&mut self, now: Instant, slot: u32) {
        loop {
            let Some(entry) = self.slab.get_mut(slot) else {
                return;
            };
            if !entry.head_fits() {
                entry.tidy();
                return;
            }
            let Some(next) = pop_first_waiter(entry) else {
                return;
            };
            let (deadline, holder) = self.waiter_holder(now, &next);
            self.grant_waiter(now, slot, next, Some(holder), deadline);
        }
    }

    /// Takes a waiter out of its queue; returns it and its entry's slot. A waiter that left
    /// the head may have been what kept the ones behind it waiting: the caller grants them
    /// ([`Locks::grant_fitting`]) once it has said why this one left.
    fn remove_waiter(&mut self, waiter: WaiterId) -> Option<(Waiter, u32)> {
        let (slot, ticket) = self.waiters.remove(&waiter)?;
        let entry = self.slab.get_mut(slot)?;
        let w = entry.more.as_mut()?.queue.remove(&ticket)?;
        if let Some(at) = w.deadline {
            self.timers.remove(&(at, Timer::Wait(waiter)));
        }
        self.sweep_ids_if_due();
        Some((w, slot))
    }

    /// The table's one `Arc` for `id`: a client that holds many locks, or takes a lock again
    /// and again, costs one allocation rather than one per LOCK.
    fn intern(&mut self, id: &str) -> Arc<str> {
        if let Some(shared) = self.ids.get(id) {
            return Arc::clone(shared);
        }
        self.sweep_ids_if_due();
        let shared: Arc<str> = id.into();
        self.ids.insert(Arc::clone(&shared));
        shared
    }

    /// Drops the interned ids nobody uses any more (only the set holds them). A sweep runs
    /// once the set is over twice the holders and waiters (plus some slack) and at least half
    /// its size in interns and releases happened since the last one, so its cost is spread
    /// over them and the set stays within about twice what is in use.
    fn sweep_ids_if_due(&mut self) {
        self.id_ops += 1;
        let in_use = self.index.len() + self.waiters.len();
        if self.ids.len() <= 2 * in_use + 1024 || self.id_ops < self.ids.len() / 2 {
            return;
        }
        self.ids.retain(|id| Arc::strong_count(id) > 1);
        self.id_ops = 0;
    }
}

/// Whether `user` may renew or release `holder`'s lease: its own user may, and anyone may
/// renew or release a lease that belongs to no user ([`NO_USER`]). Knowing a token is not
/// enough: STATUS shows every holder's token to those who may read the name.
fn owned_by(holder: &Holder, user: UserId) -> Result<(), TableError> {
    if holder.user == NO_USER || holder.user == user {
        Ok(())
    } else {
        Err(TableError::NotOwner)
    }
}

/// The head of the queue.
fn pop_first_waiter(entry: &mut Entry) -> Option<Waiter> {
    let (_, first) = entry.more.as_mut()?.queue.pop_first()?;
    Some(first)
}

fn status_of(clock: Clock, now: Instant, entry: &Entry) -> LockStatus {
    holder_status(clock, now, entry, &entry.holder)
}

/// One holder of `entry`, described as STATUS shows a lock.
fn holder_status(clock: Clock, now: Instant, entry: &Entry, holder: &Holder) -> LockStatus {
    let deadline = clock.instant(holder.deadline).unwrap_or(now);
    LockStatus {
        name: Arc::clone(&entry.name),
        holder: Arc::clone(&holder.id),
        token: holder.token,
        left: deadline.saturating_duration_since(now),
        held: clock.held(now, holder.granted),
        session: holder.bond != Bond::Plain,
        waiters: entry.waiters(),
        holders: entry.holder_count(),
        mode: entry.mode(),
        origin: holder.origin.clone(),
        granted_unix_ms: holder.granted_unix_ms,
        note: holder.note(),
    }
}
