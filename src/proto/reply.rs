//! Replies, both ways: [`Reply`] is a line as the server formats it (borrowing the table's
//! values, so a STATUS of a million locks copies nothing), [`Received`] the same line as a
//! client reads it back (owned and typed). Each line's grammar is written once, in the
//! `write_*` functions both use, and its parser sits beside it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::note::{decode_note, Encoded, NOTE_KEY};
use super::{ErrorCode, ProtoError, HELP};
use crate::locks::{Event, EventKind, LockStatus, Mode, Token, WaiterStatus};

/// One reply line, as the server sends it.
#[derive(Clone, Debug)]
pub enum Reply<'a> {
    /// `OK <token>`: LOCK granted.
    Token(Token),
    /// `OK <token> <token2> ...`: a LOCK of a set (`and=`) granted, one token per name in
    /// the request's order (at least two; one name is [`Reply::Token`]).
    Tokens(&'a [Token]),
    /// `OK`: UNLOCK, RENEW, CHECK.
    Done,
    /// `OK ttl_ms=<ms>`: RENEW and CHECK say how long the lease has left.
    Lease(Duration),
    /// `OK PONG`.
    Pong,
    /// `OK <user>`: AUTH accepted.
    Authenticated(&'a str),
    /// `OK <help>`.
    Help,
    /// `OK bye`.
    Bye,
    /// `OK watching <name|*>`.
    Watching(Option<&'a str>),
    /// `OK <name> free` or `OK <name> held ...`.
    Status(&'a str, Option<&'a LockStatus>),
    /// `STATUS <name>`'s line from a cluster front-end: the same, then how old its view is
    /// (`etcd_age_ms=<ms> etcd_bound_ms=<ms>`).
    StatusAged(&'a str, Option<&'a LockStatus>, EtcdAge),
    /// `INFO <name> held ...`: one line of a STATUS of all locks.
    Info(&'a LockStatus),
    /// `OK <count>`: ends a STATUS of all locks.
    Count(usize),
    /// `OK <count> etcd_age_ms=<ms> etcd_bound_ms=<ms>`: ends a STATUS of all locks in
    /// cluster mode, saying how old the front-end's view may be.
    CountAged(usize, EtcdAge),
    /// `HOLDER <name> id=.. token=.. held_ms=.. ttl_ms=.. session=.. mode=..`: STATUS detail,
    /// one per holder.
    Holder(&'a LockStatus),
    /// `WAITER <name> <position> id=.. waited_ms=.. session=..`: STATUS detail, queue order.
    Waiter(&'a str, usize, &'a WaiterStatus),
    /// `EVENT <kind> <name> <id> <token> <unix-ms>`.
    Event(&'a Event, u64),
    /// `ERR <code> <message>`.
    Error(&'a ProtoError),
    /// `OK broken=<n>`: BREAK ended `n` leases.
    Broken(usize),
}

impl fmt::Display for Reply<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Token(t) => write!(f, "OK {t}"),
            Reply::Tokens(tokens) => {
                f.write_str("OK")?;
                tokens.iter().try_for_each(|t| write!(f, " {t}"))
            }
            Reply::Done => f.write_str("OK"),
            Reply::Lease(left) => write!(f, "OK {LEASE_KEY}={}", left.as_millis()),
            Reply::Pong => write!(f, "OK {PONG}"),
            Reply::Authenticated(user) => write!(f, "OK {user}"),
            Reply::Help => write!(f, "OK {HELP}"),
            Reply::Bye => write!(f, "OK {BYE}"),
            Reply::Watching(name) => write!(f, "OK {WATCHING} {}", name.unwrap_or(ALL)),
            Reply::Status(name, None) => write!(f, "OK {name} {FREE}"),
            Reply::Status(_, Some(s)) => {
                f.write_str("OK ")?;
                write_held(f, &held_of(s))?;
                write_note(f, s.note.as_deref())
            }
            Reply::StatusAged(name, None, aged) => {
                Reply::Status(name, None).fmt(f)?;
                write_aged(f, aged)
            }
            Reply::StatusAged(_, Some(s), aged) => {
                // The note is the line's last field, after the cluster's too.
                f.write_str("OK ")?;
                write_held(f, &held_of(s))?;
                write_aged(f, aged)?;
                write_note(f, s.note.as_deref())
            }
            Reply::Info(s) => {
                f.write_str("INFO ")?;
                write_held(f, &held_of(s))?;
                write_note(f, s.note.as_deref())
            }
            Reply::Count(n) => write!(f, "OK {n}"),
            Reply::CountAged(n, aged) => {
                write!(f, "OK {n}")?;
                write_aged(f, aged)
            }
            Reply::Holder(s) => {
                let peer = s.origin.peer().map(|p| p.to_string());
                write_holder(
                    f,
                    &HolderLine {
                        name: &*s.name,
                        id: &*s.holder,
                        token: s.token,
                        held: s.held,
                        left: s.left,
                        session: s.session,
                        mode: s.mode,
                        user: s.origin.user(),
                        granted_unix_ms: (s.granted_unix_ms != 0).then_some(s.granted_unix_ms),
                        peer: peer.as_deref(),
                        and: others(&s.set, &s.name),
                        note: s.note.as_deref(),
                        lingering: s.lingering,
                    },
                )
            }
            Reply::Waiter(name, position, w) => write_waiter(
                f,
                &WaiterLine {
                    name: *name,
                    position: *position,
                    id: &*w.id,
                    waited: w.waited,
                    session: w.session,
                    mode: w.mode,
                    and: others(&w.set, name),
                },
            ),
            Reply::Event(e, unix_ms) => {
                let by = matches!(e.kind, EventKind::Broken | EventKind::Breaking)
                    .then(|| e.broken_by.who());
                write_event(
                    f,
                    &EventLine {
                        kind: e.kind,
                        name: &*e.name,
                        id: &*e.id,
                        token: e.token,
                        unix_ms: *unix_ms,
                        note: e.note.as_deref().filter(|_| e.kind == EventKind::Acquired),
                        by: by.as_deref(),
                    },
                )
            }
            Reply::Error(e) => e.fmt(f),
            Reply::Broken(n) => write!(f, "OK {BROKEN_KEY}={n}"),
        }
    }
}

// The fixed words of the reply lines.
const LEASE_KEY: &str = "ttl_ms";
const ETCD_AGE_KEY: &str = "etcd_age_ms";
const ETCD_BOUND_KEY: &str = "etcd_bound_ms";
const PONG: &str = "PONG";
const BYE: &str = "bye";
const WATCHING: &str = "watching";
const ALL: &str = "*";
const FREE: &str = "free";
const HELD: &str = "held";
const INFO: &str = "INFO";
const HOLDER: &str = "HOLDER";
const WAITER: &str = "WAITER";
const EVENT: &str = "EVENT";
const BROKEN_KEY: &str = "broken";
const BY_KEY: &str = "by";
/// A set's other names on a `HOLDER` or `WAITER` line, one field each, as a LOCK names them.
const AND_KEY: &str = "and";

/// How old a cluster front-end's view of etcd may be, as the end of a STATUS of all locks says
/// it: the age of its last answer from an etcd quorum, and the bound past which the
/// front-end is not ready (`/readyz` 503) and a client should call the view stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EtcdAge {
    /// Since the front-end's last answer from an etcd quorum.
    pub age: Duration,
    /// The front-end's readiness bound (`max(1s, --etcd-lease-ttl / 3)`).
    pub bound: Duration,
}

impl EtcdAge {
    /// Whether the view is older than the bound.
    pub fn stale(&self) -> bool {
        self.age > self.bound
    }
}

/// ` etcd_age_ms=<ms> etcd_bound_ms=<ms>`: how old a cluster front-end's view is.
fn write_aged(f: &mut fmt::Formatter<'_>, aged: &EtcdAge) -> fmt::Result {
    write!(
        f,
        " {ETCD_AGE_KEY}={} {ETCD_BOUND_KEY}={}",
        aged.age.as_millis(),
        aged.bound.as_millis()
    )
}

impl<'a> Reply<'a> {
    /// `STATUS <name>`'s line, with how old the view is in cluster mode.
    pub fn status(
        name: &'a str,
        status: Option<&'a LockStatus>,
        confirmed: Option<EtcdAge>,
    ) -> Reply<'a> {
        match confirmed {
            Some(aged) => Reply::StatusAged(name, status, aged),
            None => Reply::Status(name, status),
        }
    }
}

impl Reply<'_> {
    /// The end of a STATUS of `count` locks, with how old the view is in cluster mode.
    pub fn summary(count: usize, confirmed: Option<EtcdAge>) -> Reply<'static> {
        match confirmed {
            Some(aged) => Reply::CountAged(count, aged),
            None => Reply::Count(count),
        }
    }
}

