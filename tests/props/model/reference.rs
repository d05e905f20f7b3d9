//! The reference model: the lock table's rules written as plainly as possible, so that a
//! difference from `lockd::locks::Locks` points at one of the two and is easy to judge.
//!
//! Time is whole milliseconds after a fixed base instant. Nothing here is meant to be fast:
//! every step scans everything, which keeps each rule in one obvious place.
//!
//! A lease is one record whatever number of names it holds (a set, `and=`): one token, one
//! deadline, one session binding, one note. A name's holders are the leases that name it,
//! in grant order (token order: every grant takes a new, higher token). A waiter is one
//! record too, with one place in line (its ticket, in arrival order) that holds in the
//! queue of every one of its names; a name's queue is the waiters that name it, by ticket.
//! So every queue agrees on who came first, which is why nothing can deadlock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::locks::{
    ConnId, Effect, Event, EventKind, LockOutcome, LockStatus, Mode, Renewal, TableError, Token,
    UserId, WaitEnd, WaiterId, NO_USER,
};

/// Limits in milliseconds, mirroring `lockd::locks::Limits`.
#[derive(Clone, Copy, Debug)]
pub struct MLimits {
    pub default_ttl: u64,
    pub max_ttl: u64,
    pub max_locks: usize,
    pub max_waiters: usize,
}

/// One lease: of one name, or of a set of names at once.
#[derive(Clone, Debug)]
pub struct MHolder {
    pub id: String,
    pub token: Token,
    pub ttl: u64,
    pub deadline: u64,
    pub session: Option<MSession>,
    /// When it was granted.
    pub granted: u64,
    pub user: UserId,
    /// Its note: the LOCK's, or its retry's if that brought one.
    pub note: Option<String>,
    pub mode: Mode,
    /// Every name it holds, in the LOCK's order (the first is `LOCK <name>`'s).
    pub names: Vec<String>,
    /// A BREAK without `force` ended it for its holder: it keeps its place, unrenewable,
    /// until its holder's UNLOCK or its deadline, and then ends as any lease does.
    pub broken: bool,
    /// Its lock-delay (ms): when its deadline passes it keeps its place this long more.
    pub delay: u64,
    /// In its lock-delay: over for its holder, ending at `deadline`.
    pub delaying: bool,
}

impl MHolder {
    /// Over for its holder but still in its place (broken, or in its lock-delay).
    pub fn lingering(&self) -> bool {
        self.broken || self.delaying
    }
}

/// A session lease's binding.
#[derive(Clone, Copy, Debug)]
pub struct MSession {
    pub grace: u64,
    /// The open connection it is bound to; `None` once that closed (in its grace).
    pub conn: Option<ConnId>,
    /// The grace moved the deadline earlier: its end is `dropped`, not `expired`.
    pub cut: bool,
}

impl MSession {
    fn bound(grace: Option<u64>, conn: ConnId) -> Option<MSession> {
        grace.map(|grace| MSession {
            grace,
            conn: Some(conn),
            cut: false,
        })
    }
}

#[derive(Clone, Debug)]
pub struct MWaiter {
    pub waiter: WaiterId,
    /// Its place in line, in every one of its queues: lower is earlier.
    pub ticket: u64,
    pub id: String,
    pub ttl: u64,
    /// The session grace asked for; `None` for a plain lease.
    pub session: Option<u64>,
    pub conn: ConnId,
    pub deadline: Option<u64>,
    /// When it queued.
    pub queued: u64,
    pub mode: Mode,
    pub user: UserId,
    /// The note it will hold with.
    pub note: Option<String>,
    /// The names it waits for, in the LOCK's order.
    pub names: Vec<String>,
    /// The lock-delay of the lease it will hold.
    pub delay: u64,
}

/// Whether a holder in `mode` may join `holders` (in `held` mode): anyone a free name;
/// shared beside shared; a free slot of the same semaphore.
fn fits(holders: usize, held: Mode, mode: Mode) -> bool {
    if holders == 0 {
        return true;
    }
    match (held, mode) {
        (Mode::Shared, Mode::Shared) => true,
        (Mode::Limit(n), Mode::Limit(m)) => n == m && holders < n as usize,
        _ => false,
    }
}

