//! What changed while a front-end's watch was behind: an etcd compaction overtook it, and it
//! read every lock again into a fresh mirror. Its watchers are told what the two mirrors
//! show, so that a WATCH (and whoever follows one: a client waiting for a broken lease, a
//! dashboard) misses no lease that began, was broken or ended meanwhile:
//!
//! - a lease the old mirror did not have: `acquired`;
//! - a lease marked broken meanwhile (a BREAK without `force`): `broken`;
//! - a lease that ended meanwhile: its end's kind, as the name's marker says it when the
//!   marker is still the one that end wrote (it names the holder it ended); a later change on
//!   the name overwrote or deleted it: the end is told as `dropped`, the kind a lease that
//!   went without a word is told as.
//!
//! Per name: ends, then breaks, then grants, each in token order (a grant that came in the
//! gap came after the end that made room for it).

use std::time::Instant;

use crate::locks::Event;

use super::holder_events;
use super::mirror::{HolderRecord, Mirror, NameState};
use super::tokens::Tokens;

/// Keeps in `new` the leases in their lock-delay that `old` kept without a key
/// ([`HolderRecord::keyless`]), and makes such of those whose key went in the gap with no
/// marker naming them (so with their front-end's etcd lease, as far as can be told: a
/// release whose marker a later change hid is kept for its delay too, the safe side). Called
/// before [`events`], so that no end is told for them before their delay is over.
pub(super) fn keep_delays(old: &Mirror, new: &mut Mirror, now: Instant) {
    for (name, was) in &old.names {
        for h in was.holders.values() {
            let is = new.names.get(name);
            if is.is_some_and(|ns| ns.holders.contains_key(&h.rev)) {
                continue;
            }
            let named = is
                .and_then(|ns| ns.marker.as_ref())
                .is_some_and(|m| m.rev == h.rev);
            let kept = match h.keyless {
                true => Some(h.clone()).filter(|h| h.ends_at > now),
                false if named => None,
                false => h.delayed(now),
            };
            if let Some(kept) = kept {
                new.ends.insert((kept.ends_at, name.clone(), kept.rev));
                let ns = new.names.entry(name.clone()).or_default();
                ns.holders.insert(kept.rev, kept);
            }
        }
    }
}

/// The events between `old` and `new`, two mirrors of one prefix, told at `wall_ms`.
pub(super) fn events(old: &Mirror, new: &Mirror, wall_ms: u64) -> Vec<Event> {
    let empty = NameState::default();
    let mut names: Vec<&String> = old.names.keys().chain(new.names.keys()).collect();
    names.sort();
    names.dedup();
    let mut out = Vec::new();
    for name in names {
        let was = old.names.get(name).unwrap_or(&empty);
        let is = new.names.get(name).unwrap_or(&empty);
        name_events((new.tokens, wall_ms), name, was, is, &mut out);
    }
    out
}

fn name_events(
    (tokens, wall_ms): (Tokens, u64),
    name: &str,
    was: &NameState,
    is: &NameState,
    out: &mut Vec<Event>,
) {
    for gone in was
        .holders
        .values()
        .filter(|h| !is.holders.contains_key(&h.rev))
    {
        let marker = is.marker.as_ref().filter(|m| m.rev == gone.rev);
        out.push(holder_events::ended(tokens, name, gone, marker, wall_ms));
    }
    let both = is
        .holders
        .values()
        .filter_map(|h| Some((was.holders.get(&h.rev)?, h)));
    out.extend(
        both.filter_map(|(was, is)| holder_events::breaking(tokens, name, was, is, wall_ms)),
    );
    let new = is
        .holders
        .values()
        .filter(|h| !was.holders.contains_key(&h.rev));
    out.extend(new.map(|h: &HolderRecord| holder_events::acquired(tokens, name, h)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::etcd::mirror;
    use crate::locks::EventKind;

    fn kinds(events: &[Event]) -> Vec<(&str, crate::locks::Token)> {
        events.iter().map(|e| (e.kind.as_str(), e.token)).collect()
    }

    #[test]
    fn nothing_changed_tells_nothing() {
        let a = mirror::tests::one_holder("n", 5, None);
        let b = mirror::tests::one_holder("n", 5, None);
        assert!(events(&a, &b, 0).is_empty());
    }

    #[test]
    fn a_hand_over_in_the_gap_is_its_end_then_its_grant() {
        let a = mirror::tests::one_holder("n", 5, None);
        let mut b = mirror::tests::one_holder("n", 9, Some((EventKind::Released, 5)));
        b.tokens = a.tokens;
        let got = events(&a, &b, 0);
        assert_eq!(
            kinds(&got),
            vec![
                ("released", a.tokens.base + 5),
                ("acquired", a.tokens.base + 9)
            ]
        );
    }

    #[test]
    fn an_end_whose_marker_was_overwritten_is_told_as_dropped() {
        let a = mirror::tests::one_holder("n", 5, None);
        let b = mirror::tests::one_holder("n", 9, Some((EventKind::Expired, 7)));
        assert_eq!(kinds(&events(&a, &b, 0))[0], ("dropped", a.tokens.base + 5));
    }

    #[test]
    fn a_break_in_the_gap_is_told() {
        let a = mirror::tests::one_holder("n", 5, None);
        let mut b = mirror::tests::one_holder("n", 5, None);
        for h in b.names.get_mut("n").unwrap().holders.values_mut() {
            h.value.broken_by = Some(crate::locks::Origin::default());
        }
        let got = events(&a, &b, 0);
        assert_eq!(kinds(&got), vec![("broken", a.tokens.base + 5)]);
        assert_eq!(got[0].kind, EventKind::Breaking);
    }
}
