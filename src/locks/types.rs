//! The table's value types: what goes in, what comes out, and its limits.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fencing token: grows with every grant, for every name.
pub type Token = u64;
/// The server's number for one client connection.
pub type ConnId = u64;
/// The table's number for one waiting LOCK request.
pub type WaiterId = u64;
/// The server's number for an authenticated user (`--auth-file`); [`NO_USER`] without
/// authentication. The table only compares them: it knows no names or rights.
pub type UserId = u32;
/// The user of every request when authentication is off, and of leases whose user is not
/// known (taken through the compat ports, or before authentication was turned on). Such a
/// lease belongs to no user: whoever has its token may renew or release it.
pub const NO_USER: UserId = 0;
/// The user of a lease restored from a data directory whose user is no longer in the auth
/// file: it belongs to someone nobody can be any more, so nobody renews or releases it, and
/// it ends with its ttl.
pub const GONE_USER: UserId = UserId::MAX;

/// Who asked for a lease, for the audit trail (logs and STATUS): the authenticated user's
/// name and the client's address. One per connection (and per AUTH), shared by every holder
/// and waiter it made, so a record pays a pointer for it, not a copy. The table never looks
/// inside: who may do what is [`UserId`]'s business.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin(Option<Arc<Who>>);

#[derive(Debug, PartialEq, Eq)]
struct Who {
    user: Option<Box<str>>,
    peer: Option<SocketAddr>,
}

impl Origin {
    /// `user` (empty: none) from `peer`; the empty origin when neither is known.
    pub fn new(user: Option<&str>, peer: Option<SocketAddr>) -> Origin {
        let user = user.filter(|u| !u.is_empty()).map(Box::from);
        if user.is_none() && peer.is_none() {
            return Origin(None);
        }
        Origin(Some(Arc::new(Who { user, peer })))
    }

    /// The authenticated user's name, if there was one.
    pub fn user(&self) -> Option<&str> {
        self.0.as_ref()?.user.as_deref()
    }

    /// The client's address, if known.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.0.as_ref()?.peer
    }

    /// Who this is in one word, as a BREAK names its breaker: the user where there is one,
    /// else the client's `ip:port`, else `-`.
    pub fn who(&self) -> String {
        match (self.user(), self.peer()) {
            (Some(user), _) => user.to_owned(),
            (None, Some(peer)) => peer.to_string(),
            (None, None) => "-".to_owned(),
        }
    }
}

/// What a holder holds: the whole lock, a share of it, or one of a semaphore's slots.
///
/// Every holder of one name holds it in the same mode (an exclusive holder is alone, shared
/// holders only share with shared ones, a semaphore's slots only with slots of the same
/// limit), so a name has one mode while it is held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The whole lock, alone (a plain LOCK).
    #[default]
    Exclusive,
    /// A share, beside other shared holders (`shared`).
    Shared,
    /// A slot of a semaphore of this many (at least 2; one slot is [`Mode::Exclusive`]).
    Limit(u32),
}

impl Mode {
    /// A semaphore of `n` slots; one slot is an exclusive hold.
    pub fn limit(n: u32) -> Mode {
        if n <= 1 {
            Mode::Exclusive
        } else {
            Mode::Limit(n)
        }
    }

    /// Whether holders and waiters in these two modes may be on one name: exclusive and
    /// shared are the two sides of one read/write lock; a semaphore only mixes with itself.
    pub fn same_kind(self, other: Mode) -> bool {
        match (self, other) {
            (Mode::Limit(a), Mode::Limit(b)) => a == b,
            (Mode::Limit(_), _) | (_, Mode::Limit(_)) => false,
            _ => true,
        }
    }
}

impl Mode {
    /// For people: "exclusive", "shared", "as a semaphore of 3".
    fn describe(self) -> String {
        match self {
            Mode::Exclusive => "exclusive".into(),
            Mode::Shared => "shared".into(),
            Mode::Limit(n) => format!("as a semaphore of {n}"),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("exclusive"),
            Mode::Shared => f.write_str("shared"),
            Mode::Limit(n) => write!(f, "limit:{n}"),
        }
    }
}

