//! Progress in a calm run (no faults but slow answers): a waiter whose wait ran out while
//! every name it asked for was surely free for [`STALL`] or more was left waiting by lockd.
//! Safety checks cannot see this: the waiter is told `TIMEOUT`, which is a fair answer, and
//! the name drains once it goes. A queue that lost its order does it (group commit's first
//! trial: two waiters of one name written by one transaction tied on their revision, and the
//! front-end's mirror kept one of them; the other waited out every wait).
//!
//! "Surely free" is judged from the client's side, leaning to busy: a grant holds its name
//! from its LOCK's send to its UNLOCK's answer, and a LOCK whose outcome the client does not
//! know (no answer, `UNAVAILABLE`, a grant come too late, a client gone while it waited)
//! holds it to the end of the run.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::history::{Call, Op};

/// Longer than any lock-delay the clients ask for (3 s) plus a slow answer both ways.
pub const STALL: Duration = Duration::from_secs(4);

/// One violation per wait that ran out beside a free name.
pub fn stalls(ops: &[Op]) -> Vec<String> {
    let end = ops.iter().map(|o| o.complete).max().unwrap_or_default();
    let busy = busy(ops, end);
    let mut found = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let Call::Lock { name, and, id, .. } = &op.call else {
            continue;
        };
        if op.reply.as_deref() != Some("ERR TIMEOUT") {
            continue;
        }
        // The other holds of every name it asked for, as one busy list.
        let mut held: Vec<(Duration, Duration)> = std::iter::once(name)
            .chain(and)
            .flat_map(|n| busy.get(n.as_str()).into_iter().flatten())
            .filter(|(op, _, _)| *op != i)
            .map(|(_, from, to)| (*from, *to))
            .collect();
        held.sort();
        if let Some((from, to)) = longest_free(&held, op.invoke, op.complete) {
            found.push(format!(
                "progress: {id} waited for {} out ({:?}..{:?}), though it was free \
                 {from:?}..{to:?}",
                std::iter::once(name)
                    .chain(and)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("+"),
                op.invoke,
                op.complete,
            ));
        }
    }
    found
}

/// Per name, when it may have been held: (the LOCK's index in `ops`, from, to).
fn busy(ops: &[Op], end: Duration) -> BTreeMap<&str, Vec<(usize, Duration, Duration)>> {
    let mut busy: BTreeMap<&str, Vec<(usize, Duration, Duration)>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        let Call::Lock { name, and, .. } = &op.call else {
            continue;
        };
        let until = match op.reply.as_deref() {
            Some(ok) if ok.starts_with("OK ") => {
                let token = ok.split(' ').nth(1).and_then(|t| t.parse::<u64>().ok());
                // Its UNLOCK (any of a set's names, with the token): held until answered.
                ops.iter()
                    .filter(|o| o.client == op.client && o.invoke >= op.complete)
                    .find(|o| matches!(&o.call, Call::Unlock { token: t, .. } if Some(*t) == token))
                    .filter(|o| o.reply.is_some())
                    .map_or(end, |o| o.complete)
            }
            // Told it holds nothing.
            Some("LEFT") => continue,
            Some(err) if err.starts_with("ERR ") && !err.starts_with("ERR UNAVAILABLE") => continue,
            _ => end,
        };
        for n in std::iter::once(name).chain(and) {
            busy.entry(n.as_str())
                .or_default()
                .push((i, op.invoke, until));
        }
    }
    busy
}

/// The longest stretch of `from..to` outside every (sorted) interval of `held`, if it is
/// [`STALL`] or longer.
fn longest_free(
    held: &[(Duration, Duration)],
    from: Duration,
    to: Duration,
) -> Option<(Duration, Duration)> {
    let mut best: Option<(Duration, Duration)> = None;
    let mut free_from = from;
    let mut consider = |a: Duration, b: Duration| {
        if b > a && b - a >= STALL && best.is_none_or(|(x, y)| b - a > y - x) {
            best = Some((a, b));
        }
    };
    for (h_from, h_to) in held {
        if *h_from > free_from {
            consider(free_from, (*h_from).min(to));
        }
        free_from = free_from.max(*h_to);
        if free_from >= to {
            break;
        }
    }
    consider(free_from, to);
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Sharing;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn lock(client: usize, id: &str, invoke: u64, complete: u64, reply: Option<&str>) -> Op {
        Op {
            client,
            call: Call::Lock {
                name: "a".into(),
                and: Vec::new(),
                id: id.into(),
                again: false,
                sharing: Sharing::Alone,
            },
            invoke: s(invoke),
            complete: s(complete),
            reply: reply.map(str::to_owned),
        }
    }

    fn unlock(client: usize, token: u64, invoke: u64, complete: u64) -> Op {
        Op {
            client,
            call: Call::Unlock {
                name: "a".into(),
                token,
            },
            invoke: s(invoke),
            complete: s(complete),
            reply: Some("OK".into()),
        }
    }

    #[test]
    fn a_wait_that_ran_out_beside_a_free_name_is_a_stall() {
        // c0 holds a 0..2; c1 waits 1..10 and is told TIMEOUT: free 2..10.
        let ops = [
            lock(0, "c0.1", 0, 0, Some("OK 7")),
            unlock(0, 7, 2, 2),
            lock(1, "c1.1", 1, 10, Some("ERR TIMEOUT")),
        ];
        let found = stalls(&ops);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("c1.1"), "{found:?}");
    }

    #[test]
    fn a_wait_beside_a_holder_or_an_unknown_outcome_is_no_stall() {
        // Held all along (no UNLOCK), then free for less than the bound.
        let held = [
            lock(0, "c0.1", 0, 0, Some("OK 7")),
            lock(1, "c1.1", 1, 10, Some("ERR TIMEOUT")),
        ];
        assert!(stalls(&held).is_empty());
        let short = [
            lock(0, "c0.1", 0, 0, Some("OK 7")),
            unlock(0, 7, 7, 7),
            lock(1, "c1.1", 1, 10, Some("ERR TIMEOUT")),
        ];
        assert!(stalls(&short).is_empty());
        // A LOCK without an answer may hold it to the end.
        let unknown = [
            lock(0, "c0.1", 0, 1, None),
            lock(1, "c1.1", 1, 10, Some("ERR TIMEOUT")),
        ];
        assert!(stalls(&unknown).is_empty());
        // A waiter told it left holds nothing: the name was free.
        let left = [
            lock(0, "c0.1", 0, 9, Some("ERR TIMEOUT")),
            lock(1, "c1.1", 1, 10, Some("ERR TIMEOUT")),
        ];
        assert_eq!(stalls(&left).len(), 2);
    }
}
