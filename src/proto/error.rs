//! The refusals: every `ERR <code> <message>` the server sends is formed here, so its code and
//! wording live in one place (proto.md's Errors table is the contract).

use std::fmt;
use std::time::Duration;

use crate::locks::{LockStatus, TableError};

/// The error codes of `ERR <code> <message>`, as proto.md lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Malformed request: empty line, missing or extra words, unknown option.
    Syntax,
    /// No such command.
    Unknown,
    /// A word has a bad value: name, id, duration, ttl, token.
    BadArg,
    /// The line is not valid UTF-8.
    Encoding,
    /// The line is longer than the server allows; the connection is closed.
    TooLong,
    /// A LOCK's `wait=` ran out (or `wait=0` found the lock held).
    Timeout,
    /// The token is not the current holder's live lease.
    NotHeld,
    /// The id holds the lock with a session lease on another open connection.
    Conflict,
    /// A newer LOCK with the same id took this waiting LOCK's place.
    Replaced,
    /// A server limit was reached (connections, locks, waiters, idle or unfinished lines);
    /// see the message.
    Limit,
    /// A watcher fell too far behind; the connection is closed.
    Lagged,
    /// The server is shutting down; the connection is closed.
    Shutdown,
    /// The server has an auth file and this connection has not authenticated yet.
    NoAuth,
    /// A wrong AUTH, a user without the right for the command on that name, or a lease of
    /// another user.
    Denied,
    /// The backend that keeps the locks (an etcd cluster) can't be reached or has no
    /// quorum; the request may be tried again.
    Unavailable,
    /// Plain text on a port that speaks TLS: the one line before the server closes.
    Tls,
    /// A newer `supersede` LOCK took the whole queue, this waiting LOCK's place with it.
    Superseded,
}

impl ErrorCode {
    /// Every code (what [`ErrorCode::parse`] looks through).
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::Syntax,
        ErrorCode::Unknown,
        ErrorCode::BadArg,
        ErrorCode::Encoding,
        ErrorCode::TooLong,
        ErrorCode::Timeout,
        ErrorCode::NotHeld,
        ErrorCode::Conflict,
        ErrorCode::Replaced,
        ErrorCode::Limit,
        ErrorCode::Lagged,
        ErrorCode::Shutdown,
        ErrorCode::NoAuth,
        ErrorCode::Denied,
        ErrorCode::Unavailable,
        ErrorCode::Tls,
        ErrorCode::Superseded,
    ];

    /// The code as it is sent after `ERR`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Syntax => "SYNTAX",
            ErrorCode::Unknown => "UNKNOWN",
            ErrorCode::BadArg => "BADARG",
            ErrorCode::Encoding => "ENCODING",
            ErrorCode::TooLong => "TOOLONG",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::NotHeld => "NOTHELD",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::Replaced => "REPLACED",
            ErrorCode::Limit => "LIMIT",
            ErrorCode::Lagged => "LAGGED",
            ErrorCode::Shutdown => "SHUTDOWN",
            ErrorCode::NoAuth => "NOAUTH",
            ErrorCode::Denied => "DENIED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Tls => "TLS",
            ErrorCode::Superseded => "SUPERSEDED",
        }
    }

    /// Whether the server closes the connection after this refusal, or may (`LIMIT`), as
    /// proto.md's Errors table says: a client that gets one reconnects before its next
    /// request. (`DENIED` closes only in the two cases whose message ends `closing`; it is
    /// not counted here.)
    pub fn may_close(self) -> bool {
        matches!(
            self,
            ErrorCode::TooLong
                | ErrorCode::Lagged
                | ErrorCode::Shutdown
                | ErrorCode::Limit
                | ErrorCode::Tls
        )
    }

    /// The code `code` spells (as sent after `ERR`); `None` for a word that is none.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `ERR` reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoError {
    /// The word after `ERR`.
    pub code: ErrorCode,
    /// The rest of the line: for people, not programs.
    pub message: String,
}

