//! Invariants checked from what the table reports alone (return values and effects), without
//! the reference model: a second opinion, so that a bug shared by the table and the model
//! still breaks one of the documented guarantees here.

use std::collections::{HashMap, HashSet};

use lockd::locks::{Effect, EventKind, LockOutcome, LockStatus, Token, WaitEnd, WaiterId};

#[derive(Default)]
pub struct Observer {
    /// The highest token ever granted.
    last_token: Option<Token>,
    /// Holder token per name, as the events tell it.
    holders: HashMap<String, Token>,
    /// Live waiters per name, in the order they must be granted.
    queues: HashMap<String, Vec<WaiterId>>,
    /// Waiters that left without a grant: never to be granted after.
    left: HashSet<WaiterId>,
    granted: HashSet<WaiterId>,
}

/// What one call into the table did, as seen from outside.
pub enum Call<'a> {
    Lock {
        name: &'a str,
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
                .position(|w| *w == waiter)
                .map(|i| (name.as_str(), i))
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
        let mut replaced_slot: Option<(String, usize)> = None;
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
                    let head = self.queues.get(&**name).and_then(|q| q.first().copied());
                    if head != Some(*waiter) {
                        return Err(format!(
                            "waiter {waiter} granted {name} but the head of its queue is {head:?}"
                        ));
                    }
                    self.queues.get_mut(&**name).map(|q| q.remove(0));
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
                    if *why == WaitEnd::Replaced {
                        match call {
                            Call::Lock {
                                name: lock_name,
                                outcome: Some(LockOutcome::Queued { .. }),
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
                        if let Some(t) = self.holders.get(&name) {
                            return Err(format!("{name} acquired while token {t} holds it"));
                        }
                        self.new_token(e.token)?;
                        self.holders.insert(name, e.token);
                    } else {
                        if self.holders.get(&name) != Some(&e.token) {
                            return Err(format!(
                                "{name} {:?} for token {} but holder is {:?}",
                                e.kind,
                                e.token,
                                self.holders.get(&name)
                            ));
                        }
                        self.holders.remove(&name);
                    }
                }
            }
            i += 1;
        }
        match call {
            Call::Lock { name, outcome } => match outcome {
                Some(LockOutcome::Queued { waiter }) => {
                    if self.live(*waiter).is_some() || self.left.contains(waiter) {
                        return Err(format!("waiter number {waiter} used twice"));
                    }
                    if !self.holders.contains_key(name) {
                        return Err(format!("queued on {name}, which is free"));
                    }
                    let q = self.queues.entry(name.to_string()).or_default();
                    match replaced_slot {
                        Some((_, pos)) => q.insert(pos, *waiter),
                        None => q.push(*waiter),
                    }
                }
                Some(LockOutcome::Granted { token, .. })
                    if self.holders.get(name) != Some(token) =>
                {
                    return Err(format!(
                        "LOCK {name} answered token {token}, not the holder"
                    ));
                }
                Some(LockOutcome::Granted { .. }) | None => {}
            },
            Call::CancelWait { waiter, removed } => {
                let live = self.live(waiter).map(|(n, p)| (n.to_string(), p));
                match (live, removed) {
                    (Some((name, pos)), true) => {
                        if let Some(q) = self.queues.get_mut(&name) {
                            q.remove(pos);
                        }
                        self.left.insert(waiter);
                    }
                    (None, false) => {}
                    (live, removed) => {
                        return Err(format!(
                            "cancel_wait({waiter}) said {removed} but waiting is {live:?}"
                        ))
                    }
                }
            }
            Call::Other => {}
        }
        // Queues exist only while a name is held.
        for (name, q) in &self.queues {
            if !q.is_empty() && !self.holders.contains_key(name) {
                return Err(format!("{name} is free but has waiters {q:?}"));
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
            if self.holders.get(&*s.name) != Some(&s.token) {
                return Err(format!("status {s:?} but holder token {:?}", self.holders));
            }
            let waiting = self.queues.get(&*s.name).map_or(0, Vec::len);
            if waiting != s.waiters {
                return Err(format!("status {s:?} but {waiting} waiting"));
            }
        }
        if names.len() != self.holders.len() {
            return Err(format!("status {all:?} but holders {:?}", self.holders));
        }
        Ok(())
    }
}