/// Limits the table enforces; the server fills them from its flags.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Lease length when a LOCK names no ttl.
    pub default_ttl: Duration,
    /// Longest lease a LOCK or RENEW may ask for.
    pub max_ttl: Duration,
    /// Most leases that may be held at once (memory bound): each holder of a semaphore or a
    /// shared lock counts one.
    pub max_locks: usize,
    /// Most waiters one name may have: a queue is memory, and one name's crowd should not
    /// be able to take all of it.
    pub max_waiters: usize,
    /// Lock-delay of a LOCK without `delay=`.
    pub lock_delay: Duration,
    /// Longest `delay=` a LOCK may ask for.
    pub max_lock_delay: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_ttl: crate::DEFAULT_TTL,
            max_ttl: crate::DEFAULT_MAX_TTL,
            max_locks: crate::DEFAULT_MAX_LOCKS,
            max_waiters: crate::DEFAULT_MAX_WAITERS,
            lock_delay: crate::DEFAULT_LOCK_DELAY,
            max_lock_delay: crate::DEFAULT_MAX_LOCK_DELAY,
        }
    }
}

impl Limits {
    /// The lease a LOCK or RENEW asking for `ttl` gets (the default if none), if allowed.
    pub fn ttl(&self, ttl: Option<Duration>) -> Result<Duration, TableError> {
        let ttl = ttl.unwrap_or(self.default_ttl);
        if ttl < crate::MIN_TTL || ttl > self.max_ttl {
            return Err(TableError::BadTtl { max: self.max_ttl });
        }
        Ok(ttl)
    }

    /// The lock-delay a LOCK asking for `delay` gets (the default if none), if allowed.
    pub fn delay(&self, delay: Option<Duration>) -> Result<Duration, TableError> {
        let delay = delay.unwrap_or(self.lock_delay);
        if delay > self.max_lock_delay {
            return Err(TableError::BadDelay {
                max: self.max_lock_delay,
            });
        }
        Ok(delay)
    }

    /// Whether a session lease may have this grace.
    pub fn grace(&self, grace: Option<Duration>) -> Result<(), TableError> {
        if grace.is_some_and(|g| g > self.max_ttl) {
            return Err(TableError::BadGrace { max: self.max_ttl });
        }
        Ok(())
    }
}

/// How a LOCK is tied to the connection that sent it: its `session` or `detach` option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tie {
    /// Neither option: the lease outlives the connection, and a waiter whose client only
    /// half-closes stays in the queue (it may still read its grant).
    #[default]
    Plain,
    /// `detach`: the wait ends when the client closes its side; the lease is plain.
    Detach,
    /// `session` (zero grace) or `session=<grace>`: the wait ends when the client closes its
    /// side, and the lease ends `grace` after the connection closes unless it is renewed.
    Session(Duration),
}

impl Tie {
    /// Whether a waiting LOCK leaves the queue once its client closes its sending side.
    pub fn wait_ends_on_close(self) -> bool {
        self != Tie::Plain
    }

    /// The grace of the session lease to ask the table for; `None` for a plain lease.
    pub fn session(self) -> Option<Duration> {
        match self {
            Tie::Session(grace) => Some(grace),
            Tie::Plain | Tie::Detach => None,
        }
    }
}

/// `RENEW <name> <token> [ttl=] [detach]`: as the parser reads it and every layer down to the
/// table takes it (the connection and the user beside it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewRequest {
    /// The lock.
    pub name: String,
    /// The lease's fencing token.
    pub token: Token,
    /// `ttl=`; `None` renews for the lease's own ttl.
    pub ttl: Option<Duration>,
    /// `detach`: a session lease becomes a plain one (it no longer ends with a connection).
    pub detach: bool,
}

/// One LOCK request: as the parser reads it from the line, and (with its connection, user
/// and origin filled in) as the server hands it to the backend and the table. The default is
/// no request of its own (an empty name): a base for `..Default::default()`, whose user is
/// [`NO_USER`] and connection 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockRequest {
    /// The lock's name: shared, so the connection, the backend's wait and a new entry of the
    /// table hold one copy of it, not one each.
    pub name: Arc<str>,
    /// The client's id (see `user` for what the same id means).
    pub id: String,
    /// The lease's length; `None` for the default.
    pub ttl: Option<Duration>,
    /// `None` waits without bound; `Some(ZERO)` tries once.
    pub wait: Option<Duration>,
    /// How the lease and the wait are tied to `conn`: `session` (a session lease, ending its
    /// grace after `conn` closes, at once for zero, unless a RENEW binds it to another
    /// connection first), `detach`, or neither (a plain lease).
    pub tie: Tie,
    /// The connection it came on (filled in by the server, not the parser).
    pub conn: ConnId,
    /// How it would hold the lock.
    pub mode: Mode,
    /// Who asks (filled in by the server). The same-id rules (retry, `CONFLICT`, `REPLACED`) apply within one user
    /// only: another user's LOCK with the same id is just another client.
    pub user: UserId,
    /// Who asks, by name and address, for the audit trail: the holder records it (filled in
    /// by the server).
    pub origin: Origin,
    /// `note=`: the holder's free text for people (checked by the protocol); `None`: none.
    /// A repeat LOCK by the holder keeps the note it has unless it carries one
    /// ([`rules::note_again`](super::rules::note_again)).
    pub note: Option<Note>,
    /// `supersede`: if it must wait, every request waiting on the name is answered
    /// [`WaitEnd::Superseded`] and this one waits at the head (newest wins).
    pub supersede: bool,
    /// `and=<name>`, repeated: the further names of a set (in the request's order, none
    /// twice, `name` not among them; empty for one name). A set is one lease: one token,
    /// one deadline, granted on every name at once; UNLOCK, RENEW, CHECK, BREAK of any of
    /// its names with that token apply to all of them.
    pub and: Box<[String]>,
    /// `delay=`: the lock-delay, how long the name stays held after the lease ends other than
    /// by a release (its time ran out, its session ended); `None` for the default
    /// ([`Limits::lock_delay`]).
    pub delay: Option<Duration>,
}

