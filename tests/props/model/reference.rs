//! The reference model: the lock table's rules written as plainly as possible, so that a
//! difference from `lockd::locks::Locks` points at one of the two and is easy to judge.
//!
//! Time is whole milliseconds after a fixed base instant. Nothing here is meant to be fast:
//! every step scans everything, which keeps each rule in one obvious place.

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
}

#[derive(Clone, Debug)]
pub struct MEntry {
    /// In the order they were granted; never empty.
    pub holders: Vec<MHolder>,
    /// The mode every holder holds it in.
    pub mode: Mode,
    /// First in, first out: index 0 is the next to be granted.
    pub queue: Vec<MWaiter>,
}

/// Whether a holder in `mode` may join `entry`'s holders.
fn fits(entry: &MEntry, mode: Mode) -> bool {
    match (entry.mode, mode) {
        (Mode::Shared, Mode::Shared) => true,
        (Mode::Limit(n), Mode::Limit(m)) => n == m && entry.holders.len() < n as usize,
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
}

/// Something due: which comes first at one instant is part of the contract (waits first).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Wait(WaiterId),
    Lease(Token),
}

pub struct Model {
    pub base: Instant,
    pub limits: MLimits,
    pub entries: BTreeMap<String, MEntry>,
    pub next_token: Token,
    pub next_waiter: WaiterId,
    pub effects: Vec<Effect>,
}

impl Model {
    pub fn new(base: Instant, limits: MLimits, first_token: Token) -> Self {
        Model {
            base,
            limits,
            entries: BTreeMap::new(),
            next_token: first_token.max(1),
            next_waiter: 1,
            effects: Vec::new(),
        }
    }

    pub fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The soonest lease or wait deadline still pending (due or not), in ms.
    pub fn soonest(&self) -> Option<u64> {
        self.pending().into_iter().map(|(at, _)| at).min()
    }

    fn pending(&self) -> Vec<(u64, Due)> {
        let mut all = Vec::new();
        for e in self.entries.values() {
            for h in &e.holders {
                all.push((h.deadline, Due::Lease(h.token)));
            }
            for w in &e.queue {
                if let Some(at) = w.deadline {
                    all.push((at, Due::Wait(w.waiter)));
                }
            }
        }
        all
    }

    fn leases(&self) -> usize {
        self.entries.values().map(|e| e.holders.len()).sum()
    }

    /// Handles everything due at or before `now`, one at a time, earliest first.
    pub fn process(&mut self, now: u64) {
        while let Some((at, due)) = self.pending().into_iter().min() {
            if at > now {
                break;
            }
            match due {
                Due::Wait(waiter) => {
                    let name = self.remove_waiter(waiter).expect("a pending wait waits");
                    self.effects.push(Effect::WaitEnded {
                        waiter,
                        why: WaitEnd::TimedOut,
                    });
                    self.grant_fitting(now, &name);
                }
                Due::Lease(token) => {
                    let (name, cut) = self
                        .entries
                        .iter()
                        .find_map(|(n, e)| {
                            let h = e.holders.iter().find(|h| h.token == token)?;
                            Some((n.clone(), h.session.is_some_and(|s| s.cut)))
                        })
                        .expect("a pending lease has an entry");
                    let kind = if cut {
                        EventKind::Dropped
                    } else {
                        EventKind::Expired
                    };
                    self.release(now, &name, token, kind);
                }
            }
        }
    }

    /// Takes a waiter out of its queue; the name it waited for.
    fn remove_waiter(&mut self, waiter: WaiterId) -> Option<String> {
        for (name, e) in self.entries.iter_mut() {
            if let Some(i) = e.queue.iter().position(|w| w.waiter == waiter) {
                e.queue.remove(i);
                return Some(name.clone());
            }
        }
        None
    }

    /// An event; `held` and `waited` in milliseconds.
    fn event(
        &mut self,
        kind: EventKind,
        name: &str,
        id: &str,
        token: Token,
        held: u64,
        waited: Option<u64>,
    ) {
        self.noted_event(kind, name, id, token, held, waited, None);
    }

