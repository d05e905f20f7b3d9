//! Model test of the pure lock table (`lockd::locks::Locks`).
//!
//! Random histories of LOCK / UNLOCK / RENEW / CHECK / BREAK / cancelled waits / closed
//! sessions / passing time are run against the table and against a small reference model
//! (`model/reference.rs`) in lockstep, with exact time (a base instant plus whole
//! milliseconds, often landing exactly on a deadline). Every return value and every effect
//! must be equal, and after every step the documented invariants are checked again from the
//! outside (`model/observer.rs`): one holder per name, tokens that only grow, FIFO grants, no
//! grant to a waiter that left, no waiter left waiting that is first in line and fits,
//! `next_deadline()` and STATUS in agreement. After the history, time alone must empty the
//! table (no stall).
//!
//! LOCKs name sets too (`and=`, up to three names): one lease, one token on every name,
//! granted whole when first in line on each, ended whole by one call. Of several waiters
//! ready at once the table picks who goes first (the model checks each was ready). The etcd
//! part (the cluster's decision of the same LOCK, through its own view of the names, sets
//! among them) is judged on every LOCK: the answer, and where it waits and whom it ends.
//!
//! Requests come from several users (and from [`NO_USER`], as without authentication): the
//! harness checks on its own that a lease is only ever renewed or released by its user and
//! that no LOCK is answered with another user's token, whatever id it names.
//!
//! The plain tests at the end pin the tricky rules of proto.md one by one.

mod observer;
mod reference;

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use lockd::locks::{
    ConnId, Effect, Event, EventKind, Limits, LockOutcome, LockRequest, Locks, Mode, TableError,
    Tie, Token, UserId, WaitEnd, WaiterId, NO_USER,
};
use proptest::prelude::*;

use observer::{Call, Observer};
use reference::{MLimits, MLock, Model};

const NAMES: [&str; 3] = ["a", "b", "c"];
const IDS: [&str; 4] = ["p", "q", "r", "s"];
/// Notes a LOCK may carry (or none): the model checks which one a holder ends up with.
const NOTES: [&str; 2] = ["first note", "100% ☃"];

#[derive(Clone, Debug)]
enum TtlPick {
    Default,
    Zero,
    /// Folded into 1..=max_ttl.
    Ms(u64),
    Max,
    OverMax,
}

#[derive(Clone, Debug)]
enum WaitPick {
    Forever,
    Zero,
    Ms(u64),
}

/// A token chosen against the state at the time of the step, so that most are meaningful.
#[derive(Clone, Debug)]
enum TokPick {
    /// A live token of the name, the n-th holder's modulo their number (or a stale one if
    /// the name is free).
    Holder(usize),
    /// Off by one from the live token.
    Near(bool),
    /// One granted earlier (often no longer live).
    Seen(usize),
    Raw(u64),
}

/// A LOCK's session option: none (a plain lease), or a session lease with a grace.
#[derive(Clone, Debug)]
enum SessionPick {
    Plain,
    /// Grace zero: today's `session`.
    Zero,
    /// Folded into 1..=max_ttl.
    Ms(u64),
    OverMax,
}

#[derive(Clone, Debug)]
enum ConnPick {
    /// The connection the name's session lease is bound to, if any.
    Holder,
    Conn(ConnId),
}

/// Who sends an UNLOCK or RENEW.
#[derive(Clone, Debug)]
enum UserPick {
    /// The user of the lease the token names (if it is live), so most succeed.
    Owner,
    User(UserId),
}

#[derive(Clone, Debug)]
enum WaiterPick {
    /// One still waiting, if any.
    Live(usize),
    /// Any issued so far (often granted or gone).
    Seen(usize),
    Raw(WaiterId),
}

#[derive(Clone, Debug)]
enum Advance {
    By(u64),
    /// Exactly onto the soonest pending deadline.
    ToNext,
    /// One millisecond before it.
    JustBefore,
    /// Past every lease the limits allow.
    Far,
}

#[derive(Clone, Debug)]
enum Op {
    Lock {
        name: usize,
        id: usize,
        ttl: TtlPick,
        wait: WaitPick,
        session: SessionPick,
        conn: ConnId,
        mode: Mode,
        user: UserId,
        /// Index into [`NOTES`]; `None`: no note.
        note: Option<usize>,
        /// `supersede`: a wait takes the whole queue.
        supersede: bool,
        /// `and=`: further names of a set, as indexes into [`NAMES`] (the name itself and
        /// repeats are dropped; none with `supersede`, which the protocol refuses).
        and: Vec<usize>,
        /// `delay=` in ms (the lock-delay); `None`: the server's default (none).
        delay: Option<u64>,
    },
    Unlock {
        name: usize,
        tok: TokPick,
        user: UserPick,
    },
    Renew {
        name: usize,
        tok: TokPick,
        ttl: Option<TtlPick>,
        conn: ConnId,
        user: UserPick,
    },
    Revoke {
        name: usize,
        tok: TokPick,
    },
    Check {
        name: usize,
        tok: TokPick,
    },
    /// BREAK of every holder, or of one token's; `force`: the name passes on at once.
    Break {
        name: usize,
        tok: Option<TokPick>,
        force: bool,
    },
    CancelWait(WaiterPick),
    DropSession {
        name: usize,
        tok: TokPick,
        conn: ConnPick,
    },
    /// Connection `conn` closed: every session lease bound to it ends or starts its grace
    /// (`Locks::close_connection`, what the backend does when a connection closes).
    CloseConnection(ConnId),
    Status {
        name: usize,
    },
    Advance(Advance),
    Expire,
}

fn ttl_pick() -> impl Strategy<Value = TtlPick> {
    prop_oneof![
        3 => Just(TtlPick::Default),
        1 => Just(TtlPick::Zero),
        6 => (1u64..=60).prop_map(TtlPick::Ms),
        1 => Just(TtlPick::Max),
        1 => Just(TtlPick::OverMax),
    ]
}

fn wait_pick() -> impl Strategy<Value = WaitPick> {
    prop_oneof![
        3 => Just(WaitPick::Forever),
        2 => Just(WaitPick::Zero),
        5 => (1u64..=60).prop_map(WaitPick::Ms),
    ]
}

/// Exclusive most often; shared; and semaphores of two sizes, so that a name sees both
/// matching and mismatching limits.
fn mode_pick() -> impl Strategy<Value = Mode> {
    prop_oneof![
        4 => Just(Mode::Exclusive),
        3 => Just(Mode::Shared),
        2 => Just(Mode::Limit(2)),
        1 => Just(Mode::Limit(3)),
    ]
}

fn session_pick() -> impl Strategy<Value = SessionPick> {
    prop_oneof![
        4 => Just(SessionPick::Plain),
        2 => Just(SessionPick::Zero),
        3 => (1u64..=60).prop_map(SessionPick::Ms),
        1 => Just(SessionPick::OverMax),
    ]
}

fn tok_pick() -> impl Strategy<Value = TokPick> {
    prop_oneof![
        6 => (0usize..4).prop_map(TokPick::Holder),
        1 => any::<bool>().prop_map(TokPick::Near),
        2 => (0usize..64).prop_map(TokPick::Seen),
        1 => (0u64..8).prop_map(TokPick::Raw),
    ]
}

/// Mostly one user, so that the same-id rules get exercised; others to cross them; and
/// [`NO_USER`], whose leases anyone may renew or release.
fn user() -> impl Strategy<Value = UserId> {
    prop_oneof![
        5 => Just(1),
        3 => 2u32..=3,
        1 => Just(NO_USER),
    ]
}

fn user_pick() -> impl Strategy<Value = UserPick> {
    prop_oneof![
        3 => Just(UserPick::Owner),
        2 => user().prop_map(UserPick::User),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        10 => (name.clone(), 0..IDS.len(), ttl_pick(), wait_pick(), session_pick(), 1u64..=3,
               mode_pick(), user(), proptest::option::of(0..NOTES.len()),
               proptest::bool::weighted(0.2), and_pick(),
               proptest::option::weighted(0.3, prop_oneof![Just(0u64), 1u64..40]))
            .prop_map(|(name, id, ttl, wait, session, conn, mode, user, note, supersede, and,
                        delay)| {
                Op::Lock { name, id, ttl, wait, session, conn, mode, user, note, supersede, and,
                           delay }
            }),
        3 => (name.clone(), tok_pick(), user_pick())
            .prop_map(|(name, tok, user)| Op::Unlock { name, tok, user }),
        2 => (name.clone(), tok_pick(), proptest::option::of(ttl_pick()), 1u64..=3, user_pick())
            .prop_map(|(name, tok, ttl, conn, user)| Op::Renew { name, tok, ttl, conn, user }),
        1 => (name.clone(), tok_pick()).prop_map(|(name, tok)| Op::Revoke { name, tok }),
        1 => (name.clone(), tok_pick()).prop_map(|(name, tok)| Op::Check { name, tok }),
        1 => (name.clone(), proptest::option::of(tok_pick()), any::<bool>())
            .prop_map(|(name, tok, force)| Op::Break { name, tok, force }),
        2 => prop_oneof![
            4 => (0usize..64).prop_map(WaiterPick::Live),
            3 => (0usize..64).prop_map(WaiterPick::Seen),
            1 => (0u64..10).prop_map(WaiterPick::Raw),
        ].prop_map(Op::CancelWait),
        2 => (name.clone(), tok_pick(), prop_oneof![
            3 => Just(ConnPick::Holder),
            1 => (1u64..=3).prop_map(ConnPick::Conn),
        ]).prop_map(|(name, tok, conn)| Op::DropSession { name, tok, conn }),
        1 => (1u64..=3).prop_map(Op::CloseConnection),
        1 => name.prop_map(|name| Op::Status { name }),
        8 => prop_oneof![
            4 => (0u64..=25).prop_map(Advance::By),
            3 => Just(Advance::ToNext),
            1 => Just(Advance::JustBefore),
            1 => Just(Advance::Far),
        ].prop_map(Op::Advance),
        1 => Just(Op::Expire),
    ]
}

/// Whether LOCK may name a set (`and=`): the table serves them; off, the model test runs
/// as before sets.
const SETS: bool = true;

/// A set's further names: none most often, else one or two (the step drops the LOCK's own
/// name and repeats, so some of these end up smaller).
fn and_pick() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        5 => Just(Vec::new()),
        4 => prop::collection::vec(0..NAMES.len(), 1..=2),
    ]
}

