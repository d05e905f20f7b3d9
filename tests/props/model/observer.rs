//! Invariants checked from what the table reports alone (return values and effects), without
//! the reference model: a second opinion, so that a bug shared by the table and the model
//! still breaks one of the documented guarantees here.
//!
//! A set of names (`and=`) is one lease and one waiter: granted on all its names at once
//! with one new token, ended on all of them by one call, and first in line on every one of
//! its names before it is granted (FIFO per name; nobody overtakes anybody).

use std::collections::{HashMap, HashSet};

use lockd::locks::{Effect, EventKind, LockOutcome, LockStatus, Mode, Token, WaitEnd, WaiterId};

/// A live waiter as seen from outside: its names (the LOCK's order), mode, place in line.
#[derive(Clone, Debug)]
struct Waiting {
    names: Vec<String>,
    mode: Mode,
    /// Lower is earlier, in every one of its queues. A new request's is after everyone's;
    /// one of a single name that replaced the same id's older request takes its place, and
    /// so does a set that replaced the same id's one older request of the same names.
    place: u64,
}

#[derive(Default)]
pub struct Observer {
    /// The highest token ever granted.
    last_token: Option<Token>,
    /// Holders per name in grant order, with the mode they hold it in, as the events tell it.
    holders: HashMap<String, Vec<(Token, Mode)>>,
    /// The names of every live lease, as its grant told them.
    leases: HashMap<Token, Vec<String>>,
    /// Live waiters.
    waiting: HashMap<WaiterId, Waiting>,
    next_place: u64,
    /// Waiters that left without a grant: never to be granted after.
    left: HashSet<WaiterId>,
    granted: HashSet<WaiterId>,
}

/// What one call into the table did, as seen from outside.
pub enum Call<'a> {
    Lock {
        /// The LOCK's name, then its `and=` names.
        names: &'a [&'a str],
        mode: Mode,
        outcome: Option<&'a LockOutcome>,
    },
    CancelWait {
        waiter: WaiterId,
        removed: bool,
    },
    Other,
}

