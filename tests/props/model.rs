//! Model test of the pure lock table (`lockd::locks::Locks`).
//!
//! Random histories of LOCK / UNLOCK / RENEW / CHECK / BREAK / cancelled waits / closed
//! sessions / passing time are run against the table and against a small reference model
//! (`model/reference.rs`) in lockstep, with exact time (a base instant plus whole
//! milliseconds, often landing exactly on a deadline). Every return value and every effect
//! must be equal, and after every step the documented invariants are checked again from the
//! outside (`model/observer.rs`): one holder per name, tokens that only grow, FIFO grants, no
//! grant to a waiter that left, `next_deadline()` and STATUS in agreement.
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
    Token, UserId, WaitEnd, WaiterId, NO_USER,
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
    /// BREAK of every holder, or of one token's.
    Break {
        name: usize,
        tok: Option<TokPick>,
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
               proptest::bool::weighted(0.2))
            .prop_map(|(name, id, ttl, wait, session, conn, mode, user, note, supersede)| Op::Lock {
                name, id, ttl, wait, session, conn, mode, user, note, supersede
            }),
        3 => (name.clone(), tok_pick(), user_pick())
            .prop_map(|(name, tok, user)| Op::Unlock { name, tok, user }),
        2 => (name.clone(), tok_pick(), proptest::option::of(ttl_pick()), 1u64..=3, user_pick())
            .prop_map(|(name, tok, ttl, conn, user)| Op::Renew { name, tok, ttl, conn, user }),
        1 => (name.clone(), tok_pick()).prop_map(|(name, tok)| Op::Revoke { name, tok }),
        1 => (name.clone(), tok_pick()).prop_map(|(name, tok)| Op::Check { name, tok }),
        1 => (name.clone(), proptest::option::of(tok_pick()))
            .prop_map(|(name, tok)| Op::Break { name, tok }),
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