fn limits() -> impl Strategy<Value = (MLimits, Token)> {
    let max_locks = prop_oneof![1 => 1usize..=2, 3 => Just(NAMES.len())];
    // A queue holds at most one waiter per id: as many as IDS never refuses one.
    let max_waiters = prop_oneof![1 => 1usize..=2, 3 => Just(IDS.len())];
    (20u64..=100, max_locks, max_waiters, 0u64..1000).prop_flat_map(
        |(max_ttl, max_locks, max_waiters, first)| {
            (1u64..=max_ttl).prop_map(move |default_ttl| {
                (
                    MLimits {
                        default_ttl,
                        max_ttl,
                        max_locks,
                        max_waiters,
                    },
                    first,
                )
            })
        },
    )
}

/// What the etcd backend decided of a LOCK (holders named by token, waiters by ticket), and
/// what to read it by.
#[cfg(feature = "etcd")]
struct ClusterDecision {
    decision: Result<Decided, TableError>,
    /// The holders' tokens of the LOCK's names.
    tokens: Vec<Token>,
    /// The waiters of its names before it, each once, name by name in the request's order,
    /// first in line first (the order the rules name them in): number and ticket.
    waiting: Vec<(WaiterId, u64)>,
    /// How many names it asked for.
    names: usize,
    supersede: bool,
}

/// A decision of one name's LOCK, or of a set's.
#[cfg(feature = "etcd")]
#[derive(Debug, PartialEq)]
enum Decided {
    One(lockd::locks::rules::Decision<usize, usize>),
    Set(lockd::locks::rules::SetDecision<usize, usize>),
}

/// The table and the model side by side, plus what the picks need to resolve.
struct Harness {
    table: Locks,
    model: Model,
    observer: Observer,
    now: u64,
    tokens: Vec<Token>,
    waiters: Vec<WaiterId>,
    /// The user of every lease granted, by token, and of every waiter: the ownership check
    /// needs nothing of the model.
    owners: HashMap<Token, UserId>,
    waiter_users: HashMap<WaiterId, UserId>,
    log: Vec<String>,
    /// The table's effects of the step so far (see [`Harness::hint`]).
    table_fx: Vec<Effect>,
    /// LOCKs may name sets.
    sets: bool,
    /// The table is compared with the model; else only the model runs (the table's
    /// answers are replaced by the model's), judged by the observer alone.
    judge_table: bool,
}

impl Harness {
    fn new(limits: MLimits, first_token: Token) -> Self {
        let base = Instant::now();
        let table = Locks::new(
            Limits {
                default_ttl: Duration::from_millis(limits.default_ttl),
                max_ttl: Duration::from_millis(limits.max_ttl),
                max_locks: limits.max_locks,
                max_waiters: limits.max_waiters,
                lock_delay: std::time::Duration::ZERO,
                max_lock_delay: std::time::Duration::from_secs(60),
            },
            first_token,
        );
        Harness {
            table,
            model: Model::new(base, limits, first_token),
            observer: Observer::default(),
            now: 0,
            tokens: Vec::new(),
            waiters: Vec::new(),
            owners: HashMap::new(),
            waiter_users: HashMap::new(),
            log: Vec::new(),
            table_fx: Vec::new(),
            sets: SETS,
            judge_table: true,
        }
    }

    /// Takes the table's effects of the call just made (compared later, in
    /// [`Harness::effects`]), and tells the model in which order it granted waiters: of
    /// several ready at once, which goes first is the table's choice (the model checks
    /// that each was ready when granted).
    fn hint(&mut self) {
        let fx = self.table.take_effects();
        if self.judge_table {
            self.model.hint.extend(fx.iter().filter_map(|e| match e {
                Effect::Granted { waiter, .. } => Some(*waiter),
                _ => None,
            }));
            self.table_fx.extend(fx);
        }
    }

    /// What the table answered, or the model's answer when only the model is judged.
    fn judged<T: Clone>(&self, got: T, want: &T) -> T {
        if self.judge_table {
            got
        } else {
            want.clone()
        }
    }

    fn at(&self) -> Instant {
        self.model.at(self.now)
    }

    fn ttl(&self, p: &TtlPick) -> Option<u64> {
        match p {
            TtlPick::Default => None,
            TtlPick::Zero => Some(0),
            TtlPick::Ms(ms) => Some(1 + ms % self.model.limits.max_ttl),
            TtlPick::Max => Some(self.model.limits.max_ttl),
            TtlPick::OverMax => Some(self.model.limits.max_ttl + 1),
        }
    }

    fn token(&self, name: &str, p: &TokPick) -> Token {
        let pick = match p {
            TokPick::Holder(i) => *i,
            _ => 0,
        };
        let holders = self.model.holders_of(name);
        let live = (!holders.is_empty()).then(|| holders[pick % holders.len()].token);
        let last = self.tokens.last().copied().unwrap_or(1);
        match p {
            TokPick::Holder(_) => live.unwrap_or(last),
            TokPick::Near(up) => {
                let t = live.unwrap_or(last);
                if *up {
                    t + 1
                } else {
                    t.saturating_sub(1)
                }
            }
            TokPick::Seen(i) if !self.tokens.is_empty() => self.tokens[i % self.tokens.len()],
            TokPick::Seen(_) => last,
            TokPick::Raw(t) => *t,
        }
    }

    fn note_tokens(&mut self, effects: &[Effect]) {
        for e in effects {
            match e {
                Effect::Event(Event {
                    kind: EventKind::Acquired,
                    token,
                    ..
                }) => self.tokens.push(*token),
                Effect::Granted { waiter, token, .. } => {
                    let user = self.waiter_users.get(waiter).copied().unwrap_or(NO_USER);
                    self.owners.insert(*token, user);
                }
                _ => {}
            }
        }
    }

    /// The user `p` names for a request on `token`.
    fn user(&self, p: &UserPick, token: Token) -> UserId {
        match p {
            UserPick::Owner => self.owners.get(&token).copied().unwrap_or(1),
            UserPick::User(u) => *u,
        }
    }

    /// A renewal or release of `token` by `user` that succeeded: it must have been `user`'s
    /// lease, or a lease of no user.
    fn owned(&self, what: &str, token: Token, user: UserId) -> Result<(), String> {
        match self.owners.get(&token) {
            Some(&owner) if owner != user && owner != NO_USER => Err(format!(
                "{what} {token} by user {user} succeeded, but the lease is user {owner}'s"
            )),
            _ => Ok(()),
        }
    }

    /// What the etcd backend's BREAK of `name` (or of `token` only) ends on the name as the
    /// reference model has it now, read back as tokens.
    #[cfg(feature = "etcd")]
    fn cluster_breaks(
        &mut self,
        now: u64,
        name: &str,
        token: Option<Token>,
    ) -> Result<Vec<Token>, TableError> {
        use lockd::backend::etcd::model::{breaks, HolderPart};
        self.model.process(now);
        let users: Vec<String> = (0..=UserId::from(u8::MAX)).map(|u| u.to_string()).collect();
        let user = |u: UserId| users.get(u as usize).map_or("?", String::as_str);
        let held = self.model.holders_of(name);
        let tokens: Vec<Token> = held.iter().map(|h| h.token).collect();
        let holders: Vec<HolderPart<'_>> = held
            .iter()
            .enumerate()
            .map(|(key, h)| holder_part(key, h, user(h.user)))
            .collect();
        let only = token.map(|t| tokens.iter().position(|x| *x == t).unwrap_or(usize::MAX));
        let ended = breaks(&holders, only)?;
        Ok(ended.into_iter().map(|i| tokens[i]).collect())
    }

    /// What the etcd backend decides of `req` on its names as the reference model has them
    /// now (their holders and queues, sets among them, shown through the cluster's own view
    /// of a name), with what to read the decision by.
    #[cfg(feature = "etcd")]
    fn cluster_decision(&mut self, now: u64, req: &LockRequest) -> ClusterDecision {
        use lockd::backend::etcd::model::{decide, decide_set, HolderPart, WaiterPart};
        self.model.process(now);
        let users: Vec<String> = (0..=UserId::from(u8::MAX)).map(|u| u.to_string()).collect();
        let user = |u: UserId| users.get(u as usize).map_or("?", String::as_str);
        let leases = self.model.leases.values().map(|h| h.names.len()).sum();
        let names: Vec<&str> = std::iter::once(&*req.name)
            .chain(req.and.iter().map(String::as_str))
            .collect();
        let mut parts = Vec::new();
        let mut tokens = Vec::new();
        let mut waiting: Vec<(WaiterId, u64)> = Vec::new();
        for name in &names {
            let holders: Vec<HolderPart<'_>> = self
                .model
                .holders_of(name)
                .into_iter()
                .map(|h| holder_part(h.token as usize, h, user(h.user)))
                .collect();
            tokens.extend(self.model.holders_of(name).iter().map(|h| h.token));
            let queue: Vec<WaiterPart<'_>> = self
                .model
                .queue_of(name)
                .into_iter()
                .map(|w| WaiterPart {
                    key: w.ticket as usize,
                    id: &w.id,
                    user: user(w.user),
                    mode: w.mode,
                    set: set_of(&w.names),
                })
                .collect();
            for w in self.model.queue_of(name) {
                if waiting.iter().all(|(n, _)| *n != w.waiter) {
                    waiting.push((w.waiter, w.ticket));
                }
            }
            parts.push((holders, queue));
        }
        let limits = self.table.limits();
        let decision = match &parts[..] {
            [(holders, queue)] => {
                decide(holders, queue, req, user(req.user), limits, leases).map(Decided::One)
            }
            _ => {
                let parts: Vec<_> = parts.iter().map(|(h, q)| (&h[..], &q[..])).collect();
                decide_set(&parts, req, user(req.user), limits, leases).map(Decided::Set)
            }
        };
        ClusterDecision {
            decision,
            tokens,
            waiting,
            names: names.len(),
            supersede: req.supersede,
        }
    }

