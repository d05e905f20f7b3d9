//! The history of a chaos run, and a checker of lockd's promises over it.
//!
//! Clients record every operation with its invoke and complete times on one clock (this
//! process's monotonic clock), its request and its reply; observers record the queue as a
//! front-end showed it (`STATUS <name> detail`) and the events a WATCH delivered. After the
//! run, [`History::check`] looks for what must never happen, by the recorded times alone:
//!
//! - **holders at once that may not be**: the intervals in which clients believed they held
//!   a lock (from the `OK` of their LOCK to the moment they sent its UNLOCK) overlap for two
//!   exclusive holders, for holders of two kinds (exclusive, shared, a semaphore's slot), or
//!   for more of a semaphore's holders than its slots;
//! - **a token out of order**: a grant completed before another grant (of any name) was
//!   even asked for, yet has the larger token; or one token granted to two LOCKs;
//! - **a grant to a waiter that had left**: the client was told its wait ended
//!   (`ERR TIMEOUT`, `ERR REPLACED`, `ERR SUPERSEDED`; or `LEFT`, the simulator's session
//!   waiter that vanished while it waited), never sent that LOCK again, and the grant to it
//!   was made after a grant that was asked for (first sent: a LOCK sent again may claim the
//!   grant of its first send) after that answer (tokens follow grant order); or such a grant
//!   sat out its ttl (`expired` after that answer) instead of being taken back at once;
//! - **FIFO broken**: a front-end showed waiter X ahead of waiter Y, both were granted in
//!   the end and neither LOCK was sent again (a resent LOCK rightly goes to the back), yet Y
//!   was granted first.
//!
//! Every LOCK of a chaos client uses an id of its own, reused only to send that same LOCK
//! again (after a lost connection or `ERR UNAVAILABLE`), so an id names one request.
//!
//! A LOCK of a set (`and=`) is judged on each of its names: its grant (`OK <token> <token2>
//! ...`, a token per name) is a holder of every name, from its `OK` to the UNLOCK that ends
//! the set (of any of its names, with that name's token), and it waits in every name's queue.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a client asked.
#[derive(Clone, Debug)]
pub enum Call {
    /// `again`: the same LOCK sent again (same id) after its answer was lost or UNAVAILABLE.
    /// `and`: a set's further names (`and=`), empty for one name. `sharing`: how it holds them.
    Lock {
        name: String,
        and: Vec<String>,
        id: String,
        again: bool,
        sharing: Sharing,
    },
    Unlock {
        name: String,
        token: u64,
    },
}

/// How a LOCK holds its names: alone (a plain LOCK), a share beside other shares
/// (`shared`), or one of a semaphore's slots (`limit=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sharing {
    #[default]
    Alone,
    Shared,
    Slots(u32),
}

/// One operation: `reply` is `None` when the connection went before an answer.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    pub call: Call,
    pub invoke: Duration,
    pub complete: Duration,
    pub reply: Option<String>,
}

/// The queue of `name` as one front-end showed it, waiter ids in grant order, read between
/// `invoke` and `complete`.
#[derive(Clone, Debug)]
pub struct Queue {
    pub name: String,
    pub ids: Vec<String>,
    pub invoke: Duration,
    pub complete: Duration,
}

/// One WATCH event line.
#[derive(Clone, Debug)]
pub struct Seen {
    pub kind: String,
    pub name: String,
    pub id: String,
    pub token: u64,
    pub at: Duration,
}

#[derive(Default)]
struct Records {
    ops: Vec<Op>,
    queues: Vec<Queue>,
    events: Vec<Seen>,
    /// What the test did to the processes (kills, restarts, cuts), for a failure's trail.
    marks: Vec<(Duration, String)>,
}

/// A history being recorded; shared by every client and observer thread.
pub struct History {
    start: Instant,
    records: Mutex<Records>,
}

