//! A front-end's copy of every lock under the prefix, kept by one watch: pure, no I/O.
//!
//! Every front-end mirrors the whole prefix, so a release is seen by all of them from one
//! watch stream each (etcd measured ~100 ms hand-overs with a watch per waiter, ~2 ms with one
//! shared watch), and only the front-end of the head waiter acts on it. The mirror is never
//! trusted for a decision on its own: every change is a transaction whose comparisons fail if
//! the mirror was stale, and then the mirror catches up and the decision is made again.
//!
//! This file is the mirror's records and what it answers; `apply.rs` applies the watch's
//! changes to it, and `holder_events.rs` makes the events a holder's changes are for WATCH.

use std::collections::{BTreeMap, BTreeSet};

use super::hashing::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::locks::{rules, EventKind, Mode, Token};

use super::marks::MarkerValue;
use super::tokens::Tokens;
use super::values::{HolderValue, WaiterValue};

/// The value of a front-end's key (`P fe/<id>`): its keys are in slots (`slots.rs`). An older
/// lockd's front-end writes an empty one, and takes a key's last part for its request's uid,
/// so it can't grant this version's waiters (nor this version its): the two must not share
/// a prefix, which the log says when they do.
pub const FRONT_END_VALUE: &str = "keys=slots";

/// One key change, as the watch (or a range read) reports it.
#[derive(Debug, Clone)]
pub struct KeyChange {
    pub put: bool,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_rev: i64,
    pub mod_rev: i64,
    /// The etcd lease the key hangs on; 0 for none.
    pub lease: i64,
}

#[derive(Debug, Clone)]
pub struct HolderRecord {
    pub key: String,
    /// The key's last part (see `slots.rs`): a set's keys on its other names are in it too.
    pub slot: String,
    /// The request it was granted to ([`HolderValue::uid`]; its slot, for an older lockd's).
    pub uid: String,
    /// Create revision: the token is the base plus this.
    pub rev: i64,
    pub mod_rev: i64,
    /// The etcd lease its key hangs on (0: none). A plain lease granted by another
    /// front-end to this one's waiter hangs on this front-end's etcd lease until this one
    /// confirms it (see [`Granted::unconfirmed`]).
    pub lease: i64,
    pub value: HolderValue,
    /// When this front-end ends it: the time it had left when its record was written
    /// ([`HolderValue::left_ms`]) after this front-end saw the write, on its monotonic clock.
    /// Never before the lease's time, whatever any wall clock says; later by how long the
    /// write took to be seen (milliseconds; up to the time since the write for a front-end
    /// that read it at start or after a compaction).
    pub ends_at: Instant,
    /// Its key is gone with its front-end's etcd lease (that front-end died, or was cut off
    /// past its lease), and its lock-delay runs: every front-end's mirror keeps it in its
    /// place, unrenewable, until [`HolderRecord::ends_at`], as a lease in its delay is kept
    /// on one server (see [`HolderRecord::delayed`]).
    pub keyless: bool,
}

impl HolderRecord {
    /// How long it has left, as this front-end counts it.
    pub fn left(&self, now: Instant) -> Duration {
        self.ends_at.saturating_duration_since(now)
    }

    /// This holder, seen at `now` with its key gone without a marker (so with its
    /// front-end's etcd lease), kept for its lock-delay, if it has one to run: a session
    /// lease (its connection went with its front-end: its holder may still be running) from
    /// now, or a lease already in its delay until that delay's end. Without this, the next
    /// waiter would be granted the moment the key went (proto.md, `delay=`).
    pub fn delayed(&self, now: Instant) -> Option<HolderRecord> {
        let value = &self.value;
        if value.delay_ms == 0 {
            return None;
        }
        let ends_at = match (value.delaying, value.session_ms) {
            (Some(_), _) => self.ends_at,
            (None, Some(_)) => now + Duration::from_millis(value.delay_ms),
            (None, None) => return None,
        };
        if ends_at <= now {
            return None;
        }
        let mut kept = self.clone();
        kept.value.delaying.get_or_insert(EventKind::Dropped);
        kept.ends_at = ends_at;
        kept.keyless = true;
        Some(kept)
    }
}

/// A new holder the watch (or a read) showed.
#[derive(Debug, Clone)]
pub struct Granted {
    /// A granted waiter's holder key takes the waiter's uid.
    pub uid: String,
    pub name: String,
    pub token: Token,
    pub rev: i64,
    /// The key's mod revision as shown: the hand-over a take-back is guarded by.
    pub mod_rev: i64,
    /// The front-end whose waiter it was granted to: the one that tells its client.
    pub fe: String,
    pub lease: i64,
    pub ttl_ms: u64,
    pub session: bool,
}

impl Granted {
    pub fn of(tokens: Tokens, name: &str, h: &HolderRecord) -> Granted {
        Granted {
            uid: h.uid.clone(),
            name: name.to_owned(),
            token: tokens.of(h.rev, &h.slot),
            rev: h.rev,
            mod_rev: h.mod_rev,
            fe: h.value.fe.clone(),
            lease: h.lease,
            ttl_ms: h.value.ttl_ms,
            session: h.value.session_ms.is_some(),
        }
    }