    /// Whether the etcd backend's decision is the one the reference model made: its answer
    /// `want`, and the waiters its effects so far ended (the place it took is the ticket of
    /// one of them).
    #[cfg(feature = "etcd")]
    fn cluster_agrees(
        &self,
        cluster: ClusterDecision,
        want: &Result<LockOutcome, TableError>,
    ) -> Result<(), String> {
        use lockd::locks::rules::{Decision, SetDecision};
        let set = cluster.names > 1;
        let expected = match want {
            // Refused before the rules are asked, in both backends.
            Err(TableError::BadTtl { .. } | TableError::BadGrace { .. }) => return Ok(()),
            Err(e) => Err(e.clone()),
            Ok(LockOutcome::Granted { token, .. }) => {
                let again = cluster.tokens.contains(token);
                let key = *token as usize;
                Ok(match (again, set) {
                    (true, false) => Decided::One(Decision::Again(key)),
                    (true, true) => Decided::Set(SetDecision::Again(vec![key; cluster.names])),
                    (false, false) => Decided::One(Decision::Grant),
                    (false, true) => Decided::Set(SetDecision::Grant),
                })
            }
            Ok(LockOutcome::Queued { .. }) => {
                let ended = |why: fn(&WaitEnd) -> bool| -> Vec<usize> {
                    let fx = self.model.pending_effects();
                    cluster
                        .waiting
                        .iter()
                        .filter(|(w, _)| {
                            fx.iter().any(|e| {
                                matches!(e, Effect::WaitEnded { waiter, why: y } if waiter == w && why(y))
                            })
                        })
                        .map(|(_, ticket)| *ticket as usize)
                        .collect()
                };
                let replaced = ended(|y| matches!(y, WaitEnd::Replaced));
                let superseded = ended(|y| matches!(y, WaitEnd::Superseded { .. }));
                // The place it took: the ticket of a waiter it replaced. A `supersede` waits
                // at the back of the queue it emptied (its head): the rules give it no
                // place, whatever ticket the model reuses.
                let ticket = self.model.last_ticket as usize;
                let place = Some(ticket).filter(|t| !cluster.supersede && replaced.contains(t));
                Ok(if set {
                    Decided::Set(SetDecision::Queue { place, replaced })
                } else {
                    Decided::One(Decision::Queue {
                        place,
                        replaced,
                        superseded,
                    })
                })
            }
        };
        if cluster.decision != expected {
            return Err(format!(
                "etcd backend decides {:?}, model {expected:?} ({want:?})",
                cluster.decision
            ));
        }
        Ok(())
    }

    /// Whether the table's index of session leases by connection says what the model's
    /// holders say: a session lease is bound to `conn`.
    fn sessions_agree(&self, conn: ConnId) -> Result<(), String> {
        let want = self
            .model
            .leases
            .values()
            .any(|h| h.session.and_then(|s| s.conn) == Some(conn));
        let got = self.table.holds_sessions(conn);
        if self.judge_table && got != want {
            return Err(format!("holds_sessions({conn}): table {got}, model {want}"));
        }
        Ok(())
    }

    /// Compares the effects of one step, then lets the observer judge them.
    fn effects(&mut self, call: Call<'_>) -> Result<(), String> {
        let mut got = std::mem::take(&mut self.table_fx);
        got.extend(self.table.take_effects());
        self.model.hint.clear();
        let want = self.model.take_effects();
        let got = self.judged(got, &want);
        if got != want {
            return Err(format!("effects differ:\n table {got:?}\n model {want:?}"));
        }
        self.note_tokens(&got);
        self.observer.observe(call, &got)
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        self.log.push(format!("t={} {op:?}", self.now));
        let now = self.now;
        let at = self.at();
        let mut called = true;
        match op {
            Op::Lock {
                name,
                id,
                ttl,
                wait,
                session,
                conn,
                mode,
                user,
                note,
                supersede,
                and,
                delay,
            } => {
                let ttl = self.ttl(ttl);
                let mut set: Vec<&'static str> = Vec::new();
                if self.sets && !*supersede {
                    for &n in and {
                        if n != *name && !set.contains(&NAMES[n]) {
                            set.push(NAMES[n]);
                        }
                    }
                }
                let note = note.map(|i| NOTES[i]);
                let max_ttl = self.model.limits.max_ttl;
                let session = match session {
                    SessionPick::Plain => None,
                    SessionPick::Zero => Some(0),
                    SessionPick::Ms(ms) => Some(1 + ms % max_ttl),
                    SessionPick::OverMax => Some(max_ttl + 1),
                };
                let wait = match wait {
                    WaitPick::Forever => None,
                    WaitPick::Zero => Some(0),
                    WaitPick::Ms(ms) => Some(*ms),
                };
                let req = LockRequest {
                    name: NAMES[*name].into(),
                    id: IDS[*id].into(),
                    ttl: ttl.map(Duration::from_millis),
                    wait: wait.map(Duration::from_millis),
                    tie: session.map_or(Tie::Plain, |ms| Tie::Session(Duration::from_millis(ms))),
                    conn: *conn,
                    mode: *mode,
                    user: *user,
                    origin: Default::default(),
                    note: note.map(Into::into),
                    supersede: *supersede,
                    and: set.iter().map(|n| n.to_string()).collect(),
                    delay: delay.map(Duration::from_millis),
                };
                let got = self.table.lock(at, req.clone());
                self.hint();
                #[cfg(feature = "etcd")]
                let cluster = self.cluster_decision(now, &req);
                let want = self.model.lock(
                    now,
                    MLock {
                        name: NAMES[*name].into(),
                        id: IDS[*id].into(),
                        ttl,
                        wait,
                        session,
                        conn: *conn,
                        mode: *mode,
                        user: *user,
                        note: note.map(str::to_owned),
                        supersede: *supersede,
                        and: set.iter().map(|n| n.to_string()).collect(),
                        delay: delay.unwrap_or(0),
                    },
                );
                // Both backends' decisions are judged, each on its own: a wrong rule shows
                // in both, a wrong view of a name in one.
                #[cfg(feature = "etcd")]
                let cluster = self.cluster_agrees(cluster, &want);
                let got = self.judged(got, &want);
                if got != want {
                    #[cfg(feature = "etcd")]
                    if let Err(e) = &cluster {
                        return Err(format!("lock: table {got:?}, model {want:?}; and {e}"));
                    }
                    return Err(format!("lock: table {got:?}, model {want:?}"));
                }
                #[cfg(feature = "etcd")]
                cluster?;
                match &got {
                    Ok(LockOutcome::Queued { waiter }) => {
                        self.waiters.push(*waiter);
                        self.waiter_users.insert(*waiter, *user);
                    }
                    // A new token is this user's; a token granted before (a retry by the same
                    // id) must already be: never another user's lease by naming its id.
                    Ok(LockOutcome::Granted { token, .. }) => {
                        let owner = *self.owners.entry(*token).or_insert(*user);
                        if owner != *user {
                            return Err(format!(
                                "LOCK by user {user} got token {token}, user {owner}'s lease"
                            ));
                        }
                    }
                    Err(_) => {}
                }
                let mut names = vec![NAMES[*name]];
                names.extend(set.iter().copied());
                self.effects(Call::Lock {
                    names: &names,
                    mode: *mode,
                    outcome: got.as_ref().ok(),
                })?;
            }
            Op::Unlock { name, tok, user } => {
                let token = self.token(NAMES[*name], tok);
                let user = self.user(user, token);
                let got = self.table.unlock(at, NAMES[*name], token, user);
                self.hint();
                let want = self.model.unlock(now, NAMES[*name], token, user);
                let got = self.judged(got, &want);
                if got != want {
                    return Err(format!("unlock {token}: table {got:?}, model {want:?}"));
                }
                if got.is_ok() {
                    self.owned("unlock", token, user)?;
                }
                self.effects(Call::Other)?;
            }
            Op::Renew {
                name,
                tok,
                ttl,
                conn,
                user,
            } => {
                let token = self.token(NAMES[*name], tok);
                let user = self.user(user, token);
                let ttl = ttl.as_ref().and_then(|p| self.ttl(p));
                let got = self.table.renew(
                    at,
                    NAMES[*name],
                    token,
                    (ttl.map(Duration::from_millis), false),
                    *conn,
                    user,
                );
                self.hint();
                let want = self.model.renew(now, NAMES[*name], token, ttl, *conn, user);
                let got = self.judged(got, &want);
                if got != want {
                    return Err(format!("renew {token}: table {got:?}, model {want:?}"));
                }
                if got.is_ok() {
                    self.owned("renew", token, user)?;
                }
                self.effects(Call::Other)?;
            }
            Op::Revoke { name, tok } => {
                let token = self.token(NAMES[*name], tok);
                let got = self.table.revoke(at, NAMES[*name], token);
                self.hint();
                let want = self.model.revoke(now, NAMES[*name], token);
                let got = self.judged(got, &want);
                if got != want {
                    return Err(format!("revoke {token}: table {got:?}, model {want:?}"));
                }
                self.effects(Call::Other)?;
            }
            Op::Break { name, tok, force } => {
                let token = tok.as_ref().map(|p| self.token(NAMES[*name], p));
                let by = lockd::locks::Origin::default();
                let got = self.table.break_lock(at, NAMES[*name], token, &by, *force);
                self.hint();
                #[cfg(feature = "etcd")]
                let cluster = self.cluster_breaks(now, NAMES[*name], token);
                self.model.process(now);
                let sets: HashMap<Token, Vec<String>> = self
                    .model
                    .leases
                    .values()
                    .map(|h| (h.token, h.names.clone()))
                    .collect();
                // A lease in its lock-delay is past the deadline a break is remembered until.
                let delaying: Vec<Token> = self
                    .model
                    .leases
                    .values()
                    .filter(|h| h.delaying)
                    .map(|h| h.token)
                    .collect();
                let want = self.model.break_lock(now, NAMES[*name], token, *force);
                let got = self.judged(got, &want);
                if got != want {
                    return Err(format!("break {token:?}: table {got:?}, model {want:?}"));
                }
                #[cfg(feature = "etcd")]
                if cluster != want {
                    return Err(format!(
                        "break {token:?}: cluster {cluster:?}, model {want:?}"
                    ));
                }
                // The last lease it ended is remembered as broken (its holder is told so), on
                // every name of its set.
                let last = got.as_ref().ok().and_then(|ended| ended.last());
                let last = last.filter(|t| !delaying.contains(t));
                if let Some(&last) = last.filter(|_| self.judge_table) {
                    for n in sets.get(&last).map_or(&[][..], Vec::as_slice) {
                        let why = self.table.broken(at, n, last);
                        if !matches!(why, TableError::Broken { token, .. } if token == last) {
                            return Err(format!("break {last}: then told {why:?} on {n}"));
                        }
                    }
                }
                self.effects(Call::Other)?;
            }
            Op::Check { name, tok } => {
                let token = self.token(NAMES[*name], tok);
                let got = self.table.check(at, NAMES[*name], token);
                self.hint();
                let want = self.model.check(now, NAMES[*name], token);
                let got = self.judged(got, &want);
                if got != want {
                    return Err(format!("check {token}: table {got:?}, model {want:?}"));
                }
                self.effects(Call::Other)?;
            }
            Op::CancelWait(p) => {
                let live: Vec<WaiterId> = self.model.waiters.iter().map(|w| w.waiter).collect();
                let waiter = match p {
                    WaiterPick::Live(i) if !live.is_empty() => live[i % live.len()],
                    WaiterPick::Seen(i) if !self.waiters.is_empty() => {
                        self.waiters[i % self.waiters.len()]
                    }
                    WaiterPick::Live(i) | WaiterPick::Seen(i) => *i as WaiterId,
                    WaiterPick::Raw(w) => *w,
                };
                let got = self.table.cancel_wait(at, waiter);
                self.hint();
                let want = self.model.cancel_wait(now, waiter);
                let got = self.judged(got, &want);
                if got != want {
                    return Err(format!("cancel_wait {waiter}: table {got}, model {want}"));
                }
                self.effects(Call::CancelWait {
                    waiter,
                    removed: got,
                })?;
            }
            Op::DropSession { name, tok, conn } => {
                let token = self.token(NAMES[*name], tok);
                let conn = match conn {
                    ConnPick::Holder => self
                        .model
                        .lease(NAMES[*name], token)
                        .and_then(|h| h.session?.conn)
                        .unwrap_or(1),
                    ConnPick::Conn(c) => *c,
                };
                self.table.drop_session(at, NAMES[*name], token, conn);
                self.hint();
                self.model.drop_session(now, NAMES[*name], token, conn);
                self.effects(Call::Other)?;
            }
            Op::CloseConnection(conn) => {
                self.table.expire(at);
                self.hint();
                self.model.process(now);
                self.sessions_agree(*conn)?;
                // The model ends them one by one, in the order they were granted.
                // (A set is one lease, bound once: by its first name.)
                let bound: Vec<(Token, String)> = self
                    .model
                    .leases
                    .values()
                    .filter(|h| h.session.and_then(|s| s.conn) == Some(*conn))
                    .map(|h| (h.token, h.names[0].clone()))
                    .collect();
                self.table.close_connection(at, *conn);
                self.hint();
                for (token, name) in bound {
                    self.model.drop_session(now, &name, token, *conn);
                }
                self.effects(Call::Other)?;
                self.sessions_agree(*conn)?;
            }
            Op::Status { name } => {
                let got = self.table.status(at, NAMES[*name]);
                self.hint();
                let want = self.model.status(now, NAMES[*name]);
                let got = self.judged(got, &want);
                if got != want {
                    return Err(format!("status: table {got:?}, model {want:?}"));
                }
                self.effects(Call::Other)?;
            }
            Op::Expire => {
                self.table.expire(at);
                self.hint();
                self.model.process(now);
                self.effects(Call::Other)?;
            }
            Op::Advance(a) => {
                called = false;
                let soonest = self.model.soonest();
                self.now = match (a, soonest) {
                    (Advance::By(ms), _) => now + ms,
                    (Advance::ToNext, Some(s)) => s.max(now),
                    (Advance::JustBefore, Some(s)) => s.saturating_sub(1).max(now),
                    (Advance::ToNext | Advance::JustBefore, None) => now + 1,
                    (Advance::Far, _) => now + 2 * self.model.limits.max_ttl + 61,
                };
            }
        }
        self.invariants(called)
    }