/// What the checker found.
#[derive(Debug)]
pub struct Verdict {
    pub ops: usize,
    /// LOCKs whose connection ended (or went silent past the clients' read timeout) before
    /// an answer: expected where front-ends are killed, never where they all run.
    pub unanswered: usize,
    pub grants: usize,
    pub queues: usize,
    pub events: usize,
    pub violations: Vec<String>,
    /// For a failure: the operations and events of every id a violation names, and what
    /// the test did around them, in time order.
    pub trail: Vec<String>,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "history: {} operations checked ({} grants, {} LOCKs unanswered, {} queue views, \
             {} events), violations: {}",
            self.ops,
            self.grants,
            self.unanswered,
            self.queues,
            self.events,
            self.violations.len()
        )
    }
}

impl Default for History {
    fn default() -> History {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            records: Mutex::default(),
        }
    }

    /// Now, on the history's clock.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `call` (which returns the reply, `None` if the connection went) and records it.
    pub fn record(
        &self,
        client: usize,
        call: Call,
        run: impl FnOnce() -> Option<String>,
    ) -> Option<String> {
        let invoke = self.now();
        let reply = run();
        let complete = self.now();
        self.add(Op {
            client,
            call,
            invoke,
            complete,
            reply: reply.clone(),
        });
        reply
    }

    pub fn add(&self, op: Op) {
        self.records().ops.push(op);
    }

    pub fn add_queue(&self, queue: Queue) {
        self.records().queues.push(queue);
    }

    pub fn add_event(&self, seen: Seen) {
        self.records().events.push(seen);
    }

    /// Records an `EVENT <kind> <name> <id> <token> <unix-ms>` line a WATCH delivered.
    pub fn add_event_line(&self, line: &str) {
        let w: Vec<&str> = line.split(' ').collect();
        if let ["EVENT", kind, name, id, token, ..] = w[..] {
            if let Ok(token) = token.parse() {
                self.add_event(Seen {
                    kind: kind.into(),
                    name: name.into(),
                    id: id.into(),
                    token,
                    at: self.now(),
                });
            }
        }
    }

    /// Records the queue of `name` from a `STATUS <name> detail` answer's lines.
    pub fn add_detail(&self, name: &str, lines: &[String], invoke: Duration) {
        let ids = lines
            .iter()
            .filter(|l| l.starts_with("WAITER "))
            .filter_map(|l| {
                l.split(' ')
                    .find_map(|w| w.strip_prefix("id="))
                    .map(str::to_owned)
            })
            .collect();
        self.add_queue(Queue {
            name: name.into(),
            ids,
            invoke,
            complete: self.now(),
        });
    }

    /// Records what the test did to a process now (`"kill front-end 1"`), for the trail.
    pub fn mark(&self, what: impl Into<String>) {
        let at = self.now();
        self.records().marks.push((at, what.into()));
    }

    pub fn check(&self) -> Verdict {
        let r = self.records();
        let mut verdict = check(&r.ops, &r.queues, &r.events);
        verdict.trail = trail(&r, &verdict.violations);
        verdict
    }
}

/// How far around the trail's operations the test's marks are shown.
const MARKS_AROUND: Duration = Duration::from_secs(3);

/// The operations and events of every LOCK id named in `violations`, with the marks
/// within [`MARKS_AROUND`] of them, in time order.
fn trail(r: &Records, violations: &[String]) -> Vec<String> {
    let words: HashSet<&str> = violations
        .iter()
        .flat_map(|v| v.split(|c: char| c.is_whitespace() || c == ','))
        .collect();
    let named = |id: &str| words.contains(id);
    let mut lines: Vec<(Duration, String)> = Vec::new();
    for op in &r.ops {
        if let Call::Lock { id, .. } = &op.call {
            if named(id) {
                lines.push((
                    op.invoke,
                    format!("{:?}..{:?} {op:?}", op.invoke, op.complete),
                ));
            }
        }
    }
    for e in r.events.iter().filter(|e| named(&e.id)) {
        lines.push((
            e.at,
            format!(
                "{:?} event {} {} {} {}",
                e.at, e.kind, e.name, e.id, e.token
            ),
        ));
    }
    let (Some(first), Some(last)) = (
        lines.iter().map(|l| l.0).min(),
        lines.iter().map(|l| l.0).max(),
    ) else {
        return Vec::new();
    };
    let window = first.saturating_sub(MARKS_AROUND)..last + MARKS_AROUND;
    for (at, what) in r.marks.iter().filter(|(at, _)| window.contains(at)) {
        lines.push((*at, format!("{at:?} test: {what}")));
    }
    lines.sort_by_key(|l| l.0);
    lines.into_iter().map(|l| l.1).collect()
}