    /// An event with the holder's note (an acquired one shows it).
    #[allow(clippy::too_many_arguments)]
    fn noted_event(
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

    /// The head of `name`'s queue becomes a holder, its lease starting `now`.
    fn grant_head(&mut self, now: u64, name: &str) {
        let entry = self.entries.get_mut(name).expect("a held name");
        let next = entry.queue.remove(0);
        let token = self.grant_token();
        let deadline = now + next.ttl;
        self.effects.push(Effect::Granted {
            waiter: next.waiter,
            name: Arc::from(name),
            token,
            deadline: self.at(deadline),
        });
        self.noted_event(
            EventKind::Acquired,
            name,
            &next.id,
            token,
            0,
            Some(now - next.queued),
            next.note.as_deref(),
        );
        let entry = self.entries.get_mut(name).expect("a held name");
        if entry.holders.is_empty() {
            entry.mode = next.mode;
        }
        entry.holders.push(MHolder {
            id: next.id,
            token,
            ttl: next.ttl,
            deadline,
            granted: now,
            session: MSession::bound(next.session, next.conn),
            user: next.user,
            note: next.note,
        });
    }

    /// Grants, in order, every waiter at the head of the queue that fits.
    fn grant_fitting(&mut self, now: u64, name: &str) {
        while let Some(e) = self.entries.get(name) {
            match e.queue.first() {
                Some(head) if e.holders.is_empty() || fits(e, head.mode) => {
                    self.grant_head(now, name)
                }
                _ => break,
            }
        }
    }

    /// The holder `token` goes; waiters that now fit are granted, leases starting `now`.
    fn release(&mut self, now: u64, name: &str, token: Token, kind: EventKind) {
        let entry = self.entries.get_mut(name).expect("release of a held name");
        let i = entry
            .holders
            .iter()
            .position(|h| h.token == token)
            .expect("release of a holder");
        let old = entry.holders.remove(i);
        self.event(kind, name, &old.id, old.token, now - old.granted, None);
        let entry = self.entries.get(name).expect("still there");
        if entry.holders.is_empty() && entry.queue.is_empty() {
            self.entries.remove(name);
            return;
        }
        self.grant_fitting(now, name);
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

    pub fn lock(&mut self, now: u64, req: MLock) -> Result<LockOutcome, TableError> {
        self.process(now);
        let ttl = self.valid_ttl(req.ttl)?;
        if req.session.is_some_and(|g| g > self.limits.max_ttl) {
            return Err(TableError::BadGrace {
                max: Duration::from_millis(self.limits.max_ttl),
            });
        }
        let deadline = now + ttl;
        let too_many = TableError::TooManyLocks {
            max: self.limits.max_locks,
        };
        let holder = MHolder {
            id: req.id.clone(),
            token: 0,
            ttl,
            deadline,
            session: MSession::bound(req.session, req.conn),
            granted: now,
            user: req.user,
            note: req.note.clone(),
        };
        let Some(entry) = self.entries.get(&req.name) else {
            if self.leases() >= self.limits.max_locks {
                return Err(too_many);
            }
            let token = self.grant_token();
            let note = req.note.as_deref();
            self.noted_event(
                EventKind::Acquired,
                &req.name,
                &req.id,
                token,
                0,
                None,
                note,
            );
            self.entries.insert(
                req.name.clone(),
                MEntry {
                    holders: vec![MHolder { token, ..holder }],
                    mode: req.mode,
                    queue: Vec::new(),
                },
            );
            return Ok(LockOutcome::Granted {
                token,
                deadline: self.at(deadline),
            });
        };
        let held = entry.mode;
        if !same_kind(held, req.mode) {
            return Err(TableError::WrongMode {
                held,
                asked: req.mode,
            });
        }
        // The same id is the same client only within one user.
        if let Some(i) = entry
            .holders
            .iter()
            .position(|h| h.id == req.id && h.user == req.user)
        {
            if held != req.mode {
                return Err(TableError::WrongMode {
                    held,
                    asked: req.mode,
                });
            }
            if let Some(c) = entry.holders[i].session.and_then(|s| s.conn) {
                if c != req.conn {
                    return Err(TableError::Conflict);
                }
            }
            let at_deadline = self.at(deadline);
            let h = &mut self.entries.get_mut(&req.name).expect("held").holders[i];
            h.ttl = ttl;
            h.deadline = deadline;
            h.session = MSession::bound(req.session, req.conn);
            // A retry with a note replaces the holder's; without one it keeps it.
            if req.note.is_some() {
                h.note = req.note.clone();
            }
            return Ok(LockOutcome::Granted {
                token: h.token,
                deadline: at_deadline,
            });
        }
        if entry.queue.is_empty() && fits(entry, req.mode) {
            if self.leases() >= self.limits.max_locks {
                return Err(too_many);
            }
            let token = self.grant_token();
            let note = req.note.as_deref();
            self.noted_event(
                EventKind::Acquired,
                &req.name,
                &req.id,
                token,
                0,
                None,
                note,
            );
            let entry = self.entries.get_mut(&req.name).expect("held");
            entry.holders.push(MHolder { token, ..holder });
            return Ok(LockOutcome::Granted {
                token,
                deadline: self.at(deadline),
            });
        }
        if req.wait == Some(0) {
            return Err(TableError::WouldBlock {
                holder: Arc::from(entry.holders[0].id.as_str()),
            });
        }
        let replaces = entry
            .queue
            .iter()
            .any(|w| w.id == req.id && w.user == req.user);
        if req.supersede {
            let entry = self.entries.get_mut(&req.name).expect("held");
            let mut kept = Vec::new();
            for w in std::mem::take(&mut entry.queue) {
                if w.id == req.id && w.user == req.user {
                    kept.push(w);
                } else {
                    self.effects.push(Effect::WaitEnded {
                        waiter: w.waiter,
                        why: WaitEnd::Superseded {
                            by: Arc::from(req.id.as_str()),
                        },
                    });
                }
            }
            entry.queue = kept;
        }
        let entry = self.entries.get(&req.name).expect("held");
        if !req.supersede && !replaces && entry.queue.len() >= self.limits.max_waiters {
            return Err(TableError::TooManyWaiters {
                max: self.limits.max_waiters,
            });
        }
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        let new = MWaiter {
            waiter,
            id: req.id.clone(),
            ttl,
            session: req.session,
            conn: req.conn,
            deadline: req.wait.map(|w| now + w),
            queued: now,
            mode: req.mode,
            user: req.user,
            note: req.note.clone(),
        };
        let entry = self.entries.get_mut(&req.name).expect("held");
        match entry
            .queue
            .iter()
            .position(|w| w.id == req.id && w.user == req.user)
        {
            Some(i) => {
                let mut new = new;
                // The place's note stays unless the new LOCK brings one.
                if new.note.is_none() {
                    new.note = entry.queue[i].note.clone();
                }
                let old = std::mem::replace(&mut entry.queue[i], new);
                self.effects.push(Effect::WaitEnded {
                    waiter: old.waiter,
                    why: WaitEnd::Replaced,
                });
            }
            None => entry.queue.push(new),
        }
        self.grant_fitting(now, &req.name);
        Ok(LockOutcome::Queued { waiter })
    }

    fn holder_mut(&mut self, name: &str, token: Token) -> Option<&mut MHolder> {
        self.entries
            .get_mut(name)?
            .holders
            .iter_mut()
            .find(|h| h.token == token)
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
        let h = self.holder_mut(name, token).ok_or(TableError::NotHeld)?;
        Self::owner_check(h, user)?;
        self.release(now, name, token, EventKind::Released);
        Ok(())
    }

    pub fn drop_session(&mut self, now: u64, name: &str, token: Token, conn: ConnId) {
        self.process(now);
        let Some(h) = self.holder_mut(name, token) else {
            return;
        };
        let Some(s) = h.session.as_mut() else {
            return;
        };
        if s.conn != Some(conn) {
            return;
        }
        if s.grace == 0 {
            self.release(now, name, token, EventKind::Dropped);
            return;
        }
        s.conn = None;
        s.cut = now + s.grace < h.deadline;
        if s.cut {
            h.deadline = now + s.grace;
        }
    }

    /// BREAK: every holder of `name` (or only `token`'s) goes, in grant order, each as a
    /// release does (event `broken`); nobody's lease is safe from it, whoever's it is.
    pub fn break_lock(
        &mut self,
        now: u64,
        name: &str,
        token: Option<Token>,
    ) -> Result<Vec<Token>, TableError> {
        self.process(now);
        let ended: Vec<Token> = self
            .entries
            .get(name)
            .map(|e| e.holders.iter().map(|h| h.token).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| token.is_none_or(|only| only == *t))
            .collect();
        if ended.is_empty() {
            return Err(TableError::NotHeld);
        }
        for &t in &ended {
            self.release(now, name, t, EventKind::Broken);
        }
        Ok(ended)
    }

    pub fn revoke(&mut self, now: u64, name: &str, token: Token) -> Result<(), TableError> {
        self.process(now);
        self.holder_mut(name, token).ok_or(TableError::NotHeld)?;
        self.release(now, name, token, EventKind::Revoked);
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
        let h = self.holder_mut(name, token).ok_or(TableError::NotHeld)?;
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
        let deadline = self
            .holder_mut(name, token)
            .ok_or(TableError::NotHeld)?
            .deadline;
        Ok(self.at(deadline))
    }

    pub fn cancel_wait(&mut self, now: u64, waiter: WaiterId) -> bool {
        self.process(now);
        match self.remove_waiter(waiter) {
            Some(name) => {
                self.grant_fitting(now, &name);
                true
            }
            None => false,
        }
    }

    pub fn status(&mut self, now: u64, name: &str) -> Option<LockStatus> {
        self.process(now);
        let e = self.entries.get(name)?;
        Some(status_of(now, name, e, &e.holders[0]))
    }

    /// Every holder of `name`, in grant order.
    pub fn holders(&mut self, now: u64, name: &str) -> Vec<LockStatus> {
        self.process(now);
        self.entries.get(name).map_or(Vec::new(), |e| {
            e.holders
                .iter()
                .map(|h| status_of(now, name, e, h))
                .collect()
        })
    }

    /// Sorted by name (a `BTreeMap` already is).
    pub fn status_all(&mut self, now: u64) -> Vec<LockStatus> {
        self.process(now);
        self.entries
            .iter()
            .map(|(name, e)| status_of(now, name, e, &e.holders[0]))
            .collect()
    }
}

fn status_of(now: u64, name: &str, e: &MEntry, h: &MHolder) -> LockStatus {
    LockStatus {
        name: Arc::from(name),
        holder: Arc::from(h.id.as_str()),
        token: h.token,
        left: Duration::from_millis(h.deadline.saturating_sub(now)),
        held: Duration::from_millis(now - h.granted),
        session: h.session.is_some(),
        waiters: e.queue.len(),
        holders: e.holders.len(),
        mode: e.mode,
        origin: Default::default(),
        granted_unix_ms: 0,
        note: h.note.as_deref().map(Arc::from),
    }
}