    /// After every step: the same next deadline; after a call, nothing is left due and
    /// STATUS (which must itself change nothing) agrees with the model and the observer.
    fn invariants(&mut self, called: bool) -> Result<(), String> {
        if !self.judge_table {
            return self.model_invariants(called);
        }
        let want = self.model.soonest().map(|ms| self.model.at(ms));
        let got = self.table.next_deadline();
        if got != want {
            return Err(format!(
                "next_deadline: table {got:?}, model {want:?} (base {:?})",
                self.model.base
            ));
        }
        // Names held (a name only a set waits for is free).
        if self.table.len() != self.model.held_names().len() {
            return Err(format!(
                "len: table {}, model {}",
                self.table.len(),
                self.model.held_names().len()
            ));
        }
        if !called {
            return Ok(());
        }
        if let Some(s) = self.model.soonest() {
            if s <= self.now {
                return Err(format!("deadline {s} still pending at {}", self.now));
            }
        }
        // The table lists in no particular order; the server sorts by name.
        let mut got = self.table.status_all(self.at());
        got.sort_by(|a, b| a.name.cmp(&b.name));
        let mut want = self.model.status_all(self.now);
        want.sort_by(|a, b| a.name.cmp(&b.name));
        if got != want {
            return Err(format!("status_all: table {got:?}, model {want:?}"));
        }
        for name in NAMES {
            let got = self.table.holders(self.at(), name);
            let want = self.model.holders(self.now, name);
            if got != want {
                return Err(format!("holders of {name}: table {got:?}, model {want:?}"));
            }
        }
        let stray = self.table.take_effects();
        if !stray.is_empty() {
            return Err(format!(
                "status_all at the same instant had effects {stray:?}"
            ));
        }
        self.observer.check_status(&got)
    }
}

impl Harness {
    /// [`Harness::invariants`] with the model alone: nothing left due after a call, and
    /// STATUS as the observer saw it.
    fn model_invariants(&mut self, called: bool) -> Result<(), String> {
        self.table.take_effects();
        if !called {
            return Ok(());
        }
        if let Some(s) = self.model.soonest() {
            if s <= self.now {
                return Err(format!("deadline {s} still pending at {}", self.now));
            }
        }
        let all = self.model.status_all(self.now);
        self.observer.check_status(&all)
    }
}

/// A holder of the model as the etcd backend's model view takes it, named by `key`.
#[cfg(feature = "etcd")]
fn holder_part<'a>(
    key: usize,
    h: &'a reference::MHolder,
    user: &'a str,
) -> lockd::backend::etcd::model::HolderPart<'a> {
    lockd::backend::etcd::model::HolderPart {
        key,
        id: &h.id,
        user,
        mode: h.mode,
        session: h.session.map(|s| s.conn),
        lingering: h.lingering(),
        set: set_of(&h.names),
    }
}

/// The names of a lease or a waiter as its etcd record keeps them: empty for one name.
#[cfg(feature = "etcd")]
fn set_of(names: &[String]) -> Vec<String> {
    match names.len() {
        1 => Vec::new(),
        _ => names.to_vec(),
    }
}

fn run(limits: MLimits, first_token: Token, ops: &[Op]) -> Result<(), TestCaseError> {
    run_with(limits, first_token, ops, SETS, true)
}

fn run_with(
    limits: MLimits,
    first_token: Token,
    ops: &[Op],
    sets: bool,
    judge_table: bool,
) -> Result<(), TestCaseError> {
    let mut h = Harness::new(limits, first_token);
    h.sets = sets;
    h.judge_table = judge_table;
    let fail = |h: &Harness, e: String| {
        TestCaseError::fail(format!(
            "{e}\nlimits {limits:?}, first token {first_token}\nhistory:\n{}",
            h.log.join("\n")
        ))
    };
    for op in ops {
        if let Err(e) = h.step(op) {
            return Err(fail(&h, e));
        }
    }
    // No stall: once nobody takes anything new, time alone (every lease running out, and
    // each waiter granted in turn running out too) must empty the table.
    for _ in 0..4 * NAMES.len() * IDS.len() {
        if (h.table.is_empty() || !judge_table) && h.model.names().is_empty() {
            break;
        }
        for op in [Op::Advance(Advance::Far), Op::Expire] {
            if let Err(e) = h.step(&op) {
                return Err(fail(&h, e));
            }
        }
    }
    if (judge_table && !h.table.is_empty()) || !h.observer.is_empty() {
        let e = format!(
            "still held or waited for after every lease ran out: table {:?}, observer {:?}",
            h.table.status_all(h.at()),
            h.observer.left_over()
        );
        return Err(fail(&h, e));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES may ask for more.
        cases: ProptestConfig::default().cases.max(512),
        max_shrink_iters: 20_000,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "tests/props/model/proptest-regressions.txt"
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn table_matches_model((limits, first) in limits(), ops in prop::collection::vec(op(), 1..200)) {
        run(limits, first, &ops)?;
    }

    /// The reference model itself, with sets, judged by the observer alone: a wrong model
    /// would otherwise only show as a disagreement, hard to tell from the table's.
    #[test]
    fn model_keeps_the_invariants_with_sets(
        (limits, first) in limits(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run_with(limits, first, &ops, true, false)?;
    }
}

// ---- The tricky rules, one example each ----

fn table() -> (Locks, Instant) {
    let limits = Limits {
        default_ttl: Duration::from_secs(30),
        max_ttl: Duration::from_secs(60),
        max_locks: 100,
        max_waiters: 100,
        ..Limits::default()
    };
    (Locks::new(limits, 100), Instant::now())
}

fn req(
    name: &str,
    id: &str,
    ttl_ms: u64,
    wait: Option<u64>,
    session: bool,
    conn: ConnId,
) -> LockRequest {
    LockRequest {
        name: name.into(),
        id: id.into(),
        ttl: Some(Duration::from_millis(ttl_ms)),
        wait: wait.map(Duration::from_millis),
        tie: if session {
            Tie::Session(Duration::ZERO)
        } else {
            Tie::Plain
        },
        conn,
        mode: Mode::Exclusive,
        user: NO_USER,
        origin: Default::default(),
        note: None,
        supersede: false,
        and: Box::default(),
        delay: None,
    }
}

fn ms(base: Instant, ms: u64) -> Instant {
    base + Duration::from_millis(ms)
}

fn granted(out: Result<LockOutcome, TableError>) -> (Token, Instant) {
    match out {
        Ok(LockOutcome::Granted { token, deadline }) => (token, deadline),
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn queued(out: Result<LockOutcome, TableError>) -> WaiterId {
    match out {
        Ok(LockOutcome::Queued { waiter }) => waiter,
        other => panic!("expected to queue, got {other:?}"),
    }
}

/// An event as the plain tests below compare it: without its hold and wait times, which
/// the model test checks exactly (see [`effects`]).
fn ev(kind: EventKind, name: &str, id: &str, token: Token) -> Effect {
    Effect::Event(Event {
        kind,
        name: Arc::from(name),
        id: Arc::from(id),
        token,
        held: Duration::ZERO,
        waited: None,
        origin: Default::default(),
        note: None,
        broken_by: Default::default(),
    })
}

/// The table's queued effects, with events' hold and wait times blanked, as [`ev`] makes them.
fn effects(t: &mut Locks) -> Vec<Effect> {
    let mut all = t.take_effects();
    for e in &mut all {
        if let Effect::Event(event) = e {
            event.held = Duration::ZERO;
            event.waited = None;
        }
    }
    all
}

#[test]
fn same_id_relock_keeps_token_and_restarts_lease() {
    let (mut t, base) = table();
    let (token, d1) = granted(t.lock(base, req("x", "p", 1000, None, false, 1)));
    assert_eq!(d1, ms(base, 1000));
    // From another connection (a retry after a lost reply), with a new ttl.
    let (again, d2) = granted(t.lock(ms(base, 500), req("x", "p", 2000, Some(0), false, 2)));
    assert_eq!(again, token);
    assert_eq!(d2, ms(base, 2500));
    assert_eq!(t.next_deadline(), Some(ms(base, 2500)));
    assert_eq!(t.check(ms(base, 1500), "x", token), Ok(ms(base, 2500)));
    // No second Acquired event, no second token.
    assert_eq!(
        effects(&mut t),
        vec![ev(EventKind::Acquired, "x", "p", token)]
    );
    assert_eq!(t.next_token(), token + 1);
    // RENEW without ttl uses the ttl of the last LOCK.
    assert_eq!(
        t.renew(ms(base, 2000), "x", token, (None, false), 1, NO_USER)
            .map(|r| r.deadline),
        Ok(ms(base, 4000))
    );
}

#[test]
fn session_lease_on_another_connection_conflicts() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 1000, None, true, 1)));
    assert_eq!(
        t.lock(ms(base, 1), req("x", "p", 1000, None, false, 2)),
        Err(TableError::Conflict)
    );
    // The refused request changed nothing.
    let s = t.status(ms(base, 1), "x").expect("held");
    assert!(s.session);
    assert_eq!(s.left, Duration::from_millis(999));
    // The same connection may repeat it, and drop the session binding by doing so.
    let (again, _) = granted(t.lock(ms(base, 2), req("x", "p", 1000, None, false, 1)));
    assert_eq!(again, token);
    assert!(!t.status(ms(base, 2), "x").expect("held").session);
    // Now the lease belongs to the id: another connection may repeat it too.
    let (again, _) = granted(t.lock(ms(base, 3), req("x", "p", 1000, None, true, 2)));
    assert_eq!(again, token);
    // Closing connection 1 no longer ends it; closing connection 2 does.
    t.drop_session(ms(base, 4), "x", token, 1);
    assert!(t.status(ms(base, 4), "x").is_some());
    t.drop_session(ms(base, 5), "x", token, 2);
    assert_eq!(t.status(ms(base, 5), "x"), None);
    let effects = effects(&mut t);
    assert_eq!(
        effects.last(),
        Some(&ev(EventKind::Dropped, "x", "p", token))
    );
}