/// ` note=<encoded>`, the last field of a line, where there is a note.
fn write_note<S: AsRef<str>>(f: &mut fmt::Formatter<'_>, note: Option<S>) -> fmt::Result {
    match note {
        Some(note) => write!(f, " {NOTE_KEY}={}", Encoded(note.as_ref())),
        None => Ok(()),
    }
}

/// A line's `note=`: `Some(None)` without one, `None` for one that does not decode.
fn read_note(value: Option<&str>) -> Option<Option<String>> {
    match value {
        None => Some(None),
        Some(v) => decode_note(v).map(Some),
    }
}

fn held_of(s: &LockStatus) -> HeldLine<&str> {
    HeldLine {
        name: &s.name,
        id: &s.holder,
        token: s.token,
        left: s.left,
        session: s.session,
        waiters: s.waiters,
        holders: s.holders,
        mode: s.mode,
        // The server's lines write the note themselves: it goes after the cluster fields.
        note: None,
    }
}

/// `<name> held id=.. token=.. ttl_ms=.. session=.. waiters=..`, and for a shared lock or a
/// semaphore ` holders=.. mode=..` (an exclusive lock's line is as it always was).
fn write_held<S: AsRef<str>>(f: &mut fmt::Formatter<'_>, h: &HeldLine<S>) -> fmt::Result {
    write!(
        f,
        "{} {HELD} id={} token={} ttl_ms={} session={} waiters={}",
        h.name.as_ref(),
        h.id.as_ref(),
        h.token,
        h.left.as_millis(),
        u8::from(h.session),
        h.waiters
    )?;
    if h.mode != Mode::Exclusive {
        write!(f, " holders={} mode={}", h.holders, h.mode)?;
    }
    Ok(())
}

