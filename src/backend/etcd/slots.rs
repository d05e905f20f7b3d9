//! The last part of this front-end's waiter and holder keys: a slot, used again once every
//! key in it is gone, rather than a new part per request. [`Slots`] is pure, no I/O (part of the
//! core's state); `slot_writes.rs` takes a request's slot and gives it back as its write's
//! answer says.
//!
//! etcd checks a comparison over a key range against every key the range held since its
//! last compaction, deleted ones included, and the grant of a waiter compares the name's
//! whole waiter range ("nobody is ahead of me"). With a new key per wait, a busy name's
//! hand-overs grew slower with every wait until etcd compacted; with slots a name's ranges
//! hold as many keys as it had requests at once.
//!
//! A slot stays taken from the moment a request takes it until this front-end's mirror
//! shows none of its keys left on any name it was taken for (a set takes one slot on all
//! its names): a waiter key becomes a holder key of the same slot in the write that grants
//! it, so the slot is free only once that holder is gone too. A write that may have been
//! applied but whose answer was lost keeps its slot taken for good (its keys, if they were
//! written, free it when they go): a slot leaks, a key is never written twice at once. The
//! request's own identity (its uid) is in the key's value, so nothing that tracks a request
//! mistakes one incarnation of a slot for another; and every write that creates a key of a
//! slot compares the key's absence, so a slot wrongly thought free fails a write, never
//! overwrites another request's key.

use std::collections::BTreeSet;

use super::hashing::HashMap;

/// This front-end's slots.
#[derive(Debug)]
pub struct Slots {
    /// The front-end's id: a slot is `<fe>.<n>`.
    fe: String,
    /// Free slots, smallest first (so a name keeps using the few it had).
    free: BTreeSet<u64>,
    /// The next slot never used.
    next: u64,
    /// Taken slots: on how many names each may still have keys.
    taken: HashMap<u64, usize>,
}

impl Slots {
    pub fn new(fe: &str) -> Slots {
        Slots {
            fe: fe.to_owned(),
            free: BTreeSet::new(),
            next: 1,
            taken: HashMap::default(),
        }
    }

    /// Takes a slot for keys on `names` names.
    pub fn take(&mut self, names: usize) -> String {
        self.take_avoiding(names, |_| false)
    }

    /// Takes a slot for keys on `names` names, but none that a key of `ended` is in: the
    /// keys the same write deletes ([`Slots::take_avoiding`]).
    pub fn take_clear_of<'a>(
        &mut self,
        names: usize,
        ended: impl Iterator<Item = &'a str> + Clone,
    ) -> String {
        let in_slot = |slot: &str| {
            ended
                .clone()
                .any(|key| key.rsplit('/').next() == Some(slot))
        };
        self.take_avoiding(names, in_slot)
    }

    /// Takes a slot for keys on `names` names, but none that `avoid` says the same write
    /// deletes a key in: etcd refuses a write that puts and deletes one key. A slot is free
    /// once the mirror shows its keys gone, and a decision made on an older view may still
    /// end the waiter that had it (simulator seed 201: a LOCK answered UNAVAILABLE).
    pub fn take_avoiding(&mut self, names: usize, avoid: impl Fn(&str) -> bool) -> String {
        let free = self.free.iter().copied().find(|n| !avoid(&self.slot(*n)));
        let n = match free {
            Some(n) => {
                self.free.remove(&n);
                n
            }
            None => {
                self.next += 1;
                self.next - 1
            }
        };
        self.taken.insert(n, names.max(1));
        self.slot(n)
    }

    /// `slot`'s write created no key (it failed its comparisons); `present` of its names
    /// still show a key in it (none, unless the slot was wrongly thought free): it is free
    /// again once those go.
    pub fn give_back(&mut self, slot: &str, present: usize) {
        let Some(n) = self.number(slot) else {
            return;
        };
        if present == 0 {
            if self.taken.remove(&n).is_some() {
                self.free.insert(n);
            }
        } else {
            self.taken.insert(n, present);
        }
    }

    /// The last key of `slot` on one of its names went.
    pub fn gone(&mut self, slot: &str) {
        let Some(n) = self.number(slot) else {
            return;
        };
        let Some(left) = self.taken.get_mut(&n) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.taken.remove(&n);
            self.free.insert(n);
        }
    }

    /// How many slots are taken, and how many were ever used.
    pub fn counts(&self) -> (usize, u64) {
        (self.taken.len(), self.next - 1)
    }

    fn slot(&self, n: u64) -> String {
        format!("{}.{n}", self.fe)
    }

    /// The number of `slot`, if it is one of this front-end's.
    fn number(&self, slot: &str) -> Option<u64> {
        slot.strip_prefix(self.fe.as_str())?
            .strip_prefix('.')?
            .parse()
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_used_again_only_once_its_keys_on_every_name_are_gone() {
        let mut s = Slots::new("fe1");
        let a = s.take(1);
        let set = s.take(2);
        assert_ne!(a, set);
        s.gone(&set);
        assert_ne!(s.take(1), set, "one of the set's names still has its key");
        s.gone(&set);
        s.gone(&a);
        assert_eq!(s.take(1), a, "the smallest free slot comes first");
        assert_eq!(s.take(1), set);
    }

    #[test]
    fn a_slot_the_same_write_deletes_a_key_in_is_not_taken() {
        let mut slots = Slots::new("fe0");
        let (one, two) = (slots.take(1), slots.take(1));
        slots.give_back(&one, 0);
        slots.give_back(&two, 0);
        // fe0.1 is free, but the write deletes a key in it: fe0.2, then a new one.
        assert_eq!(slots.take_avoiding(1, |s| s == "fe0.1"), "fe0.2");
        assert_eq!(slots.take_avoiding(1, |s| s == "fe0.1"), "fe0.3");
        assert_eq!(slots.take(1), "fe0.1");
        slots.give_back("fe0.1", 0);
        let ended = ["/p/q/a/fe0.1", "/p/q/a/fe1.4"];
        assert_eq!(slots.take_clear_of(1, ended.into_iter()), "fe0.4");
    }

    #[test]
    fn a_failed_write_gives_its_slot_back_unless_a_key_is_seen_in_it() {
        let mut s = Slots::new("fe1");
        let a = s.take(1);
        s.give_back(&a, 0);
        assert_eq!(s.take(1), a);
        s.give_back(&a, 1);
        let b = s.take(1);
        assert_ne!(b, a, "a key still in it: taken until it goes");
        s.gone(&a);
        assert_eq!(s.take(1), a);
    }

    #[test]
    fn keys_of_other_front_ends_and_unknown_slots_change_nothing() {
        let mut s = Slots::new("fe1");
        let a = s.take(1);
        for other in ["fe10.1", "fe2.1", "fe1.x", "fe1", "fe1.99"] {
            s.gone(other);
            s.give_back(other, 0);
        }
        assert_eq!(s.counts(), (1, 1));
        s.gone(&a);
        s.gone(&a);
        assert_eq!(s.counts(), (0, 1));
        assert_eq!(s.take(1), a);
        assert_eq!(s.counts(), (1, 1));
    }
}
