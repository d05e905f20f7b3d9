//! How the watch's key changes (or a read's) are applied to the mirror: each key parsed, its
//! record put in or taken out, and what that showed (events, grants, waiters new or gone,
//! slots freed) gathered in [`Applied`] for the watch to act on. Pure, no I/O.

use std::time::{Duration, Instant};

use super::hashing::HashSet;
use crate::locks::{Event, EventKind};

use super::holder_events::{acquired, breaking, ended};
use super::keys::{Key, Layout};
use super::marks::MarkerValue;
use super::mirror::{
    uid_of, Granted, HolderRecord, KeyChange, Mirror, NameState, WaiterRecord, FRONT_END_VALUE,
};
use super::tokens::Tokens;
use super::values::{HolderValue, WaiterValue};

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

impl Mirror {
    /// Applies changes in revision order. A holder's end is an event only with the marker
    /// written in the same transaction (put first in every transaction that removes a
    /// holder), which says whether it was released, expired, dropped or revoked; a holder
    /// key that vanishes alone went with its front-end's etcd lease (`dropped`).
    /// `now`: when they were seen (the monotonic clock), which holders' ends count from;
    /// `wall_ms`: the wall clock then, which how long a holder held is told by.
    pub fn apply(
        &mut self,
        layout: &Layout,
        changes: &[KeyChange],
        at_rev: i64,
        now: Instant,
        wall_ms: u64,
    ) -> Applied {
        let mut out = Applied::default();
        for c in changes {
            let Some(key) = layout.parse(&c.key) else {
                continue;
            };
            match key {
                Key::Base => {
                    if let Some(tokens) = Tokens::parse(&c.value, c.mod_rev) {
                        self.tokens = tokens;
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
                    self.holder_change(name, slot, key, c, (now, wall_ms), &mut out);
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
        (now, wall_ms): (Instant, u64),
        out: &mut Applied,
    ) {
        let tokens = self.tokens;
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
                    out.off_lease.push(Granted::of(tokens, &name, &holder));
                }
                if let Some(breaking) = breaking(tokens, &name, old, &holder, wall_ms) {
                    out.event(c.mod_rev, breaking);
                }
            } else {
                out.granted.push(Granted::of(tokens, &name, &holder));
                out.event(c.mod_rev, acquired(tokens, &name, &holder));
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
            out.event(c.mod_rev, ended(tokens, &name, &old, marker, wall_ms));
        }
    }
}