impl Observer {
    /// The queue of `name`, first in line first.
    fn queue(&self, name: &str) -> Vec<(WaiterId, &Waiting)> {
        let mut q: Vec<(WaiterId, &Waiting)> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.names.iter().any(|n| n == name))
            .map(|(id, w)| (*id, w))
            .collect();
        q.sort_by_key(|(_, w)| w.place);
        q
    }

    /// Whether a holder in `mode` may join the holders of `name` now: nobody holds it, or
    /// shared beside shared, or a free slot of the same semaphore. Never an exclusive holder
    /// beside another, never more holders than a limit.
    fn fits(&self, name: &str, mode: Mode) -> bool {
        let holders = self.holders.get(name).map_or(&[][..], Vec::as_slice);
        holders.iter().all(|(_, m)| match (*m, mode) {
            (Mode::Shared, Mode::Shared) => true,
            (Mode::Limit(a), Mode::Limit(b)) => a == b && holders.len() < a as usize,
            _ => false,
        })
    }

    fn new_token(&mut self, token: Token) -> Result<(), String> {
        if let Some(last) = self.last_token {
            if token <= last {
                return Err(format!("token {token} granted after {last}"));
            }
        }
        self.last_token = Some(token);
        Ok(())
    }

    /// Nothing held, nobody waiting.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.holders.values().all(Vec::is_empty)
    }

    /// What is still held and waiting, for a failure's message.
    pub fn left_over(&self) -> String {
        format!("holders {:?}, waiting {:?}", self.holders, self.waiting)
    }

    /// One grant: `effects` (from `i`) must be an Acquired event for every one of `names`,
    /// with the same new token, each fitting beside that name's holders. Returns how many
    /// effects it took.
    fn acquire(
        &mut self,
        effects: &[Effect],
        i: usize,
        names: &[String],
        mode: Mode,
        token: Token,
    ) -> Result<usize, String> {
        let mut seen: Vec<String> = Vec::new();
        for k in 0..names.len() {
            match effects.get(i + k) {
                Some(Effect::Event(e)) if e.kind == EventKind::Acquired && e.token == token => {
                    let name = e.name.to_string();
                    if !names.contains(&name) || seen.contains(&name) {
                        return Err(format!(
                            "grant of {names:?} with token {token} acquired {name}"
                        ));
                    }
                    seen.push(name);
                }
                other => {
                    return Err(format!(
                        "grant of {names:?} with token {token}: {} of {} names acquired, then {other:?}",
                        k,
                        names.len()
                    ))
                }
            }
        }
        // All at once: each name fits before any of them is taken.
        for name in names {
            if !self.fits(name, mode) {
                return Err(format!(
                    "{name} acquired {mode} while held by {:?}",
                    self.holders.get(name)
                ));
            }
        }
        self.new_token(token)?;
        for name in names {
            self.holders
                .entry(name.clone())
                .or_default()
                .push((token, mode));
        }
        self.leases.insert(token, names.to_vec());
        Ok(names.len())
    }

    /// Checks one call's outcome and effects against everything seen before.
    pub fn observe(&mut self, call: Call<'_>, effects: &[Effect]) -> Result<(), String> {
        // A cancelled waiter leaves first: the grants its leaving allows come after. (It was
        // still waiting once the call had processed what was due, or it would not have been
        // removed: whatever that processing did concerned others.)
        if let Call::CancelWait {
            waiter,
            removed: true,
        } = call
        {
            if self.waiting.remove(&waiter).is_none() {
                return Err(format!(
                    "cancel_wait({waiter}) removed a waiter not waiting"
                ));
            }
            self.left.insert(waiter);
        }
        let lock_names: Vec<String> = match &call {
            Call::Lock { names, .. } => names.iter().map(|n| n.to_string()).collect(),
            _ => Vec::new(),
        };
        let queued = match &call {
            Call::Lock {
                outcome: Some(LockOutcome::Queued { waiter }),
                mode,
                ..
            } => Some((*waiter, *mode)),
            _ => None,
        };
        if let Some((waiter, _)) = queued {
            if self.waiting.contains_key(&waiter)
                || self.left.contains(&waiter)
                || self.granted.contains(&waiter)
            {
                return Err(format!("waiter number {waiter} used twice"));
            }
        }
        let mut lock_granted = false;
        // The places of the requests this LOCK replaced, and whether it is in line yet.
        let mut replaced: Vec<(u64, Vec<String>)> = Vec::new();
        let mut in_line = false;
        let mut i = 0;
        while i < effects.len() {
            match &effects[i] {
                Effect::Granted {
                    waiter,
                    name,
                    token,
                    ..
                } => {
                    if self.left.contains(waiter) {
                        return Err(format!("waiter {waiter} granted after it left"));
                    }
                    if !self.granted.insert(*waiter) {
                        return Err(format!("waiter {waiter} granted twice"));
                    }
                    // The LOCK of this call may be granted before its answer says it queued
                    // (it took the place of the head, and fits): it joins its queues now.
                    if let Some((new, mode)) = queued.filter(|(w, _)| w == waiter && !in_line) {
                        in_line = true;
                        self.join(new, &lock_names, mode, &replaced);
                    }
                    let Some(w) = self.waiting.get(waiter).cloned() else {
                        return Err(format!("waiter {waiter} granted but it was not waiting"));
                    };
                    if !w.names.iter().any(|n| **n == **name) {
                        return Err(format!(
                            "waiter {waiter} of {:?} granted as {name}",
                            w.names
                        ));
                    }
                    // FIFO per name: first in line in every one of its queues.
                    for n in &w.names {
                        let head = self.queue(n).first().map(|(id, _)| *id);
                        if head != Some(*waiter) {
                            return Err(format!(
                                "waiter {waiter} granted {:?} but the head of {n}'s queue is {head:?}",
                                w.names
                            ));
                        }
                    }
                    self.waiting.remove(waiter);
                    i += 1;
                    i += self.acquire(effects, i, &w.names, w.mode, *token)?;
                    continue;
                }
                Effect::WaitEnded { waiter, why } => {
                    let Some(w) = self.waiting.remove(waiter) else {
                        return Err(format!("wait of {waiter} ended but it was not waiting"));
                    };
                    self.left.insert(*waiter);
                    let on_lock = w.names.iter().any(|n| lock_names.contains(n));
                    match why {
                        // Only a LOCK of that name that then queues supersedes.
                        WaitEnd::Superseded { .. }
                            if !(queued.is_some()
                                && lock_names.len() == 1
                                && w.names.contains(&lock_names[0])) =>
                        {
                            return Err(format!("waiter {waiter} superseded outside a LOCK"));
                        }
                        WaitEnd::Replaced if !(queued.is_some() && on_lock) => {
                            return Err(format!("waiter {waiter} replaced outside a LOCK"));
                        }
                        WaitEnd::Replaced => replaced.push((w.place, w.names.clone())),
                        _ => {}
                    }
                }
                Effect::Event(e) => {
                    let name = e.name.to_string();
                    if e.kind == EventKind::Acquired {
                        // Not after a waiter's Granted: the LOCK being answered at once.
                        let Call::Lock {
                            mode,
                            outcome: Some(LockOutcome::Granted { token, .. }),
                            ..
                        } = &call
                        else {
                            return Err(format!("{name} acquired outside a LOCK or a grant"));
                        };
                        if *token != e.token || lock_granted {
                            return Err(format!(
                                "{name} acquired with {} in a LOCK answered {token}",
                                e.token
                            ));
                        }
                        lock_granted = true;
                        i += self.acquire(effects, i, &lock_names, *mode, *token)?;
                        continue;
                    }
                    if e.kind == EventKind::Breaking {
                        // Over for its holder, but it keeps its place until it ends.
                        i += 1;
                        continue;
                    }
                    let holders = self.holders.entry(name.clone()).or_default();
                    let Some(at) = holders.iter().position(|(t, _)| *t == e.token) else {
                        return Err(format!(
                            "{name} {:?} for token {} but holders are {holders:?}",
                            e.kind, e.token,
                        ));
                    };
                    holders.remove(at);
                }
            }
            i += 1;
        }
        match call {
            Call::Lock {
                outcome: Some(LockOutcome::Queued { waiter }),
                mode,
                ..
            } => {
                if !in_line && !self.granted.contains(waiter) {
                    self.join(*waiter, &lock_names, mode, &replaced);
                }
            }
            Call::Lock {
                outcome: Some(LockOutcome::Granted { token, .. }),
                ..
            } => {
                for name in &lock_names {
                    if !self
                        .holders
                        .get(name)
                        .is_some_and(|h| h.iter().any(|(t, _)| t == token))
                    {
                        return Err(format!(
                            "LOCK {lock_names:?} answered token {token}, not the holder of {name}"
                        ));
                    }
                }
                if self.leases.get(token) != Some(&lock_names) {
                    let mut held = self.leases.get(token).cloned().unwrap_or_default();
                    let mut asked = lock_names.clone();
                    held.sort();
                    asked.sort();
                    if held != asked {
                        return Err(format!(
                            "LOCK {lock_names:?} answered token {token}, the lease of {:?}",
                            self.leases.get(token)
                        ));
                    }
                }
            }
            Call::CancelWait {
                waiter,
                removed: false,
            } => {
                if let Some(live) = self.waiting.get(&waiter) {
                    return Err(format!(
                        "cancel_wait({waiter}) said it was not waiting, but it is: {live:?}"
                    ));
                }
            }
            Call::Lock { .. } | Call::CancelWait { .. } | Call::Other => {}
        }
        // One call ends a lease on all its names or on none.
        let mut ended = Vec::new();
        for (token, names) in &self.leases {
            let on: Vec<&String> = names
                .iter()
                .filter(|n| {
                    self.holders
                        .get(*n)
                        .is_some_and(|h| h.iter().any(|(t, _)| t == token))
                })
                .collect();
            if on.is_empty() {
                ended.push(*token);
            } else if on.len() != names.len() {
                return Err(format!(
                    "lease {token} of {names:?} ended on some names only: still holds {on:?}"
                ));
            }
        }
        for token in ended {
            self.leases.remove(&token);
        }
        // No missed grant, no stall: nobody waits who is first in line everywhere and fits.
        for (waiter, w) in &self.waiting {
            let ready = w.names.iter().all(|n| {
                self.queue(n).first().map(|(id, _)| id) == Some(waiter) && self.fits(n, w.mode)
            });
            if ready {
                return Err(format!(
                    "waiter {waiter} ({}, {:?}) waits though it is first in line and fits beside {:?}",
                    w.mode,
                    w.names,
                    w.names
                        .iter()
                        .map(|n| self.holders.get(n))
                        .collect::<Vec<_>>()
                ));
            }
        }
        Ok(())
    }

    /// A LOCK that queued joins the queue of each of its names in one step.
    /// It takes the place of what it replaced if it is one name, or if it replaced one
    /// request of the very same names (in any order).
    fn join(
        &mut self,
        waiter: WaiterId,
        names: &[String],
        mode: Mode,
        replaced: &[(u64, Vec<String>)],
    ) {
        let same_set = |was: &[String]| {
            let (mut was, mut asked) = (was.to_vec(), names.to_vec());
            was.sort();
            asked.sort();
            was == asked
        };
        let place = match replaced {
            [(p, was)] if same_set(was) => Some(*p),
            _ if names.len() == 1 => replaced.iter().map(|(p, _)| *p).min(),
            _ => None,
        };
        let place = match place {
            Some(p) => p,
            None => {
                self.next_place += 1;
                self.next_place
            }
        };
        self.waiting.insert(
            waiter,
            Waiting {
                names: names.to_vec(),
                mode,
                place,
            },
        );
    }

    /// STATUS must show exactly the holders and queue lengths seen so far.
    pub fn check_status(&self, all: &[LockStatus]) -> Result<(), String> {
        let mut names = HashSet::new();
        for s in all {
            if !names.insert(s.name.to_string()) {
                return Err(format!("{} listed twice", s.name));
            }
            let holders = self.holders.get(&*s.name).map_or(&[][..], Vec::as_slice);
            let first = holders.first().copied();
            if first != Some((s.token, s.mode)) || holders.len() != s.holders {
                return Err(format!("status {s:?} but holders {holders:?}"));
            }
            let waiting = self.queue(&s.name).len();
            if waiting != s.waiters {
                return Err(format!("status {s:?} but {waiting} waiting"));
            }
        }
        if names.len() != self.holders.values().filter(|h| !h.is_empty()).count() {
            return Err(format!("status {all:?} but holders {:?}", self.holders));
        }
        Ok(())
    }
}