#[test]
fn replaced_waiter_keeps_its_place() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "a", 1000, None, false, 1)));
    let b1 = queued(t.lock(base, req("x", "b", 1000, Some(100), false, 2)));
    let c = queued(t.lock(base, req("x", "c", 1000, None, false, 3)));
    effects(&mut t);
    // b again, from another connection and without a wait bound.
    let b2 = queued(t.lock(ms(base, 10), req("x", "b", 700, None, false, 4)));
    assert_eq!(
        effects(&mut t),
        vec![Effect::WaitEnded {
            waiter: b1,
            why: WaitEnd::Replaced
        }]
    );
    assert_eq!(t.status(ms(base, 10), "x").expect("held").waiters, 2);
    // The old wait bound went with the old request.
    assert_eq!(t.next_deadline(), Some(ms(base, 1000)));
    assert!(!t.cancel_wait(ms(base, 10), b1));
    assert_eq!(t.unlock(ms(base, 20), "x", token, NO_USER), Ok(()));
    assert_eq!(
        effects(&mut t),
        vec![
            ev(EventKind::Released, "x", "a", token),
            Effect::Granted {
                waiter: b2,
                name: Arc::from("x"),
                token: token + 1,
                deadline: ms(base, 720),
            },
            ev(EventKind::Acquired, "x", "b", token + 1),
        ]
    );
    assert!(t.cancel_wait(ms(base, 20), c));
    assert_eq!(t.status(ms(base, 20), "x").expect("held").waiters, 0);
}

#[test]
fn wait_zero_would_block_and_changes_nothing() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 1000, Some(0), false, 1)));
    let q = queued(t.lock(base, req("x", "q", 1000, None, false, 2)));
    effects(&mut t);
    assert_eq!(
        t.lock(ms(base, 1), req("x", "q", 1000, Some(0), false, 3)),
        Err(TableError::WouldBlock {
            holder: Arc::from("p")
        })
    );
    // q's earlier request still waits (wait=0 did not replace it).
    assert!(effects(&mut t).is_empty());
    assert_eq!(t.status(ms(base, 1), "x").expect("held").waiters, 1);
    assert_eq!(t.unlock(ms(base, 2), "x", token, NO_USER), Ok(()));
    assert!(t
        .take_effects()
        .iter()
        .any(|e| matches!(e, Effect::Granted { waiter, .. } if *waiter == q)));
}

#[test]
fn expiry_hands_over_with_lease_from_processing_time() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 10, None, false, 1)));
    let q = queued(t.lock(ms(base, 1), req("x", "q", 50, Some(100), true, 7)));
    effects(&mut t);
    assert_eq!(t.next_deadline(), Some(ms(base, 10)));
    // Nobody looks until 25ms: the new lease runs from 25ms, not from 10ms.
    t.expire(ms(base, 25));
    assert_eq!(
        effects(&mut t),
        vec![
            ev(EventKind::Expired, "x", "p", token),
            Effect::Granted {
                waiter: q,
                name: Arc::from("x"),
                token: token + 1,
                deadline: ms(base, 75),
            },
            ev(EventKind::Acquired, "x", "q", token + 1),
        ]
    );
    // Its wait bound (101ms) is gone with the wait.
    assert_eq!(t.next_deadline(), Some(ms(base, 75)));
    let s = t.status(ms(base, 25), "x").expect("held");
    assert!(s.session);
    assert_eq!(s.left, Duration::from_millis(50));
    // A live lease is live strictly before its deadline.
    assert!(t.check(ms(base, 74), "x", token + 1).is_ok());
    assert_eq!(
        t.check(ms(base, 75), "x", token + 1),
        Err(TableError::NotHeld)
    );
}

#[test]
fn wait_ending_with_the_lease_gives_up_first() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 10, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 50, Some(10), false, 2)));
    let r = queued(t.lock(base, req("x", "r", 50, None, false, 3)));
    effects(&mut t);
    // At exactly 10ms q's wait and p's lease both end: q gives up, r is granted.
    assert_eq!(t.check(ms(base, 10), "x", token), Err(TableError::NotHeld));
    assert_eq!(
        effects(&mut t),
        vec![
            Effect::WaitEnded {
                waiter: q,
                why: WaitEnd::TimedOut
            },
            ev(EventKind::Expired, "x", "p", token),
            Effect::Granted {
                waiter: r,
                name: Arc::from("x"),
                token: token + 1,
                deadline: ms(base, 60),
            },
            ev(EventKind::Acquired, "x", "r", token + 1),
        ]
    );
}

#[test]
fn cancelled_waiter_is_never_granted() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 10, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 50, None, true, 2)));
    assert!(t.cancel_wait(ms(base, 5), q));
    assert!(!t.cancel_wait(ms(base, 5), q));
    effects(&mut t);
    assert_eq!(t.unlock(ms(base, 6), "x", token, NO_USER), Ok(()));
    assert_eq!(
        effects(&mut t),
        vec![ev(EventKind::Released, "x", "p", token)]
    );
    assert!(t.is_empty());
    assert_eq!(t.next_deadline(), None);
}

fn req_mode(name: &str, id: &str, mode: Mode, conn: ConnId) -> LockRequest {
    LockRequest {
        mode,
        ..req(name, id, 1000, None, false, conn)
    }
}

/// The waiters granted by the effects, in order.
fn grants(effects: &[Effect]) -> Vec<WaiterId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Granted { waiter, .. } => Some(*waiter),
            _ => None,
        })
        .collect()
}

#[test]
fn shared_then_exclusive_then_shared_is_served_in_order() {
    let (mut t, base) = table();
    let (s1, _) = granted(t.lock(base, req_mode("x", "s1", Mode::Shared, 1)));
    let (s2, _) = granted(t.lock(base, req_mode("x", "s2", Mode::Shared, 2)));
    let w = queued(t.lock(base, req_mode("x", "w", Mode::Exclusive, 3)));
    // A shared request behind a waiting exclusive one waits: writers never starve.
    let r1 = queued(t.lock(base, req_mode("x", "r1", Mode::Shared, 4)));
    let r2 = queued(t.lock(base, req_mode("x", "r2", Mode::Shared, 5)));
    effects(&mut t);
    assert_eq!(t.unlock(base, "x", s1, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), Vec::<WaiterId>::new());
    assert_eq!(t.unlock(base, "x", s2, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![w]);
    let holder = t.status(base, "x").expect("held");
    assert_eq!((holder.holders, holder.mode), (1, Mode::Exclusive));
    // The writer leaves: both readers are granted at once, in queue order.
    assert_eq!(t.unlock(base, "x", holder.token, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![r1, r2]);
    let now = t.status(base, "x").expect("held");
    assert_eq!((now.holders, now.mode, now.waiters), (2, Mode::Shared, 0));
}

#[test]
fn a_cancelled_writer_lets_the_readers_behind_it_in() {
    let (mut t, base) = table();
    granted(t.lock(base, req_mode("x", "s1", Mode::Shared, 1)));
    let w = queued(t.lock(base, req_mode("x", "w", Mode::Exclusive, 2)));
    let r = queued(t.lock(base, req_mode("x", "r", Mode::Shared, 3)));
    effects(&mut t);
    assert!(t.cancel_wait(base, w));
    assert_eq!(grants(&effects(&mut t)), vec![r]);
}

#[test]
fn a_semaphore_holds_up_to_its_limit_and_refuses_other_shapes() {
    let (mut t, base) = table();
    let two = Mode::limit(2);
    let (a, _) = granted(t.lock(base, req_mode("s", "a", two, 1)));
    let (b, _) = granted(t.lock(base, req_mode("s", "b", two, 2)));
    assert!(b > a);
    let c = queued(t.lock(base, req_mode("s", "c", two, 3)));
    for mode in [Mode::limit(3), Mode::Exclusive, Mode::Shared] {
        assert_eq!(
            t.lock(base, req_mode("s", "d", mode, 4)),
            Err(TableError::WrongMode {
                held: two,
                asked: mode
            })
        );
    }
    // The same id again in its own mode is its own slot again; in another, a conflict.
    assert_eq!(granted(t.lock(base, req_mode("s", "a", two, 1))).0, a);
    effects(&mut t);
    // One slot frees: the head waiter takes it, and only it.
    assert_eq!(t.unlock(base, "s", a, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![c]);
    assert!(t.check(base, "s", b).is_ok());
    assert_eq!(t.status(base, "s").map(|s| s.holders), Some(2));
}

#[test]
fn limit_one_is_an_exclusive_lock() {
    assert_eq!(Mode::limit(1), Mode::Exclusive);
    assert_eq!(Mode::limit(0), Mode::Exclusive);
    assert_eq!(Mode::limit(5), Mode::Limit(5));
}

fn as_user(user: UserId, req: LockRequest) -> LockRequest {
    LockRequest { user, ..req }
}

#[test]
fn another_user_cannot_unlock_renew_or_take_over_by_id() {
    let (mut t, base) = table();
    let (alice, bob) = (1, 2);
    let (token, _) = granted(t.lock(base, as_user(alice, req("x", "p", 1000, None, true, 1))));
    // Bob read the token (STATUS shows it): it is still not his lease.
    assert_eq!(t.unlock(base, "x", token, bob), Err(TableError::NotOwner));
    assert_eq!(
        t.renew(base, "x", token, (None, false), 2, bob),
        Err(TableError::NotOwner)
    );
    assert_eq!(
        t.unlock(base, "x", token, NO_USER),
        Err(TableError::NotOwner)
    );
    // A token that is not live is NOTHELD for anyone.
    assert_eq!(
        t.unlock(base, "x", token + 1, bob),
        Err(TableError::NotHeld)
    );
    // Bob naming Alice's id is another client: no same token, no CONFLICT; he waits.
    let w = queued(t.lock(base, as_user(bob, req("x", "p", 1000, None, false, 2))));
    // Nor does his LOCK replace a waiter of Alice's with the same id, or she his.
    let w2 = queued(t.lock(base, as_user(alice, req("x", "q", 1000, None, false, 3))));
    let w3 = queued(t.lock(base, as_user(bob, req("x", "q", 1000, None, false, 4))));
    assert_eq!(t.status(base, "x").map(|s| s.waiters), Some(3));
    effects(&mut t);
    assert_eq!(t.unlock(ms(base, 1), "x", token, alice), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![w]);
    let holder = t.status(ms(base, 1), "x").expect("held");
    // Granted to Bob: Alice can't release it with the token either.
    assert_eq!(
        t.unlock(ms(base, 1), "x", holder.token, alice),
        Err(TableError::NotOwner)
    );
    assert_eq!(t.unlock(ms(base, 1), "x", holder.token, bob), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![w2]);
    assert!(t.cancel_wait(ms(base, 1), w3));
}

#[test]
fn a_lease_of_no_user_is_anyones_with_its_token() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 1000, None, false, 1)));
    assert!(t.renew(base, "x", token, (None, false), 1, 7).is_ok());
    assert_eq!(t.unlock(base, "x", token, 8), Ok(()));
}