fn write_holder<S: AsRef<str>>(f: &mut fmt::Formatter<'_>, h: &HolderLine<S>) -> fmt::Result {
    write!(
        f,
        "{HOLDER} {} id={} token={} held_ms={} ttl_ms={} session={} mode={}",
        h.name.as_ref(),
        h.id.as_ref(),
        h.token,
        h.held.as_millis(),
        h.left.as_millis(),
        u8::from(h.session),
        h.mode
    )?;
    if let Some(user) = &h.user {
        write!(f, " user={}", user.as_ref())?;
    }
    if let Some(granted) = h.granted_unix_ms {
        write!(f, " granted={granted}")?;
    }
    if let Some(peer) = &h.peer {
        write!(f, " peer={}", peer.as_ref())?;
    }
    if h.lingering {
        f.write_str(" lingering=1")?;
    }
    write_and(f, &h.and)?;
    write_note(f, h.note.as_ref())
}

/// ` and=<name>` for each of a set's other names.
fn write_and<S: AsRef<str>>(f: &mut fmt::Formatter<'_>, and: &[S]) -> fmt::Result {
    and.iter()
        .try_for_each(|n| write!(f, " {AND_KEY}={}", n.as_ref()))
}

/// A set's names but `name`, in their order: what a `HOLDER` or `WAITER` line of `name`
/// lists as `and=`.
fn others<'s>(set: &'s [Arc<str>], name: &str) -> Vec<&'s str> {
    set.iter().map(|n| &**n).filter(|n| *n != name).collect()
}

fn write_waiter<S: AsRef<str>>(f: &mut fmt::Formatter<'_>, w: &WaiterLine<S>) -> fmt::Result {
    write!(
        f,
        "{WAITER} {} {} id={} waited_ms={} session={} mode={}",
        w.name.as_ref(),
        w.position,
        w.id.as_ref(),
        w.waited.as_millis(),
        u8::from(w.session),
        w.mode
    )?;
    write_and(f, &w.and)
}

fn write_event<S: AsRef<str>>(f: &mut fmt::Formatter<'_>, e: &EventLine<S>) -> fmt::Result {
    write!(
        f,
        "{EVENT} {} {} {} {} {}",
        e.kind.as_str(),
        e.name.as_ref(),
        e.id.as_ref(),
        e.token,
        e.unix_ms
    )?;
    if let Some(by) = &e.by {
        write!(f, " {BY_KEY}={}", by.as_ref())?;
    }
    write_note(f, e.note.as_ref())
}

/// A held lock as a STATUS line (`OK` or `INFO`) describes it: its first holder (the lowest
/// token still holding), and how many hold and wait. Generic over its text so that the server
/// formats it from borrowed names and a client reads it into owned ones, with one grammar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLine<S = String> {
    /// The lock's name.
    pub name: S,
    /// The first holder's client id.
    pub id: S,
    /// The first holder's fencing token.
    pub token: Token,
    /// The first holder's lease time left (`ttl_ms`).
    pub left: Duration,
    /// `session=1`: a session lease.
    pub session: bool,
    /// The queue's length.
    pub waiters: usize,
    /// How many hold it: 1 for an exclusive lock (whose line does not say).
    pub holders: usize,
    /// `exclusive` where the line does not say (an exclusive lock, or an older server).
    pub mode: Mode,
    /// `note=`, decoded: the first holder's note; `None` without one (or from an older
    /// server).
    pub note: Option<S>,
}

/// The answer to `STATUS <name>`, and the last line of `STATUS <name> detail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusLine {
    /// `<name> free`.
    Free(String),
    /// `<name> held ...`.
    Held(HeldLine),
}

impl StatusLine {
    /// The lock's name, free or held.
    pub fn name(&self) -> &str {
        match self {
            StatusLine::Free(name) => name,
            StatusLine::Held(h) => &h.name,
        }
    }

    /// Who holds it, if anyone.
    pub fn held(&self) -> Option<&HeldLine> {
        match self {
            StatusLine::Free(_) => None,
            StatusLine::Held(h) => Some(h),
        }
    }
}

/// One `HOLDER` line of `STATUS <name> detail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderLine<S = String> {
    /// The lock's name.
    pub name: S,
    /// The holder's client id.
    pub id: S,
    /// Its fencing token.
    pub token: Token,
    /// How long it has held the lock (`held_ms`).
    pub held: Duration,
    /// Lease time left (`ttl_ms`).
    pub left: Duration,
    /// `session=1`: a session lease.
    pub session: bool,
    /// The mode it holds the lock in.
    pub mode: Mode,
    /// `user=`: the authenticated user that took the lease; `None` for a lease of no user
    /// (no `--auth-file`), and from servers older than the field.
    pub user: Option<S>,
    /// `granted=`: the server's wall clock at the grant, in Unix milliseconds; `None` where
    /// the server does not know it (a lease restored from an older journal) or is older.
    pub granted_unix_ms: Option<u64>,
    /// `peer=`: the `ip:port` of the client that took the lease, where known.
    pub peer: Option<S>,
    /// `and=`, repeated: a set's other names, in the LOCK's order (empty for a lease of one
    /// name, and from servers older than the field).
    pub and: Vec<S>,
    /// `note=`, decoded: the holder's note, if it gave one.
    pub note: Option<S>,
    /// `lingering=1`: the lease is over for its holder (broken, or in its lock-delay) and
    /// keeps its place until its holder's UNLOCK or `ttl_ms` runs out.
    pub lingering: bool,
}

/// One `WAITER` line of `STATUS <name> detail`: `position` 1 is granted next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterLine<S = String> {
    /// The lock's name.
    pub name: S,
    /// Its place in the queue, from 1.
    pub position: usize,
    /// The waiter's client id.
    pub id: S,
    /// How long it has waited so far (`waited_ms`).
    pub waited: Duration,
    /// It asked for a session lease.
    pub session: bool,
    /// The mode it asked for.
    pub mode: Mode,
    /// `and=`, repeated: a set's other names, in the LOCK's order (empty for a request of
    /// one name, and from servers older than the field).
    pub and: Vec<S>,
}

