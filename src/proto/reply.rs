//! Replies: formatted by the server, split by clients.

use std::fmt;
use std::time::Duration;

use super::{ErrorCode, ProtoError, HELP};
use crate::locks::{Event, LockStatus, Mode, Token, WaiterStatus};

/// One reply line, as the server sends it.
#[derive(Clone, Debug)]
pub enum Reply<'a> {
    /// `OK <token>`: LOCK granted.
    Token(Token),
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
    /// `INFO <name> held ...`: one line of a STATUS of all locks.
    Info(&'a LockStatus),
    /// `OK <count>`: ends a STATUS of all locks.
    Count(usize),
    /// `HOLDER <name> id=.. token=.. held_ms=.. ttl_ms=.. session=.. mode=..`: STATUS detail,
    /// one per holder.
    Holder(&'a LockStatus),
    /// `WAITER <name> <position> id=.. waited_ms=.. session=..`: STATUS detail, queue order.
    Waiter(&'a str, usize, &'a WaiterStatus),
    /// `EVENT <kind> <name> <id> <token> <unix-ms>`.
    Event(&'a Event, u64),
    /// `ERR <code> <message>`.
    Error(&'a ProtoError),
}

impl fmt::Display for Reply<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Token(t) => write!(f, "OK {t}"),
            Reply::Done => f.write_str("OK"),
            Reply::Lease(left) => write!(f, "OK ttl_ms={}", left.as_millis()),
            Reply::Pong => f.write_str("OK PONG"),
            Reply::Authenticated(user) => write!(f, "OK {user}"),
            Reply::Help => write!(f, "OK {HELP}"),
            Reply::Bye => f.write_str("OK bye"),
            Reply::Watching(name) => write!(f, "OK watching {}", name.unwrap_or("*")),
            Reply::Status(name, None) => write!(f, "OK {name} free"),
            Reply::Status(_, Some(s)) => write!(f, "OK {}", HeldStatus(s)),
            Reply::Info(s) => write!(f, "INFO {}", HeldStatus(s)),
            Reply::Count(n) => write!(f, "OK {n}"),
            Reply::Holder(s) => write!(
                f,
                "HOLDER {} id={} token={} held_ms={} ttl_ms={} session={} mode={}",
                s.name,
                s.holder,
                s.token,
                s.held.as_millis(),
                s.remaining.as_millis(),
                u8::from(s.session),
                s.mode
            ),
            Reply::Waiter(name, position, w) => write!(
                f,
                "WAITER {name} {position} id={} waited_ms={} session={} mode={}",
                w.id,
                w.waited.as_millis(),
                u8::from(w.session),
                w.mode
            ),
            Reply::Event(e, unix_ms) => write!(
                f,
                "EVENT {} {} {} {} {unix_ms}",
                e.kind.as_str(),
                e.name,
                e.id,
                e.token
            ),
            Reply::Error(e) => e.fmt(f),
        }
    }
}

struct HeldStatus<'a>(&'a LockStatus);

impl fmt::Display for HeldStatus<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        write!(
            f,
            "{} held id={} token={} ttl_ms={} session={} waiters={}",
            s.name,
            s.holder,
            s.token,
            s.remaining.as_millis(),
            u8::from(s.session),
            s.waiters
        )?;
        // An exclusive lock's line is as it always was; the others say what they are.
        if s.mode != Mode::Exclusive {
            write!(f, " holders={} mode={}", s.holders, s.mode)?;
        }
        Ok(())
    }
}

/// A reply line as a client sees it: `OK <rest>`, `ERR <code> <message>`, or another line
/// (`INFO`, `EVENT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyLine<'a> {
    Ok(&'a str),
    Err(ProtoError),
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
