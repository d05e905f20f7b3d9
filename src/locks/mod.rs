//! The lock table: a pure state machine, and the only place that decides who holds a lock.
//!
//! It owns no sockets, spawns nothing and never reads a clock: every call takes `now`, and
//! everything that should happen elsewhere (a waiter to wake, a waiter to fail, an event for
//! watchers) comes back as an [`Effect`] queued for the caller to drain. That is what lets the
//! model test drive it through millions of random histories with exact time.
//!
//! Invariants (checked by `tests/props/model.rs`):
//! - a name has at most one exclusive holder; an entry exists only while it has a holder or
//!   a waiter (a set waits on every one of its names, the free ones too: an entry nobody
//!   holds is shown as free, and counts in no `len()`);
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
//! - a set of names (`and=`) costs a held name nothing when there is none: its link is a side
//!   map by token (`Locks::sets`), and a waiting set's by waiter (`Locks::set_waiters`).
//!
//! # Sets of names
//! A set is one lease over several names: each name has a holder with the set's one token,
//! deadline, binding and note, and `sets` names the set's slots; whatever ends, renews or
//! binds one of them does it to all (`Locks::end_token`, `Locks::renew`,
//! `Locks::drop_session`). A waiting set has one `WaiterId` and one ticket, and a place in
//! every one of its names' queues. Hand-over goes by a work list of slots whose head or
//! holders changed (`Locks::hand_over`): a single waiter at the head is granted when it fits,
//! a set at the head when [`rules::set_ready`] holds on all of its names (and then its other
//! names are looked at too). No scan of the table: per name, a hand-over looks at that
//! name's head.
//!
//! When the table empties after having been large, it hands its slab, index and unused ids
//! back to the allocator.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod layout;
pub mod rules;
mod sessions;
#[cfg(test)]
mod set_tests;
mod types;