/// One `EVENT` line of a watch. A client reads a revoked grant as [`EventKind::Dropped`]: the
/// wire says `dropped` for both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLine<S = String> {
    /// What happened.
    pub kind: EventKind,
    /// The lock's name.
    pub name: S,
    /// The client id of the holder it happened to.
    pub id: S,
    /// The lease's fencing token.
    pub token: Token,
    /// The server's wall clock when it happened, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// `note=`, decoded: the new holder's note, on `acquired` only, if it gave one.
    pub note: Option<S>,
    /// `by=<who>`, on a `broken` event: who sent the BREAK (its user, else its `ip:port`).
    pub by: Option<S>,
}

impl<S: AsRef<str>> fmt::Display for HeldLine<S> {
    /// The line's text after `OK ` or `INFO `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_held(f, self)?;
        write_note(f, self.note.as_ref())
    }
}

impl fmt::Display for StatusLine {
    /// The line's text after `OK `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusLine::Free(name) => write!(f, "{name} {FREE}"),
            StatusLine::Held(h) => h.fmt(f),
        }
    }
}

impl<S: AsRef<str>> fmt::Display for HolderLine<S> {
    /// The whole line, `HOLDER` first.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_holder(f, self)
    }
}

impl<S: AsRef<str>> fmt::Display for WaiterLine<S> {
    /// The whole line, `WAITER` first.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_waiter(f, self)
    }
}

impl<S: AsRef<str>> fmt::Display for EventLine<S> {
    /// The whole line, `EVENT` first.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_event(f, self)
    }
}

/// What a client asked, which says how to read its `OK` line: `OK 7` is a token after LOCK and
/// a count after STATUS, `OK alice` a user after AUTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// `LOCK`: `OK <token>`.
    Lock,
    /// `UNLOCK`.
    Unlock,
    /// `RENEW`: `OK ttl_ms=<ms>`.
    Renew,
    /// `CHECK`: `OK ttl_ms=<ms>`.
    Check,
    /// `STATUS <name>`.
    Status,
    /// `STATUS`: `INFO` lines, then `OK <count>`.
    StatusAll,
    /// `STATUS <name> detail`: `HOLDER` and `WAITER` lines, then the `STATUS <name>` line.
    Detail,
    /// `WATCH [<name>]`: `OK watching ..`, then `EVENT` lines.
    Watch,
    /// `AUTH`: `OK <user>`.
    Auth,
    /// `PING`.
    Ping,
    /// `HELP`.
    Help,
    /// `QUIT`.
    Quit,
    /// `BREAK`: `OK broken=<n>`.
    Break,
}

impl From<&super::Request> for Asked {
    fn from(req: &super::Request) -> Asked {
        use super::Request as R;
        match req {
            R::Lock { .. } => Asked::Lock,
            R::Unlock { .. } => Asked::Unlock,
            R::Renew { .. } => Asked::Renew,
            R::Check { .. } => Asked::Check,
            R::Status { name: Some(n) } if super::prefix_of(n).is_none() => Asked::Status,
            R::Status { .. } => Asked::StatusAll,
            R::StatusDetail { .. } => Asked::Detail,
            R::Watch { .. } => Asked::Watch,
            R::Auth { .. } => Asked::Auth,
            R::Ping => Asked::Ping,
            R::Help => Asked::Help,
            R::Quit => Asked::Quit,
            R::Break { .. } => Asked::Break,
        }
    }
}

/// A reply line as a client reads it: owned and typed, the inverse of [`Reply`] (its
/// `Display` is the line the server sends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Received {
    /// `OK <token>`: LOCK granted.
    Token(Token),
    /// `OK <token> <token2> ...`: a LOCK of a set granted, a token per name in its order.
    Tokens(Vec<Token>),
    /// `OK`: UNLOCK (and RENEW or CHECK of an older server).
    Done,
    /// `OK ttl_ms=<ms>`: RENEW and CHECK.
    Lease(Duration),
    /// `OK PONG`.
    Pong,
    /// `OK <user>`: AUTH accepted.
    Authenticated(String),
    /// `OK <help>`: its text is for people, and not kept.
    Help,
    /// `OK bye`.
    Bye,
    /// `OK watching <name|*>` (`None` for `*`, all locks).
    Watching(Option<String>),
    /// `OK <name> free` or `OK <name> held ...`.
    Status(StatusLine),
    /// The same from a cluster front-end, with how old its view is.
    StatusAged(StatusLine, EtcdAge),
    /// `INFO <name> held ...`.
    Info(HeldLine),
    /// `OK <count>`: ends a STATUS of all locks.
    Count(usize),
    /// `OK <count> etcd_age_ms=.. etcd_bound_ms=..`: the same, from a cluster front-end.
    CountAged(usize, EtcdAge),
    /// `HOLDER ...`.
    Holder(HolderLine),
    /// `WAITER ...`.
    Waiter(WaiterLine),
    /// `EVENT ...`.
    Event(EventLine),
    /// `ERR <code> <message>`: any request may get one.
    Error(ProtoError),
    /// `OK broken=<n>`: BREAK ended `n` leases.
    Broken(usize),
}

