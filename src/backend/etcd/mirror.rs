//! A front-end's copy of every lock under the prefix, kept by one watch: pure, no I/O.
//!
//! Every front-end mirrors the whole prefix, so a release is seen by all of them from one
//! watch stream each (etcd measured ~100 ms hand-overs with a watch per waiter, ~2 ms with one
//! shared watch), and only the front-end of the head waiter acts on it. The mirror is never
//! trusted for a decision on its own: every change is a transaction whose comparisons fail if
//! the mirror was stale, and then the mirror catches up and the decision is made again.

use std::collections::{BTreeMap, BTreeSet};

use super::hashing::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::locks::{rules, Event, EventKind, Mode, Origin, Token};

use super::keys::{Key, Layout};
use super::marks::MarkerValue;
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
    pub fn of(base: Token, name: &str, h: &HolderRecord) -> Granted {
        Granted {
            uid: h.uid.clone(),
            name: name.to_owned(),
            token: base + h.rev as Token,
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

/// What applying changes showed: events for watchers, and which names moved.
#[derive(Debug, Default)]
pub struct Applied {
    pub events: Vec<Event>,
    /// The revision of each of `events`, to order them once all are in.
    event_revs: Vec<i64>,
    pub touched: HashSet<String>,
    /// Waiter keys deleted (by a grant, a replacement, a timeout or their lease's end).
    pub waiters_gone: Vec<(String, String)>,
    /// Waiter keys new in the queue: name and create revision.
    pub waiters_new: Vec<(String, i64)>,
    /// New holders.
    pub granted: Vec<Granted>,
    /// Holders rewritten off the etcd lease they hung on (a confirmation, a lock-delay's
    /// start), as they are now. Only those: a RENEW keeps its key's lease, and every RENEW
    /// of the cluster passes here.
    pub off_lease: Vec<Granted>,
    /// Waiter keys rewritten to another connection or front-end (a LOCK of the same id took
    /// over their place): name, uid and the front-end that now waits on them.
    pub adopted: Vec<(String, String, String)>,
    /// Slots (`slots.rs`) left without a key on a name: name and slot.
    pub slots_gone: Vec<(String, String)>,
    /// Front-ends of an older lockd that came (their key's value is not
    /// [`FRONT_END_VALUE`]).
    pub older_front_ends: Vec<String>,
}

impl Applied {
    /// An event of the change made at revision `rev`.
    fn event(&mut self, rev: i64, event: Event) {
        self.events.push(event);
        self.event_revs.push(rev);
    }

    /// Puts the events in the order they happened: by revision, and within one write (a
    /// release that grants the next waiter puts the new holder's key before it deletes the
    /// old one's) the end of a lease before the grant it made room for, as one server tells
    /// its watchers.
    fn order_events(&mut self) {
        let revs = std::mem::take(&mut self.event_revs);
        let mut events: Vec<(i64, bool, Event)> = revs
            .into_iter()
            .zip(self.events.drain(..))
            .map(|(rev, e)| (rev, e.kind == EventKind::Acquired, e))
            .collect();
        events.sort_by_key(|(rev, acquired, _)| (*rev, *acquired));
        self.events = events.into_iter().map(|(_, _, e)| e).collect();
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
    pub base: Token,
}

impl Mirror {
    pub fn name(&self, name: &str) -> Option<&NameState> {
        self.names.get(name)
    }

    pub fn token(&self, rev: i64) -> Token {
        self.base + rev as Token
    }

    /// The create revision a token stands for, if it can be one of this cluster's.
    pub fn rev_of(&self, token: Token) -> Option<i64> {
        token
            .checked_sub(self.base)
            .filter(|r| *r > 0)
            .and_then(|r| i64::try_from(r).ok())
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

    /// Applies changes in revision order. A holder's end is an event only with the marker
    /// written in the same transaction (put first in every transaction that removes a
    /// holder), which says whether it was released, expired, dropped or revoked; a holder
    /// key that vanishes alone went with its front-end's etcd lease (`dropped`).
    /// `now`: when they were seen (the monotonic clock), which holders' ends count from.
    pub fn apply(
        &mut self,
        layout: &Layout,
        changes: &[KeyChange],
        at_rev: i64,
        now: Instant,
    ) -> Applied {
        let mut out = Applied::default();
        for c in changes {
            let Some(key) = layout.parse(&c.key) else {
                continue;
            };
            match key {
                Key::Base => {
                    if let Some(base) = std::str::from_utf8(&c.value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                    {
                        self.base = base;
                    }
                }
                // Read by the watch itself (the waiter's front-end answers its client).
                Key::Superseded { .. } => {}
                Key::FrontEnd { id } => {
                    if c.put {
                        if c.value != FRONT_END_VALUE.as_bytes() {
                            out.older_front_ends.push(id.clone());
                        }
                        self.front_ends.insert(id);
                    } else {
                        self.front_ends.remove(&id);
                    }
                }
                Key::Marker { name } => {
                    let ns = self.names.entry(name.clone()).or_default();
                    ns.last_rev = c.mod_rev;
                    ns.marker_changed = c.mod_rev;
                    if c.put {
                        ns.marker_rev = c.mod_rev;
                        ns.marker = MarkerValue::decode(&c.value);
                    } else {
                        ns.marker_rev = 0;
                        // Deleted with the last holder by an UNLOCK: a release.
                        ns.marker = Some(MarkerValue {
                            kind: EventKind::Released,
                            rev: 0,
                            fe: String::new(),
                            by_user: String::new(),
                            by_peer: String::new(),
                        });
                    }
                    out.touched.insert(name);
                }
                Key::Holder { name, slot } => {
                    let key = String::from_utf8_lossy(&c.key).into_owned();
                    self.holder_change(name, slot, key, c, now, &mut out);
                }
                Key::Waiter { name, slot } => {
                    let ns = self.names.entry(name.clone()).or_default();
                    ns.last_rev = c.mod_rev;
                    if c.put {
                        if let Some(value) = WaiterValue::decode(&c.value) {
                            let key = String::from_utf8_lossy(&c.key).into_owned();
                            let rev = c.create_rev;
                            let uid = uid_of(&value.uid, &slot);
                            let moved = ns.queue.get(&rev).is_some_and(|old| {
                                (&old.value.fe, old.value.conn) != (&value.fe, value.conn)
                            });
                            if moved {
                                out.adopted
                                    .push((name.clone(), uid.clone(), value.fe.clone()));
                            }
                            if !ns.queue.contains_key(&rev) {
                                out.waiters_new.push((name.clone(), rev));
                            }
                            ns.queue.insert(
                                rev,
                                WaiterRecord {
                                    key,
                                    slot,
                                    uid,
                                    rev,
                                    mod_rev: c.mod_rev,
                                    value,
                                },
                            );
                        }
                    } else {
                        let gone = ns
                            .queue
                            .iter()
                            .find(|(_, w)| w.slot == slot)
                            .map(|(r, _)| *r);
                        let gone = gone.and_then(|rev| ns.queue.remove(&rev));
                        // (Its grant, in the same write, put its holder key first.)
                        if !ns.uses_slot(&slot) {
                            out.slots_gone.push((name.clone(), slot.clone()));
                        }
                        let uid = gone.map_or(slot, |w| w.uid);
                        out.waiters_gone.push((name.clone(), uid));
                    }
                    out.touched.insert(name);
                }
            }
        }
        self.rev = self.rev.max(at_rev);
        out.order_events();
        for name in &out.touched {
            if self.names.get(name).is_some_and(NameState::is_empty) {
                self.names.remove(name);
            }
        }
        out
    }

    fn holder_change(
        &mut self,
        name: String,
        slot: String,
        key: String,
        c: &KeyChange,
        now: Instant,
        out: &mut Applied,
    ) {
        let base = self.base;
        let ns = self.names.entry(name.clone()).or_default();
        ns.last_rev = c.mod_rev;
        out.touched.insert(name.clone());
        if c.put {
            let Some(value) = HolderValue::decode(&c.value) else {
                return;
            };
            let rev = c.create_rev;
            let holder = HolderRecord {
                key,
                uid: uid_of(&value.uid, &slot),
                slot,
                rev,
                mod_rev: c.mod_rev,
                lease: c.lease,
                ends_at: now + Duration::from_millis(value.left_ms()),
                keyless: false,
                value,
            };
            if let Some(old) = ns.holders.get(&rev) {
                self.ends.remove(&(old.ends_at, name.clone(), old.rev));
                if old.lease != 0 && holder.lease == 0 {
                    out.off_lease.push(Granted::of(base, &name, &holder));
                }
                if let Some(breaking) = breaking(base, &name, old, &holder) {
                    out.event(c.mod_rev, breaking);
                }
            } else {
                out.granted.push(Granted::of(base, &name, &holder));
                out.event(c.mod_rev, acquired(base, &name, &holder));
            }
            self.ends.insert((holder.ends_at, name.clone(), rev));
            ns.holders.insert(rev, holder);
        } else {
            let keyed = ns.holders.values().find(|h| h.slot == slot && !h.keyless);
            let Some(rev) = keyed.map(|h| h.rev) else {
                return;
            };
            let Some(old) = ns.holders.remove(&rev) else {
                return;
            };
            if !ns.uses_slot(&slot) {
                out.slots_gone.push((name.clone(), slot));
            }
            self.ends.remove(&(old.ends_at, name.clone(), rev));
            // The marker written in the same transaction says why; none: the lease went
            // with its front-end's etcd lease, and may have a lock-delay to run first.
            let marker = ns
                .marker
                .as_ref()
                .filter(|_| ns.marker_changed == c.mod_rev);
            if let (None, Some(kept)) = (marker, old.delayed(now)) {
                self.ends.insert((kept.ends_at, name.clone(), rev));
                ns.holders.insert(rev, kept);
                return;
            }
            out.event(c.mod_rev, ended(base, &name, &old, marker));
        }
    }
}

/// The event of `holder`'s grant.
pub(super) fn acquired(base: Token, name: &str, holder: &HolderRecord) -> Event {
    Event {
        waited: holder.value.waited_ms.map(Duration::from_millis),
        note: holder.value.note(),
        ..holder_event(EventKind::Acquired, base, name, holder)
    }
}

/// The event of a BREAK without `force` that `now` shows and `was` did not (over for its
/// holder, still in its place), if it is one.
pub(super) fn breaking(
    base: Token,
    name: &str,
    was: &HolderRecord,
    now: &HolderRecord,
) -> Option<Event> {
    let (None, Some(by)) = (&was.value.broken_by, &now.value.broken_by) else {
        return None;
    };
    Some(Event {
        held: held(&now.value),
        broken_by: by.clone(),
        ..holder_event(EventKind::Breaking, base, name, now)
    })
}

/// The event of `holder`'s end: `marker` (written by the transaction that ended it) says
/// why; without one, the lease went with its front-end's etcd lease (`dropped`).
pub(super) fn ended(
    base: Token,
    name: &str,
    holder: &HolderRecord,
    marker: Option<&MarkerValue>,
) -> Event {
    let kind = marker.map_or(EventKind::Dropped, |m| m.kind);
    // A BREAK's marker says who sent it, for every front-end's watchers.
    let broken_by = match marker {
        Some(m) if kind == EventKind::Broken => {
            Origin::new(Some(m.by_user.as_str()), m.by_peer.parse().ok())
        }
        _ => Origin::default(),
    };
    Event {
        held: held(&holder.value),
        broken_by,
        ..holder_event(kind, base, name, holder)
    }
}

fn holder_event(kind: EventKind, base: Token, name: &str, holder: &HolderRecord) -> Event {
    Event {
        kind,
        name: Arc::from(name),
        id: holder.value.id.as_str().into(),
        token: base + holder.rev as Token,
        held: Duration::ZERO,
        waited: None,
        origin: holder.value.origin(),
        note: None,
        broken_by: Origin::default(),
    }
}

/// How long a lease has been held, by the wall clock its grant was written with.
fn held(value: &HolderValue) -> Duration {
    Duration::from_millis(super::wall_ms().saturating_sub(value.granted_ms))
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
#[path = "mirror_tests.rs"]
pub(super) mod tests;