impl LockRequest {
    /// The grace of the session lease it asks for; `None` for a plain lease.
    pub fn session(&self) -> Option<Duration> {
        self.tie.session()
    }
}

/// A holder's note (`LOCK ... note=<text>`): shared by the holder, its events and its
/// journal record, so passing it on copies a pointer.
pub type Note = Arc<str>;

/// What a RENEW did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The lease's new deadline.
    pub deadline: Instant,
    /// The lease was a session lease in its grace (its connection had closed), and is now
    /// bound to the renewing connection: that connection's close starts a new grace.
    pub bound: bool,
}

/// What a LOCK did at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockOutcome {
    /// Granted now (also a repeat LOCK by the holder's own id, with the same token).
    Granted {
        /// The fencing token.
        token: Token,
        /// When the lease ends.
        deadline: Instant,
    },
    /// Queued: the answer comes later as [`Effect::Granted`] or [`Effect::WaitEnded`].
    Queued {
        /// The waiter's number in those effects, and to cancel it by.
        waiter: WaiterId,
    },
}

/// Why a request changed nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableError {
    /// ttl is under [`crate::MIN_TTL`] or above the maximum.
    BadTtl {
        /// The maximum ttl.
        max: Duration,
    },
    /// A session lease's grace is above the maximum ttl.
    BadGrace {
        /// The maximum ttl.
        max: Duration,
    },
    /// `delay=` is above the maximum lock-delay.
    BadDelay {
        /// The maximum lock-delay.
        max: Duration,
    },
    /// `wait=0` and the lock is held by someone else.
    WouldBlock {
        /// The first holder's id; `(queue)` when waiters alone stand in the way.
        holder: Arc<str>,
    },
    /// The token is not the live lease of that name.
    NotHeld,
    /// The token is the live lease of another user: only its own user may renew or release it.
    NotOwner,
    /// The id holds the name through a session lease bound to another open connection.
    Conflict,
    /// The name is held or waited for in a mode this LOCK can't join (a semaphore of another
    /// limit, a semaphore against a read/write lock), or the id holds it in another mode.
    WrongMode {
        /// The mode the name (or the id) is held or waited for in.
        held: Mode,
        /// The mode this LOCK asked for.
        asked: Mode,
    },
    /// `max_locks` names are already held.
    TooManyLocks {
        /// `max_locks`.
        max: usize,
    },
    /// The name already has `max_waiters` waiters, and this LOCK would have been one more.
    TooManyWaiters {
        /// `max_waiters`.
        max: usize,
    },
    /// The token was a lease of the name that a BREAK ended (not long ago: before the
    /// deadline it had then). Answered `NOTHELD`, as a lost lease, with who broke it.
    Broken {
        /// The broken lease's token.
        token: Token,
        /// Who broke it ([`Origin::who`]).
        by: Arc<str>,
        /// When, in Unix milliseconds.
        at_unix_ms: u64,
    },
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::BadTtl { max } => write!(
                f,
                "ttl must be at least {} and at most {}",
                FlagDuration(crate::MIN_TTL),
                FlagDuration(*max)
            ),
            TableError::BadGrace { max } => {
                write!(f, "session grace must be at most {}", FlagDuration(*max))
            }
            TableError::BadDelay { max } => write!(
                f,
                "delay must be at most {} (--max-lock-delay)",
                FlagDuration(*max)
            ),
            TableError::WouldBlock { holder } => write!(f, "held by {holder}"),
            TableError::NotHeld => f.write_str("token is not the current holder's live lease"),
            TableError::NotOwner => f.write_str("that lease belongs to another user"),
            TableError::Conflict => {
                f.write_str("this id holds the lock with a session lease on another connection")
            }
            TableError::TooManyLocks { max } => write!(f, "too many locks held (max {max})"),
            TableError::TooManyWaiters { max } => {
                write!(f, "too many waiters for this lock (max {max})")
            }
            TableError::Broken {
                token,
                by,
                at_unix_ms,
            } => write!(f, "lease {token} was broken by {by} at {at_unix_ms}"),
            TableError::WrongMode { held, asked } => {
                write!(
                    f,
                    "it is held {}; this LOCK asks for it {}",
                    held.describe(),
                    asked.describe()
                )
            }
        }
    }
}

