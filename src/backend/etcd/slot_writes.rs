//! A request's slot (`slots.rs`) taken for its keys, and given back as its write's answer
//! says: the driver of `slot_answers.rs`.

use super::guards::SlotWrite;
use super::slot_answers::{given_back, slot_answered};
use super::{rpc, Cluster};

impl Cluster {
    /// A slot for the keys of a new request on `names` names (`slots.rs`).
    pub(super) fn take_slot(&self, names: usize) -> String {
        self.guard().slots.take(names)
    }

    /// Whether an [`super::guards::in_empty_slot`] write of keys in `slot` on `names` was
    /// made; the slot is kept or given back as [`slot_answered`] decides.
    pub(super) fn slot_written<'a>(
        &self,
        slot: &str,
        names: impl IntoIterator<Item = &'a str> + Clone,
        resp: &rpc::TxnResponse,
    ) -> bool {
        let answer = slot_answered(&mut self.guard(), slot, names.clone(), resp);
        if answer == SlotWrite::Taken {
            let names: Vec<&str> = names.into_iter().collect();
            tracing::warn!(
                fe = self.fe,
                slot,
                names = names.join(" "),
                "a key is in a slot this front-end thought free: it takes another"
            );
        }
        answer == SlotWrite::Done
    }

    /// The write that would have created keys in `slot` on `names` failed its comparisons:
    /// the slot is free again, unless the mirror shows a key in it ([`given_back`]).
    pub(super) fn give_back<'a>(&self, slot: &str, names: impl IntoIterator<Item = &'a str>) {
        given_back(&mut self.guard(), slot, names);
    }
}