impl fmt::Display for Received {
    /// The line as the server sends it (without its line ending).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Received::Token(t) => Reply::Token(*t).fmt(f),
            Received::Tokens(tokens) => Reply::Tokens(tokens).fmt(f),
            Received::Done => Reply::Done.fmt(f),
            Received::Lease(left) => Reply::Lease(*left).fmt(f),
            Received::Pong => Reply::Pong.fmt(f),
            Received::Authenticated(user) => Reply::Authenticated(user).fmt(f),
            Received::Help => Reply::Help.fmt(f),
            Received::Bye => Reply::Bye.fmt(f),
            Received::Watching(name) => Reply::Watching(name.as_deref()).fmt(f),
            Received::Status(s) => write!(f, "OK {s}"),
            Received::StatusAged(StatusLine::Held(h), aged) => {
                f.write_str("OK ")?;
                write_held(f, h)?;
                write_aged(f, aged)?;
                write_note(f, h.note.as_ref())
            }
            Received::StatusAged(s, aged) => {
                write!(f, "OK {s}")?;
                write_aged(f, aged)
            }
            Received::Info(h) => write!(f, "{INFO} {h}"),
            Received::Count(n) => Reply::Count(*n).fmt(f),
            Received::CountAged(n, aged) => Reply::CountAged(*n, *aged).fmt(f),
            Received::Holder(h) => h.fmt(f),
            Received::Waiter(w) => w.fmt(f),
            Received::Event(e) => e.fmt(f),
            Received::Error(e) => e.fmt(f),
            Received::Broken(n) => Reply::Broken(*n).fmt(f),
        }
    }
}

/// A line that is not a reply to what was asked, or not one proto.md describes: it is kept
/// whole, for the message that names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadReply(pub String);

impl fmt::Display for BadReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unexpected reply {:?}", self.0)
    }
}

impl std::error::Error for BadReply {}

impl Received {
    /// Reads one reply line (its `\r` if any stripped) to a request of kind `asked`. Any
    /// line that is not what proto.md says the server answers to it is a [`BadReply`]; no
    /// input panics. Fields a newer server adds to a line are passed over.
    pub fn parse(line: &str, asked: Asked) -> Result<Received, BadReply> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        Received::read(line, asked).ok_or_else(|| BadReply(line.to_owned()))
    }

    fn read(line: &str, asked: Asked) -> Option<Received> {
        if let ReplyLine::Err(e) = parse_reply(line) {
            return Some(Received::Error(e));
        }
        let (first, rest) = line.split_once(' ').unwrap_or((line, ""));
        match (first, asked) {
            ("OK", _) => ok_line(rest, line == "OK", asked),
            (INFO, Asked::StatusAll) => Some(Received::Info(HeldLine::parse(rest)?)),
            (HOLDER, Asked::Detail) => Some(Received::Holder(HolderLine::parse(line)?)),
            (WAITER, Asked::Detail) => Some(Received::Waiter(WaiterLine::parse(line)?)),
            (EVENT, Asked::Watch) => Some(Received::Event(EventLine::parse(line).ok()?)),
            _ => None,
        }
    }
}

/// The text after `OK` (`bare`: there was none), read as the answer to `asked`.
fn ok_line(rest: &str, bare: bool, asked: Asked) -> Option<Received> {
    if bare {
        return matches!(asked, Asked::Unlock | Asked::Renew | Asked::Check)
            .then_some(Received::Done);
    }
    match asked {
        Asked::Lock => match rest.split_once(' ') {
            None => Some(Received::Token(number(rest)?)),
            // A set's grant: a token per name, single spaces, at least two.
            Some(_) => Some(Received::Tokens(
                rest.split(' ').map(number).collect::<Option<Vec<_>>>()?,
            )),
        },
        Asked::Renew | Asked::Check => {
            let ms = rest.strip_prefix(LEASE_KEY)?.strip_prefix('=')?;
            Some(Received::Lease(Duration::from_millis(number(ms)?)))
        }
        Asked::Status | Asked::Detail => status_line(rest),
        Asked::StatusAll => count_line(rest),
        Asked::Watch => match rest.strip_prefix(WATCHING)?.strip_prefix(' ')? {
            ALL => Some(Received::Watching(None)),
            name => Some(Received::Watching(Some(word(name)?.to_owned()))),
        },
        Asked::Auth => Some(Received::Authenticated(word(rest)?.to_owned())),
        Asked::Ping => (rest == PONG).then_some(Received::Pong),
        Asked::Help => Some(Received::Help),
        Asked::Quit => (rest == BYE).then_some(Received::Bye),
        Asked::Unlock => None,
        Asked::Break => {
            let n = rest.strip_prefix(BROKEN_KEY)?.strip_prefix('=')?;
            Some(Received::Broken(number(n)?))
        }
    }
}

/// `<name> free` or `<name> held ...`, then (cluster mode) how old the view is.
fn status_line(rest: &str) -> Option<Received> {
    let Some(at) = rest.find(&format!(" {ETCD_AGE_KEY}=")) else {
        return Some(Received::Status(StatusLine::parse(rest)?));
    };
    let (line, fields) = rest.split_at(at);
    let age = millis(field(fields, ETCD_AGE_KEY)?)?;
    let bound = millis(field(fields, ETCD_BOUND_KEY)?)?;
    let mut status = StatusLine::parse(line)?;
    // The note comes after the cluster's fields.
    if let (StatusLine::Held(h), Some(note)) = (&mut status, field(fields, NOTE_KEY)) {
        h.note = Some(decode_note(note)?);
    }
    Some(Received::StatusAged(status, EtcdAge { age, bound }))
}

