//! The WATCH events a holder's changes make: its grant, a BREAK that leaves it in its place,
//! its end (why, from the marker written with it; how long it was held by the wall clock
//! the caller gives). Every front-end makes the same ones from
//! the same changes (the mirror's, a read's gap, a lock-delay's end). Pure, no I/O.

use std::sync::Arc;
use std::time::Duration;

use crate::locks::{Event, EventKind, Origin};

use super::tokens::Tokens;

use super::marks::MarkerValue;
use super::mirror::HolderRecord;
use super::values::HolderValue;

/// The event of `holder`'s grant.
pub(super) fn acquired(tokens: Tokens, name: &str, holder: &HolderRecord) -> Event {
    Event {
        waited: holder.value.waited_ms.map(Duration::from_millis),
        note: holder.value.note(),
        ..holder_event(EventKind::Acquired, tokens, name, holder)
    }
}

/// The event of a BREAK without `force` that `now` shows and `was` did not (over for its
/// holder, still in its place), if it is one.
pub(super) fn breaking(
    tokens: Tokens,
    name: &str,
    was: &HolderRecord,
    now: &HolderRecord,
    wall_ms: u64,
) -> Option<Event> {
    let (None, Some(by)) = (&was.value.broken_by, &now.value.broken_by) else {
        return None;
    };
    Some(Event {
        held: held(&now.value, wall_ms),
        broken_by: by.clone(),
        ..holder_event(EventKind::Breaking, tokens, name, now)
    })
}

/// The event of `holder`'s end: `marker` (written by the transaction that ended it) says
/// why; without one, the lease went with its front-end's etcd lease (`dropped`).
pub(super) fn ended(
    tokens: Tokens,
    name: &str,
    holder: &HolderRecord,
    marker: Option<&MarkerValue>,
    wall_ms: u64,
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
        held: held(&holder.value, wall_ms),
        broken_by,
        ..holder_event(kind, tokens, name, holder)
    }
}

fn holder_event(kind: EventKind, tokens: Tokens, name: &str, holder: &HolderRecord) -> Event {
    Event {
        kind,
        name: Arc::from(name),
        id: holder.value.id.as_str().into(),
        token: tokens.of(holder.rev, &holder.slot),
        held: Duration::ZERO,
        waited: None,
        origin: holder.value.origin(),
        note: None,
        broken_by: Origin::default(),
    }
}

/// How long a lease has been held at `wall_ms`, by the wall clock its grant was written
/// with.
fn held(value: &HolderValue, wall_ms: u64) -> Duration {
    Duration::from_millis(wall_ms.saturating_sub(value.granted_ms))
}