/// The table and the model side by side, plus what the picks need to resolve.
/// What the etcd backend decided of a LOCK, and what to read it by.
#[cfg(feature = "etcd")]
struct ClusterDecision {
    decision: Result<lockd::locks::rules::Decision<usize, usize>, TableError>,
    tokens: Vec<Token>,
    same_waiter: Option<usize>,
    superseded: Vec<usize>,
}

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
        let live = self
            .model
            .entries
            .get(name)
            .map(|e| e.holders[pick % e.holders.len()].token);
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
        let entry = self.model.entries.get(name);
        let tokens: Vec<Token> =
            entry.map_or_else(Vec::new, |e| e.holders.iter().map(|h| h.token).collect());
        let holders: Vec<HolderPart<'_>> = entry.map_or_else(Vec::new, |e| {
            e.holders
                .iter()
                .map(|h| HolderPart {
                    id: &h.id,
                    user: user(h.user),
                    mode: e.mode,
                    session: h.session.map(|s| s.conn),
                })
                .collect()
        });
        let only = token.map(|t| tokens.iter().position(|x| *x == t).unwrap_or(usize::MAX));
        let ended = breaks(&holders, only)?;
        Ok(ended.into_iter().map(|i| tokens[i]).collect())
    }

    /// What the etcd backend decides of `req` on the name as the reference model has it
    /// now (its holders and queue shown through the cluster's own view of a name), with
    /// the holders' tokens and the waiters' (id, user), to read the decision by.
    #[cfg(feature = "etcd")]
    fn cluster_decision(&mut self, now: u64, req: &LockRequest) -> ClusterDecision {
        use lockd::backend::etcd::model::{decide, HolderPart, WaiterPart};
        self.model.process(now);
        let users: Vec<String> = (0..=UserId::from(u8::MAX)).map(|u| u.to_string()).collect();
        let user = |u: UserId| users.get(u as usize).map_or("?", String::as_str);
        let leases = self.model.entries.values().map(|e| e.holders.len()).sum();
        let entry = self.model.entries.get(&req.name);
        let holders: Vec<HolderPart<'_>> = entry.map_or_else(Vec::new, |e| {
            e.holders
                .iter()
                .map(|h| HolderPart {
                    id: &h.id,
                    user: user(h.user),
                    mode: e.mode,
                    session: h.session.map(|s| s.conn),
                })
                .collect()
        });
        let queue: Vec<WaiterPart<'_>> = entry.map_or_else(Vec::new, |e| {
            e.queue
                .iter()
                .map(|w| WaiterPart {
                    id: &w.id,
                    user: user(w.user),
                    mode: w.mode,
                })
                .collect()
        });
        let decision = decide(
            &holders,
            &queue,
            req,
            user(req.user),
            self.table.limits(),
            leases,
        );
        let tokens = entry.map_or_else(Vec::new, |e| e.holders.iter().map(|h| h.token).collect());
        let same_waiter = entry.and_then(|e| {
            e.queue
                .iter()
                .position(|w| w.id == req.id && w.user == req.user)
        });
        // A supersede takes every waiter but the one it replaces.
        let queued = entry.map_or(0, |e| e.queue.len());
        let superseded = if req.supersede {
            (0..queued).filter(|i| Some(*i) != same_waiter).collect()
        } else {
            Vec::new()
        };
        ClusterDecision {
            decision,
            tokens,
            same_waiter,
            superseded,
        }
    }

    /// Whether the etcd backend's decision is the one the reference model made.
    #[cfg(feature = "etcd")]
    fn cluster_agrees(
        &self,
        cluster: ClusterDecision,
        want: &Result<LockOutcome, TableError>,
    ) -> Result<(), String> {
        use lockd::locks::rules::Decision;
        let expected = match want {
            // Refused before the rules are asked, in both backends.
            Err(TableError::BadTtl { .. } | TableError::BadGrace { .. }) => return Ok(()),
            Err(e) => Err(e.clone()),
            Ok(LockOutcome::Granted { token, .. }) => {
                Ok(match cluster.tokens.iter().position(|t| t == token) {
                    Some(i) => Decision::Again(i),
                    None => Decision::Grant,
                })
            }
            Ok(LockOutcome::Queued { .. }) => Ok(Decision::Queue {
                replaces: cluster.same_waiter,
                superseded: cluster.superseded.clone(),
            }),
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
        let want = self.model.entries.values().any(|e| {
            e.holders
                .iter()
                .any(|h| h.session.and_then(|s| s.conn) == Some(conn))
        });
        let got = self.table.holds_sessions(conn);
        if got != want {
            return Err(format!("holds_sessions({conn}): table {got}, model {want}"));
        }
        Ok(())
    }

    /// Compares the effects of one step, then lets the observer judge them.
    fn effects(&mut self, call: Call<'_>) -> Result<(), String> {
        let got = self.table.take_effects();
        let want = self.model.take_effects();
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
            } => {
                let ttl = self.ttl(ttl);
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
                    session: session.map(Duration::from_millis),
                    conn: *conn,
                    mode: *mode,
                    user: *user,
                    origin: Default::default(),
                    note: note.map(Into::into),
                    supersede: *supersede,
                    and: Box::default(),
                };
                #[cfg(feature = "etcd")]
                let cluster = self.cluster_decision(now, &req);
                let got = self.table.lock(at, req);
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
                    },
                );
                // Both backends' decisions are judged, each on its own: a wrong rule shows
                // in both, a wrong view of a name in one.
                #[cfg(feature = "etcd")]
                let cluster = self.cluster_agrees(cluster, &want);
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
                self.effects(Call::Lock {
                    name: NAMES[*name],
                    mode: *mode,
                    outcome: got.as_ref().ok(),
                })?;
            }
            Op::Unlock { name, tok, user } => {
                let token = self.token(NAMES[*name], tok);
                let user = self.user(user, token);
                let got = self.table.unlock(at, NAMES[*name], token, user);
                let want = self.model.unlock(now, NAMES[*name], token, user);
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
                    ttl.map(Duration::from_millis),
                    *conn,
                    user,
                );
                let want = self.model.renew(now, NAMES[*name], token, ttl, *conn, user);
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
                let want = self.model.revoke(now, NAMES[*name], token);
                if got != want {
                    return Err(format!("revoke {token}: table {got:?}, model {want:?}"));
                }
                self.effects(Call::Other)?;
            }
            Op::Break { name, tok } => {
                let token = tok.as_ref().map(|p| self.token(NAMES[*name], p));
                let by = lockd::locks::Origin::default();
                #[cfg(feature = "etcd")]
                let cluster = self.cluster_breaks(now, NAMES[*name], token);
                let got = self.table.break_lock(at, NAMES[*name], token, &by);
                let want = self.model.break_lock(now, NAMES[*name], token);
                if got != want {
                    return Err(format!("break {token:?}: table {got:?}, model {want:?}"));
                }
                #[cfg(feature = "etcd")]
                if cluster != want {
                    return Err(format!(
                        "break {token:?}: cluster {cluster:?}, model {want:?}"
                    ));
                }
                // The last lease it ended is remembered as broken (its holder is told so).
                if let Some(&last) = got.as_ref().ok().and_then(|ended| ended.last()) {
                    let why = self.table.broken(at, NAMES[*name], last);
                    if !matches!(why, TableError::Broken { token, .. } if token == last) {
                        return Err(format!("break {last}: then told {why:?}"));
                    }
                }
                self.effects(Call::Other)?;
            }
            Op::Check { name, tok } => {
                let token = self.token(NAMES[*name], tok);
                let got = self.table.check(at, NAMES[*name], token);
                let want = self.model.check(now, NAMES[*name], token);
                if got != want {
                    return Err(format!("check {token}: table {got:?}, model {want:?}"));
                }
                self.effects(Call::Other)?;
            }
            Op::CancelWait(p) => {
                let live: Vec<WaiterId> = self
                    .model
                    .entries
                    .values()
                    .flat_map(|e| e.queue.iter().map(|w| w.waiter))
                    .collect();
                let waiter = match p {
                    WaiterPick::Live(i) if !live.is_empty() => live[i % live.len()],
                    WaiterPick::Seen(i) if !self.waiters.is_empty() => {
                        self.waiters[i % self.waiters.len()]
                    }
                    WaiterPick::Live(i) | WaiterPick::Seen(i) => *i as WaiterId,
                    WaiterPick::Raw(w) => *w,
                };
                let got = self.table.cancel_wait(at, waiter);
                let want = self.model.cancel_wait(now, waiter);
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
                        .entries
                        .get(NAMES[*name])
                        .and_then(|e| e.holders.iter().find(|h| h.token == token))
                        .and_then(|h| h.session?.conn)
                        .unwrap_or(1),
                    ConnPick::Conn(c) => *c,
                };
                self.table.drop_session(at, NAMES[*name], token, conn);
                self.model.drop_session(now, NAMES[*name], token, conn);
                self.effects(Call::Other)?;
            }
            Op::CloseConnection(conn) => {
                self.table.expire(at);
                self.model.process(now);
                self.sessions_agree(*conn)?;
                // The model ends them one by one, in the order they were granted.
                let mut bound: Vec<(Token, String)> = self
                    .model
                    .entries
                    .iter()
                    .flat_map(|(name, e)| {
                        e.holders
                            .iter()
                            .filter(|h| h.session.and_then(|s| s.conn) == Some(*conn))
                            .map(move |h| (h.token, name.clone()))
                    })
                    .collect();
                bound.sort();
                self.table.close_connection(at, *conn);
                for (token, name) in bound {
                    self.model.drop_session(now, &name, token, *conn);
                }
                self.effects(Call::Other)?;
                self.sessions_agree(*conn)?;
            }
            Op::Status { name } => {
                let got = self.table.status(at, NAMES[*name]);
                let want = self.model.status(now, NAMES[*name]);
                if got != want {
                    return Err(format!("status: table {got:?}, model {want:?}"));
                }
                self.effects(Call::Other)?;
            }
            Op::Expire => {
                self.table.expire(at);
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
        let want = self.model.soonest().map(|ms| self.model.at(ms));
        let got = self.table.next_deadline();
        if got != want {
            return Err(format!(
                "next_deadline: table {got:?}, model {want:?} (base {:?})",
                self.model.base
            ));
        }
        if self.table.len() != self.model.entries.len() {
            return Err(format!(
                "len: table {}, model {}",
                self.table.len(),
                self.model.entries.len()
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

fn run(limits: MLimits, first_token: Token, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::new(limits, first_token);
    for op in ops {
        if let Err(e) = h.step(op) {
            return Err(TestCaseError::fail(format!(
                "{e}\nlimits {limits:?}, first token {first_token}\nhistory:\n{}",
                h.log.join("\n")
            )));
        }
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
}

// ---- The tricky rules, one example each ----

fn table() -> (Locks, Instant) {
    let limits = Limits {
        default_ttl: Duration::from_secs(30),
        max_ttl: Duration::from_secs(60),
        max_locks: 100,
        max_waiters: 100,
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
        session: session.then_some(Duration::ZERO),
        conn,
        mode: Mode::Exclusive,
        user: NO_USER,
        origin: Default::default(),
        note: None,
        supersede: false,
        and: Box::default(),
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
        t.renew(ms(base, 2000), "x", token, None, 1, NO_USER)
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
        t.renew(base, "x", token, None, 2, bob),
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
    assert!(t.renew(base, "x", token, None, 1, 7).is_ok());
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
fn a_break_hands_over_with_a_higher_token_and_is_remembered_until_the_old_deadline() {
    let (mut t, base) = table();
    let (token, _) = granted(t.lock(base, req("x", "p", 10, None, false, 1)));
    let q = queued(t.lock(base, req("x", "q", 50, None, true, 2)));
    effects(&mut t);
    let by = lockd::locks::Origin::new(Some("ops"), None);
    assert_eq!(t.break_lock(ms(base, 2), "x", None, &by), Ok(vec![token]));
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
        t.renew(ms(base, 3), "x", token, None, 1, NO_USER),
        Err(TableError::NotHeld)
    );
    assert!(matches!(
        t.broken(ms(base, 9), "x", token),
        TableError::Broken { by, .. } if &*by == "ops"
    ));
    assert_eq!(t.broken(ms(base, 10), "x", token), TableError::NotHeld);
    // Nothing left of that token, or on a free name.
    assert_eq!(
        t.break_lock(ms(base, 11), "x", Some(token), &by),
        Err(TableError::NotHeld)
    );
    assert_eq!(
        t.break_lock(ms(base, 11), "free", None, &by),
        Err(TableError::NotHeld)
    );
}
