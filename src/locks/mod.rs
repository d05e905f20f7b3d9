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
//!
//! # Layout: memory per held lock
//! A server may hold a million locks, so the table is laid out to cost under 256 bytes of heap
//! per held lock with 16-byte names (`tests/memory.rs` measures it; about 202 B at 200,000
//! locks and 222 B at 1,000,000, against 290 and 380 B for a `HashMap<Arc<str>, Entry>`):
//! - the entries live in a `Slab` of 88-byte slots, grown 4096 slots at a time and reused
//!   once freed; a `HashMap<Arc<str>, u32>` (24-byte buckets) maps a name to its slot. A hash
//!   map of whole entries would pay its spare buckets (up to half the table) at entry size.
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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod layout;
mod types;

use layout::{nanos, Bond, Clock, Entry, Holder, Queue, Slab, Timer, Waiter};
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
            clock: Clock::default(),
            index: HashMap::new(),
            slab: Slab::default(),
            ids: HashSet::new(),
            id_ops: 0,
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
        self.clock.start(now);
        if lease.deadline <= now || self.index.contains_key(lease.name.as_str()) {
            return;
        }
        let holder = Holder {
            id: self.intern(&lease.id),
            token: lease.token,
            ttl: nanos(lease.ttl.min(self.limits.max_ttl)),
            // Past 584 years from now: as good as never.
            deadline: self.clock.ticks(lease.deadline).unwrap_or(u64::MAX),
            granted: self.clock.ticks(now).unwrap_or(0),
            conn: 0,
            grace_ms: 0,
            bond: Bond::Plain,
        };
        let deadline = holder.deadline;
        if let Some(slot) = self.add_entry(lease.name.into(), holder) {
            self.timers
                .insert((deadline, Timer::Lease(lease.token, slot)));
        }
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

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// LOCK: grant now, queue, or refuse.
    pub fn lock(&mut self, now: Instant, req: LockRequest) -> Result<LockOutcome, TableError> {
        self.expire(now);
        let ttl = self.check_ttl(req.ttl)?;
        if req.session.is_some_and(|grace| grace > self.limits.max_ttl) {
            return Err(TableError::BadGrace {
                max: self.limits.max_ttl,
            });
        }
        let bad_ttl = TableError::BadTtl {
            max: self.limits.max_ttl,
        };
        let (deadline, deadline_ticks) = self.clock.after(now, ttl).ok_or(bad_ttl)?;
        let Some(&slot) = self.index.get(req.name.as_str()) else {
            let too_many = TableError::TooManyLocks {
                max: self.limits.max_locks,
            };
            if self.index.len() >= self.limits.max_locks {
                return Err(too_many);
            }
            let mut holder = Holder {
                id: self.intern(&req.id),
                token: 0,
                ttl: nanos(ttl),
                deadline: deadline_ticks,
                granted: self.clock.ticks(now).unwrap_or(0),
                conn: 0,
                grace_ms: 0,
                bond: Bond::Plain,
            };
            holder.bind(req.session, req.conn);
            let slot = self.add_entry(req.name.into(), holder).ok_or(too_many)?;
            let token = self.start_lease(slot, deadline, None);
            return Ok(LockOutcome::Granted { token, deadline });
        };
        let Some(entry) = self.slab.get_mut(slot) else {
            return Err(TableError::NotHeld);
        };

        if *entry.holder.id == *req.id {
            // A repeat by the holder (typically a retry after a lost reply): same grant, new
            // lease. Two processes can't share it through one id while the first one's session
            // connection is open: that is refused. A session lease in its grace has no open
            // connection, so its holder coming back takes it up again.
            let holder = &mut entry.holder;
            if matches!(holder.open_conn(), Some(c) if c != req.conn) {
                return Err(TableError::Conflict);
            }
            let timer = Timer::Lease(holder.token, slot);
            self.timers.remove(&(holder.deadline, timer));
            holder.ttl = nanos(ttl);
            holder.deadline = deadline_ticks;
            holder.bind(req.session, req.conn);
            self.timers.insert((deadline_ticks, timer));
            if self.journal {
                self.changes.push(Change::Grant {
                    name: Arc::clone(&entry.name),
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
            // Past 584 years from now: as good as without bound.
            Some(w) => self.clock.after(now, w).map(|(_, ticks)| ticks),
        };

        // A LOCK by an id that already waits takes over that place; the older request fails.
        let replaced = entry.queue.as_deref().and_then(|queue| {
            queue
                .iter()
                .find(|(_, w)| *w.id == *req.id)
                .map(|(ticket, w)| (*ticket, w.waiter, w.deadline))
        });
        let ticket = match replaced {
            Some((ticket, old, old_deadline)) => {
                if let Some(queue) = entry.queue.as_deref_mut() {
                    queue.remove(&ticket);
                }
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
        entry.queue.get_or_insert_with(Box::default).insert(
            ticket,
            Waiter {
                waiter,
                id,
                ttl,
                session: req.session,
                conn: req.conn,
                deadline: wait_deadline,
                queued: self.clock.ticks(now).unwrap_or(0),
            },
        );
        if let Some(at) = wait_deadline {
            self.timers.insert((at, Timer::Wait(waiter)));
        }
        self.waiters.insert(waiter, (slot, ticket));
        Ok(LockOutcome::Queued { waiter })
    }

    /// UNLOCK: release if `token` is the live lease; the next waiter is granted at once.
    pub fn unlock(&mut self, now: Instant, name: &str, token: Token) -> Result<(), TableError> {
        self.expire(now);
        self.end_lease(now, name, token, EventKind::Released, None)
    }

    /// Connection `conn`, to which the session lease `token` is bound, closed. Without a
    /// grace the lease ends now (event `dropped`); with one, it ends `grace` from now (or at
    /// its own deadline, if sooner) unless a RENEW binds it to another connection first. A
    /// no-op if the lease already ended, changed hands or is bound elsewhere.
    pub fn drop_session(&mut self, now: Instant, name: &str, token: Token, conn: ConnId) {
        self.expire(now);
        let Some(slot) = self.live_slot(name, token) else {
            return;
        };
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        let holder = &mut entry.holder;
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
        if let Some((deadline, ticks)) = cut {
            let timer = Timer::Lease(token, slot);
            self.timers.remove(&(holder.deadline, timer));
            holder.deadline = ticks;
            self.timers.insert((ticks, timer));
            if self.journal {
                self.changes.push(Change::Renew {
                    name: Arc::clone(&entry.name),
                    token,
                    ttl: Duration::from_nanos(holder.ttl),
                    deadline,
                });
            }
        }
    }

    /// Takes back a grant whose client is known to be gone (its connection was reset before
    /// it could read the token): the lease ends now with event `dropped` and the next waiter
    /// is granted. `NotHeld` if `token` is not the live lease.
    pub fn revoke(&mut self, now: Instant, name: &str, token: Token) -> Result<(), TableError> {
        self.expire(now);
        self.end_lease(now, name, token, EventKind::Revoked, None)
    }

    /// RENEW on connection `conn`: a new deadline `ttl` (or the lease's own ttl) from now. A
    /// session lease in its grace is bound to `conn` from now on.
    pub fn renew(
        &mut self,
        now: Instant,
        name: &str,
        token: Token,
        ttl: Option<Duration>,
        conn: ConnId,
    ) -> Result<Renewal, TableError> {
        self.expire(now);
        let ttl = match ttl {
            Some(_) => Some(self.check_ttl(ttl)?),
            None => None,
        };
        let slot = *self.index.get(name).ok_or(TableError::NotHeld)?;
        let Some(entry) = self.slab.get_mut(slot).filter(|e| e.holder.token == token) else {
            return Err(TableError::NotHeld);
        };
        let holder = &mut entry.holder;
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
        }
        if self.journal {
            self.changes.push(Change::Renew {
                name: Arc::clone(&entry.name),
                token,
                ttl,
                deadline,
            });
        }
        Ok(Renewal { deadline, bound })
    }

    /// CHECK: the deadline of `token`'s lease on `name`, if it is live.
    pub fn check(&mut self, now: Instant, name: &str, token: Token) -> Result<Instant, TableError> {
        self.expire(now);
        self.entry(name)
            .filter(|e| e.holder.token == token)
            .and_then(|e| self.clock.instant(e.holder.deadline))
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
        let entry = self.entry(name)?;
        Some(status_of(self.clock, now, entry))
    }

    /// The first `max` waiters of `name`, in the order they will be granted.
    pub fn queue(&mut self, now: Instant, name: &str, max: usize) -> Vec<WaiterStatus> {
        self.expire(now);
        let Some(queue) = self.entry(name).and_then(|e| e.queue.as_deref()) else {
            return Vec::new();
        };
        queue
            .values()
            .take(max)
            .map(|w| WaiterStatus {
                id: Arc::clone(&w.id),
                waited: self.clock.held(now, w.queued),
                session: w.session.is_some(),
            })
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
                    if self.remove_waiter(waiter).is_some() {
                        self.effects.push(Effect::WaitEnded {
                            waiter,
                            why: WaitEnd::TimedOut,
                        });
                    }
                }
                Timer::Lease(token, slot) => {
                    let ended = self.slab.get(slot).filter(|e| e.holder.token == token);
                    if let Some(entry) = ended {
                        let kind = match entry.holder.bond {
                            Bond::Orphan { cut: true } => EventKind::Dropped,
                            _ => EventKind::Expired,
                        };
                        self.release_and_hand_over(now, slot, kind);
                    }
                }
            }
        }
    }

    fn check_ttl(&self, ttl: Option<Duration>) -> Result<Duration, TableError> {
        let ttl = ttl.unwrap_or(self.limits.default_ttl);
        if ttl < crate::MIN_TTL || ttl > self.limits.max_ttl {
            return Err(TableError::BadTtl {
                max: self.limits.max_ttl,
            });
        }
        Ok(ttl)
    }

    /// The slot of `name` if `token` is its live lease.
    fn live_slot(&self, name: &str, token: Token) -> Option<u32> {
        let slot = *self.index.get(name)?;
        self.slab
            .get(slot)
            .is_some_and(|e| e.holder.token == token)
            .then_some(slot)
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        let slot = *self.index.get(name)?;
        self.slab.get(slot)
    }

    /// Puts a new entry for `name` in a free slot (its lease timer is the caller's); `None`
    /// when all 2^32 slots are taken.
    fn add_entry(&mut self, name: Arc<str>, holder: Holder) -> Option<u32> {
        let entry = Entry {
            name: Arc::clone(&name),
            holder,
            queue: None,
        };
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

    /// Gives the holder in `slot` the next token and starts its lease (timer, journal,
    /// Acquired event, which says how long it `waited` in the queue); returns the token.
    fn start_lease(&mut self, slot: u32, deadline: Instant, waited: Option<Duration>) -> Token {
        let token = self.next_token;
        let Some(entry) = self.slab.get_mut(slot) else {
            return token;
        };
        self.next_token += 1;
        let holder = &mut entry.holder;
        holder.token = token;
        if self.journal {
            self.changes.push(Change::Grant {
                name: Arc::clone(&entry.name),
                id: Arc::clone(&holder.id),
                token,
                ttl: Duration::from_nanos(holder.ttl),
                deadline,
            });
        }
        self.timers
            .insert((holder.deadline, Timer::Lease(token, slot)));
        self.effects.push(Effect::Event(Event {
            kind: EventKind::Acquired,
            name: Arc::clone(&entry.name),
            id: Arc::clone(&holder.id),
            token,
            held: Duration::ZERO,
            waited,
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
        let entry = self
            .slab
            .get(slot)
            .filter(|e| e.holder.token == token)
            .ok_or(TableError::NotHeld)?;
        if only_conn.is_some() && entry.holder.open_conn() != only_conn {
            return Err(TableError::NotHeld);
        }
        self.timers
            .remove(&(entry.holder.deadline, Timer::Lease(token, slot)));
        if self.journal {
            self.changes.push(Change::Release {
                name: Arc::clone(&entry.name),
                token,
            });
        }
        self.release_and_hand_over(now, slot, kind);
        Ok(())
    }

    /// Removes the holder in `slot` (its timer is already gone) and grants the head of the
    /// queue, if any, in the same slot: one effect for one waiter, no scan.
    fn release_and_hand_over(&mut self, now: Instant, slot: u32, kind: EventKind) {
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        let next = pop_first_waiter(&mut entry.queue);
        let Some(next) = next else {
            if let Some(Entry { name, holder, .. }) = self.remove_entry(slot) {
                let held = self.clock.held(now, holder.granted);
                self.effects.push(Effect::Event(Event {
                    kind,
                    name,
                    id: holder.id,
                    token: holder.token,
                    held,
                    waited: None,
                }));
            }
            return;
        };
        // A ttl accepted at enqueue time fits, short of a deadline 584 years out.
        let (deadline, deadline_ticks) = self
            .clock
            .after(now, next.ttl)
            .unwrap_or((now, self.clock.ticks(now).unwrap_or(u64::MAX)));
        let mut new_holder = Holder {
            id: next.id,
            token: 0,
            ttl: nanos(next.ttl),
            deadline: deadline_ticks,
            granted: self.clock.ticks(now).unwrap_or(0),
            conn: 0,
            grace_ms: 0,
            bond: Bond::Plain,
        };
        new_holder.bind(next.session, next.conn);
        let old = std::mem::replace(&mut entry.holder, new_holder);
        let name = Arc::clone(&entry.name);
        self.effects.push(Effect::Event(Event {
            kind,
            name: Arc::clone(&name),
            id: old.id,
            token: old.token,
            held: self.clock.held(now, old.granted),
            waited: None,
        }));
        self.waiters.remove(&next.waiter);
        if let Some(at) = next.deadline {
            self.timers.remove(&(at, Timer::Wait(next.waiter)));
        }
        let waited = self.clock.held(now, next.queued);
        let token = self.start_lease(slot, deadline, Some(waited));
        // The grant goes before the Acquired event, so a watcher never sees a holder whose
        // client has not been told.
        let acquired = self.effects.pop();
        self.effects.push(Effect::Granted {
            waiter: next.waiter,
            name,
            token,
            deadline,
        });
        self.effects.extend(acquired);
        self.sweep_ids_if_due();
    }

    fn remove_waiter(&mut self, waiter: WaiterId) -> Option<Waiter> {
        let (slot, ticket) = self.waiters.remove(&waiter)?;
        let entry = self.slab.get_mut(slot)?;
        let w = entry.queue.as_deref_mut()?.remove(&ticket)?;
        if entry.queue.as_ref().is_some_and(|q| q.is_empty()) {
            entry.queue = None;
        }
        if let Some(at) = w.deadline {
            self.timers.remove(&(at, Timer::Wait(waiter)));
        }
        self.sweep_ids_if_due();
        Some(w)
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

/// The head of the queue, leaving `None` behind when it was the last.
fn pop_first_waiter(queue: &mut Option<Box<Queue>>) -> Option<Waiter> {
    let (_, first) = queue.as_deref_mut()?.pop_first()?;
    if queue.as_ref().is_some_and(|q| q.is_empty()) {
        *queue = None;
    }
    Some(first)
}

fn status_of(clock: Clock, now: Instant, entry: &Entry) -> LockStatus {
    let deadline = clock.instant(entry.holder.deadline).unwrap_or(now);
    LockStatus {
        name: Arc::clone(&entry.name),
        holder: Arc::clone(&entry.holder.id),
        token: entry.holder.token,
        remaining: deadline.saturating_duration_since(now),
        held: clock.held(now, entry.holder.granted),
        session: entry.holder.bond != Bond::Plain,
        waiters: entry.queue.as_ref().map_or(0, |q| q.len()),
    }
}
