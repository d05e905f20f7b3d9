//! What a write's answer means for the slot (`slots.rs`) of the keys it would have created,
//! as the front-end's core decides it: made, the slot stays taken by its keys; refused, it is
//! free again (unless the mirror shows a key in it); found a key in it (a slot thought free
//! by mistake, or a key this front-end can't read), it stays taken and the request takes
//! another. Pure: `slot_writes.rs` is its driver (it takes slots and logs the last case).

use super::guards::{slot_write, SlotWrite};
use super::rpc::TxnResponse;
use super::ClusterState;

/// Steps the core with `resp`, the answer to an [`super::guards::in_empty_slot`] write of
/// keys in `slot` on `names`: the slot kept or given back as it says; what it says.
pub(super) fn slot_answered<'a>(
    g: &mut ClusterState,
    slot: &str,
    names: impl IntoIterator<Item = &'a str>,
    resp: &TxnResponse,
) -> SlotWrite {
    let answer = slot_write(resp);
    match answer {
        SlotWrite::Done => {}
        SlotWrite::Refused => given_back(g, slot, names),
        SlotWrite::Taken => g.slots.give_back(slot, names.into_iter().count()),
    }
    answer
}

/// The write that would have created keys in `slot` on `names` failed its comparisons: the
/// slot is free again, unless the mirror shows a key in it.
pub(super) fn given_back<'a>(
    g: &mut ClusterState,
    slot: &str,
    names: impl IntoIterator<Item = &'a str>,
) {
    let present = names
        .into_iter()
        .filter(|n| g.mirror.name(n).is_some_and(|ns| ns.uses_slot(slot)))
        .count();
    g.slots.give_back(slot, present);
}