use layout::{nanos, Bond, Clock, Entry, Holder, Slab, TableView, Timer, Waiter, WaiterPlace};
use rules::{Ask, Decision, SetDecision};
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
    /// A set is there once, by its token and one of its slots.
    bound: sessions::Bound,
    /// Held sets: token -> the slots of its names, in the request's order.
    sets: HashMap<Token, Box<[u32]>>,
    /// Waiting sets: waiter -> the slots of its names, in the request's order (`waiters` has
    /// the first one and the ticket, the same in every queue).
    set_waiters: HashMap<WaiterId, Box<[u32]>>,
    /// Entries nobody holds (only a set's waiting keeps them): `index.len()` less these is
    /// how many names are held.
    vacant: usize,
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
    /// A broken set's further names (its holder may ask through any of them).
    also: Vec<Arc<str>>,
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
            sets: HashMap::new(),
            set_waiters: HashMap::new(),
            vacant: 0,
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
        // Restores come first: the table's epoch goes back far enough that a lease granted
        // before the restart keeps its grant time (STATUS's held_ms, the audit line's).
        self.clock
            .start(now.checked_sub(RESTORED_HISTORY).unwrap_or(now));
        if lease.deadline <= now {
            return;
        }
        // Held since its grant, by the wall clocks of then and now (0: not known, held since
        // the restart).
        let now_ticks = self.clock.ticks(now).unwrap_or(0);
        let since = match lease.granted_unix_ms {
            0 => Duration::ZERO,
            at => Duration::from_millis(self.wall_ms.saturating_sub(at)),
        };
        let granted = now_ticks.saturating_sub(nanos(since));
        let mut holder = Holder::new(
            self.intern(&lease.id),
            nanos(lease.ttl.min(self.limits.max_ttl)),
            // Past 584 years from now: as good as never.
            self.clock.ticks(lease.deadline).unwrap_or(u64::MAX),
            (granted, lease.granted_unix_ms),
            lease.user,
            lease.origin,
        );
        holder.token = lease.token;
        holder.set_note(lease.note);
        let deadline = holder.deadline;
        let slot = match self.index.get(lease.name.as_str()) {
            None => self.add_entry(lease.name.into()),
            Some(&slot) => self.slab.get(slot).and_then(|entry| {
                let holding = entry.holders().map(|_| entry.mode());
                rules::admits(holding, lease.mode).then_some(slot)
            }),
        };
        let slot = slot.filter(|&slot| self.place_holder(slot, holder, lease.mode).is_some());
        if let Some(slot) = slot {
            self.leases += 1;
            self.timers
                .insert((deadline, Timer::Lease(lease.token, slot)));
        }
    }

    /// Links the restored leases `token` of `names` again as one set (a LOCK with `and=`),
    /// after [`Locks::restore`] put them back: from then on, whatever ends, renews or breaks
    /// one of them does it to all. Names whose lease did not come back are left out.
    pub fn restore_set(&mut self, token: Token, names: &[String]) {
        let slots: Vec<u32> = names
            .iter()
            .filter_map(|name| self.index.get(name.as_str()).copied())
            .filter(|&slot| {
                self.slab
                    .get(slot)
                    .is_some_and(|e| e.holder(token).is_some())
            })
            .collect();
        if slots.len() > 1 {
            self.sets.insert(token, slots.into());
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
        self.index.len() - self.vacant
    }

    /// Whether no name is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name in `slot` (`None`: free) as the lock rules see it.
    fn view(&self, slot: Option<u32>) -> TableView<'_> {
        let entry = slot.and_then(|slot| self.slab.get(slot));
        TableView(entry, &self.sets, &self.set_waiters)
    }

    /// LOCK: grant now, queue, or refuse, as [`rules::decide`] says.
    pub fn lock(&mut self, now: Instant, mut req: LockRequest) -> Result<LockOutcome, TableError> {
        self.expire(now);
        let ttl = self.check_ttl(req.ttl)?;
        self.limits.grace(req.session())?;
        req.delay = Some(self.limits.delay(req.delay)?);
        let bad_ttl = TableError::BadTtl {
            max: self.limits.max_ttl,
        };
        let (deadline, deadline_ticks) = self.clock.after(now, ttl).ok_or(bad_ttl)?;
        if !req.and.is_empty() {
            return self.lock_set(now, req, ttl, (deadline, deadline_ticks));
        }
        let slot = self.index.get(&*req.name).copied();
        let ask = Ask {
            id: &req.id,
            user: &req.user,
            mode: req.mode,
            conn: req.conn,
            wait: req.wait,
            supersede: req.supersede,
        };
        let view = self.view(slot);
        let decision = rules::decide(&view, &ask, &self.limits, self.leases)?;
        let too_many = TableError::TooManyLocks {
            max: self.limits.max_locks,
        };
        let Some(slot) = slot else {
            // A free name: the only decision the rules make for it is a grant.
            let holder = self.new_holder(now, &req, ttl, deadline_ticks);
            let slot = self.add_entry(req.name).ok_or(too_many)?;
            let token = self.start_lease(slot, holder, req.mode, deadline, None);
            return Ok(LockOutcome::Granted { token, deadline });
        };
        match decision {
            Decision::Grant => {
                let holder = self.new_holder(now, &req, ttl, deadline_ticks);
                let token = self.start_lease(slot, holder, req.mode, deadline, None);
                Ok(LockOutcome::Granted { token, deadline })
            }
            Decision::Again(token) => {
                self.grant_again(slot, token, &req, ttl, (deadline, deadline_ticks))?;
                Ok(LockOutcome::Granted { token, deadline })
            }
            Decision::Queue {
                place,
                replaced,
                superseded,
            } => {
                let mut touched = self.supersede(slot, &req.id, superseded);
                let waiter = self.enqueue(now, slot, req, ttl, (place, replaced), &mut touched)?;
                self.hand_over(now, touched);
                Ok(LockOutcome::Queued { waiter })
            }
        }
    }

    /// LOCK of a set (`req.and` is not empty): granted on every name at once, queued on
    /// every name at once, or refused whole, as [`rules::decide_set`] says.
    fn lock_set(
        &mut self,
        now: Instant,
        req: LockRequest,
        ttl: Duration,
        (deadline, deadline_ticks): (Instant, u64),
    ) -> Result<LockOutcome, TableError> {
        let names: Vec<&str> = std::iter::once(&*req.name)
            .chain(req.and.iter().map(String::as_str))
            .collect();
        let slots: Vec<Option<u32>> = names.iter().map(|n| self.index.get(*n).copied()).collect();
        let ask = Ask {
            id: &req.id,
            user: &req.user,
            mode: req.mode,
            conn: req.conn,
            wait: req.wait,
            supersede: false,
        };
        let views: Vec<TableView<'_>> = slots.iter().map(|&slot| self.view(slot)).collect();
        // The names as sets name them, by slot: a name without one is in no set.
        let asked: Vec<u32> = slots.iter().flatten().copied().collect();
        let decision = rules::decide_set(&views, &asked, &ask, &self.limits, self.leases)?;
        drop(views);
        match decision {
            SetDecision::Again(tokens) => {
                // The rules made sure it is this very set: one token on every name.
                let Some(&token) = tokens.first() else {
                    return Err(TableError::Conflict);
                };
                for slot in slots.into_iter().flatten() {
                    self.grant_again(slot, token, &req, ttl, (deadline, deadline_ticks))?;
                }
                Ok(LockOutcome::Granted { token, deadline })
            }
            SetDecision::Grant => {
                let too_many = TableError::TooManyLocks {
                    max: self.limits.max_locks,
                };
                let names: Vec<Arc<str>> = names.iter().map(|&n| Arc::from(n)).collect();
                let mut placed = Vec::with_capacity(slots.len());
                for (slot, name) in slots.iter().zip(names) {
                    let slot = match slot {
                        Some(slot) => *slot,
                        None => self.add_entry(name).ok_or(too_many.clone())?,
                    };
                    placed.push(slot);
                }
                let token = self.next_token;
                self.next_token += 1;
                for &slot in &placed {
                    let holder = self.new_holder(now, &req, ttl, deadline_ticks);
                    self.start_lease_as(slot, holder, req.mode, deadline, None, token);
                }
                self.journal_set(token, &placed);
                self.sets.insert(token, placed.into());
                Ok(LockOutcome::Granted { token, deadline })
            }
            SetDecision::Queue { place, replaced } => {
                let mut touched = Vec::new();
                // In the place (the ticket, in every queue) the rules say, or a new one.
                let place = place.map(|(ticket, _, _)| ticket);
                let mut had = None;
                for (_, old, _) in replaced {
                    if let Some((replaced, left)) = self.remove_waiter(old) {
                        had = had.or(replaced.note);
                        touched.extend(left);
                        self.effects.push(Effect::WaitEnded {
                            waiter: old,
                            why: WaitEnd::Replaced,
                        });
                    }
                }
                let note = rules::note_again(had.as_ref(), req.note.as_ref()).cloned();
                let waiter = self.enqueue_set(now, &names, &req, ttl, (place, note))?;
                touched.extend(self.set_waiters.get(&waiter).into_iter().flatten());
                self.hand_over(now, touched);
                Ok(LockOutcome::Queued { waiter })
            }
        }
    }

    /// Queues a set on every one of its `names` (made waited-for entries where free), with
    /// one waiter and one ticket: `place`, the ticket of the older request of the same set
    /// it takes over, or a new one at the back of every queue. `note`: the waiter's.
    fn enqueue_set(
        &mut self,
        now: Instant,
        names: &[&str],
        req: &LockRequest,
        ttl: Duration,
        (place, note): (Option<u64>, Option<Note>),
    ) -> Result<WaiterId, TableError> {
        let too_many = TableError::TooManyLocks {
            max: self.limits.max_locks,
        };
        let mut slots = Vec::with_capacity(names.len());
        for &name in names {
            let slot = match self.index.get(name) {
                Some(&slot) => slot,
                None => self.add_entry(name.into()).ok_or(too_many.clone())?,
            };
            slots.push(slot);
        }
        let wait_deadline = match req.wait {
            None => None,
            Some(w) => self.clock.after(now, w).map(|(_, ticks)| ticks),
        };
        let ticket = place.unwrap_or_else(|| {
            self.next_ticket += 1;
            self.next_ticket - 1
        });
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        let id = self.intern(&req.id);
        let queued = self.clock.ticks(now).unwrap_or(0);
        for &slot in &slots {
            let Some(entry) = self.slab.get_mut(slot) else {
                continue;
            };
            entry.more_mut().queue.insert(
                ticket,
                Waiter {
                    waiter,
                    id: Arc::clone(&id),
                    ttl,
                    session: req.session(),
                    conn: req.conn,
                    deadline: wait_deadline,
                    queued,
                    mode: req.mode,
                    user: req.user,
                    origin: req.origin.clone(),
                    note: note.clone(),
                    delay_ms: millis(req.delay),
                },
            );
        }
        if let Some(at) = wait_deadline {
            self.timers.insert((at, Timer::Wait(waiter)));
        }
        if let Some(&first) = slots.first() {
            self.waiters.insert(waiter, (first, ticket));
        }
        self.set_waiters.insert(waiter, slots.into());
        Ok(waiter)
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
        let was = existing.bind(req.session(), req.conn);
        // The client that asked last holds it now: its address is the one to show.
        existing.origin = req.origin.clone();
        existing.delay_ms = millis(req.delay);
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

    /// Queues `req` on `slot` at `place` (`None`: at the back; else the place of that
    /// older request), once the requests it `replaced` have ended `Replaced` (a set leaves
    /// all its queues, whose slots go to `touched`), as [`rules::decide`] said. The caller
    /// hands over `touched` and `slot`.
    fn enqueue(
        &mut self,
        now: Instant,
        slot: u32,
        req: LockRequest,
        ttl: Duration,
        (place, replaced): (Option<WaiterPlace>, Vec<WaiterPlace>),
        touched: &mut Vec<u32>,
    ) -> Result<WaiterId, TableError> {
        let wait_deadline = match req.wait {
            None => None,
            // Past 584 years from now: as good as without bound.
            Some(w) => self.clock.after(now, w).map(|(_, ticks)| ticks),
        };
        if self.slab.get(slot).is_none() {
            return Err(TableError::NotHeld);
        }
        let mut note = req.note;
        // The note of the (first) request it replaces, unless it brings its own.
        let first = replaced.first().map(|&(_, old, _)| old);
        let kept = |had: Option<&Note>, note: &mut Option<Note>, old: WaiterId| {
            if first == Some(old) {
                *note = rules::note_again(had, note.as_ref()).cloned();
            }
        };
        for (ticket, old, old_deadline) in replaced {
            if self.set_waiters.contains_key(&old) {
                // A set leaves every queue.
                if let Some((replaced, left)) = self.remove_waiter(old) {
                    kept(replaced.note.as_ref(), &mut note, old);
                    touched.extend(left);
                }
            } else if let Some(entry) = self.slab.get_mut(slot) {
                let replaced = entry.more_mut().queue.remove(&ticket);
                kept(
                    replaced.as_ref().and_then(|w| w.note.as_ref()),
                    &mut note,
                    old,
                );
                self.waiters.remove(&old);
                if let Some(at) = old_deadline {
                    self.timers.remove(&(at, Timer::Wait(old)));
                }
            }
            self.effects.push(Effect::WaitEnded {
                waiter: old,
                why: WaitEnd::Replaced,
            });
        }
        let ticket = match place {
            Some((ticket, _, _)) => ticket,
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
                session: req.tie.session(),
                conn: req.conn,
                deadline: wait_deadline,
                queued: self.clock.ticks(now).unwrap_or(0),
                mode: req.mode,
                user: req.user,
                delay_ms: millis(req.delay),
                origin: req.origin,
                note,
            },
        );
        if let Some(at) = wait_deadline {
            self.timers.insert((at, Timer::Wait(waiter)));
        }
        self.waiters.insert(waiter, (slot, ticket));
        // A replacing request in another mode may fit where the one it replaced did not.
        touched.push(slot);
        Ok(waiter)
    }

    /// Ends the waits of `superseded` (waiters of `slot`) with [`WaitEnd::Superseded`] by
    /// `by`: a `supersede` LOCK takes the queue. The caller queues that LOCK next, so nobody
    /// behind them is granted meanwhile. A set among them leaves all its queues: returns
    /// the slots of its other names, for the caller to hand over.
    fn supersede(&mut self, slot: u32, by: &str, superseded: Vec<WaiterPlace>) -> Vec<u32> {
        let mut touched = Vec::new();
        if superseded.is_empty() {
            return touched;
        }
        let by: Arc<str> = self.intern(by);
        for (ticket, waiter, deadline) in superseded {
            if self.set_waiters.contains_key(&waiter) {
                if let Some((_, left)) = self.remove_waiter(waiter) {
                    touched.extend(left.into_iter().filter(|&s| s != slot));
                }
                self.effects.push(Effect::WaitEnded {
                    waiter,
                    why: WaitEnd::Superseded {
                        by: Arc::clone(&by),
                    },
                });
                continue;
            }
            let Some(entry) = self.slab.get_mut(slot) else {
                return touched;
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
        touched
    }

    /// UNLOCK by `user`: release if `token` is the live lease and `user` may (see
    /// [`owned_by`]); the next waiter is granted at once. A lease a BREAK left in place
    /// ([`Locks::break_lock`]) is let go the same way: its holder says its job is gone.
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

    /// BREAK by `by`: every lease of `name`, or only `token`'s, as [`rules::breaks`] says,
    /// whoever holds them, ends for its holder (event `broken` at once; its RENEW and CHECK
    /// are told who broke it, until the deadline it had: [`Locks::broken`]). Without `force`
    /// each keeps its place on the name, unrenewable, until its holder lets go (UNLOCK, once
    /// its job is gone) or its deadline passes: only then does the queue move, so the next
    /// holder never runs beside a job still being stopped. With `force` the queue moves now,
    /// as after a release. Breaking a lease already broken changes nothing but counts (a
    /// BREAK sent again). Returns the tokens, in grant order. Who may break a name is the
    /// caller's business (the `admin` right).
    pub fn break_lock(
        &mut self,
        now: Instant,
        name: &str,
        token: Option<Token>,
        by: &Origin,
        force: bool,
    ) -> Result<Vec<Token>, TableError> {
        self.expire(now);
        let slot = self.index.get(name).copied();
        let view = self.view(slot);
        let ended = rules::breaks(&view, token.as_ref())?;
        let slot = slot.ok_or(TableError::NotHeld)?;
        let who: Arc<str> = by.who().into();
        for &token in &ended {
            // A set is one lease: each of its names is broken alike.
            let slots = match self.sets.get(&token) {
                Some(slots) => slots.to_vec(),
                None => vec![slot],
            };
            for each in slots {
                self.break_one(now, each, token, (by, &who), !force);
            }
            if force {
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
        }
        Ok(ended)
    }

    /// Marks the lease `token` of `slot` broken (unless it is already): remembered and
    /// journaled as a break and, when it stays (`stays`: not `force`), its `breaking` event.
    fn break_one(
        &mut self,
        now: Instant,
        slot: u32,
        token: Token,
        (by, who): (&Origin, &Arc<str>),
        stays: bool,
    ) {
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        let name = Arc::clone(&entry.name);
        let Some(holder) = entry.holder_mut(token) else {
            return;
        };
        if holder.broken {
            return;
        }
        holder.broken = true;
        let deadline = holder.deadline;
        let event = Event {
            kind: EventKind::Breaking,
            name: Arc::clone(&name),
            id: Arc::clone(&holder.id),
            token,
            held: self.clock.held(now, holder.granted),
            waited: None,
            origin: holder.origin.clone(),
            note: None,
            broken_by: by.clone(),
        };
        if stays {
            self.effects.push(Effect::Event(event));
        }
        if self.journal {
            self.changes.push(Change::Break {
                name: Arc::clone(&name),
                token,
                by: Arc::clone(who),
                at_unix_ms: self.wall_ms,
                deadline: self.clock.instant(deadline).unwrap_or(now),
            });
        }
        self.remember_break(name, token, Arc::clone(who), self.wall_ms, deadline);
    }

    /// Why `token` is not a live lease of `name`: `Broken` while the table remembers a
    /// BREAK of it, else `NotHeld`. A backend asks after a RENEW, CHECK or UNLOCK was
    /// refused `NotHeld`.
    pub fn broken(&mut self, now: Instant, name: &str, token: Token) -> TableError {
        self.expire(now);
        match self.broken.get(&token) {
            Some(b) if &*b.name == name || b.also.iter().any(|n| &**n == name) => {
                TableError::Broken {
                    token,
                    by: Arc::clone(&b.by),
                    at_unix_ms: b.at_unix_ms,
                }
            }
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
        // A lease broken without `force` and not let go yet keeps its place, broken.
        let slot = self.index.get(&*lease.name).copied();
        let holder = slot.and_then(|s| self.slab.get_mut(s)?.holder_mut(lease.token));
        if let Some(holder) = holder {
            holder.broken = true;
        }
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
        if let Some(b) = self.broken.get_mut(&token) {
            // Another name of the same broken set.
            if b.name != name && !b.also.contains(&name) {
                b.also.push(name);
            }
            return;
        }
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
            also: Vec::new(),
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
        let Some(holder) = self.slab.get(slot).and_then(|e| e.holder(token)) else {
            return;
        };
        if holder.open_conn() != Some(conn) {
            return;
        }
        if holder.grace_ms == 0 && holder.delay_ms > 0 {
            // Its session ended now: its lock-delay starts.
            let now_ticks = self.clock.ticks(now).unwrap_or(u64::MAX);
            self.delay_end(now, now_ticks, slot, token, true);
            return;
        }
        if holder.grace_ms == 0 {
            let _ = self.end_lease(now, name, token, EventKind::Dropped, Some(conn));
            return;
        }
        self.bound.remove(conn, token);
        match self.sets.get(&token).cloned() {
            Some(slots) => slots.iter().for_each(|&s| self.orphan(now, s, token)),
            None => self.orphan(now, slot, token),
        }
    }

    /// Starts the grace of the session lease `token` of `slot`, whose connection closed.
    fn orphan(&mut self, now: Instant, slot: u32, token: Token) {
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        let entry_name = Arc::clone(&entry.name);
        let Some(holder) = entry.holder_mut(token) else {
            return;
        };
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
    /// from now. A session lease in its grace is bound to `conn` from now on; with `detach`
    /// (RENEW ... detach) it becomes a plain one instead. Only the lease's own user may (see
    /// [`owned_by`]).
    pub fn renew(
        &mut self,
        now: Instant,
        name: &str,
        token: Token,
        (ttl, detach): (Option<Duration>, bool),
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewal, TableError> {
        let renewal = self.renew_lease(now, name, token, ttl, conn, user)?;
        match detach {
            false => Ok(renewal),
            true => Ok(self.detach(name, token, conn, renewal)),
        }
    }

    /// [`Locks::renew`] without `detach`.
    fn renew_lease(
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
        let holder = self
            .slab
            .get(slot)
            .and_then(|e| e.holder(token))
            .filter(|h| !h.lingering())
            .ok_or(TableError::NotHeld)?;
        owned_by(holder, user)?;
        let ttl = ttl.unwrap_or(Duration::from_nanos(holder.ttl));
        let (deadline, deadline_ticks) = self.clock.after(now, ttl).ok_or(TableError::BadTtl {
            max: self.limits.max_ttl,
        })?;
        // A set's lease is one: every one of its names gets the new deadline.
        let bound = match self.sets.get(&token).cloned() {
            Some(slots) => slots.iter().fold(false, |bound, &s| {
                self.renew_one(s, token, ttl, (deadline, deadline_ticks), conn) | bound
            }),
            None => self.renew_one(slot, token, ttl, (deadline, deadline_ticks), conn),
        };
        Ok(Renewal { deadline, bound })
    }

    /// Gives the lease `token` of `slot` a new deadline; a session lease in its grace is
    /// bound to `conn` (returns whether it was).
    fn renew_one(
        &mut self,
        slot: u32,
        token: Token,
        ttl: Duration,
        (deadline, deadline_ticks): (Instant, u64),
        conn: ConnId,
    ) -> bool {
        let Some(entry) = self.slab.get_mut(slot) else {
            return false;
        };
        let entry_name = Arc::clone(&entry.name);
        let Some(holder) = entry.holder_mut(token) else {
            return false;
        };
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
        bound
    }

    /// RENEW ... detach, once renewed: a session lease becomes a plain one: it is bound to
    /// no connection and lasts until UNLOCK or its deadline (a grace it was in is over: the
    /// renewal set its deadline). A plain lease only gets its new deadline. The journal needs
    /// nothing more: it keeps no session flag (a restart restores every lease as a plain one).
    fn detach(&mut self, name: &str, token: Token, conn: ConnId, renewal: Renewal) -> Renewal {
        let Some(slot) = self.index.get(name).copied() else {
            return renewal;
        };
        let slots = match self.sets.get(&token) {
            Some(slots) => slots.to_vec(),
            None => vec![slot],
        };
        for slot in slots {
            let holder = self
                .slab
                .get_mut(slot)
                .and_then(|entry| entry.holder_mut(token));
            if let Some(holder) = holder {
                let was = holder.bind(None, conn);
                if let Some(c) = was {
                    self.bound.remove(c, token);
                }
            }
        }
        Renewal {
            bound: false,
            ..renewal
        }
    }

    /// CHECK: the deadline of `token`'s lease on `name`, if it is live.
    pub fn check(&mut self, now: Instant, name: &str, token: Token) -> Result<Instant, TableError> {
        self.expire(now);
        self.entry(name)
            .and_then(|e| e.holder(token))
            .filter(|h| !h.lingering())
            .and_then(|h| self.clock.instant(h.deadline))
            .ok_or(TableError::NotHeld)
    }

    /// Removes a waiter that left (its connection closed). Returns false if it was no longer
    /// waiting: it was granted or ended already, and the caller owns what the effects said.
    pub fn cancel_wait(&mut self, now: Instant, waiter: WaiterId) -> bool {
        self.expire(now);
        let Some((_, slots)) = self.remove_waiter(waiter) else {
            return false;
        };
        self.hand_over(now, slots);
        true
    }

    /// STATUS of one name; `None` when it is free.
    pub fn status(&mut self, now: Instant, name: &str) -> Option<LockStatus> {
        self.expire(now);
        let entry = self.entry(name)?;
        status_of(self.clock, now, entry, self.held_set())
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
                set: self.names_of(self.set_waiters.get(&w.waiter).map(|s| &s[..])),
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
            .map(|h| holder_status(self.clock, now, entry, h, self.held_set()))
            .collect()
    }

    /// The names of the slots a set holds or waits on (`None`: a lease or request of one
    /// name), in the request's order.
    fn names_of(&self, slots: Option<&[u32]>) -> Box<[Arc<str>]> {
        slots
            .unwrap_or_default()
            .iter()
            .filter_map(|&slot| self.slab.get(slot).map(|e| Arc::clone(&e.name)))
            .collect()
    }

    /// What [`holder_status`] asks of a holder's lease: the names of its set, if it is one
    /// (no lookup while no set is held: most tables, always).
    fn held_set(&self) -> impl Fn(Token) -> Box<[Arc<str>]> + '_ {
        |token| {
            if self.sets.is_empty() {
                return Box::default();
            }
            self.names_of(self.sets.get(&token).map(|s| &s[..]))
        }
    }

    /// STATUS of every held name, in no particular order.
    pub fn status_all(&mut self, now: Instant) -> Vec<LockStatus> {
        self.expire(now);
        self.slab
            .iter()
            .filter_map(|entry| status_of(self.clock, now, entry, self.held_set()))
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
            let Some((at, timer)) = self.timers.pop_first() else {
                break;
            };
            match timer {
                Timer::Wait(waiter) => {
                    if let Some((_, slots)) = self.remove_waiter(waiter) {
                        self.effects.push(Effect::WaitEnded {
                            waiter,
                            why: WaitEnd::TimedOut,
                        });
                        self.hand_over(now, slots);
                    }
                }
                Timer::Lease(token, slot) => {
                    let ended = self.slab.get(slot).and_then(|e| e.holder(token));
                    if ended.is_some_and(|h| h.delay_ms > 0 && !h.delaying) {
                        self.delay_end(now, at, slot, token, false);
                        continue;
                    }
                    if let Some(holder) = ended {
                        let kind = match holder.bond {
                            Bond::Orphan { cut: true } => EventKind::Dropped,
                            _ => EventKind::Expired,
                        };
                        self.end_token(now, slot, token, kind, false);
                    }
                }
            }
        }
        self.forget_breaks(now_ticks);
    }

    /// The lease `token` of `slot` (and of its set's other names) reached its end at `at`
    /// (ticks) without a release: it keeps its place for its lock-delay more, over for its
    /// holder, and then ends as it would have (`expired`, or `dropped` for a session that
    /// ended: `dropped`). Journaled as a renewal to the delay's end, so a restart keeps the
    /// name held.
    fn delay_end(&mut self, now: Instant, at: u64, slot: u32, token: Token, dropped: bool) {
        let slots = match self.sets.get(&token) {
            Some(slots) => slots.to_vec(),
            None => vec![slot],
        };
        for slot in slots {
            let Some(entry) = self.slab.get_mut(slot) else {
                continue;
            };
            let name = Arc::clone(&entry.name);
            let Some(holder) = entry.holder_mut(token) else {
                continue;
            };
            let timer = Timer::Lease(token, slot);
            self.timers.remove(&(holder.deadline, timer));
            if let Some(conn) = holder.open_conn() {
                // Bound to no connection from now on: nobody takes it up again.
                self.bound.remove(conn, token);
                holder.bond = Bond::Orphan { cut: dropped };
                holder.conn = 0;
            }
            let delay = Duration::from_millis(u64::from(holder.delay_ms));
            holder.delaying = true;
            holder.deadline = at.saturating_add(nanos(delay));
            self.timers.insert((holder.deadline, timer));
            if self.journal {
                self.changes.push(Change::Renew {
                    name,
                    token,
                    ttl: Duration::from_nanos(holder.ttl),
                    deadline: self.clock.instant(holder.deadline).unwrap_or(now),
                });
            }
        }
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
        holder.bind(req.session(), req.conn);
        holder.delay_ms = millis(req.delay);
        holder
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        let slot = *self.index.get(name)?;
        self.slab.get(slot)
    }

    /// Puts a new entry for `name`, held by nobody yet, in a free slot (the caller places a
    /// holder or a waiter in it at once); `None` when all 2^32 slots are taken.
    fn add_entry(&mut self, name: Arc<str>) -> Option<u32> {
        let entry = Entry {
            name: Arc::clone(&name),
            holder: None,
            more: None,
        };
        let slot = self.slab.insert(entry)?;
        self.index.insert(name, slot);
        self.vacant += 1;
        Some(slot)
    }

    /// Places `holder` (its token set) on `slot` in `mode`: the entry's first holder if
    /// nobody holds it, else beside those holding. `None` if the slot is empty.
    fn place_holder(&mut self, slot: u32, holder: Holder, mode: Mode) -> Option<()> {
        let entry = self.slab.get_mut(slot)?;
        if entry.holder.is_none() {
            entry.holder = Some(holder);
            self.vacant -= 1;
            if mode != Mode::Exclusive {
                entry.more_mut().mode = mode;
            } else if let Some(more) = entry.more.as_mut() {
                more.mode = mode;
            }
        } else {
            entry.more_mut().others.push(holder);
        }
        Some(())
    }

    /// Takes the entry out of `slot` and frees the slot.
    fn remove_entry(&mut self, slot: u32) -> Option<Entry> {
        let entry = self.slab.remove(slot)?;
        if entry.is_vacant() {
            self.vacant -= 1;
        }
        self.index.remove(&entry.name);
        if self.index.is_empty() {
            self.on_empty();
        }
        self.sweep_ids_if_due();
        Some(entry)
    }

    /// Nothing is held or waited for (so no timer points into the slab): start the slab
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

    /// Gives `holder` the next token and starts its lease on `slot` (see
    /// [`Locks::start_lease_as`]); returns the token.
    fn start_lease(
        &mut self,
        slot: u32,
        holder: Holder,
        mode: Mode,
        deadline: Instant,
        waited: Option<Duration>,
    ) -> Token {
        let token = self.next_token;
        self.next_token += 1;
        self.start_lease_as(slot, holder, mode, deadline, waited, token);
        token
    }

    /// Places `holder` on `slot` with `token` (a set's names share one) and starts its lease:
    /// timer, journal, Acquired event, which says how long it `waited` in the queue.
    fn start_lease_as(
        &mut self,
        slot: u32,
        mut holder: Holder,
        mode: Mode,
        deadline: Instant,
        waited: Option<Duration>,
        token: Token,
    ) {
        holder.token = token;
        if self.place_holder(slot, holder, mode).is_none() {
            return;
        }
        let Some(entry) = self.slab.get(slot) else {
            return;
        };
        let name = Arc::clone(&entry.name);
        let Some(holder) = entry.holder(token) else {
            return;
        };
        self.leases += 1;
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
        self.end_token(now, slot, token, kind, true);
        Ok(())
    }

    /// Ends the lease `token` of `slot` with `kind`, and of every other name of its set:
    /// one event per name, and each name's queue moves on. `record`: journal the release
    /// (an expiry needs none).
    /// A set ends on all its names before any of them is handed over, so that watchers and
    /// the journal see it end as one.
    fn end_token(&mut self, now: Instant, slot: u32, token: Token, kind: EventKind, record: bool) {
        match self.sets.remove(&token) {
            Some(slots) => {
                for &each in slots.iter() {
                    self.end_one(now, each, token, kind, record);
                }
                self.hand_over(now, slots.iter().copied());
            }
            None => {
                self.end_one(now, slot, token, kind, record);
                self.hand_over(now, [slot]);
            }
        }
        self.sweep_ids_if_due();
    }

    /// Ends the lease `token` of `slot` alone, without handing the name over.
    fn end_one(&mut self, now: Instant, slot: u32, token: Token, kind: EventKind, record: bool) {
        let Some(entry) = self.slab.get(slot) else {
            return;
        };
        let Some(holder) = entry.holder(token) else {
            return;
        };
        self.timers
            .remove(&(holder.deadline, Timer::Lease(token, slot)));
        if record && self.journal {
            self.changes.push(Change::Release {
                name: Arc::clone(&entry.name),
                token,
            });
        }
        self.release(now, slot, token, kind);
    }

    /// Removes the holder `token` of `slot` (its timer is already gone); the caller hands
    /// the name over ([`Locks::hand_over`]: for an exclusive lock, one effect for one
    /// waiter, no scan).
    fn release(&mut self, now: Instant, slot: u32, token: Token, kind: EventKind) {
        let Some(entry) = self.slab.get_mut(slot) else {
            return;
        };
        if let Some(conn) = entry.holder(token).and_then(Holder::open_conn) {
            self.bound.remove(conn, token);
        }
        let old = if entry.holder.as_ref().is_some_and(|h| h.token == token) {
            let next = entry
                .more
                .as_mut()
                .and_then(|m| (!m.others.is_empty()).then(|| m.others.remove(0)));
            let old = std::mem::replace(&mut entry.holder, next);
            if entry.holder.is_none() {
                self.vacant += 1;
            }
            old
        } else {
            entry.more.as_mut().and_then(|more| {
                let i = more.others.iter().position(|h| h.token == token)?;
                Some(more.others.remove(i))
            })
        };
        let Some(old) = old else {
            return;
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
        holder.delay_ms = next.delay_ms;
        (deadline, holder)
    }

    /// Starts the lease of single-name waiter `next`, already out of the queue, as `holder`
    /// of `slot`, and tells it: the grant goes before the Acquired event, so a watcher never
    /// sees a holder whose client has not been told.
    fn grant_waiter(
        &mut self,
        now: Instant,
        slot: u32,
        next: Waiter,
        holder: Holder,
        deadline: Instant,
    ) {
        self.waiters.remove(&next.waiter);
        if let Some(at) = next.deadline {
            self.timers.remove(&(at, Timer::Wait(next.waiter)));
        }
        let waited = self.clock.held(now, next.queued);
        let token = self.start_lease(slot, holder, next.mode, deadline, Some(waited));
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

    /// Grants the waiting set `waiter` (ready on every one of its names, at `ticket` in each
    /// queue) one lease over all its `slots`: one token, one Granted effect (before the
    /// Acquired events, one per name).
    fn grant_set(&mut self, now: Instant, waiter: WaiterId, ticket: u64, slots: Box<[u32]>) {
        self.waiters.remove(&waiter);
        let token = self.next_token;
        self.next_token += 1;
        let mark = self.effects.len();
        let mut granted = None;
        for &slot in slots.iter() {
            let next = self
                .slab
                .get_mut(slot)
                .and_then(|e| e.more.as_mut())
                .and_then(|m| m.queue.remove(&ticket));
            let Some(next) = next else {
                continue;
            };
            let waited = self.clock.held(now, next.queued);
            let (deadline, holder) = self.waiter_holder(now, &next);
            self.start_lease_as(slot, holder, next.mode, deadline, Some(waited), token);
            if granted.is_none() {
                granted = Some((next.deadline, deadline));
            }
        }
        let Some((wait_deadline, deadline)) = granted else {
            return;
        };
        if let Some(at) = wait_deadline {
            self.timers.remove(&(at, Timer::Wait(waiter)));
        }
        let name = slots
            .first()
            .and_then(|&slot| self.slab.get(slot))
            .map(|e| Arc::clone(&e.name))
            .unwrap_or_else(|| Arc::from(""));
        self.effects.insert(
            mark,
            Effect::Granted {
                waiter,
                name,
                token,
                deadline,
            },
        );
        self.journal_set(token, &slots);
        self.sets.insert(token, slots);
    }

    /// Records that the leases `token` of `slots` (just granted) are one set.
    fn journal_set(&mut self, token: Token, slots: &[u32]) {
        if !self.journal {
            return;
        }
        let names = slots
            .iter()
            .filter_map(|&slot| self.slab.get(slot).map(|e| Arc::clone(&e.name)))
            .collect();
        self.changes.push(Change::Set { token, names });
    }

    /// Hands over every name of `slots` whose head or holders changed, and then every name
    /// a grant of a set touched in turn (a work list: only those names, never a scan).
    fn hand_over(&mut self, now: Instant, slots: impl IntoIterator<Item = u32>) {
        let mut work = Vec::new();
        for slot in slots {
            self.hand_over_one(now, slot, &mut work);
        }
        while let Some(slot) = work.pop() {
            self.hand_over_one(now, slot, &mut work);
        }
    }

    /// Grants, in queue order, every waiter at the head of `slot` that fits beside those
    /// holding: all the shared ones up to the next exclusive one, a semaphore's free slots; a
    /// set once [`rules::set_ready`] holds on all its names (its other names go to `work`).
    /// For an exclusive lock it looks at the head and stops. An entry left with neither
    /// holder nor waiter goes.
    fn hand_over_one(&mut self, now: Instant, slot: u32, work: &mut Vec<u32>) {
        loop {
            let Some(entry) = self.slab.get_mut(slot) else {
                return;
            };
            if !entry.head_fits() {
                if entry.is_vacant() && entry.waiters() == 0 {
                    self.remove_entry(slot);
                } else {
                    entry.tidy();
                }
                return;
            }
            let Some((&ticket, head)) = entry.queue().and_then(|q| q.first_key_value()) else {
                return;
            };
            let waiter = head.waiter;
            if self.set_waiters.contains_key(&waiter) {
                if !self.set_is_ready(waiter, ticket) {
                    if let Some(entry) = self.slab.get_mut(slot) {
                        entry.tidy();
                    }
                    return;
                }
                let Some(slots) = self.set_waiters.remove(&waiter) else {
                    return;
                };
                work.extend(slots.iter().copied().filter(|&s| s != slot));
                self.grant_set(now, waiter, ticket, slots);
                continue;
            }
            let Some(next) = pop_first_waiter(entry) else {
                return;
            };
            let (deadline, holder) = self.waiter_holder(now, &next);
            self.grant_waiter(now, slot, next, holder, deadline);
        }
    }

    /// Whether the waiting set `waiter` (at `ticket` in each of its queues) is granted now,
    /// as [`rules::set_ready`] says over its names.
    fn set_is_ready(&self, waiter: WaiterId, ticket: u64) -> bool {
        let Some(slots) = self.set_waiters.get(&waiter) else {
            return false;
        };
        let mut views = Vec::with_capacity(slots.len());
        let mut keys = Vec::with_capacity(slots.len());
        let mut mode = Mode::Exclusive;
        for &slot in slots.iter() {
            let Some(entry) = self.slab.get(slot) else {
                return false;
            };
            let Some(w) = entry.queue().and_then(|q| q.get(&ticket)) else {
                return false;
            };
            mode = w.mode;
            keys.push((ticket, waiter, w.deadline));
            views.push(TableView(Some(entry), &self.sets, &self.set_waiters));
        }
        rules::set_ready(views.iter().zip(keys.iter()), mode)
    }

    /// Takes a waiter out of its queue (a set out of every one); returns it and the slots
    /// of its names. A waiter that left the head may have been what kept the ones behind it
    /// waiting: the caller hands those names over ([`Locks::hand_over`]) once it has said
    /// why this one left (which also drops an entry nobody holds or waits for any more).
    fn remove_waiter(&mut self, waiter: WaiterId) -> Option<(Waiter, Vec<u32>)> {
        let (slot, ticket) = self.waiters.remove(&waiter)?;
        let slots = match self.set_waiters.remove(&waiter) {
            Some(slots) => slots.into_vec(),
            None => vec![slot],
        };
        let mut first = None;
        for &each in &slots {
            let removed = self
                .slab
                .get_mut(each)
                .and_then(|e| e.more.as_mut())
                .and_then(|m| m.queue.remove(&ticket));
            if first.is_none() {
                first = removed;
            }
        }
        let w = first?;
        if let Some(at) = w.deadline {
            self.timers.remove(&(at, Timer::Wait(waiter)));
        }
        self.sweep_ids_if_due();
        Some((w, slots))
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

/// How far back a restored lease's grant may lie for its hold time to count from it (older
/// grants count as this old): the table's clock starts this long before a restart.
const RESTORED_HISTORY: Duration = Duration::from_secs(366 * 24 * 3600);

/// A lock-delay as the table keeps it: milliseconds, saturating.
fn millis(delay: Option<Duration>) -> u32 {
    delay.map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX))
}

/// The head of the queue.
fn pop_first_waiter(entry: &mut Entry) -> Option<Waiter> {
    let (_, first) = entry.more.as_mut()?.queue.pop_first()?;
    Some(first)
}

/// STATUS of `entry`: its first holder's; `None` while nobody holds it (only waiters).
fn status_of(
    clock: Clock,
    now: Instant,
    entry: &Entry,
    set: impl Fn(Token) -> Box<[Arc<str>]>,
) -> Option<LockStatus> {
    let holder = entry.holder.as_ref()?;
    Some(holder_status(clock, now, entry, holder, set))
}

/// One holder of `entry`, described as STATUS shows a lock; `set` names a set's names by
/// its token.
fn holder_status(
    clock: Clock,
    now: Instant,
    entry: &Entry,
    holder: &Holder,
    set: impl Fn(Token) -> Box<[Arc<str>]>,
) -> LockStatus {
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
        set: set(holder.token),
        lingering: holder.lingering(),
    }
}