/// A LOCK answered `OK`.
struct Grant<'a> {
    client: usize,
    name: &'a str,
    id: &'a str,
    token: u64,
    invoke: Duration,
    complete: Duration,
    /// When its client sent the UNLOCK (or the history ended): the end of its section.
    until: Duration,
    sharing: Sharing,
}

/// Whether a LOCK's answer told the client its wait ended without a grant. Not
/// `ERR UNAVAILABLE`: that LOCK may have been granted after all (the same LOCK again gets it).
pub fn told_it_left(reply: &str) -> bool {
    // `LEFT`: the client went while it waited (the simulator's), told nothing.
    reply == "LEFT"
        || reply.starts_with("ERR TIMEOUT")
        || reply.starts_with("ERR REPLACED")
        || reply.starts_with("ERR SUPERSEDED")
}

/// Every token of a grant, one per name in the LOCK's order; `None` for anything else.
fn tokens_of(reply: &Option<String>) -> Option<Vec<u64>> {
    let tokens = reply.as_deref()?.strip_prefix("OK ")?;
    tokens.split(' ').map(|t| t.parse().ok()).collect()
}

/// What is wrong with grant `g` beside the grants of its name still `open` when it came, if
/// anything.
fn crowded(open: &[&Grant], g: &Grant) -> Option<String> {
    let o = open.iter().max_by_key(|o| o.until)?;
    let held = |x: &Grant| {
        format!(
            "client {} (token {}, {:?}, held {:?}..{:?})",
            x.client, x.token, x.sharing, x.complete, x.until
        )
    };
    if let Some(other) = open.iter().find(|o| o.sharing != g.sharing) {
        return Some(format!(
            "{} held two ways at once: {} and {}",
            g.name,
            held(other),
            held(g)
        ));
    }
    match g.sharing {
        Sharing::Alone => Some(format!(
            "two holders of {}: client {} (token {}, held {:?}..{:?}) and client {} \
             (token {}, from {:?})",
            g.name, o.client, o.token, o.complete, o.until, g.client, g.token, g.complete
        )),
        Sharing::Shared => None,
        Sharing::Slots(n) if open.len() < n as usize => None,
        Sharing::Slots(n) => Some(format!(
            "{} holders of {}, a semaphore of {n}: {}",
            open.len() + 1,
            g.name,
            open.iter()
                .chain(std::iter::once(&g))
                .map(|x| held(x))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The checks described in the module's doc, over recorded operations, queue views and
/// events.
pub fn check(ops: &[Op], queues: &[Queue], events: &[Seen]) -> Verdict {
    let mut violations = Vec::new();
    let end = ops.iter().map(|o| o.complete).max().unwrap_or_default();
    // Each client's operations in order, to find the UNLOCK that ends each grant.
    let mut by_client: BTreeMap<usize, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_client.entry(op.client).or_default().push(op);
    }
    let mut grants: Vec<Grant> = Vec::new();
    for list in by_client.values_mut() {
        list.sort_by_key(|o| o.invoke);
        for (i, op) in list.iter().enumerate() {
            let Call::Lock {
                name,
                and,
                id,
                sharing,
                ..
            } = &op.call
            else {
                continue;
            };
            let Some(tokens) = tokens_of(&op.reply) else {
                continue;
            };
            let names: Vec<&str> = std::iter::once(name)
                .chain(and)
                .map(String::as_str)
                .collect();
            if tokens.len() != names.len() {
                violations.push(format!(
                    "{id}: {} tokens for {} names: {:?}",
                    tokens.len(),
                    names.len(),
                    op.reply
                ));
                continue;
            }
            // The set ends with an UNLOCK of any of its names, with that name's token.
            let ends = |o: &&&Op| {
                let Call::Unlock { name: n, token: t } = &o.call else {
                    return false;
                };
                names
                    .iter()
                    .zip(&tokens)
                    .any(|(name, token)| n == name && t == token)
            };
            let until = list[i + 1..].iter().find(ends).map_or(end, |o| o.invoke);
            for (name, token) in names.into_iter().zip(tokens) {
                grants.push(Grant {
                    client: op.client,
                    name,
                    id,
                    token,
                    invoke: op.invoke,
                    complete: op.complete,
                    until,
                    sharing: *sharing,
                });
            }
        }
    }

    // Holders at once: an exclusive holder alone, shares beside shares, a semaphore's
    // holders up to its slots, and never two of these kinds at once.
    let mut by_name: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in &grants {
        by_name.entry(g.name).or_default().push(g);
    }
    for list in by_name.values_mut() {
        // Grants completed in the same instant (a release's own write granted the next holder
        // in the millisecond its UNLOCK was answered) come in grant order, their tokens', not in
        // the hash order of the clients they were gathered from.
        list.sort_by_key(|g| (g.complete, g.token));
        let mut open: Vec<&Grant> = Vec::new();
        for g in list.iter() {
            open.retain(|o| o.until > g.complete);
            violations.extend(crowded(&open, g));
            open.push(g);
        }
    }

    // A token is never reused: two grants with one token are one LOCK's (its names, or its
    // grant told again to the same LOCK sent again).
    let mut by_token: HashMap<u64, &Grant> = HashMap::new();
    for g in &grants {
        let first = by_token.entry(g.token).or_insert(g);
        if first.id != g.id {
            violations.push(format!(
                "token {} granted twice: {} of {} (client {}) and {} of {} (client {})",
                g.token, first.id, first.name, first.client, g.id, g.name, g.client
            ));
        }
    }

    // When each id's LOCK was first sent: a LOCK sent again (after `UNAVAILABLE`) may claim a
    // grant made for its first send, before anything asked after that.
    let mut first_sent: HashMap<&str, Duration> = HashMap::new();
    for op in ops {
        if let Call::Lock { id, .. } = &op.call {
            let at = first_sent.entry(id.as_str()).or_insert(op.invoke);
            *at = (*at).min(op.invoke);
        }
    }
    let asked_at = |g: &Grant| first_sent.get(g.id).copied().unwrap_or(g.invoke);

    // Tokens in real-time order of grants: every grant completed before this one was asked
    // for (first sent: a LOCK sent again may claim the grant of its first send, made before
    // a grant that completed in between, which a semaphore's or shared holders can hold at
    // once) has a smaller token: of its name, and of any name (proto.md: "strictly greater
    // than every token granted before it ... for any name").
    // (Across names, only a pair of two names: one name's pairs are found on their own.)
    let every: Vec<&Grant> = grants.iter().collect();
    let lists = by_name.values().map(|l| (l, false));
    for (list, across) in lists.chain([(&every, true)]) {
        let mut done: Vec<&Grant> = list.to_vec();
        done.sort_by_key(|g| (g.complete, g.token));
        let mut asked: Vec<&Grant> = list.to_vec();
        asked.sort_by_key(|g| (asked_at(g), g.token));
        let (mut i, mut max): (usize, Option<&Grant>) = (0, None);
        for g in asked {
            while i < done.len() && done[i].complete < asked_at(g) {
                if max.is_none_or(|m| done[i].token > m.token) {
                    max = Some(done[i]);
                }
                i += 1;
            }
            if let Some(m) = max {
                if m.token >= g.token && (!across || m.name != g.name) {
                    violations.push(format!(
                        "token regressed on {}: {} (client {}, asked at {:?}) after {} of {} \
                         (client {}, granted by {:?})",
                        g.name,
                        g.token,
                        g.client,
                        asked_at(g),
                        m.token,
                        m.name,
                        m.client,
                        m.complete
                    ));
                }
            }
        }
    }

    // Waiters that were told their wait ended, and never sent that LOCK again.
    let mut last_lock: HashMap<&str, &Op> = HashMap::new();
    let mut resent: HashSet<&str> = HashSet::new();
    for op in ops {
        if let Call::Lock { id, again, .. } = &op.call {
            if *again {
                resent.insert(id);
            }
            let later = last_lock
                .get(id.as_str())
                .is_none_or(|o| o.invoke < op.invoke);
            if later {
                last_lock.insert(id, op);
            }
        }
    }
    let told_left: HashMap<&str, Duration> = last_lock
        .iter()
        .filter(|(_, op)| op.reply.as_deref().is_some_and(told_it_left))
        .map(|(id, op)| (*id, op.complete))
        .collect();
    for e in events.iter().filter(|e| e.kind == "acquired") {
        let Some(&told) = told_left.get(e.id.as_str()) else {
            continue;
        };
        let later = grants.iter().find(|g| {
            let asked = asked_at(g);
            g.name == e.name && asked > told && g.token < e.token
        });
        if let Some(g) = later {
            violations.push(format!(
                "{} was granted {} (token {}) after it was told its wait ended at {told:?}: \
                 after token {}, asked at {:?}",
                e.id, e.name, e.token, g.token, g.invoke
            ));
        }
        // (A lease broken meanwhile lingers until its deadline by design: BREAK without
        // force waits for a holder that never lets go. A lease that ran out before its client
        // was told anything is one proto.md allows: its LOCK's answer was lost, and a lease
        // granted so ends with its ttl unless the same LOCK comes again in time.)
        let ends = |kind: &str, after: Duration| {
            events
                .iter()
                .any(|x| x.kind == kind && x.token == e.token && x.name == e.name && x.at >= after)
        };
        // Front-ends tell an expiry each as its own view reaches it: the lease ran out at the
        // first of them (one that had run out before its client was told is allowed, as
        // above; a front-end whose watch was behind may tell it seconds later).
        let ran_out = events
            .iter()
            .filter(|x| x.kind == "expired" && x.token == e.token && x.name == e.name)
            .map(|x| x.at)
            .min();
        let expired = ran_out.is_some_and(|at| at >= told) && !ends("broken", Duration::ZERO);
        if expired {
            violations.push(format!(
                "the grant of {} to {} (token {}), which had left, sat out its ttl",
                e.name, e.id, e.token
            ));
        }
    }

    // FIFO, as queues were shown.
    // An id's grant, by name: a set's tokens are one per name.
    let final_token: HashMap<(&str, &str), u64> = last_lock
        .iter()
        .filter_map(|(id, op)| {
            let Call::Lock { name, and, .. } = &op.call else {
                return None;
            };
            let names = std::iter::once(name).chain(and).map(String::as_str);
            Some(names.zip(tokens_of(&op.reply)?).map(|(n, t)| ((*id, n), t)))
        })
        .flatten()
        .collect();
    let mut reported: HashSet<(String, String)> = HashSet::new();
    for q in queues {
        let kept: Vec<(&str, u64)> = q
            .ids
            .iter()
            .filter(|id| !resent.contains(id.as_str()))
            .filter_map(|id| {
                let t = final_token.get(&(id.as_str(), q.name.as_str()))?;
                Some((id.as_str(), *t))
            })
            .collect();
        for (i, (x, tx)) in kept.iter().enumerate() {
            for (y, ty) in &kept[i + 1..] {
                if tx > ty && reported.insert((x.to_string(), y.to_string())) {
                    violations.push(format!(
                        "FIFO: {x} was ahead of {y} in the queue of {} (seen at {:?}) but got \
                         token {tx} after {y}'s {ty}",
                        q.name, q.invoke
                    ));
                }
            }
        }
    }

    let unanswered = ops
        .iter()
        .filter(|o| matches!(o.call, Call::Lock { .. }) && o.reply.is_none())
        .count();
    Verdict {
        ops: ops.len(),
        unanswered,
        grants: grants.len(),
        queues: queues.len(),
        events: events.len(),
        violations,
        trail: Vec::new(),
    }
}