/// The end of a STATUS of all locks: `<count>`, then (cluster mode) how old the view is.
/// Other fields a newer server adds are passed over.
fn count_line(rest: &str) -> Option<Received> {
    let (count, fields) = rest.split_once(' ').unwrap_or((rest, ""));
    let count = number(count)?;
    let age = field(fields, ETCD_AGE_KEY).map(millis);
    let bound = field(fields, ETCD_BOUND_KEY).map(millis);
    Some(match (age, bound) {
        (None, None) => Received::Count(count),
        (Some(age), Some(bound)) => Received::CountAged(
            count,
            EtcdAge {
                age: age?,
                bound: bound?,
            },
        ),
        _ => return None,
    })
}

/// One non-empty word.
fn word(text: &str) -> Option<&str> {
    (!text.is_empty() && !text.contains(' ')).then_some(text)
}

/// A decimal number of digits only (no sign, no spaces).
fn number<N: std::str::FromStr>(text: &str) -> Option<N> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn millis(text: &str) -> Option<Duration> {
    number(text).map(Duration::from_millis)
}

fn flag(text: &str) -> Option<bool> {
    match text {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// `exclusive`, `shared` or `limit:<n>`, as [`Mode`] displays itself.
pub fn parse_mode(text: &str) -> Option<Mode> {
    match text {
        "exclusive" => Some(Mode::Exclusive),
        "shared" => Some(Mode::Shared),
        _ => match number::<u32>(text.strip_prefix("limit:")?)? {
            0 => None,
            n => Some(Mode::limit(n)),
        },
    }
}

fn event_kind(text: &str) -> Option<EventKind> {
    [
        EventKind::Acquired,
        EventKind::Released,
        EventKind::Expired,
        EventKind::Dropped,
        EventKind::Broken,
    ]
    .into_iter()
    .find(|k| k.as_str() == text)
}

/// The `key=value` words of a line, after its fixed words: looked up by key, so a field a
/// newer server adds is passed over, and a name that looks like `id=x` is never read as one.
struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Fields<'a> {
    fn of(words: impl Iterator<Item = &'a str>) -> Fields<'a> {
        Fields(words.filter_map(|w| w.split_once('=')).collect())
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// Every value of a key that repeats (`and=`), in the line's order.
    fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, v)| *k == key && !v.is_empty())
            .map(|(_, v)| (*v).to_owned())
            .collect()
    }

    /// A name or id: one non-empty word.
    fn text(&self, key: &str) -> Option<String> {
        self.get(key).filter(|v| !v.is_empty()).map(str::to_owned)
    }

    /// `mode=`, exclusive if the line does not say.
    fn mode(&self) -> Option<Mode> {
        self.get("mode").map_or(Some(Mode::Exclusive), parse_mode)
    }
}

impl HeldLine {
    /// Reads `<name> held id=.. token=.. ttl_ms=.. session=.. waiters=..` (and `holders=..
    /// mode=..`): the text after `OK ` or `INFO `.
    pub fn parse(text: &str) -> Option<HeldLine> {
        let mut words = text.split(' ');
        let name = word(words.next()?)?.to_owned();
        if words.next()? != HELD {
            return None;
        }
        let f = Fields::of(words);
        let mode = f.mode()?;
        Some(HeldLine {
            name,
            id: f.text("id")?,
            token: number(f.get("token")?)?,
            left: millis(f.get("ttl_ms")?)?,
            session: flag(f.get("session")?)?,
            waiters: number(f.get("waiters")?)?,
            holders: match f.get("holders") {
                Some(k) => number(k)?,
                None => 1,
            },
            mode,
            note: read_note(f.get(NOTE_KEY))?,
        })
    }
}

impl StatusLine {
    /// Reads `<name> free` or `<name> held ...`: the text after `OK `.
    pub fn parse(text: &str) -> Option<StatusLine> {
        match text.split_once(' ') {
            Some((name, FREE)) => Some(StatusLine::Free(word(name)?.to_owned())),
            _ => HeldLine::parse(text).map(StatusLine::Held),
        }
    }
}

impl HolderLine {
    /// Reads `HOLDER <name> id=.. token=.. held_ms=.. ttl_ms=.. session=.. [mode=..]
    /// [user=..] [granted=..] [peer=..]`: an older server's line, without the last three,
    /// reads too.
    pub fn parse(line: &str) -> Option<HolderLine> {
        let mut words = line.split(' ');
        if words.next()? != HOLDER {
            return None;
        }
        let name = word(words.next()?)?.to_owned();
        let f = Fields::of(words);
        Some(HolderLine {
            name,
            id: f.text("id")?,
            token: number(f.get("token")?)?,
            held: millis(f.get("held_ms")?)?,
            left: millis(f.get("ttl_ms")?)?,
            session: flag(f.get("session")?)?,
            mode: f.mode()?,
            user: f.text("user"),
            granted_unix_ms: match f.get("granted") {
                Some(ms) => Some(number(ms)?),
                None => None,
            },
            peer: f.text("peer"),
            and: f.all(AND_KEY),
            note: read_note(f.get(NOTE_KEY))?,
            lingering: f.get("lingering") == Some("1"),
        })
    }
}

impl WaiterLine {
    /// Reads `WAITER <name> <position> id=.. waited_ms=.. session=.. [mode=..]`.
    pub fn parse(line: &str) -> Option<WaiterLine> {
        let mut words = line.split(' ');
        if words.next()? != WAITER {
            return None;
        }
        let name = word(words.next()?)?.to_owned();
        let position = number(words.next()?)?;
        let f = Fields::of(words);
        Some(WaiterLine {
            name,
            position,
            id: f.text("id")?,
            waited: millis(f.get("waited_ms")?)?,
            session: flag(f.get("session")?)?,
            mode: f.mode()?,
            and: f.all(AND_KEY),
        })
    }
}