#[test]
fn a_queue_at_max_waiters_refuses_a_new_waiter_but_not_a_replacing_one() {
    let (_, base) = table();
    let mut t = Locks::new(
        Limits {
            max_waiters: 2,
            ..Limits::default()
        },
        100,
    );
    granted(t.lock(base, req("x", "p", 1000, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 1000, None, false, 2)));
    queued(t.lock(base, req("x", "r", 1000, None, false, 3)));
    effects(&mut t);
    assert_eq!(
        t.lock(base, req("x", "s", 1000, Some(500), false, 4)),
        Err(TableError::TooManyWaiters { max: 2 })
    );
    // Refused without a trace: no waiter, no timer, no effect.
    assert_eq!(t.status(base, "x").map(|s| s.waiters), Some(2));
    assert_eq!(t.next_deadline(), Some(ms(base, 1000)));
    assert_eq!(effects(&mut t), vec![]);
    // The same id again takes over its own place: the queue does not grow.
    queued(t.lock(base, req("x", "q", 1000, None, false, 2)));
    assert_eq!(
        effects(&mut t),
        vec![Effect::WaitEnded {
            waiter: q,
            why: WaitEnd::Replaced
        }]
    );
    // Another name has a queue of its own.
    granted(t.lock(base, req("y", "p", 1000, None, false, 1)));
    queued(t.lock(base, req("y", "s", 1000, None, false, 4)));
}

#[test]
fn a_forced_break_hands_over_with_a_higher_token_and_is_remembered_until_the_old_deadline() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 10, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 50, None, true, 2)));
    effects(&mut t);
    let by = lockd::locks::Origin::new(Some("ops"), None);
    assert_eq!(
        t.break_lock(ms(base, 2), "x", None, &by, true),
        Ok(vec![token])
    );
    let after = effects(&mut t);
    assert_eq!(grants(&after), vec![q]);
    let broken = after.iter().find_map(|e| match e {
        Effect::Event(e) if e.kind == EventKind::Broken => Some(e.clone()),
        _ => None,
    });
    let broken = broken.expect("a broken event");
    assert_eq!(
        (broken.token, broken.broken_by.user()),
        (token, Some("ops"))
    );
    let next = t.status(ms(base, 2), "x").map(|s| s.token);
    assert!(next > Some(token), "{next:?} after {token}");
    // The broken lease is gone: told why until its old deadline (10ms), plainly after.
    assert_eq!(
        t.renew(ms(base, 3), "x", token, (None, false), 1, NO_USER),
        Err(TableError::NotHeld)
    );
    assert!(matches!(
        t.broken(ms(base, 9), "x", token),
        TableError::Broken { by, .. } if &*by == "ops"
    ));
    assert_eq!(t.broken(ms(base, 10), "x", token), TableError::NotHeld);
    // Nothing left of that token, or on a free name.
    assert_eq!(
        t.break_lock(ms(base, 11), "x", Some(token), &by, false),
        Err(TableError::NotHeld)
    );
    assert_eq!(
        t.break_lock(ms(base, 11), "free", None, &by, false),
        Err(TableError::NotHeld)
    );
}

/// The promise of `lockctl run`: the next holder never runs beside a job still being stopped.
#[test]
fn a_break_holds_the_name_until_the_broken_holder_lets_go_or_runs_out() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 100, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 50, None, true, 2)));
    effects(&mut t);
    let by = lockd::locks::Origin::new(Some("ops"), None);
    assert_eq!(
        t.break_lock(ms(base, 2), "x", None, &by, false),
        Ok(vec![token])
    );
    let after = effects(&mut t);
    // Told at once (event), but nobody is granted yet.
    assert!(grants(&after).is_empty(), "{after:?}");
    assert!(after.iter().any(
        |e| matches!(e, Effect::Event(e) if e.kind == EventKind::Breaking && e.token == token)
    ));
    assert_eq!(t.status(ms(base, 3), "x").map(|s| s.token), Some(token));
    // Its holder can't renew or check it, and is told who broke it.
    assert_eq!(
        t.renew(ms(base, 3), "x", token, (None, false), 1, NO_USER),
        Err(TableError::NotHeld)
    );
    assert_eq!(t.check(ms(base, 3), "x", token), Err(TableError::NotHeld));
    assert!(matches!(
        t.broken(ms(base, 3), "x", token),
        TableError::Broken { by, .. } if &*by == "ops"
    ));
    // Its id can't take it up again: a LOCK of it waits like anyone's.
    assert_eq!(
        t.lock(ms(base, 3), req("x", "p", 100, Some(0), false, 1)),
        Err(TableError::WouldBlock { holder: "p".into() })
    );
    // A BREAK sent again counts it, and changes nothing.
    assert_eq!(
        t.break_lock(ms(base, 4), "x", None, &by, false),
        Ok(vec![token])
    );
    assert!(effects(&mut t).is_empty());
    // Its holder's UNLOCK (the job is gone) ends it and hands the name on.
    assert_eq!(t.unlock(ms(base, 5), "x", token, NO_USER), Ok(()));
    let after = effects(&mut t);
    assert_eq!(grants(&after), vec![q]);
    assert!(after.iter().any(
        |e| matches!(e, Effect::Event(e) if e.kind == EventKind::Released && e.token == token)
    ));

    // A holder that never answers: the name passes on at the deadline the lease had.
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 100, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 50, None, true, 2)));
    assert_eq!(
        t.break_lock(ms(base, 2), "x", None, &by, false),
        Ok(vec![token])
    );
    effects(&mut t);
    t.expire(ms(base, 99));
    assert!(grants(&effects(&mut t)).is_empty());
    t.expire(ms(base, 100));
    assert_eq!(grants(&effects(&mut t)), vec![q]);

    // `force` ends a lease already broken now.
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 100, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 50, None, true, 2)));
    assert_eq!(
        t.break_lock(ms(base, 2), "x", None, &by, false),
        Ok(vec![token])
    );
    effects(&mut t);
    assert_eq!(
        t.break_lock(ms(base, 3), "x", None, &by, true),
        Ok(vec![token])
    );
    assert_eq!(grants(&effects(&mut t)), vec![q]);
}

// ---- Sets of names (`and=`), one example each ----

/// A LOCK of `name` and the further names `and`, exclusive, without wait bound.
fn req_set(name: &str, and: &[&str], id: &str, ttl_ms: u64, conn: ConnId) -> LockRequest {
    LockRequest {
        and: and.iter().map(|n| n.to_string()).collect(),
        ..req(name, id, ttl_ms, None, false, conn)
    }
}

/// The token each of `names` is held with (`None`: free).
fn tokens_of(t: &mut Locks, now: Instant, names: &[&str]) -> Vec<Option<Token>> {
    names
        .iter()
        .map(|n| t.status(now, n).map(|s| s.token))
        .collect()
}

#[test]
fn a_set_is_granted_whole_with_one_token_and_released_whole() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req_set("x", &["y", "z"], "p", 1000, 1)));
    assert_eq!(
        effects(&mut t),
        vec![
            ev(EventKind::Acquired, "x", "p", token),
            ev(EventKind::Acquired, "y", "p", token),
            ev(EventKind::Acquired, "z", "p", token),
        ]
    );
    assert_eq!(
        tokens_of(&mut t, base, &["x", "y", "z"]),
        vec![Some(token); 3]
    );
    assert_eq!(t.len(), 3);
    // UNLOCK of any of its names releases all of them.
    assert_eq!(t.unlock(ms(base, 1), "y", token, NO_USER), Ok(()));
    assert_eq!(
        effects(&mut t),
        vec![
            ev(EventKind::Released, "x", "p", token),
            ev(EventKind::Released, "y", "p", token),
            ev(EventKind::Released, "z", "p", token),
        ]
    );
    assert!(t.is_empty());
    assert_eq!(t.next_deadline(), None);
}