/// Why a waiter stopped waiting without a grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    /// Its `wait=` ran out.
    TimedOut,
    /// A newer LOCK with the same id took its place in the queue.
    Replaced,
    /// A newer `supersede` LOCK, by the id `by`, took the whole queue.
    Superseded {
        /// The id of the superseding LOCK.
        by: Arc<str>,
    },
}

/// What happened to a lock, for watchers and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A lease was granted (at once or to a waiter).
    Acquired,
    /// UNLOCK ended a lease.
    Released,
    /// A lease's time ran out.
    Expired,
    /// A session lease ended because its connection closed (at once, or after its grace).
    Dropped,
    /// A grant was taken back: its waiter was gone before it could read it. Shown to
    /// clients as `dropped` too; told apart for metrics and logs.
    Revoked,
    /// A BREAK (an operator's force-release) ended the lease; [`Event::broken_by`] says who.
    Broken,
    /// A BREAK without `force`: the lease is over for its holder, who is told to stop, but it
    /// keeps its place on the name until its holder lets go (then `Released`) or its deadline
    /// passes (`Expired`, or `Dropped` for a session whose grace ran out). Shown to clients
    /// as `broken`; told apart for metrics and logs, since the lease has not ended yet.
    Breaking,
}

impl EventKind {
    /// The kind as WATCH shows it (`Revoked` is `dropped` there).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Acquired => "acquired",
            EventKind::Released => "released",
            EventKind::Expired => "expired",
            EventKind::Dropped | EventKind::Revoked => "dropped",
            EventKind::Broken | EventKind::Breaking => "broken",
        }
    }
}

/// A change of holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The lock's name.
    pub name: Arc<str>,
    /// The id of the holder it happened to.
    pub id: Arc<str>,
    /// The lease's fencing token.
    pub token: Token,
    /// How long the lease had been held when it ended (zero for `Acquired`).
    pub held: Duration,
    /// For `Acquired` after waiting in the queue: how long the request waited. `None` for a
    /// grant made at once, and for the other kinds.
    pub waited: Option<Duration>,
    /// Who took the lease (user and address), for the log line: an expiry or a session's
    /// end happens with no request in flight, so the holder carries it.
    pub origin: Origin,
    /// The holder's note, for `acquired` (WATCH shows it); `None` for the other kinds.
    pub note: Option<Note>,
    /// For `Broken`: who sent the BREAK (user and address); empty for the other kinds.
    pub broken_by: Origin,
}

/// Work for the caller, in the order it must happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Wake this waiter with its grant.
    Granted {
        /// The waiter [`LockOutcome::Queued`] named.
        waiter: WaiterId,
        /// The lock's name.
        name: Arc<str>,
        /// The fencing token.
        token: Token,
        /// When the lease ends.
        deadline: Instant,
    },
    /// Fail this waiter.
    WaitEnded {
        /// The waiter [`LockOutcome::Queued`] named.
        waiter: WaiterId,
        /// Why it ended.
        why: WaitEnd,
    },
    /// Tell watchers (and logs, and metrics).
    Event(Event),
}