/// Whether `a` and `b` may be on one name at once (holding or waiting).
fn same_kind(a: Mode, b: Mode) -> bool {
    match (a, b) {
        (Mode::Limit(x), Mode::Limit(y)) => x == y,
        (Mode::Limit(_), _) | (_, Mode::Limit(_)) => false,
        _ => true,
    }
}

/// One LOCK, with durations in milliseconds (`wait: None` waits without bound).
#[derive(Clone, Debug)]
pub struct MLock {
    pub name: String,
    pub id: String,
    pub ttl: Option<u64>,
    pub wait: Option<u64>,
    pub session: Option<u64>,
    pub conn: ConnId,
    pub mode: Mode,
    pub user: UserId,
    pub note: Option<String>,
    /// `supersede`: if it must wait, every waiter but its own id's older request is answered
    /// SUPERSEDED and it waits at the head.
    pub supersede: bool,
    /// `and=`: the set's further names (none twice, not `name`).
    pub and: Vec<String>,
    /// `delay=`: the lock-delay (0: none).
    pub delay: u64,
}

impl MLock {
    fn names(&self) -> Vec<String> {
        let mut all = vec![self.name.clone()];
        all.extend(self.and.iter().cloned());
        all
    }
}

/// Something due: which comes first at one instant is part of the contract (waits first).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Wait(WaiterId),
    Lease(Token),
}

/// What one name of a LOCK says, before the answer for the whole set.
enum Per {
    Again(Token),
    Grant,
    /// Waits; the same id's older waiter there, if any.
    Queue(Option<WaiterId>),
}

pub struct Model {
    pub base: Instant,
    pub limits: MLimits,
    /// Every live lease, by token (so in grant order).
    pub leases: BTreeMap<Token, MHolder>,
    /// Every waiter, in ticket order.
    pub waiters: Vec<MWaiter>,
    pub next_token: Token,
    pub next_waiter: WaiterId,
    pub next_ticket: u64,
    /// The ticket of the last LOCK queued: its place in line (it may be granted at once).
    pub last_ticket: u64,
    pub effects: Vec<Effect>,
    /// Waiters in the order the table granted them in the call being made: of several
    /// ready at once, which goes first is not part of the contract, so the model takes the
    /// table's choice when that waiter is ready here too (else the earliest in line).
    pub hint: Vec<WaiterId>,
}

impl Model {
    pub fn new(base: Instant, limits: MLimits, first_token: Token) -> Self {
        Model {
            base,
            limits,
            leases: BTreeMap::new(),
            waiters: Vec::new(),
            next_token: first_token.max(1),
            next_waiter: 1,
            next_ticket: 1,
            last_ticket: 0,
            effects: Vec::new(),
            hint: Vec::new(),
        }
    }

    pub fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The effects of the step so far, left for [`Model::take_effects`].
    #[cfg(feature = "etcd")]
    pub fn pending_effects(&self) -> &[Effect] {
        &self.effects
    }

    // ---- Views of one name ----

    /// The leases holding `name`, in grant order.
    pub fn holders_of(&self, name: &str) -> Vec<&MHolder> {
        self.leases
            .values()
            .filter(|h| h.names.iter().any(|n| n == name))
            .collect()
    }

    /// The waiters of `name`, first in line first.
    pub fn queue_of(&self, name: &str) -> Vec<&MWaiter> {
        self.waiters
            .iter()
            .filter(|w| w.names.iter().any(|n| n == name))
            .collect()
    }

    /// The name's mode: its holders', else (while only waited for) its first waiter's.
    fn mode_of(&self, name: &str) -> Option<Mode> {
        self.holders_of(name)
            .first()
            .map(|h| h.mode)
            .or_else(|| self.queue_of(name).first().map(|w| w.mode))
    }