#[test]
fn a_set_waits_on_a_free_name_and_nobody_overtakes_it() {
    let (mut t, base) = table();
    let (held, _) = granted(t.lock(base, req("y", "h", 1000, None, false, 1)));
    let s = queued(t.lock(base, req_set("x", &["y"], "s", 1000, 2)));
    // x is free, but the set waits for it: a LOCK of x alone queues behind the set.
    assert_eq!(t.status(base, "x"), None);
    assert_eq!(
        t.lock(base, req("x", "q", 1000, Some(0), false, 3)),
        Err(TableError::WouldBlock {
            holder: Arc::from("(queue)")
        })
    );
    let q = queued(t.lock(base, req("x", "q", 1000, None, false, 3)));
    effects(&mut t);
    assert_eq!(t.unlock(ms(base, 5), "y", held, NO_USER), Ok(()));
    let after = effects(&mut t);
    assert_eq!(grants(&after), vec![s]);
    let set = t.status(ms(base, 5), "x").expect("held").token;
    assert!(set > held);
    assert_eq!(
        tokens_of(&mut t, ms(base, 5), &["x", "y"]),
        vec![Some(set); 2]
    );
    assert_eq!(t.status(ms(base, 5), "x").map(|s| s.waiters), Some(1));
    assert_eq!(t.unlock(ms(base, 6), "x", set, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![q]);
    assert_eq!(
        tokens_of(&mut t, ms(base, 6), &["x", "y"]),
        vec![Some(set + 1), None]
    );
}

#[test]
fn a_set_is_one_lease_renewed_checked_and_ended_through_any_name() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req_set("x", &["y"], "p", 100, 1)));
    let renewed = t.renew(ms(base, 50), "y", token, (None, false), 1, NO_USER);
    assert_eq!(renewed.map(|r| r.deadline), Ok(ms(base, 150)));
    assert_eq!(t.check(ms(base, 60), "x", token), Ok(ms(base, 150)));
    assert_eq!(t.next_deadline(), Some(ms(base, 150)));
    effects(&mut t);
    // Its time runs out on both names at once.
    t.expire(ms(base, 150));
    assert_eq!(
        effects(&mut t),
        vec![
            ev(EventKind::Expired, "x", "p", token),
            ev(EventKind::Expired, "y", "p", token),
        ]
    );
    // A session set ends with its connection, on every name.
    let (token, _) = granted(t.lock(
        ms(base, 200),
        req_set("y", &["x"], "p", 100, 7).session_zero(),
    ));
    effects(&mut t);
    assert!(t.holds_sessions(7));
    t.close_connection(ms(base, 201), 7);
    assert_eq!(
        effects(&mut t),
        vec![
            ev(EventKind::Dropped, "y", "p", token),
            ev(EventKind::Dropped, "x", "p", token),
        ]
    );
    assert!(t.is_empty());
}

trait SessionZero {
    fn session_zero(self) -> Self;
}

impl SessionZero for LockRequest {
    /// A session lease without grace.
    fn session_zero(self) -> Self {
        LockRequest {
            tie: Tie::Session(Duration::ZERO),
            ..self
        }
    }
}

#[test]
fn a_break_of_one_name_ends_the_whole_set() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req_set("x", &["y"], "p", 1000, 1)));
    let q = queued(t.lock(base, req("y", "q", 1000, None, false, 2)));
    effects(&mut t);
    let by = lockd::locks::Origin::new(Some("ops"), None);
    assert_eq!(
        t.break_lock(ms(base, 1), "y", None, &by, true),
        Ok(vec![token])
    );
    let after = effects(&mut t);
    let broken: Vec<&str> = after
        .iter()
        .filter_map(|e| match e {
            Effect::Event(e) if e.kind == EventKind::Broken => Some(&*e.name),
            _ => None,
        })
        .collect();
    assert_eq!(broken, vec!["x", "y"]);
    assert_eq!(grants(&after), vec![q]);
    assert_eq!(
        tokens_of(&mut t, ms(base, 1), &["x", "y"]),
        vec![None, Some(token + 1)]
    );
    // Its holder is told so through either name.
    for name in ["x", "y"] {
        assert!(matches!(
            t.broken(ms(base, 2), name, token),
            TableError::Broken { by, .. } if &*by == "ops"
        ));
    }
}

#[test]
fn the_same_set_again_is_a_retry_and_a_part_of_it_a_conflict() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req_set("x", &["y"], "p", 1000, 1)));
    // The same names in another order: the same set.
    let (again, deadline) = granted(t.lock(ms(base, 10), req_set("y", &["x"], "p", 500, 1)));
    assert_eq!((again, deadline), (token, ms(base, 510)));
    assert_eq!(t.check(ms(base, 10), "x", token), Ok(ms(base, 510)));
    for (name, and) in [("x", &[][..]), ("y", &[][..]), ("x", &["y", "z"][..])] {
        assert_eq!(
            t.lock(ms(base, 11), req_set(name, and, "p", 1000, 1)),
            Err(TableError::Conflict),
            "{name} and {and:?}"
        );
    }
    // Refused, it changed nothing: z is still free.
    assert_eq!(
        tokens_of(&mut t, ms(base, 11), &["x", "y", "z"]),
        vec![Some(token), Some(token), None]
    );
}

#[test]
fn a_refusal_of_one_name_refuses_the_whole_set() {
    let (_, base) = table();
    let mut t = Locks::new(
        Limits {
            max_locks: 3,
            ..Limits::default()
        },
        100,
    );
    granted(t.lock(base, req_mode("s", "a", Mode::limit(2), 1)));
    assert_eq!(
        t.lock(base, req_set("x", &["s"], "p", 1000, 2)),
        Err(TableError::WrongMode {
            held: Mode::limit(2),
            asked: Mode::Exclusive
        })
    );
    // One lease per name: three more would be four.
    assert_eq!(
        t.lock(base, req_set("x", &["y", "z"], "p", 1000, 2)),
        Err(TableError::TooManyLocks { max: 3 })
    );
    assert_eq!(t.len(), 1);
    effects(&mut t);
    granted(t.lock(base, req_set("x", &["y"], "p", 1000, 2)));
}

#[test]
fn a_set_replaces_the_same_ids_waits_and_queues_at_the_back() {
    let (mut t, base) = table();
    let (hx, _) = granted(t.lock(base, req("x", "h", 1000, None, false, 1)));
    let p1 = queued(t.lock(base, req("x", "p", 1000, None, false, 2)));
    let r = queued(t.lock(base, req("x", "r", 1000, None, false, 3)));
    effects(&mut t);
    let p2 = queued(t.lock(ms(base, 1), req_set("x", &["y"], "p", 1000, 2)));
    assert_eq!(
        effects(&mut t),
        vec![Effect::WaitEnded {
            waiter: p1,
            why: WaitEnd::Replaced
        }]
    );
    assert_eq!(t.status(ms(base, 1), "x").map(|s| s.waiters), Some(2));
    assert_eq!(t.unlock(ms(base, 2), "x", hx, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![r]);
    let rt = t.status(ms(base, 2), "x").expect("held").token;
    assert_eq!(t.unlock(ms(base, 3), "x", rt, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![p2]);
    assert_eq!(
        tokens_of(&mut t, ms(base, 3), &["x", "y"]),
        vec![Some(rt + 1); 2]
    );
}

/// The contract: a set's lease "ends all names at once". The table hands each name over as
/// it ends it, so watchers see a name granted again while the set still holds the next.
#[test]
fn a_set_ends_on_all_its_names_before_anyone_is_granted_one() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req_set("c", &["a"], "p", 10, 1)));
    let q = queued(t.lock(base, req("c", "q", 1000, None, false, 2)));
    effects(&mut t);
    t.expire(ms(base, 10));
    let after = effects(&mut t);
    let kinds: Vec<(EventKind, &str)> = after
        .iter()
        .filter_map(|e| match e {
            Effect::Event(e) => Some((e.kind, &*e.name)),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::Expired, "c"),
            (EventKind::Expired, "a"),
            (EventKind::Acquired, "c"),
        ],
        "waiter {q} granted c before the set ended on a (token {token})"
    );
}

/// `rules::note_again`: a newer LOCK by the same id that takes over its wait keeps the
/// note the wait had when it brings none; the table's set drops it.
#[test]
fn a_set_replacing_the_same_ids_wait_keeps_its_note() {
    let (mut t, base) = table();
    let (held, _) = granted(t.lock(base, req("c", "p", 1000, None, false, 1)));
    let noted = LockRequest {
        note: Some("first note".into()),
        ..req("c", "r", 1000, None, false, 2)
    };
    queued(t.lock(base, noted));
    queued(t.lock(base, req_set("a", &["c"], "r", 1000, 2)));
    assert_eq!(t.unlock(ms(base, 1), "c", held, NO_USER), Ok(()));
    effects(&mut t);
    let note = t.status(ms(base, 1), "a").and_then(|s| s.note);
    assert_eq!(note.as_deref(), Some("first note"));
}

#[test]
fn the_same_set_again_keeps_its_waiting_place_in_every_queue() {
    let (mut t, base) = table();
    let (hx, _) = granted(t.lock(base, req("x", "h", 1000, None, false, 1)));
    let p1 = queued(t.lock(base, req_set("x", &["y"], "p", 1000, 2)));
    let r = queued(t.lock(base, req("y", "r", 1000, None, false, 3)));
    effects(&mut t);
    // The same names in another order: the same set, its place kept (before r on y).
    let p2 = queued(t.lock(ms(base, 1), req_set("y", &["x"], "p", 1000, 2)));
    assert_eq!(
        effects(&mut t),
        vec![Effect::WaitEnded {
            waiter: p1,
            why: WaitEnd::Replaced
        }]
    );
    assert_eq!(t.unlock(ms(base, 2), "x", hx, NO_USER), Ok(()));
    assert_eq!(grants(&effects(&mut t)), vec![p2]);
    let _ = r;
}

// ---- Where a LOCK waits and whom it ends, over a waiting set: on both backends' views ----
//
// Each case runs three ways: through the harness (the table and the etcd backend's view of
// the names each decide every LOCK, judged against the reference model: the answer, the
// effects, and for etcd where it waits and whom it ends), on the table alone (who is
// granted first), and on the etcd backend's view built from plain parts (the decision
// itself).

/// A LOCK of `NAMES[name]` (and `and`) by `IDS[id]` on connection `conn`, for the harness.
fn lock_op(name: usize, and: &[usize], id: usize, conn: ConnId) -> Op {
    Op::Lock {
        name,
        id,
        ttl: TtlPick::Ms(1000),
        wait: WaitPick::Forever,
        session: SessionPick::Plain,
        conn,
        mode: Mode::Exclusive,
        user: NO_USER,
        note: None,
        supersede: false,
        and: and.to_vec(),
        delay: None,
    }
}

/// Runs `ops` through the harness: every LOCK judged on both backends' views.
fn judged_on_both_views(ops: &[Op]) {
    let limits = MLimits {
        default_ttl: 1000,
        max_ttl: 10_000,
        max_locks: 100,
        max_waiters: 10,
    };
    if let Err(e) = run_with(limits, 1, ops, true, true) {
        panic!("{e}");
    }
}

