//! The two messages of the old bash mutex protocol, `lock:<client-id>:<unix-time>` and
//! `unlock:<client-id>:<unix-time>` (pure parsing, no I/O).

use std::fmt;

/// Which port a connection came in on, and so which message it must send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The lock port: `lock:<client-id>:<unix-time>`.
    Lock,
    /// The unlock port: `unlock:<client-id>:<unix-time>`.
    Unlock,
}

impl Kind {
    /// The message's first word, which is also how the logs name it.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Unlock => "unlock",
        }
    }

    /// "a lock" or "an unlock", for log lines.
    pub fn with_article(self) -> &'static str {
        match self {
            Kind::Lock => "a lock",
            Kind::Unlock => "an unlock",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

/// A well-formed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The client's id; it becomes the lock holder's id, so line-protocol clients see it in
    /// STATUS and WATCH.
    pub id: String,
    /// The client's clock, as it sent it (only logged: the server keeps its own time).
    pub at: String,
}

/// Longest unix time accepted, in digits (u64's maximum has 20).
const MAX_TIME_DIGITS: usize = 20;

/// Parses one line (without its `\n`; a trailing `\r` is allowed) as a message of `kind`.
/// `None` for anything else: the wrong word, an id the line protocol could not show (empty,
/// over 255 bytes, whitespace or control characters), or a time that is not decimal digits.
/// The id may itself contain `:`; the time is what follows the last one.
pub fn parse(kind: Kind, line: &[u8]) -> Option<Message> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).ok()?;
    let rest = text.strip_prefix(kind.word())?.strip_prefix(':')?;
    let (id, at) = rest.rsplit_once(':')?;
    let time_ok =
        !at.is_empty() && at.len() <= MAX_TIME_DIGITS && at.bytes().all(|b| b.is_ascii_digit());
    if !time_ok || crate::proto::validate_name("client id", id).is_err() {
        return None;
    }
    Some(Message {
        id: id.to_owned(),
        at: at.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str, at: &str) -> Option<Message> {
        Some(Message {
            id: id.into(),
            at: at.into(),
        })
    }

    #[test]
    fn well_formed_messages() {
        assert_eq!(
            parse(Kind::Lock, b"lock:host1-42:1700000000"),
            msg("host1-42", "1700000000")
        );
        assert_eq!(parse(Kind::Unlock, b"unlock:a:1\r"), msg("a", "1"));
        assert_eq!(parse(Kind::Lock, b"lock:a:b:17"), msg("a:b", "17"));
    }

    #[test]
    fn anything_else_is_not_a_message() {
        for line in [
            &b""[..],
            b"lock",
            b"lock:",
            b"lock:a",
            b"lock:a:",
            b"lock::17",
            b"lock:a:17x",
            b"lock:a:-17",
            b"lock:a b:17",
            b"lock:a\t:17",
            b"LOCK:a:17",
            b" lock:a:17",
            b"lock:a:17 ",
            b"unlock:a:17",
            b"lock:a:123456789012345678901",
            b"lock:\xff:17",
            b"GET / HTTP/1.0",
        ] {
            assert_eq!(parse(Kind::Lock, line), None, "{line:?}");
        }
        assert_eq!(parse(Kind::Unlock, b"lock:a:17"), None);
        let long_id = "i".repeat(256);
        assert_eq!(
            parse(Kind::Lock, format!("lock:{long_id}:17").as_bytes()),
            None
        );
    }
}