    /// A plain lease that still hangs on its waiter's front-end's etcd lease: granted by
    /// another front-end in the same write as a release, to a waiter whose front-end may
    /// be dead. Its front-end takes it off the etcd lease before it tells the client, so a
    /// dead front-end's waiter never keeps the lock longer than that lease.
    pub fn unconfirmed(&self) -> bool {
        !self.session && self.lease != 0
    }
}

#[derive(Debug, Clone)]
pub struct WaiterRecord {
    pub key: String,
    /// As [`HolderRecord::slot`].
    pub slot: String,
    /// The request ([`WaiterValue::uid`]; its slot, for an older lockd's record).
    pub uid: String,
    /// Create revision: its place in the queue.
    pub rev: i64,
    /// Mod revision: which front-end's write it is (a LOCK of the same id through another
    /// front-end rewrites the key to take over its place).
    pub mod_rev: i64,
    pub value: WaiterValue,
}

/// One name: its holders and queue, in revision order, and its marker.
#[derive(Debug, Default)]
pub struct NameState {
    /// The marker's mod revision; 0 while it does not exist (what etcd compares it with).
    pub marker_rev: i64,
    pub marker: Option<MarkerValue>,
    /// The revision the marker was last written or deleted at.
    pub marker_changed: i64,
    pub holders: BTreeMap<i64, HolderRecord>,
    pub queue: BTreeMap<i64, WaiterRecord>,
    /// The revision of the last change to this name, to know whether a failed transaction
    /// may be tried again already.
    pub last_rev: i64,
}

impl NameState {
    pub(super) fn is_empty(&self) -> bool {
        self.marker_rev == 0 && self.holders.is_empty() && self.queue.is_empty()
    }

    /// Whether a holder or waiter key of this name is in `slot`.
    pub fn uses_slot(&self, slot: &str) -> bool {
        self.holders.values().any(|h| h.slot == slot && !h.keyless)
            || self.queue.values().any(|w| w.slot == slot)
    }

    /// Whether a holder in `mode` fits beside the present holders (the queue aside) once
    /// the holder of create revision `leaving` is gone.
    pub fn admits_without(&self, mode: Mode, leaving: Option<i64>) -> bool {
        let staying = self.holders.values().filter(|h| Some(h.rev) != leaving);
        rules::admits(staying.map(|h| h.value.mode), mode)
    }

    pub fn holder_by_rev(&self, rev: i64) -> Option<&HolderRecord> {
        self.holders.get(&rev)
    }
}

/// The mirror itself.
#[derive(Debug, Default)]
pub struct Mirror {
    /// Every change up to this revision is applied.
    pub rev: i64,
    pub names: HashMap<String, NameState>,
    pub front_ends: HashSet<String>,
    /// Holders by when they end ([`HolderRecord::ends_at`]): the expiry timer's structure.
    pub ends: BTreeSet<(Instant, String, i64)>,
    pub tokens: Tokens,
}

impl Mirror {
    pub fn name(&self, name: &str) -> Option<&NameState> {
        self.names.get(name)
    }

    /// The token of a holder created at `rev` in `slot` ([`Tokens::of`]).
    pub fn token(&self, rev: i64, slot: &str) -> Token {
        self.tokens.of(rev, slot)
    }

    /// The create revision a token stands for, if it can be one of this cluster's: the
    /// holder it names is the one created then that [`Mirror::is_token_of`] it.
    pub fn rev_of(&self, token: Token) -> Option<i64> {
        self.tokens.rev_of(token)
    }

    /// Whether `token` is `holder`'s (a dense revision has several holders' tokens).
    pub fn is_token_of(&self, token: Token, holder: &HolderRecord) -> bool {
        self.tokens.of(holder.rev, &holder.slot) == token
    }

    /// Whether front-end `fe`'s own key, last put at revision `put_at` (0: not yet), is gone
    /// though this mirror has applied every change since: a put sent before, answered lost,
    /// landed late on an etcd lease given up on since and went with it (simulator seed
    /// 43119). The front-end then puts it again (`lease.rs::keep_announced`).
    pub fn registration_gone(&self, fe: &str, put_at: i64) -> bool {
        put_at > 0 && self.rev >= put_at && !self.front_ends.contains(fe)
    }

    /// Holders of every name, without a walk over the names (a LOCK checks `--max-locks`
    /// against it on every request): each holder has exactly one entry in [`Mirror::ends`].
    pub fn holders(&self) -> usize {
        self.ends.len()
    }

    /// Held locks (holders) and queued waiters.
    pub fn counts(&self) -> (usize, usize) {
        self.names
            .values()
            .fold((0, 0), |(h, w), n| (h + n.holders.len(), w + n.queue.len()))
    }
}

/// A record's uid: the one its value names, or (a record of an older lockd, whose keys took
/// a new uid each) its slot.
pub(super) fn uid_of(value_uid: &str, slot: &str) -> String {
    if value_uid.is_empty() {
        slot
    } else {
        value_uid
    }
    .to_owned()
}

#[cfg(test)]
#[path = "mirror_front_ends_tests.rs"]
mod front_ends_tests;
#[cfg(test)]
#[path = "mirror_tests.rs"]
pub(super) mod tests;