/// Every refusal the server sends is made here, so its code and wording live in one place.
impl ProtoError {
    /// An `ERR <code> <message>`; a line break (CR or LF) in `message` becomes a space.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ProtoError {
            code,
            message: one_line(message.into()),
        }
    }

    /// A line over `--max-line`; the connection is closed.
    pub fn too_long(max_line: usize) -> Self {
        Self::new(
            ErrorCode::TooLong,
            format!("line longer than {max_line} bytes; closing"),
        )
    }

    /// A line that is not UTF-8.
    pub fn bad_utf8() -> Self {
        Self::new(ErrorCode::Encoding, "line is not valid UTF-8")
    }

    /// The lock table refused an operation on `name`.
    pub fn table(name: &str, e: &TableError) -> Self {
        let code = match e {
            TableError::BadTtl { .. }
            | TableError::BadGrace { .. }
            | TableError::BadDelay { .. } => ErrorCode::BadArg,
            TableError::WouldBlock { .. } => ErrorCode::Timeout,
            // A broken lease is a lost one: the code every client already reads as "lost".
            TableError::NotHeld | TableError::Broken { .. } => ErrorCode::NotHeld,
            TableError::Conflict | TableError::WrongMode { .. } => ErrorCode::Conflict,
            TableError::TooManyLocks { .. } | TableError::TooManyWaiters { .. } => ErrorCode::Limit,
            TableError::NotOwner => ErrorCode::Denied,
        };
        Self::new(code, format!("{name}: {e}"))
    }

    /// A plain-text client on a TLS port (its first byte can't start a TLS handshake); the
    /// connection is closed.
    pub fn tls_port() -> Self {
        Self::new(
            ErrorCode::Tls,
            "this port speaks TLS: connect with TLS (lockctl --tls or --tls-ca)",
        )
    }

    /// The backend could not do it (no quorum, unreachable): `why` says what failed.
    pub fn unavailable(why: &str) -> Self {
        Self::new(ErrorCode::Unavailable, format!("{why}; try again"))
    }

    /// A LOCK's `wait=` ran out.
    pub fn wait_over(name: &str, waited: Duration) -> Self {
        Self::new(
            ErrorCode::Timeout,
            format!(
                "{name} still held after waiting {}",
                humantime::format_duration(waited)
            ),
        )
    }

    /// A LOCK refused because `name` is held, said to a user who may read `name`: who holds
    /// it (the first holder), for how long, how many wait, and its note, as `key=value`
    /// fields. `waited`: the LOCK's `wait=` ran out after that long; `None`: `wait=0`.
    /// `user`: the holder's user, where authentication names one.
    pub fn blocked_by(
        name: &str,
        waited: Option<Duration>,
        holder: &LockStatus,
        user: Option<&str>,
    ) -> Self {
        use std::fmt::Write as _;
        let mut message = match waited {
            Some(waited) => format!(
                "{name} still held after waiting {}; held by {}",
                humantime::format_duration(waited),
                holder.holder
            ),
            None => format!("{name}: held by {}", holder.holder),
        };
        if let Some(user) = user {
            let _ = write!(message, " user={user}");
        }
        let _ = write!(
            message,
            " held_ms={} waiters={}",
            holder.held.as_millis(),
            holder.waiters
        );
        if let Some(note) = &holder.note {
            let _ = write!(message, " note={}", super::note::Encoded(note));
        }
        Self::new(ErrorCode::Timeout, message)
    }

    /// A waiting LOCK was taken over by a newer one with the same id.
    pub fn replaced(name: &str) -> Self {
        Self::new(
            ErrorCode::Replaced,
            format!("a newer LOCK {name} with the same id took this one's place"),
        )
    }

    /// A waiting LOCK was superseded: a newer `supersede` LOCK by `by` took the queue.
    pub fn superseded(name: &str, by: &str) -> Self {
        Self::new(
            ErrorCode::Superseded,
            format!("{name}: a newer LOCK by {by} took the queue"),
        )
    }

    /// `ERR SHUTDOWN`: the server is shutting down.
    pub fn shutdown() -> Self {
        Self::new(ErrorCode::Shutdown, "server is shutting down")
    }

    /// BREAK of every holder of a name nobody holds.
    pub fn nothing_to_break(name: &str) -> Self {
        Self::new(ErrorCode::NotHeld, format!("{name}: nothing holds it"))
    }

    /// A change was made but can never be made durable: the store failed.
    pub fn not_durable() -> Self {
        Self::new(
            ErrorCode::Shutdown,
            "server is shutting down: the change could not be made durable",
        )
    }

    /// A watcher fell `behind` events behind; it is disconnected.
    pub fn lagged(behind: u64) -> Self {
        Self::new(
            ErrorCode::Lagged,
            format!("watcher fell {behind} events behind; closing"),
        )
    }

    /// A command other than PING, HELP, QUIT or AUTH before AUTH, on a server with users.
    pub fn no_auth() -> Self {
        Self::new(
            ErrorCode::NoAuth,
            "authenticate first: AUTH <user> <secret>",
        )
    }

    /// A wrong AUTH (unknown user or wrong secret: not told apart); `closing` after the last
    /// one a connection may make.
    pub fn bad_auth(closing: bool) -> Self {
        let message = if closing {
            "bad user or secret; too many failures, closing"
        } else {
            "bad user or secret"
        };
        Self::new(ErrorCode::Denied, message)
    }

    /// AUTH on a server without an auth file.
    pub fn auth_off() -> Self {
        Self::new(
            ErrorCode::Denied,
            "authentication is off on this server (no --auth-file)",
        )
    }

    /// AUTH on a connection that has authenticated already.
    pub fn already_authenticated(user: &str) -> Self {
        Self::new(
            ErrorCode::Denied,
            format!("already authenticated as {user}; connect again to be another user"),
        )
    }

    /// `user` lacks `right` (`lock` or `read`) on the lock `name`.
    pub fn denied(user: &str, right: &str, name: &str) -> Self {
        Self::new(
            ErrorCode::Denied,
            format!("{name}: user {user} has no {right} right on it"),
        )
    }

    /// The user of this connection is no longer in the reloaded auth file.
    pub fn user_removed(user: &str) -> Self {
        Self::new(
            ErrorCode::Denied,
            format!("user {user} was removed from the auth file; closing"),
        )
    }

    /// A connection over `--max-connections`.
    pub fn too_many_connections(max: usize) -> Self {
        Self::new(
            ErrorCode::Limit,
            format!("too many connections (max {max}); try again later"),
        )
    }

    /// A connection over `--max-connections-per-ip` from its address.
    pub fn too_many_from_address(max: usize) -> Self {
        Self::new(
            ErrorCode::Limit,
            format!("too many connections from this address (max {max}); try again later"),
        )
    }

    /// A connection that sent nothing for `--idle-timeout` while it had nothing going on.
    pub fn idle(timeout: Duration) -> Self {
        Self::new(
            ErrorCode::Limit,
            format!("idle for {}; closing", humantime::format_duration(timeout)),
        )
    }

    /// Bytes of a request line that waited `--line-timeout` for the rest of it.
    pub fn line_not_finished(timeout: Duration) -> Self {
        Self::new(
            ErrorCode::Limit,
            format!(
                "line not finished within {}; closing",
                humantime::format_duration(timeout)
            ),
        )
    }
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ERR {} {}", self.code, self.message)
    }
}

impl std::error::Error for ProtoError {}

/// Keeps a message on one line whatever it contains.
fn one_line(message: String) -> String {
    if message.contains(['\n', '\r']) {
        message.replace(['\n', '\r'], " ")
    } else {
        message
    }
}