impl EventLine {
    /// Reads `EVENT <kind> <name> <id> <token> <unix-ms> [by=<who>] [note=<encoded>]` (and
    /// passes over other `key=value` fields a newer server adds); anything else is a
    /// [`BadReply`].
    pub fn parse(line: &str) -> Result<EventLine, BadReply> {
        let words: Vec<&str> = line.split(' ').collect();
        let event = match words.as_slice() {
            [EVENT, kind, name, id, token, unix_ms, more @ ..] => (|| {
                if more.iter().any(|w| !w.contains('=')) {
                    return None;
                }
                let f = Fields::of(more.iter().copied());
                Some(EventLine {
                    kind: event_kind(kind)?,
                    name: word(name)?.to_owned(),
                    id: word(id)?.to_owned(),
                    token: number(token)?,
                    unix_ms: number(unix_ms)?,
                    note: read_note(f.get(NOTE_KEY))?,
                    by: match f.get(BY_KEY) {
                        Some(by) => Some(word(by)?.to_owned()),
                        None => None,
                    },
                })
            })(),
            _ => None,
        };
        event.ok_or_else(|| BadReply(line.to_owned()))
    }
}

/// A reply line as a client sees it: `OK <rest>`, `ERR <code> <message>`, or another line
/// (`INFO`, `EVENT`). The first split of a line, for callers that read its text themselves;
/// [`Received::parse`] reads it whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyLine<'a> {
    /// `OK`, and the text after it.
    Ok(&'a str),
    /// `ERR`, read.
    Err(ProtoError),
    /// Any other line, whole.
    Other(&'a str),
}

/// Splits a reply line for a client.
pub fn parse_reply(line: &str) -> ReplyLine<'_> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line == "OK" {
        return ReplyLine::Ok("");
    }
    if let Some(rest) = line.strip_prefix("OK ") {
        return ReplyLine::Ok(rest);
    }
    if let Some(rest) = line.strip_prefix("ERR ") {
        let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
        let code = ErrorCode::parse(code).unwrap_or(ErrorCode::Unknown);
        return ReplyLine::Err(ProtoError::new(code, message));
    }
    ReplyLine::Other(line)
}