/// A change to a lease, for a durable store to record in the order the table made it.
///
/// Only produced after [`Locks::journal_changes`]. Expiries produce none: the deadline is in
/// the `Grant` or `Renew` that set it, so a store can tell on its own when a lease has ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `id` holds `name` with `token` until `deadline` (a new grant, or a repeat LOCK by the
    /// holder that restarted the lease).
    #[allow(missing_docs)] // the variant's doc names each field
    Grant {
        name: Arc<str>,
        id: Arc<str>,
        token: Token,
        /// The lease's length.
        ttl: Duration,
        deadline: Instant,
        mode: Mode,
        user: UserId,
        /// Who took it, kept across a restart (the user's name, the client's address).
        origin: Origin,
        /// The wall clock of the grant, in Unix milliseconds (0: not known).
        granted_unix_ms: u64,
        /// The holder's note, kept across a restart.
        note: Option<Note>,
    },
    /// The lease `token` of `name` now ends at `deadline`.
    #[allow(missing_docs)] // the variant's doc names each field
    Renew {
        name: Arc<str>,
        token: Token,
        /// The length it was renewed for.
        ttl: Duration,
        deadline: Instant,
    },
    /// The lease `token` of `name` ended before its deadline (UNLOCK, or its session closed).
    #[allow(missing_docs)] // the variant's doc names each field
    Release { name: Arc<str>, token: Token },
    /// A BREAK is about to end the lease `token` of `name` (its `Release` follows): its
    /// holder's RENEW and CHECK are told so until `deadline`, the deadline the lease had.
    #[allow(missing_docs)] // the variant's doc names each field
    Break {
        name: Arc<str>,
        token: Token,
        /// Who broke it ([`Origin::who`]).
        by: Arc<str>,
        /// When, in Unix milliseconds.
        at_unix_ms: u64,
        deadline: Instant,
    },
    /// The leases `token` of `names` (each just granted by its own `Grant`) are one set (a
    /// LOCK with `and=`), in the request's order: a restart links them again.
    #[allow(missing_docs)] // the variant's doc names each field
    Set {
        token: Token,
        names: Box<[Arc<str>]>,
    },
}

/// A broken lease the table still remembers (see [`Locks::broken`]), as a durable store
/// reads it back after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the fields of `Change::Break`, read back
pub struct BrokenLease {
    pub name: Arc<str>,
    pub token: Token,
    pub by: Arc<str>,
    pub at_unix_ms: u64,
    pub deadline: Instant,
}

/// A lease read back from a durable store after a restart.
#[derive(Clone, Debug)]
#[allow(missing_docs)] // the fields of `Change::Grant`, read back
pub struct RestoredLease {
    pub name: String,
    pub id: String,
    pub token: Token,
    pub ttl: Duration,
    pub deadline: Instant,
    pub mode: Mode,
    pub user: UserId,
    pub origin: Origin,
    pub granted_unix_ms: u64,
    pub note: Option<Note>,
}

/// One waiter of a lock, in queue order, for `STATUS <name> detail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterStatus {
    /// The id it asked with.
    pub id: Arc<str>,
    /// How long it has waited so far.
    pub waited: Duration,
    /// It asked for a session lease.
    pub session: bool,
    /// The mode it asked for.
    pub mode: Mode,
    /// A set's names (`and=`), every one in the LOCK's order; empty for a LOCK of one name.
    pub set: Box<[Arc<str>]>,
}

/// A snapshot of one lock, for STATUS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockStatus {
    /// The lock's name.
    pub name: Arc<str>,
    /// The holder's id (the first holder's, for several).
    pub holder: Arc<str>,
    /// The holder's fencing token.
    pub token: Token,
    /// The time the lease has left.
    pub left: Duration,
    /// How long the holder has held it (since its grant, across a restart too).
    pub held: Duration,
    /// It is a session lease.
    pub session: bool,
    /// How many wait.
    pub waiters: usize,
    /// How many hold it (more than one only for a shared lock or a semaphore).
    pub holders: usize,
    /// The mode it is held in.
    pub mode: Mode,
    /// Who took the lease: its user and the client's address, where known.
    pub origin: Origin,
    /// The wall clock of the grant, in Unix milliseconds; 0 where not known (a table never
    /// told the time, a lease an older lockd granted).
    pub granted_unix_ms: u64,
    /// The holder's note (`LOCK ... note=`), if it gave one.
    pub note: Option<Note>,
    /// The holder's set of names (`and=`), every one in the LOCK's order; empty for a lease
    /// of one name.
    pub set: Box<[Arc<str>]>,
    /// The lease is over for its holder (broken, or in its lock-delay) and keeps its place
    /// until its holder's UNLOCK or `left` runs out.
    pub lingering: bool,
}

/// A duration in its largest whole unit (`24h`, `10m`, `30s`, `500ms`), as a flag is written:
/// a refusal that names a limit says it as the flag that set it does (`at most 24h`, not
/// `1day`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FlagDuration(pub Duration);

impl fmt::Display for FlagDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            return write!(f, "{}", humantime::format_duration(d));
        }
        let ms = d.as_millis();
        let (n, unit) = match ms {
            0 => (0, "s"),
            _ if ms.is_multiple_of(3_600_000) => (ms / 3_600_000, "h"),
            _ if ms.is_multiple_of(60_000) => (ms / 60_000, "m"),
            _ if ms.is_multiple_of(1000) => (ms / 1000, "s"),
            _ => (ms, "ms"),
        };
        write!(f, "{n}{unit}")
    }
}
