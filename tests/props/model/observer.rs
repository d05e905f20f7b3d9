//! Invariants checked from what the table reports alone (return values and effects), without
//! the reference model: a second opinion, so that a bug shared by the table and the model
//! still breaks one of the documented guarantees here.

use std::collections::{HashMap, HashSet};

use lockd::locks::{Effect, EventKind, LockOutcome, LockStatus, Mode, Token, WaitEnd, WaiterId};

#[derive(Default)]
pub struct Observer {
    /// The highest token ever granted.
    last_token: Option<Token>,
    /// Holders per name in grant order, with the mode they hold it in, as the events tell it.
    holders: HashMap<String, Vec<(Token, Mode)>>,
    /// Live waiters per name, in the order they must be granted, with the mode they ask for.
    queues: HashMap<String, Vec<(WaiterId, Mode)>>,
    /// Waiters that left without a grant: never to be granted after.
    left: HashSet<WaiterId>,
    granted: HashSet<WaiterId>,
}

/// What one call into the table did, as seen from outside.
pub enum Call<'a> {
    Lock {
        name: &'a str,
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
    fn live(&self, waiter: WaiterId) -> Option<(&str, usize)> {
        self.queues.iter().find_map(|(name, q)| {
            q.iter()
                .position(|(w, _)| *w == waiter)
                .map(|i| (name.as_str(), i))
        })
    }

    fn held(&self, name: &str) -> bool {
        self.holders.get(name).is_some_and(|h| !h.is_empty())
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
            let Some((name, pos)) = self.live(waiter).map(|(n, p)| (n.to_string(), p)) else {
                return Err(format!(
                    "cancel_wait({waiter}) removed a waiter not waiting"
                ));
            };
            if let Some(q) = self.queues.get_mut(&name) {
                q.remove(pos);
            }
            self.left.insert(waiter);
        }
        let mut replaced_slot: Option<(String, usize)> = None;
        // A `supersede` LOCK of this call emptied the queue of this name before it joined.
        let mut superseded_on: Option<String> = None;
        // The mode of the grant whose Acquired event comes next.
        let mut granting: Option<Mode> = None;
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
                    // A LOCK that took the place of the head of the queue (same id) and fits
                    // is granted in the same call, before the answer that queues it.
                    let replacing_head = match &call {
                        Call::Lock {
                            name: lock_name,
                            mode,
                            outcome: Some(LockOutcome::Queued { waiter: queued }),
                        } if queued == waiter
                            && *lock_name == &**name
                            && (matches!(&replaced_slot, Some((_, 0)))
                                || (superseded_on.as_deref() == Some(&**name)
                                    && self.queues.get(&**name).is_none_or(|q| q.is_empty()))) =>
                        {
                            Some(*mode)
                        }
                        _ => None,
                    };
                    if let Some(mode) = replacing_head {
                        granting = Some(mode);
                    } else {
                        let head = self.queues.get(&**name).and_then(|q| q.first().copied());
                        let Some((_, mode)) = head.filter(|(w, _)| w == waiter) else {
                            return Err(format!(
                                "waiter {waiter} granted {name} but the head of its queue is {head:?}"
                            ));
                        };
                        self.queues.get_mut(&**name).map(|q| q.remove(0));
                        granting = Some(mode);
                    }
                    // The Acquired event for the same grant must follow at once.
                    match effects.get(i + 1) {
                        Some(Effect::Event(e))
                            if e.kind == EventKind::Acquired
                                && e.name == *name
                                && e.token == *token => {}
                        other => {
                            return Err(format!(
                                "grant of {name} to {waiter} not followed by its event: {other:?}"
                            ))
                        }
                    }
                }
                Effect::WaitEnded { waiter, why } => {
                    let Some((name, pos)) = self.live(*waiter).map(|(n, p)| (n.to_string(), p))
                    else {
                        return Err(format!("wait of {waiter} ended but it was not waiting"));
                    };
                    if let Some(q) = self.queues.get_mut(&name) {
                        q.remove(pos);
                    }
                    self.left.insert(*waiter);
                    if matches!(why, WaitEnd::Superseded { .. }) {
                        // Only a LOCK on the same name that then queues supersedes.
                        match call {
                            Call::Lock {
                                name: lock_name,
                                outcome: Some(LockOutcome::Queued { .. }),
                                ..
                            } if lock_name == name => superseded_on = Some(name.clone()),
                            _ => return Err(format!("waiter {waiter} superseded outside a LOCK")),
                        }
                    }
                    if *why == WaitEnd::Replaced {
                        match call {
                            Call::Lock {
                                name: lock_name,
                                outcome: Some(LockOutcome::Queued { .. }),
                                ..
                            } if lock_name == name && replaced_slot.is_none() => {
                                replaced_slot = Some((name, pos));
                            }
                            _ => return Err(format!("waiter {waiter} replaced outside a LOCK")),
                        }
                    }
                }
                Effect::Event(e) => {
                    let name = e.name.to_string();
                    if e.kind == EventKind::Acquired {
                        // A waiter's grant, or else the LOCK being answered at once.
                        let mode = match (granting.take(), &call) {
                            (Some(mode), _) => mode,
                            (None, Call::Lock { mode, .. }) => *mode,
                            (None, _) => {
                                return Err(format!("{name} acquired outside a LOCK or a grant"))
                            }
                        };
                        if !self.fits(&name, mode) {
                            return Err(format!(
                                "{name} acquired {mode} while held by {:?}",
                                self.holders.get(&name)
                            ));
                        }
                        self.new_token(e.token)?;
                        self.holders.entry(name).or_default().push((e.token, mode));
                    } else {
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
            }
            i += 1;
        }
        match call {
            Call::Lock {
                name,
                mode,
                outcome,
            } => match outcome {
                Some(LockOutcome::Queued { waiter }) => {
                    if self.live(*waiter).is_some() || self.left.contains(waiter) {
                        return Err(format!("waiter number {waiter} used twice"));
                    }
                    if !self.held(name) {
                        return Err(format!("queued on {name}, which is free"));
                    }
                    // Unless it was granted at once in this call (see above).
                    if !self.granted.contains(waiter) {
                        let q = self.queues.entry(name.to_string()).or_default();
                        match replaced_slot {
                            Some((_, pos)) => q.insert(pos, (*waiter, mode)),
                            None => q.push((*waiter, mode)),
                        }
                    }
                }
                Some(LockOutcome::Granted { token, .. })
                    if !self
                        .holders
                        .get(name)
                        .is_some_and(|h| h.iter().any(|(t, _)| t == token)) =>
                {
                    return Err(format!(
                        "LOCK {name} answered token {token}, not the holder"
                    ));
                }
                Some(LockOutcome::Granted { .. }) | None => {}
            },
            Call::CancelWait {
                waiter,
                removed: false,
            } => {
                if let Some(live) = self.live(waiter) {
                    return Err(format!(
                        "cancel_wait({waiter}) said it was not waiting, but it is: {live:?}"
                    ));
                }
            }
            Call::CancelWait { .. } | Call::Other => {}
        }
        // Queues exist only while a name is held, and nobody waits who could hold it.
        for (name, q) in &self.queues {
            if !q.is_empty() && !self.held(name) {
                return Err(format!("{name} is free but has waiters {q:?}"));
            }
            if let Some((waiter, mode)) = q.first() {
                if self.fits(name, *mode) {
                    return Err(format!(
                        "{name}: waiter {waiter} ({mode}) waits though it fits beside {:?}",
                        self.holders.get(name)
                    ));
                }
            }
        }
        Ok(())
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
            let waiting = self.queues.get(&*s.name).map_or(0, Vec::len);
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
