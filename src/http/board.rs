//! What the web view shows, as JSON: every held lock a viewer may read with its holders and
//! queue, and the events WATCH tells. Built from the backend's STATUS answers, so the page
//! shows exactly what `STATUS <name> detail` would.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::backend::{Backend, Published};
use crate::locks::{EventKind, LockStatus, WaiterStatus};
use crate::proto;

/// The board as one moment saw it.
pub struct Board {
    /// The JSON the page renders.
    pub json: Value,
    /// Who holds and waits where, without the times, which change by the millisecond: two
    /// boards with one shape show the same thing, and the page counts the times on itself.
    pub shape: u64,
}

/// Which names a viewer is shown: under `prefix` (all for none) and readable by it.
pub struct Filter<'a> {
    /// The name prefix, without a trailing `*`.
    pub prefix: Option<&'a str>,
    /// Whether the viewer may read a name (its `read=` rights, as for STATUS).
    pub may_read: &'a (dyn Fn(&str) -> bool + Send + Sync),
}

impl Filter<'_> {
    /// Whether `name` is shown.
    pub fn shows(&self, name: &str) -> bool {
        self.prefix.is_none_or(|p| name.starts_with(p)) && (self.may_read)(name)
    }
}

/// The locks `filter` shows, at most `max` of them in name order (the rest counted).
pub async fn board(backend: &Backend, filter: &Filter<'_>, max: usize) -> Result<Board, String> {
    let view = backend
        .status_snapshot()
        .await
        .map_err(|e| e.refusal("").to_string())?;
    let now = unix_ms();
    let mut shape = DefaultHasher::new();
    let mut locks = Vec::new();
    let mut more = 0usize;
    for status in view.iter().filter(|s| filter.shows(&s.name)) {
        if locks.len() == max {
            more += 1;
            continue;
        }
        // The lock may have gone since the snapshot: then it is not shown.
        let Ok(Some(detail)) = backend
            .status_detail(&status.name, proto::DETAIL_WAITERS)
            .await
        else {
            continue;
        };
        let status = detail.status;
        status.name.hash(&mut shape);
        let holders: Vec<Value> = detail
            .holders
            .iter()
            .map(|h| {
                // A RENEW moves the deadline: to the second, the page counts the rest.
                let deadline = (now + millis(h.left)) / 1000;
                (&h.holder, h.token, h.lingering, &h.note, deadline).hash(&mut shape);
                holder(h)
            })
            .collect();
        let queue: Vec<Value> = detail
            .queue
            .iter()
            .map(|w| {
                (&w.id, w.session).hash(&mut shape);
                waiter(w)
            })
            .collect();
        status.waiters.hash(&mut shape);
        locks.push(json!({
            "name": &*status.name,
            "mode": status.mode.to_string(),
            "holders": holders,
            "queue": queue,
            "waiting": status.waiters,
        }));
    }
    more.hash(&mut shape);
    let aged = backend.view_age().map(|a| {
        json!({
            "age_ms": millis(a.age),
            "bound_ms": millis(a.bound),
        })
    });
    Ok(Board {
        json: json!({
            "at_unix_ms": now,
            "locks": locks,
            "more": more,
            "etcd": aged,
        }),
        shape: shape.finish(),
    })
}

fn holder(h: &LockStatus) -> Value {
    json!({
        "id": &*h.holder,
        "user": h.origin.user(),
        "peer": h.origin.peer().map(|p| p.to_string()),
        "note": h.note.as_deref(),
        "token": h.token,
        "held_ms": millis(h.held),
        "left_ms": millis(h.left),
        "session": h.session,
        "lingering": h.lingering,
        "set": h.set.iter().map(|n| &**n).collect::<Vec<_>>(),
    })
}

fn waiter(w: &WaiterStatus) -> Value {
    json!({
        "id": &*w.id,
        "waited_ms": millis(w.waited),
        "session": w.session,
        "mode": w.mode.to_string(),
        "set": w.set.iter().map(|n| &**n).collect::<Vec<_>>(),
    })
}

/// One event as WATCH tells it (`Revoked` is `dropped`, `Breaking` is `broken` there too).
pub fn event(p: &Published) -> Value {
    let e = &p.event;
    json!({
        "kind": e.kind.as_str(),
        "name": &*e.name,
        "id": &*e.id,
        "token": e.token,
        "held_ms": millis(e.held),
        "waited_ms": e.waited.map(millis),
        "note": e.note.as_deref(),
        "by": matches!(e.kind, EventKind::Broken | EventKind::Breaking).then(|| e.broken_by.who()),
        "at_unix_ms": p.unix_ms,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}
