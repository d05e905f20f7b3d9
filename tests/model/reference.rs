//! The reference model: the lock table's rules written as plainly as possible, so that a
//! difference from `lockd::locks::Locks` points at one of the two and is easy to judge.
//!
//! Time is whole milliseconds after a fixed base instant. Nothing here is meant to be fast:
//! every step scans everything, which keeps each rule in one obvious place.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::locks::{
    ConnId, Effect, Event, EventKind, LockOutcome, LockStatus, Renewal, TableError, Token, WaitEnd,
    WaiterId,
};

/// Limits in milliseconds, mirroring `lockd::locks::Limits`.
#[derive(Clone, Copy, Debug)]
pub struct MLimits {
    pub default_ttl: u64,
    pub max_ttl: u64,
    pub max_locks: usize,
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
}

#[derive(Clone, Debug)]
pub struct MEntry {
    pub holder: MHolder,
    /// First in, first out: index 0 is the next to be granted.
    pub queue: Vec<MWaiter>,
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
            all.push((e.holder.deadline, Due::Lease(e.holder.token)));
            for w in &e.queue {
                if let Some(at) = w.deadline {
                    all.push((at, Due::Wait(w.waiter)));
                }
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
                    self.remove_waiter(waiter);
                    self.effects.push(Effect::WaitEnded {
                        waiter,
                        why: WaitEnd::TimedOut,
                    });
                }
                Due::Lease(token) => {
                    let (name, cut) = self
                        .entries
                        .iter()
                        .find(|(_, e)| e.holder.token == token)
                        .map(|(n, e)| (n.clone(), e.holder.session.is_some_and(|s| s.cut)))
                        .expect("a pending lease has an entry");
                    let kind = if cut {
                        EventKind::Dropped
                    } else {
                        EventKind::Expired
                    };
                    self.release(now, &name, kind);
                }
            }
        }
    }

    fn remove_waiter(&mut self, waiter: WaiterId) -> bool {
        for e in self.entries.values_mut() {
            if let Some(i) = e.queue.iter().position(|w| w.waiter == waiter) {
                e.queue.remove(i);
                return true;
            }
        }
        false
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
        self.effects.push(Effect::Event(Event {
            kind,
            name: Arc::from(name),
            id: Arc::from(id),
            token,
            held: Duration::from_millis(held),
            waited: waited.map(Duration::from_millis),
        }));
    }

    fn grant_token(&mut self) -> Token {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// The holder goes; the head of the queue, if any, gets a lease starting `now`.
    fn release(&mut self, now: u64, name: &str, kind: EventKind) {
        let mut entry = self.entries.remove(name).expect("release of a held name");
        let held = now - entry.holder.granted;
        self.event(
            kind,
            name,
            &entry.holder.id.clone(),
            entry.holder.token,
            held,
            None,
        );
        if entry.queue.is_empty() {
            return;
        }
        let next = entry.queue.remove(0);
        let token = self.grant_token();
        let deadline = now + next.ttl;
        self.effects.push(Effect::Granted {
            waiter: next.waiter,
            name: Arc::from(name),
            token,
            deadline: self.at(deadline),
        });
        let waited = now - next.queued;
        self.event(EventKind::Acquired, name, &next.id, token, 0, Some(waited));
        entry.holder = MHolder {
            id: next.id,
            token,
            ttl: next.ttl,
            deadline,
            granted: now,
            session: MSession::bound(next.session, next.conn),
        };
        self.entries.insert(name.to_string(), entry);
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
        if !self.entries.contains_key(&req.name) {
            if self.entries.len() >= self.limits.max_locks {
                return Err(TableError::TooManyLocks {
                    max: self.limits.max_locks,
                });
            }
            let token = self.grant_token();
            self.event(EventKind::Acquired, &req.name, &req.id, token, 0, None);
            self.entries.insert(
                req.name.clone(),
                MEntry {
                    holder: MHolder {
                        id: req.id,
                        token,
                        ttl,
                        deadline,
                        session: MSession::bound(req.session, req.conn),
                        granted: now,
                    },
                    queue: Vec::new(),
                },
            );
            return Ok(LockOutcome::Granted {
                token,
                deadline: self.at(deadline),
            });
        }
        let at_deadline = self.at(deadline);
        let entry = self.entries.get_mut(&req.name).expect("checked above");
        if entry.holder.id == req.id {
            if let Some(c) = entry.holder.session.and_then(|s| s.conn) {
                if c != req.conn {
                    return Err(TableError::Conflict);
                }
            }
            entry.holder.ttl = ttl;
            entry.holder.deadline = deadline;
            entry.holder.session = MSession::bound(req.session, req.conn);
            return Ok(LockOutcome::Granted {
                token: entry.holder.token,
                deadline: at_deadline,
            });
        }
        if req.wait == Some(0) {
            return Err(TableError::WouldBlock {
                holder: Arc::from(entry.holder.id.as_str()),
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
        };
        let entry = self.entries.get_mut(&req.name).expect("checked above");
        match entry.queue.iter().position(|w| w.id == req.id) {
            Some(i) => {
                let old = std::mem::replace(&mut entry.queue[i], new);
                self.effects.push(Effect::WaitEnded {
                    waiter: old.waiter,
                    why: WaitEnd::Replaced,
                });
            }
            None => entry.queue.push(new),
        }
        Ok(LockOutcome::Queued { waiter })
    }

    pub fn unlock(&mut self, now: u64, name: &str, token: Token) -> Result<(), TableError> {
        self.process(now);
        match self.entries.get(name) {
            Some(e) if e.holder.token == token => {
                self.release(now, name, EventKind::Released);
                Ok(())
            }
            _ => Err(TableError::NotHeld),
        }
    }

    pub fn drop_session(&mut self, now: u64, name: &str, token: Token, conn: ConnId) {
        self.process(now);
        let Some(e) = self.entries.get_mut(name) else {
            return;
        };
        let Some(s) = e.holder.session.as_mut() else {
            return;
        };
        if e.holder.token != token || s.conn != Some(conn) {
            return;
        }
        if s.grace == 0 {
            self.release(now, name, EventKind::Dropped);
            return;
        }
        s.conn = None;
        s.cut = now + s.grace < e.holder.deadline;
        if s.cut {
            e.holder.deadline = now + s.grace;
        }
    }

    pub fn revoke(&mut self, now: u64, name: &str, token: Token) -> Result<(), TableError> {
        self.process(now);
        match self.entries.get(name) {
            Some(e) if e.holder.token == token => {
                self.release(now, name, EventKind::Revoked);
                Ok(())
            }
            _ => Err(TableError::NotHeld),
        }
    }

    pub fn renew(
        &mut self,
        now: u64,
        name: &str,
        token: Token,
        ttl: Option<u64>,
        conn: ConnId,
    ) -> Result<Renewal, TableError> {
        self.process(now);
        if ttl.is_some() {
            self.valid_ttl(ttl)?;
        }
        let base = self.base;
        match self.entries.get_mut(name) {
            Some(e) if e.holder.token == token => {
                let ttl = ttl.unwrap_or(e.holder.ttl);
                e.holder.ttl = ttl;
                e.holder.deadline = now + ttl;
                let mut bound = false;
                if let Some(s) = e.holder.session.as_mut().filter(|s| s.conn.is_none()) {
                    s.conn = Some(conn);
                    s.cut = false;
                    bound = true;
                }
                Ok(Renewal {
                    deadline: base + Duration::from_millis(now + ttl),
                    bound,
                })
            }
            _ => Err(TableError::NotHeld),
        }
    }

    pub fn check(&mut self, now: u64, name: &str, token: Token) -> Result<Instant, TableError> {
        self.process(now);
        match self.entries.get(name) {
            Some(e) if e.holder.token == token => Ok(self.at(e.holder.deadline)),
            _ => Err(TableError::NotHeld),
        }
    }

    pub fn cancel_wait(&mut self, now: u64, waiter: WaiterId) -> bool {
        self.process(now);
        self.remove_waiter(waiter)
    }

    pub fn status(&mut self, now: u64, name: &str) -> Option<LockStatus> {
        self.process(now);
        let e = self.entries.get(name)?;
        Some(status_of(now, name, e))
    }

    /// Sorted by name (a `BTreeMap` already is).
    pub fn status_all(&mut self, now: u64) -> Vec<LockStatus> {
        self.process(now);
        self.entries
            .iter()
            .map(|(name, e)| status_of(now, name, e))
            .collect()
    }
}

fn status_of(now: u64, name: &str, e: &MEntry) -> LockStatus {
    LockStatus {
        name: Arc::from(name),
        holder: Arc::from(e.holder.id.as_str()),
        token: e.holder.token,
        remaining: Duration::from_millis(e.holder.deadline.saturating_sub(now)),
        held: Duration::from_millis(now - e.holder.granted),
        session: e.holder.session.is_some(),
        waiters: e.queue.len(),
    }
}