/// q holds a and b; p waits for the set `p_waits`, then r for `r_waits` (by name index):
/// the start of every case below.
fn set_waiting(p_waits: &[usize], r_waits: &[usize]) -> Vec<Op> {
    let (a, b) = (0, 1);
    let (p, q, r) = (0, 1, 2);
    let (p_first, p_more) = p_waits.split_first().expect("a name");
    let (first, more) = r_waits.split_first().expect("a name");
    vec![
        lock_op(a, &[], q, 1),
        lock_op(b, &[], q, 1),
        lock_op(*p_first, p_more, p, 2),
        lock_op(*first, more, r, 3),
    ]
}

/// The table with q holding a and b, p waiting for the set `p_waits` and then r for
/// `r_waits`: q's tokens, p's wait.
fn table_set_waiting(
    t: &mut Locks,
    base: Instant,
    p_waits: &[&str],
    r_waits: &[&str],
) -> (Vec<Token>, WaiterId) {
    let (qa, _) = granted(t.lock(base, req("a", "q", 1000, None, false, 1)));
    let (qb, _) = granted(t.lock(base, req("b", "q", 1000, None, false, 1)));
    let (p_first, p_more) = p_waits.split_first().expect("a name");
    let p = queued(t.lock(base, req_set(p_first, p_more, "p", 1000, 2)));
    let (first, more) = r_waits.split_first().expect("a name");
    queued(t.lock(base, req_set(first, more, "r", 1000, 3)));
    effects(t);
    (vec![qa, qb], p)
}

/// q's holds on a and b released: who the table grants, in order.
fn release_q(t: &mut Locks, base: Instant, held: &[Token]) -> Vec<WaiterId> {
    let mut order = Vec::new();
    for (name, token) in ["a", "b"].iter().zip(held) {
        assert_eq!(t.unlock(ms(base, 2), name, *token, NO_USER), Ok(()));
        order.extend(grants(&effects(t)));
    }
    order
}

/// The etcd backend's view of a, b and c as [`set_waiting`] leaves them (q holding a and b,
/// keys 0 and 1; p's set waiting at key 10 for `p_waits`, then r at key 11 for `r_waits`).
#[cfg(feature = "etcd")]
fn etcd_parts(
    p_waits: &[&str],
    r_waits: &[&str],
) -> Vec<(
    Vec<lockd::backend::etcd::model::HolderPart<'static>>,
    Vec<lockd::backend::etcd::model::WaiterPart<'static>>,
)> {
    use lockd::backend::etcd::model::{HolderPart, WaiterPart};
    let names = |n: &[&str]| match n.len() {
        1 => Vec::new(),
        _ => n.iter().map(|s| s.to_string()).collect(),
    };
    ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let holders = (*name != "c")
                .then(|| HolderPart {
                    key: i,
                    id: "q",
                    user: "0",
                    mode: Mode::Exclusive,
                    session: None,
                    lingering: false,
                    set: Vec::new(),
                })
                .into_iter()
                .collect();
            let mut queue = Vec::new();
            if p_waits.contains(name) {
                queue.push(WaiterPart {
                    key: 10,
                    id: "p",
                    user: "0",
                    mode: Mode::Exclusive,
                    set: names(p_waits),
                });
            }
            if r_waits.contains(name) {
                queue.push(WaiterPart {
                    key: 11,
                    id: "r",
                    user: "0",
                    mode: Mode::Exclusive,
                    set: names(r_waits),
                });
            }
            (holders, queue)
        })
        .collect()
}

/// What the etcd backend's view decides of `req` on the names of [`etcd_parts`].
#[cfg(feature = "etcd")]
fn etcd_decides(
    p_waits: &[&str],
    r_waits: &[&str],
    req: &LockRequest,
) -> Result<lockd::locks::rules::SetDecision<usize, usize>, TableError> {
    use lockd::backend::etcd::model::decide_set;
    let parts = etcd_parts(p_waits, r_waits);
    let index = |n: &str| {
        ["a", "b", "c"]
            .iter()
            .position(|x| *x == n)
            .expect("a name")
    };
    let asked: Vec<_> = std::iter::once(&*req.name)
        .chain(req.and.iter().map(String::as_str))
        .map(|n| (&parts[index(n)].0[..], &parts[index(n)].1[..]))
        .collect();
    decide_set(&asked, req, "0", &Limits::default(), 2)
}

/// The three cases: what the same id p LOCKs while its set `p_waits` waits ahead of r (which
/// waits for `r_waits`), and whether it keeps the set's place (ahead of r).
struct Case {
    what: &'static str,
    p_waits: &'static [&'static str],
    r_waits: &'static [&'static str],
    name: &'static str,
    and: &'static [&'static str],
    keeps_place: bool,
}

/// Set over set: the very set it waits for, its names in another order: it keeps its place,
/// ahead of r, in every queue.
const SET_OVER_THE_SAME_SET: Case = Case {
    what: "set over the same set",
    p_waits: &["a", "b"],
    r_waits: &["a", "b"],
    name: "b",
    and: &["a"],
    keeps_place: true,
};

/// Set over another set (one name more, one less, or another name): its waiting set is
/// replaced, and the new one waits at the back of every queue (behind r).
const SETS_OVER_ANOTHER_SET: [Case; 3] = [
    Case {
        what: "set over a set of one name less",
        p_waits: &["a", "b"],
        r_waits: &["a", "b"],
        name: "a",
        and: &["b", "c"],
        keeps_place: false,
    },
    Case {
        what: "set over a set of one name more",
        p_waits: &["a", "b", "c"],
        r_waits: &["a", "b"],
        name: "b",
        and: &["a"],
        keeps_place: false,
    },
    Case {
        what: "set over another set",
        p_waits: &["a", "b"],
        r_waits: &["a", "b"],
        name: "a",
        and: &["c"],
        keeps_place: false,
    },
];

/// One name over a set: one name of the set it waits for: the set is replaced (it leaves
/// b's queue too), and the new LOCK takes the set's place on a, ahead of r.
const ONE_NAME_OVER_A_SET: Case = Case {
    what: "one name over a set",
    p_waits: &["a", "b"],
    r_waits: &["a"],
    name: "a",
    and: &[],
    keeps_place: true,
};

impl Case {
    fn index(name: &str) -> usize {
        NAMES.iter().position(|n| *n == name).expect("a name")
    }

    /// Through the harness: every LOCK judged on both views against the reference model.
    fn against_the_model(&self) {
        let p_waits: Vec<usize> = self.p_waits.iter().map(|n| Case::index(n)).collect();
        let r_waits: Vec<usize> = self.r_waits.iter().map(|n| Case::index(n)).collect();
        let and: Vec<usize> = self.and.iter().map(|n| Case::index(n)).collect();
        let mut ops = set_waiting(&p_waits, &r_waits);
        ops.push(lock_op(Case::index(self.name), &and, 0, 2));
        judged_on_both_views(&ops);
    }

    /// On the table: the older set ends REPLACED; once q lets go, p goes first exactly when
    /// it kept its place.
    fn on_the_table(&self) {
        let (mut t, base) = table();
        let (held, p1) = table_set_waiting(&mut t, base, self.p_waits, self.r_waits);
        let again = req_set(self.name, self.and, "p", 1000, 2);
        let p2 = queued(t.lock(ms(base, 1), again));
        let ended = vec![Effect::WaitEnded {
            waiter: p1,
            why: WaitEnd::Replaced,
        }];
        assert_eq!(effects(&mut t), ended, "{}", self.what);
        let first = release_q(&mut t, base, &held);
        assert_eq!(first.len(), 1, "{}: one of r and p at a time", self.what);
        assert_eq!(
            first == vec![p2],
            self.keeps_place,
            "{}: p granted first: {}",
            self.what,
            first == vec![p2]
        );
        if self.and.is_empty() {
            assert_eq!(t.status(ms(base, 2), "b"), None, "the set left b's queue");
        }
    }

    /// On the etcd backend's view of the names: its decision (p's set at key 10).
    #[cfg(feature = "etcd")]
    fn on_the_etcd_view(&self) {
        use lockd::backend::etcd::model::decide;
        use lockd::locks::rules::{Decision, SetDecision};
        let place = self.keeps_place.then_some(10);
        let again = req_set(self.name, self.and, "p", 1000, 2);
        if self.and.is_empty() {
            let parts = etcd_parts(self.p_waits, self.r_waits);
            let (holders, queue) = &parts[Case::index(self.name)];
            let decided = decide(holders, queue, &again, "0", &Limits::default(), 2);
            let want = Decision::Queue {
                place,
                replaced: vec![10],
                superseded: vec![],
            };
            assert_eq!(decided, Ok(want), "{}", self.what);
        } else {
            let decided = etcd_decides(self.p_waits, self.r_waits, &again);
            let want = SetDecision::Queue {
                place,
                replaced: vec![10],
            };
            assert_eq!(decided, Ok(want), "{}", self.what);
        }
    }
}

#[test]
fn set_over_the_same_set_keeps_its_place_against_the_model() {
    SET_OVER_THE_SAME_SET.against_the_model();
}

#[test]
fn set_over_the_same_set_keeps_its_place_on_the_table() {
    SET_OVER_THE_SAME_SET.on_the_table();
}

#[cfg(feature = "etcd")]
#[test]
fn set_over_the_same_set_keeps_its_place_on_the_etcd_view() {
    SET_OVER_THE_SAME_SET.on_the_etcd_view();
}

#[test]
fn set_over_another_set_is_replaced_from_the_back_against_the_model() {
    for case in &SETS_OVER_ANOTHER_SET {
        case.against_the_model();
    }
}

#[test]
fn set_over_another_set_is_replaced_from_the_back_on_the_table() {
    for case in &SETS_OVER_ANOTHER_SET {
        case.on_the_table();
    }
}

#[cfg(feature = "etcd")]
#[test]
fn set_over_another_set_is_replaced_from_the_back_on_the_etcd_view() {
    for case in &SETS_OVER_ANOTHER_SET {
        case.on_the_etcd_view();
    }
}

#[test]
fn one_name_over_a_set_takes_its_place_against_the_model() {
    ONE_NAME_OVER_A_SET.against_the_model();
}

#[test]
fn one_name_over_a_set_takes_its_place_on_the_table() {
    ONE_NAME_OVER_A_SET.on_the_table();
}

#[cfg(feature = "etcd")]
#[test]
fn one_name_over_a_set_takes_its_place_on_the_etcd_view() {
    ONE_NAME_OVER_A_SET.on_the_etcd_view();
}