    /// Every name held or waited for, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .leases
            .values()
            .flat_map(|h| h.names.iter().cloned())
            .chain(self.waiters.iter().flat_map(|w| w.names.iter().cloned()))
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Every name held, sorted.
    pub fn held_names(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .leases
            .values()
            .flat_map(|h| h.names.iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// How many leases are held, one per name of a set.
    fn lease_count(&self) -> usize {
        self.leases.values().map(|h| h.names.len()).sum()
    }

    /// The lease `token`, if it holds `name`.
    pub fn lease(&self, name: &str, token: Token) -> Option<&MHolder> {
        self.leases
            .get(&token)
            .filter(|h| h.names.iter().any(|n| n == name))
    }

    fn lease_mut(&mut self, name: &str, token: Token) -> Option<&mut MHolder> {
        self.leases
            .get_mut(&token)
            .filter(|h| h.names.iter().any(|n| n == name))
    }

    /// Whether waiter `w` is granted now: first in line in each of its queues, and fitting
    /// beside each name's holders.
    fn ready(&self, w: &MWaiter) -> bool {
        w.names.iter().all(|name| {
            let first = self.queue_of(name).first().map(|f| f.waiter) == Some(w.waiter);
            let holders = self.holders_of(name);
            let held = holders.first().map_or(w.mode, |h| h.mode);
            first && fits(holders.len(), held, w.mode)
        })
    }

    // ---- Time ----

    /// The soonest lease or wait deadline still pending (due or not), in ms.
    pub fn soonest(&self) -> Option<u64> {
        self.pending().into_iter().map(|(at, _)| at).min()
    }

    fn pending(&self) -> Vec<(u64, Due)> {
        let mut all = Vec::new();
        for h in self.leases.values() {
            all.push((h.deadline, Due::Lease(h.token)));
        }
        for w in &self.waiters {
            if let Some(at) = w.deadline {
                all.push((at, Due::Wait(w.waiter)));
            }
        }
        all
    }

    /// Handles everything due at or before `now`, one at a time, earliest first.
    pub fn process(&mut self, now: u64) {
        while let Some((at, due)) = self.pending().into_iter().min() {
            if at > now {
                break;
            }
            match due {
                Due::Wait(waiter) => {
                    self.remove_waiter(waiter).expect("a pending wait waits");
                    self.effects.push(Effect::WaitEnded {
                        waiter,
                        why: WaitEnd::TimedOut,
                    });
                    self.settle(now);
                }
                Due::Lease(token) => {
                    let h = &self.leases[&token];
                    if h.delay > 0 && !h.delaying {
                        self.delay_end(at, token, false);
                        continue;
                    }
                    let cut = self.leases[&token].session.is_some_and(|s| s.cut);
                    let kind = if cut {
                        EventKind::Dropped
                    } else {
                        EventKind::Expired
                    };
                    self.end(now, token, kind);
                }
            }
        }
    }

    /// Lease `token` reached its end at `at` without a release: it stays `delay` more, bound
    /// to no connection, then ends `dropped` (a session that ended: `dropped`) or `expired`.
    fn delay_end(&mut self, at: u64, token: Token, dropped: bool) {
        let Some(h) = self.leases.get_mut(&token) else {
            return;
        };
        h.delaying = true;
        h.deadline = at + h.delay;
        if let Some(s) = h.session.as_mut().filter(|s| s.conn.is_some()) {
            s.conn = None;
            s.cut = dropped;
        }
    }

    /// Takes a waiter out of every queue it is in.
    fn remove_waiter(&mut self, waiter: WaiterId) -> Option<MWaiter> {
        let i = self.waiters.iter().position(|w| w.waiter == waiter)?;
        Some(self.waiters.remove(i))
    }

    // ---- Effects ----

    /// An event with the holder's note (an acquired one shows it); times in milliseconds.
    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        kind: EventKind,
        name: &str,
        id: &str,
        token: Token,
        held: u64,
        waited: Option<u64>,
        note: Option<&str>,
    ) {
        self.effects.push(Effect::Event(Event {
            kind,
            name: Arc::from(name),
            id: Arc::from(id),
            token,
            held: Duration::from_millis(held),
            waited: waited.map(Duration::from_millis),
            origin: Default::default(),
            note: note.map(Arc::from),
            broken_by: Default::default(),
        }));
    }

    fn grant_token(&mut self) -> Token {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// A new lease on every name of `h` (whose token is set here): one event per name.
    fn start(&mut self, mut h: MHolder, waited: Option<u64>) -> Token {
        let token = self.grant_token();
        h.token = token;
        for name in h.names.clone() {
            self.event(
                EventKind::Acquired,
                &name,
                &h.id,
                token,
                0,
                waited,
                h.note.as_deref(),
            );
        }
        self.leases.insert(token, h);
        token
    }

    /// Grants every waiter that is ready, earliest in line first, until none is: one grant
    /// can make another ready (a reader behind a set, on the set's other names).
    fn settle(&mut self, now: u64) {
        loop {
            let hinted = self.hint.iter().enumerate().find_map(|(k, h)| {
                let i = self.waiters.iter().position(|w| w.waiter == *h)?;
                self.ready(&self.waiters[i]).then_some((k, i))
            });
            let i = match hinted {
                Some((k, i)) => {
                    self.hint.remove(k);
                    i
                }
                None => match self.waiters.iter().position(|w| self.ready(w)) {
                    Some(i) => i,
                    None => break,
                },
            };
            let w = self.waiters.remove(i);
            let deadline = now + w.ttl;
            // The waiter is told once, by its first name; watchers see every name.
            let at = self.at(deadline);
            let first = w.names[0].clone();
            let mark = self.effects.len();
            let token = self.start(
                MHolder {
                    id: w.id.clone(),
                    token: 0,
                    ttl: w.ttl,
                    deadline,
                    session: MSession::bound(w.session, w.conn),
                    granted: now,
                    user: w.user,
                    note: w.note.clone(),
                    mode: w.mode,
                    names: w.names.clone(),
                    broken: false,
                    delay: w.delay,
                    delaying: false,
                },
                Some(now - w.queued),
            );
            self.effects.insert(
                mark,
                Effect::Granted {
                    waiter: w.waiter,
                    name: Arc::from(first.as_str()),
                    token,
                    deadline: at,
                },
            );
        }
    }

    /// The lease `token` ends on every one of its names (one event each, in its order);
    /// then, and only then, whoever is ready is granted, leases starting `now`.
    fn end(&mut self, now: u64, token: Token, kind: EventKind) {
        let Some(old) = self.leases.get(&token).cloned() else {
            return;
        };
        for name in &old.names {
            self.event(kind, name, &old.id, token, now - old.granted, None, None);
        }
        self.leases.remove(&token);
        self.settle(now);
    }

    fn bad_ttl(&self) -> TableError {
        TableError::BadTtl {
            max: Duration::from_millis(self.limits.max_ttl),
        }
    }

    fn valid_ttl(&self, ttl: Option<u64>) -> Result<u64, TableError> {
        let ttl = ttl.unwrap_or(self.limits.default_ttl);
        if ttl == 0 || ttl > self.limits.max_ttl {
            return Err(self.bad_ttl());
        }
        Ok(ttl)
    }

    /// What a LOCK says of one of its names, or why the whole LOCK is refused.
    fn per_name(&self, name: &str, req: &MLock) -> Result<Per, TableError> {
        let holders = self.holders_of(name);
        let queue = self.queue_of(name);
        if let Some(held) = self.mode_of(name) {
            if !same_kind(held, req.mode) {
                return Err(TableError::WrongMode {
                    held,
                    asked: req.mode,
                });
            }
        }
        // The same id is the same client only within one user.
        if let Some(h) = holders
            .iter()
            .find(|h| !h.lingering() && h.id == req.id && h.user == req.user)
        {
            if h.mode != req.mode {
                return Err(TableError::WrongMode {
                    held: h.mode,
                    asked: req.mode,
                });
            }
            if let Some(c) = h.session.and_then(|s| s.conn) {
                if c != req.conn {
                    return Err(TableError::Conflict);
                }
            }
            return Ok(Per::Again(h.token));
        }
        let held = holders.first().map_or(req.mode, |h| h.mode);
        if queue.is_empty() && fits(holders.len(), held, req.mode) {
            if self.lease_count() >= self.limits.max_locks {
                return Err(self.too_many());
            }
            return Ok(Per::Grant);
        }
        if req.wait == Some(0) {
            let by = holders.first().map_or("(queue)", |h| h.id.as_str());
            return Err(TableError::WouldBlock {
                holder: Arc::from(by),
            });
        }
        let same = queue
            .iter()
            .find(|w| w.id == req.id && w.user == req.user)
            .map(|w| w.waiter);
        if !req.supersede && same.is_none() && queue.len() >= self.limits.max_waiters {
            return Err(TableError::TooManyWaiters {
                max: self.limits.max_waiters,
            });
        }
        Ok(Per::Queue(same))
    }

    fn too_many(&self) -> TableError {
        TableError::TooManyLocks {
            max: self.limits.max_locks,
        }
    }

    pub fn lock(&mut self, now: u64, req: MLock) -> Result<LockOutcome, TableError> {
        self.process(now);
        let ttl = self.valid_ttl(req.ttl)?;
        if req.session.is_some_and(|g| g > self.limits.max_ttl) {
            return Err(TableError::BadGrace {
                max: Duration::from_millis(self.limits.max_ttl),
            });
        }
        let names = req.names();
        // Every name first (the first refusal, in the request's order, refuses it all).
        let mut per = Vec::new();
        for name in &names {
            per.push(self.per_name(name, &req)?);
        }
        let again: Vec<Token> = per
            .iter()
            .filter_map(|p| match p {
                Per::Again(t) => Some(*t),
                _ => None,
            })
            .collect();
        if let Some(&token) = again.first() {
            // A retry: the same id holds exactly these names, as one lease. Holding some
            // of them, or them in several leases, or in a lease of more names: a conflict.
            let mut held = self.leases[&token].names.clone();
            held.sort();
            let mut asked = names.clone();
            asked.sort();
            if again.len() != names.len() || again.iter().any(|t| *t != token) || held != asked {
                return Err(TableError::Conflict);
            }
            let deadline = now + ttl;
            let h = self.leases.get_mut(&token).expect("held");
            h.ttl = ttl;
            h.deadline = deadline;
            h.session = MSession::bound(req.session, req.conn);
            h.delay = req.delay;
            // A retry with a note replaces the holder's; without one it keeps it.
            if req.note.is_some() {
                h.note = req.note.clone();
            }
            return Ok(LockOutcome::Granted {
                token,
                deadline: self.at(deadline),
            });
        }
        let queues = per.iter().any(|p| matches!(p, Per::Queue(_)));
        if !queues {
            if self.lease_count() + names.len() > self.limits.max_locks {
                return Err(self.too_many());
            }
            let deadline = now + ttl;
            let token = self.start(
                MHolder {
                    id: req.id.clone(),
                    token: 0,
                    ttl,
                    deadline,
                    session: MSession::bound(req.session, req.conn),
                    granted: now,
                    user: req.user,
                    note: req.note.clone(),
                    mode: req.mode,
                    names,
                    broken: false,
                    delay: req.delay,
                    delaying: false,
                },
                None,
            );
            return Ok(LockOutcome::Granted {
                token,
                deadline: self.at(deadline),
            });
        }
        // It waits. First a `supersede` (one name only) ends every other waiter there.
        if req.supersede {
            let gone: Vec<WaiterId> = self
                .queue_of(&req.name)
                .iter()
                .filter(|w| !(w.id == req.id && w.user == req.user))
                .map(|w| w.waiter)
                .collect();
            for waiter in gone {
                self.remove_waiter(waiter);
                self.effects.push(Effect::WaitEnded {
                    waiter,
                    why: WaitEnd::Superseded {
                        by: Arc::from(req.id.as_str()),
                    },
                });
            }
        }
        // The same id's older requests on any of these names leave every queue. A LOCK of
        // one name takes the place its older request had there, and so does a set whose one
        // older request was a set of the very same names; any other set goes to the back of
        // every queue (a place kept on one name would put it before others on another).
        let mut replaced: Vec<WaiterId> = Vec::new();
        for p in &per {
            if let Per::Queue(Some(w)) = p {
                if !replaced.contains(w) {
                    replaced.push(*w);
                }
            }
        }
        let mut ticket = None;
        let mut note = req.note.clone();
        let mut had_note = None;
        let mut same_set = false;
        for &w in &replaced {
            let old = self.remove_waiter(w).expect("a replaced waiter waits");
            ticket = Some(ticket.map_or(old.ticket, |t: u64| t.min(old.ticket)));
            had_note = had_note.or(old.note);
            let (mut was, mut asked) = (old.names.clone(), names.clone());
            was.sort();
            asked.sort();
            same_set = replaced.len() == 1 && was == asked;
            self.effects.push(Effect::WaitEnded {
                waiter: w,
                why: WaitEnd::Replaced,
            });
        }
        if note.is_none() {
            note = had_note;
        }
        let ticket = match ticket {
            Some(t) if names.len() == 1 || same_set => t,
            _ => {
                self.next_ticket += 1;
                self.next_ticket - 1
            }
        };
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        self.last_ticket = ticket;
        let new = MWaiter {
            waiter,
            ticket,
            id: req.id.clone(),
            ttl,
            session: req.session,
            conn: req.conn,
            deadline: req.wait.map(|w| now + w),
            queued: now,
            mode: req.mode,
            user: req.user,
            note,
            names,
            delay: req.delay,
        };
        let at = self
            .waiters
            .iter()
            .position(|w| w.ticket > ticket)
            .unwrap_or(self.waiters.len());
        self.waiters.insert(at, new);
        // A replacing request in another mode may fit where the one it replaced did not;
        // a superseded set's other names may let someone in.
        self.settle(now);
        Ok(LockOutcome::Queued { waiter })
    }

    /// Only the lease's own user may renew or release it; anyone may, a lease of no user.
    fn owner_check(h: &MHolder, user: UserId) -> Result<(), TableError> {
        if h.user != NO_USER && h.user != user {
            return Err(TableError::NotOwner);
        }
        Ok(())
    }

    pub fn unlock(
        &mut self,
        now: u64,
        name: &str,
        token: Token,
        user: UserId,
    ) -> Result<(), TableError> {
        self.process(now);
        let h = self.lease(name, token).ok_or(TableError::NotHeld)?;
        Self::owner_check(h, user)?;
        self.end(now, token, EventKind::Released);
        Ok(())
    }

    pub fn drop_session(&mut self, now: u64, name: &str, token: Token, conn: ConnId) {
        self.process(now);
        let Some(h) = self.lease_mut(name, token) else {
            return;
        };
        let Some(s) = h.session.as_mut() else {
            return;
        };
        if s.conn != Some(conn) {
            return;
        }
        if s.grace == 0 && h.delay > 0 {
            self.delay_end(now, token, true);
            return;
        }
        if s.grace == 0 {
            self.end(now, token, EventKind::Dropped);
            return;
        }
        s.conn = None;
        s.cut = now + s.grace < h.deadline;
        if s.cut {
            h.deadline = now + s.grace;
        }
    }

    /// BREAK: every lease holding `name` (or only `token`'s), in grant order, whoever's it
    /// is, ends for its holder (event `broken` on each of its names, once); with `force` it
    /// goes as a release does, else it stays in place until its holder's UNLOCK or its
    /// deadline.
    pub fn break_lock(
        &mut self,
        now: u64,
        name: &str,
        token: Option<Token>,
        force: bool,
    ) -> Result<Vec<Token>, TableError> {
        self.process(now);
        let ended: Vec<Token> = self
            .holders_of(name)
            .iter()
            .map(|h| h.token)
            .filter(|t| token.is_none_or(|only| only == *t))
            .collect();
        if ended.is_empty() {
            return Err(TableError::NotHeld);
        }
        for &t in &ended {
            let h = &self.leases[&t];
            if !h.broken && !force {
                let (names, id, held) = (h.names.clone(), h.id.clone(), now - h.granted);
                for n in &names {
                    self.event(EventKind::Breaking, n, &id, t, held, None, None);
                }
            }
            if let Some(h) = self.leases.get_mut(&t) {
                h.broken = true;
            }
            if force {
                self.end(now, t, EventKind::Broken);
            }
        }
        Ok(ended)
    }

    pub fn revoke(&mut self, now: u64, name: &str, token: Token) -> Result<(), TableError> {
        self.process(now);
        self.lease(name, token).ok_or(TableError::NotHeld)?;
        self.end(now, token, EventKind::Revoked);
        Ok(())
    }

    pub fn renew(
        &mut self,
        now: u64,
        name: &str,
        token: Token,
        ttl: Option<u64>,
        conn: ConnId,
        user: UserId,
    ) -> Result<Renewal, TableError> {
        self.process(now);
        if ttl.is_some() {
            self.valid_ttl(ttl)?;
        }
        let base = self.base;
        let h = self.lease_mut(name, token).filter(|h| !h.lingering());
        let h = h.ok_or(TableError::NotHeld)?;
        Self::owner_check(h, user)?;
        let ttl = ttl.unwrap_or(h.ttl);
        h.ttl = ttl;
        h.deadline = now + ttl;
        let mut bound = false;
        if let Some(s) = h.session.as_mut().filter(|s| s.conn.is_none()) {
            s.conn = Some(conn);
            s.cut = false;
            bound = true;
        }
        Ok(Renewal {
            deadline: base + Duration::from_millis(now + ttl),
            bound,
        })
    }

    pub fn check(&mut self, now: u64, name: &str, token: Token) -> Result<Instant, TableError> {
        self.process(now);
        let lease = self.lease(name, token).filter(|h| !h.lingering());
        let deadline = lease.ok_or(TableError::NotHeld)?.deadline;
        Ok(self.at(deadline))
    }

    pub fn cancel_wait(&mut self, now: u64, waiter: WaiterId) -> bool {
        self.process(now);
        match self.remove_waiter(waiter) {
            Some(_) => {
                self.settle(now);
                true
            }
            None => false,
        }
    }

    /// STATUS of one name: `None` unless it is held.
    pub fn status(&mut self, now: u64, name: &str) -> Option<LockStatus> {
        self.process(now);
        let first = *self.holders_of(name).first()?;
        Some(self.status_of(now, name, first))
    }

    /// Every holder of `name`, in grant order.
    pub fn holders(&mut self, now: u64, name: &str) -> Vec<LockStatus> {
        self.process(now);
        self.holders_of(name)
            .into_iter()
            .map(|h| self.status_of(now, name, h))
            .collect()
    }

    /// Every held name, sorted by name.
    pub fn status_all(&mut self, now: u64) -> Vec<LockStatus> {
        self.process(now);
        self.held_names()
            .iter()
            .map(|name| self.status_of(now, name, self.holders_of(name)[0]))
            .collect()
    }

    fn status_of(&self, now: u64, name: &str, h: &MHolder) -> LockStatus {
        LockStatus {
            name: Arc::from(name),
            holder: Arc::from(h.id.as_str()),
            token: h.token,
            left: Duration::from_millis(h.deadline.saturating_sub(now)),
            held: Duration::from_millis(now - h.granted),
            session: h.session.is_some(),
            waiters: self.queue_of(name).len(),
            holders: self.holders_of(name).len(),
            mode: h.mode,
            origin: Default::default(),
            granted_unix_ms: 0,
            lingering: h.lingering(),
            note: h.note.as_deref().map(Arc::from),
            set: if h.names.len() > 1 {
                h.names.iter().map(|n| Arc::from(n.as_str())).collect()
            } else {
                Box::default()
            },
        }
    }
}
