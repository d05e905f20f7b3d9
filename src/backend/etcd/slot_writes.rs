//! A request's slot (`slots.rs`) taken for its keys, and given back as its write's answer
//! says.

use super::{guards, rpc, Cluster};

impl Cluster {
    /// A slot for the keys of a new request on `names` names (`slots.rs`).
    pub(super) fn take_slot(&self, names: usize) -> String {
        self.guard().slots.take(names)
    }

    /// A slot for a new request's keys on `names` names, in which its write deletes none of
    /// `ended`, the keys of the waiters it ends ([`super::slots::Slots::take_avoiding`]).
    pub(super) fn take_slot_avoiding<'a>(
        &self,
        names: usize,
        ended: impl Iterator<Item = &'a str> + Clone,
    ) -> String {
        let in_slot = |slot: &str| {
            ended
                .clone()
                .any(|key| key.rsplit('/').next() == Some(slot))
        };
        self.guard().slots.take_avoiding(names, in_slot)
    }

    /// Whether an [`guards::in_empty_slot`] write of keys in `slot` on `names` was made.
    /// Refused, the slot is given back; a key found in it (a slot thought free by mistake,
    /// or a key this front-end can't read), it stays taken and the request takes another.
    pub(super) fn slot_written<'a>(
        &self,
        slot: &str,
        names: impl IntoIterator<Item = &'a str> + Clone,
        resp: &rpc::TxnResponse,
    ) -> bool {
        match guards::slot_write(resp) {
            guards::SlotWrite::Done => true,
            guards::SlotWrite::Refused => {
                self.give_back(slot, names);
                false
            }
            guards::SlotWrite::Taken => {
                let names: Vec<&str> = names.into_iter().collect();
                tracing::warn!(
                    fe = self.fe,
                    slot,
                    names = names.join(" "),
                    "a key is in a slot this front-end thought free: it takes another"
                );
                self.guard().slots.give_back(slot, names.len());
                false
            }
        }
    }

    /// The write that would have created keys in `slot` on `names` failed its comparisons:
    /// the slot is free again, unless the mirror shows a key in it.
    pub(super) fn give_back<'a>(&self, slot: &str, names: impl IntoIterator<Item = &'a str>) {
        let mut g = self.guard();
        let present = names
            .into_iter()
            .filter(|n| g.mirror.name(n).is_some_and(|ns| ns.uses_slot(slot)))
            .count();
        g.slots.give_back(slot, present);
    }
}