/// Reads `key=value` out of a STATUS line's words.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(line: &str) -> HeldLine {
        match Received::parse(line, Asked::Status) {
            Ok(Received::Status(StatusLine::Held(h))) => h,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn status_lines_read() {
        let h = held("OK a held id=h:1 token=7 ttl_ms=1500 session=1 waiters=2");
        assert_eq!(
            (
                h.name.as_str(),
                h.id.as_str(),
                h.token,
                h.session,
                h.waiters
            ),
            ("a", "h:1", 7, true, 2)
        );
        assert_eq!((h.holders, h.mode), (1, Mode::Exclusive));
        assert_eq!(h.left, Duration::from_millis(1500));
        assert_eq!(
            Received::parse("OK b free", Asked::Status),
            Ok(Received::Status(StatusLine::Free("b".into())))
        );
        // A name that looks like a field is not read as one.
        assert_eq!(
            held("OK id=x held id=h token=1 ttl_ms=1 session=0 waiters=0").id,
            "h"
        );
        let h = held("OK s held id=a token=3 ttl_ms=9 session=0 waiters=1 holders=4 mode=shared");
        assert_eq!((h.holders, h.mode), (4, Mode::Shared));
        // A field a newer server adds is passed over.
        let h = held("OK s held id=a token=3 ttl_ms=9 session=0 waiters=1 color=red");
        assert_eq!(h.token, 3);
    }

    #[test]
    fn bad_lines_are_errors() {
        for (line, asked) in [
            ("OK b gone", Asked::Status),
            (
                "OK a held id=h token=x ttl_ms=1 session=0 waiters=0",
                Asked::Status,
            ),
            (
                "OK a held id= token=1 ttl_ms=1 session=0 waiters=0",
                Asked::Status,
            ),
            (
                "OK a held id=h token=1 ttl_ms=1 session=2 waiters=0",
                Asked::Status,
            ),
            (
                "OK a held id=h token=1 ttl_ms=1 session=0 waiters=0 mode=odd",
                Asked::Status,
            ),
            (
                "OK a held id=h token=1 ttl_ms=1 session=0 waiters=0 mode=limit:0",
                Asked::Status,
            ),
            ("OK +5", Asked::Lock),
            ("OK", Asked::Lock),
            ("OK 5", Asked::Unlock),
            ("OK ttl_ms=-1", Asked::Renew),
            ("OK ponG", Asked::Ping),
            ("WAITER d x id=w waited_ms=1 session=0", Asked::Detail),
            ("HOLDER d id=h token=1", Asked::Detail),
            ("INFO a held", Asked::StatusAll),
            ("INFO a free", Asked::StatusAll),
            ("EVENT odd", Asked::Watch),
            ("EVENT acquired a b 1 2", Asked::Status),
            ("EVENT lost a b 1 2", Asked::Watch),
            ("OK watching ", Asked::Watch),
            ("", Asked::Ping),
            ("hello", Asked::Help),
        ] {
            assert_eq!(
                Received::parse(line, asked),
                Err(BadReply(line.to_owned())),
                "{line}"
            );
        }
    }

    #[test]
    fn details_read() {
        let h = Received::parse(
            "HOLDER d id=h:1 token=7 held_ms=1200 ttl_ms=800 session=1",
            Asked::Detail,
        );
        let Ok(Received::Holder(h)) = h else {
            panic!("{h:?}")
        };
        assert_eq!(
            (h.held, h.mode),
            (Duration::from_millis(1200), Mode::Exclusive)
        );
        let w = Received::parse(
            "WAITER d 2 id=w:2 waited_ms=100 session=1 mode=limit:3\r",
            Asked::Detail,
        );
        let Ok(Received::Waiter(w)) = w else {
            panic!("{w:?}")
        };
        assert_eq!(
            (w.position, w.id.as_str(), w.mode),
            (2, "w:2", Mode::Limit(3))
        );
    }

    #[test]
    fn holder_lines_say_who_took_the_lease_when_and_from_where() {
        let line = "HOLDER d id=h token=7 held_ms=5 ttl_ms=8 session=0 mode=exclusive \
                    user=alice granted=1796094720000 peer=10.0.0.7:41234";
        let Ok(Received::Holder(h)) = Received::parse(line, Asked::Detail) else {
            panic!("{line}")
        };
        assert_eq!(h.user.as_deref(), Some("alice"));
        assert_eq!(h.granted_unix_ms, Some(1_796_094_720_000));
        assert_eq!(h.peer.as_deref(), Some("10.0.0.7:41234"));
        assert_eq!(h.to_string(), line);
        // An older server's line has none of them, and the line it reads back to says so.
        let old = "HOLDER d id=h token=7 held_ms=5 ttl_ms=8 session=0 mode=exclusive";
        let Ok(Received::Holder(h)) = Received::parse(old, Asked::Detail) else {
            panic!("{old}")
        };
        assert_eq!((h.user, h.granted_unix_ms, h.peer), (None, None, None));
        let bad = "HOLDER d id=h token=7 held_ms=5 ttl_ms=8 session=0 granted=soon";
        assert!(Received::parse(bad, Asked::Detail).is_err());
    }

    #[test]
    fn ok_lines_read_by_what_was_asked() {
        let r = |line, asked| Received::parse(line, asked).unwrap();
        assert_eq!(r("OK 12", Asked::Lock), Received::Token(12));
        assert_eq!(
            r("OK 12 13 20", Asked::Lock),
            Received::Tokens(vec![12, 13, 20])
        );
        assert_eq!(Received::Tokens(vec![12, 13]).to_string(), "OK 12 13");
        assert!(Received::parse("OK 12  13", Asked::Lock).is_err());
        assert!(Received::parse("OK 12 x", Asked::Lock).is_err());
        assert_eq!(r("OK 12", Asked::StatusAll), Received::Count(12));
        let aged = EtcdAge {
            age: Duration::from_millis(4200),
            bound: Duration::from_millis(1666),
        };
        assert_eq!(
            r("OK 3 etcd_age_ms=4200 etcd_bound_ms=1666", Asked::StatusAll),
            Received::CountAged(3, aged)
        );
        assert_eq!(
            Reply::summary(3, Some(aged)).to_string(),
            "OK 3 etcd_age_ms=4200 etcd_bound_ms=1666"
        );
        assert_eq!(Reply::summary(3, None).to_string(), "OK 3");
        assert!(aged.stale());
        assert_eq!(r("OK 3 later=1", Asked::StatusAll), Received::Count(3));
        assert!(Received::parse("OK 3 etcd_age_ms=x etcd_bound_ms=1", Asked::StatusAll).is_err());
        assert!(Received::parse("OK 3 etcd_age_ms=1", Asked::StatusAll).is_err());
        // One lock's line, free or held, from a cluster front-end.
        assert_eq!(
            r(
                "OK a free etcd_age_ms=4200 etcd_bound_ms=1666",
                Asked::Status
            ),
            Received::StatusAged(StatusLine::Free("a".into()), aged)
        );
        assert_eq!(
            Reply::status("a", None, Some(aged)).to_string(),
            "OK a free etcd_age_ms=4200 etcd_bound_ms=1666"
        );
        assert_eq!(Reply::status("a", None, None).to_string(), "OK a free");
        let held = "OK a held id=me token=7 ttl_ms=10 session=0 waiters=0";
        let aged_held = format!("{held} etcd_age_ms=4200 etcd_bound_ms=1666");
        match Received::parse(&aged_held, Asked::Detail) {
            Ok(Received::StatusAged(StatusLine::Held(h), a)) => {
                assert_eq!((h.id.as_str(), h.token, a), ("me", 7, aged));
            }
            other => panic!("{other:?}"),
        }
        assert!(Received::parse("OK a free etcd_age_ms=1", Asked::Status).is_err());
        assert_eq!(r("OK", Asked::Renew), Received::Done);
        assert_eq!(
            r("OK ttl_ms=250", Asked::Check),
            Received::Lease(Duration::from_millis(250))
        );
        assert_eq!(r("OK PONG", Asked::Ping), Received::Pong);
        assert_eq!(
            r("OK alice", Asked::Auth),
            Received::Authenticated("alice".into())
        );
        assert_eq!(r("OK watching *", Asked::Watch), Received::Watching(None));
        assert_eq!(
            r("ERR TIMEOUT waited 1s", Asked::Lock),
            Received::Error(ProtoError::new(ErrorCode::Timeout, "waited 1s"))
        );
        assert_eq!(
            r("EVENT dropped a b 3 17", Asked::Watch).to_string(),
            "EVENT dropped a b 3 17"
        );
    }
}
