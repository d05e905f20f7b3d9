//! The wire protocol: requests parsed into a typed enum, replies formatted from one.
//!
//! Pure text in, text out: no I/O and no tokio, so the server, `lockctl` and the tests share one
//! definition of every line. `proto.md` is the public contract this module implements; every
//! reply and error code there is produced here and nowhere else: requests here, replies in
//! [`reply`], refusals (`ERR <code> <message>`) in [`error`].

use std::fmt;
use std::time::Duration;

pub use crate::locks::Tie;
use crate::locks::{LockRequest, Mode, RenewRequest, Token};

mod duration;
pub mod error;
pub mod note;
pub mod reply;

pub use duration::HumanDuration;
pub use error::{ErrorCode, ProtoError};
pub use reply::{
    field, parse_mode, parse_reply, Asked, BadReply, EtcdAge, EventLine, HeldLine, HolderLine,
    Received, Reply, ReplyLine, StatusLine, WaiterLine,
};

/// Longest name or id, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Most `WAITER` lines one `STATUS <name> detail` lists (the `OK` line counts them all).
pub const DETAIL_WAITERS: usize = 1000;

/// One request line, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `LOCK <name> <id> [ttl=] [wait=] [session[=<grace>] | detach] [shared | limit=<n>]
    /// [supersede] [delay=] [and=<name>]... [note=<text>]`: the request as the backend takes
    /// it (the server fills in its connection, user and origin). Boxed: most requests are
    /// smaller.
    Lock(Box<LockRequest>),
    /// `UNLOCK <name> <token>`.
    Unlock {
        /// The lock.
        name: String,
        /// The lease's fencing token.
        token: Token,
    },
    /// `RENEW <name> <token> [ttl=] [detach]`.
    Renew(RenewRequest),
    /// `CHECK <name> <token>`.
    Check {
        /// The lock.
        name: String,
        /// The lease's fencing token.
        token: Token,
    },
    /// `STATUS [<name>]`.
    Status {
        /// The lock; `None` for every lock.
        name: Option<String>,
    },
    /// `STATUS <name> detail`: the holder and the queue, "why am I waiting".
    StatusDetail {
        /// The lock.
        name: String,
    },
    /// `WATCH [<name>]`.
    Watch {
        /// The lock; `None` for every lock.
        name: Option<String>,
    },
    /// `AUTH <user> <secret>`.
    Auth {
        /// The user to log in as.
        user: String,
        /// Its secret (never displayed).
        secret: Secret,
    },
    /// `PING`.
    Ping,
    /// `HELP`.
    Help,
    /// `QUIT`.
    Quit,
    /// `BREAK <name> [<token>] [force]`: an operator's release of every lease of the name,
    /// or of the one with `<token>` (needs the `admin` right).
    Break {
        /// The lock.
        name: String,
        /// Only this lease; `None` for every holder's.
        token: Option<Token>,
        /// `force`: the name passes on now, not once the broken holder has let go.
        force: bool,
    },
}

/// AUTH's secret. It is shown as `***` by `Display` and `Debug`, so a request that is logged or
/// printed never shows it; [`AuthLine`] is the one place that writes it out.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    /// The secret itself, to check it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// The AUTH line as a client sends it, secret included (a [`Request::Auth`] displays `***`).
pub struct AuthLine<'a> {
    /// The user to log in as.
    pub user: &'a str,
    /// Its secret, written out as it is.
    pub secret: &'a str,
}

impl fmt::Display for AuthLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AUTH {} {}", self.user, self.secret)
    }
}

/// The HELP reply's text: one line, so it is also a valid reply.
pub const HELP: &str = "commands: LOCK <name> <id> [ttl=<dur>] [wait=<dur>] \
[session[=<grace>] | detach] [shared | limit=<n>] [supersede] [delay=<dur>] [and=<name>]... \
[note=<text>, last] | UNLOCK <name> <token> | RENEW <name> <token> [ttl=<dur>] [detach] | CHECK <name> <token> | \
STATUS [<name> [detail]] | WATCH [<name>] | AUTH <user> <secret> | BREAK <name> [<token>] [force] | \
PING | HELP | QUIT; \
durations: 250ms 30s 5m or plain seconds; see proto.md";

const USAGE_LOCK: &str = "usage: LOCK <name> <id> [ttl=<dur>] [wait=<dur>] \
[session[=<grace>] | detach] [shared | limit=<n>] [supersede] [delay=<dur>] [and=<name>]... \
[note=<text>, last]";

/// Most slots a semaphore may have.
pub const MAX_LIMIT: u32 = 100_000;
const USAGE_UNLOCK: &str = "usage: UNLOCK <name> <token>";
const USAGE_RENEW: &str = "usage: RENEW <name> <token> [ttl=<dur>] [detach]";
const USAGE_CHECK: &str = "usage: CHECK <name> <token>";
const USAGE_STATUS: &str = "usage: STATUS [<name> [detail]]";
const USAGE_WATCH: &str = "usage: WATCH [<name>]";
const USAGE_AUTH: &str = "usage: AUTH <user> <secret>";
const USAGE_BREAK: &str = "usage: BREAK <name> [<token>] [force]";

/// Parses one request line (without its line ending).
pub fn parse(line: &str) -> Result<Request, ProtoError> {
    // A LOCK's note takes the rest of the line, spaces and all: split it off first.
    let first = line.split([' ', '\t']).find(|w| !w.is_empty());
    let (line, note) = match first {
        Some(c) if c.eq_ignore_ascii_case("LOCK") => note::split_note(line),
        _ => (line, None),
    };
    let mut words = line.split([' ', '\t']).filter(|w| !w.is_empty());
    let Some(command) = words.next() else {
        return Err(ProtoError::new(
            ErrorCode::Syntax,
            "empty request; try HELP",
        ));
    };
    let words = Words::collect(words);
    let args = words.as_slice();
    let mut upper = [0u8; COMMAND_MAX];
    let cmd = upper_command(command, &mut upper);
    match cmd {
        "LOCK" => parse_lock(args, note),
        "UNLOCK" => {
            let [name, token] = exact(args, USAGE_UNLOCK)?;
            Ok(Request::Unlock {
                name: valid_name("name", name)?,
                token: parse_token(token)?,
            })
        }
        "RENEW" => {
            if args.len() < 2 {
                return Err(syntax(USAGE_RENEW));
            }
            let opts = Options::parse(&args[2..], &["ttl", "detach"], USAGE_RENEW)?;
            Ok(Request::Renew(RenewRequest {
                name: valid_name("name", args[0])?,
                token: parse_token(args[1])?,
                ttl: opts.ttl,
                detach: opts.tie == Tie::Detach,
            }))
        }
        "CHECK" => {
            let [name, token] = exact(args, USAGE_CHECK)?;
            Ok(Request::Check {
                name: valid_name("name", name)?,
                token: parse_token(token)?,
            })
        }
        "STATUS" => match args[..] {
            [name, detail] if detail.eq_ignore_ascii_case("detail") => {
                if prefix_of(name).is_some() {
                    return Err(bad_arg(format!(
                        "detail is of one lock; {} is a prefix (STATUS without detail lists \
                         its held locks)",
                        quote(name)
                    )));
                }
                Ok(Request::StatusDetail {
                    name: valid_name("name", name)?,
                })
            }
            _ => Ok(Request::Status {
                name: optional_name(args, USAGE_STATUS)?,
            }),
        },
        "WATCH" => Ok(Request::Watch {
            name: optional_name(args, USAGE_WATCH)?,
        }),
        "AUTH" => {
            // The usage, never the words: one of them may be a secret.
            let [user, secret] = exact(args, USAGE_AUTH)?;
            Ok(Request::Auth {
                user: valid_name("user", user)?,
                secret: Secret::new(secret),
            })
        }
        "BREAK" => {
            // A lock may be called `force`: the word is the option only after the name.
            let (args, force) = match args[..] {
                [ref rest @ .., "force"] if !rest.is_empty() => (rest, true),
                _ => (args, false),
            };
            let (name, token) = match *args {
                [name] => (name, None),
                [name, token] => (name, Some(parse_token(token)?)),
                _ => return Err(syntax(USAGE_BREAK)),
            };
            Ok(Request::Break {
                name: valid_name("name", name)?,
                token,
                force,
            })
        }
        "PING" | "HELP" | "QUIT" => {
            if !args.is_empty() {
                return Err(syntax(format!("usage: {cmd}")));
            }
            Ok(match cmd {
                "PING" => Request::Ping,
                "HELP" => Request::Help,
                _ => Request::Quit,
            })
        }
        _ => Err(ProtoError::new(
            ErrorCode::Unknown,
            format!("unknown command {}; try HELP", quote(command)),
        )),
    }
}

fn parse_lock(args: &[&str], note: Option<&str>) -> Result<Request, ProtoError> {
    if args.len() < 2 {
        return Err(syntax(USAGE_LOCK));
    }
    // `and=` is the one option that repeats: the set's further names, taken out first.
    let name = valid_name("name", args[0])?;
    let mut and: Vec<String> = Vec::new();
    let mut words: Vec<&str> = Vec::with_capacity(args.len() - 2);
    for word in &args[2..] {
        match word.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("and") => {
                let further = valid_name("name", value)?;
                if further == name || and.contains(&further) {
                    return Err(syntax(format!(
                        "name {} given twice in one LOCK; {USAGE_LOCK}",
                        quote(&further)
                    )));
                }
                and.push(further);
            }
            None if word.eq_ignore_ascii_case("and") => {
                return Err(syntax(format!(
                    "and needs a value, as and=<name>; {USAGE_LOCK}"
                )))
            }
            _ => words.push(word),
        }
    }
    let opts = Options::parse(
        &words,
        &[
            "ttl",
            "wait",
            "session",
            "detach",
            "shared",
            "limit",
            "supersede",
            "delay",
        ],
        USAGE_LOCK,
    )?;
    if opts.supersede && !and.is_empty() {
        return Err(syntax(format!(
            "supersede takes one name, not a set (and=); {USAGE_LOCK}"
        )));
    }
    Ok(Request::Lock(Box::new(LockRequest {
        name: name.into(),
        id: valid_name("id", args[1])?,
        ttl: opts.ttl,
        wait: opts.wait,
        tie: opts.tie,
        mode: opts.mode,
        note: match note {
            Some(note) => note::valid_note(note)?.map(Into::into),
            None => None,
        },
        supersede: opts.supersede,
        and: and.into(),
        delay: opts.delay,
        // The server's to fill in.
        ..LockRequest::default()
    })))
}

#[derive(Default)]
struct Options {
    ttl: Option<Duration>,
    wait: Option<Duration>,
    tie: Tie,
    mode: Mode,
    supersede: bool,
    delay: Option<Duration>,
}

impl Options {
    fn parse(words: &[&str], allowed: &[&str], usage: &str) -> Result<Options, ProtoError> {
        let mut opts = Options::default();
        let mut seen: Vec<String> = Vec::new();
        for word in words {
            let (key, value) = match word.split_once('=') {
                Some((k, v)) => (k.to_ascii_lowercase(), Some(v)),
                None => (word.to_ascii_lowercase(), None),
            };
            if !allowed.contains(&key.as_str()) {
                return Err(syntax(format!("unknown option {}; {usage}", quote(word))));
            }
            if seen.contains(&key) {
                return Err(syntax(format!("option {key} given twice; {usage}")));
            }
            if matches!(key.as_str(), "shared" | "limit") && opts.mode != Mode::Exclusive {
                return Err(syntax(format!(
                    "shared and limit exclude each other; {usage}"
                )));
            }
            if matches!(key.as_str(), "session" | "detach") && opts.tie != Tie::Plain {
                return Err(syntax(format!(
                    "session and detach exclude each other; {usage}"
                )));
            }
            match (key.as_str(), value) {
                ("session", None) => opts.tie = Tie::Session(Duration::ZERO),
                ("session", Some(v)) => opts.tie = Tie::Session(parse_duration("session", v)?),
                ("detach", None) => opts.tie = Tie::Detach,
                ("supersede", None) => opts.supersede = true,
                ("supersede", Some(_)) => {
                    return Err(syntax(format!("supersede takes no value; {usage}")))
                }
                ("shared", None) => opts.mode = Mode::Shared,
                ("shared", Some(_)) => {
                    return Err(syntax(format!("shared takes no value; {usage}")))
                }
                ("limit", Some(v)) => opts.mode = Mode::limit(parse_limit(v)?),
                ("detach", Some(_)) => {
                    return Err(syntax(format!("detach takes no value; {usage}")))
                }
                (_, None) => return Err(syntax(format!("{key} needs a value, as {key}=30s"))),
                ("ttl", Some(v)) => opts.ttl = Some(parse_duration("ttl", v)?),
                ("delay", Some(v)) => opts.delay = Some(parse_duration("delay", v)?),
                (_, Some(v)) => opts.wait = Some(parse_duration("wait", v)?),
            }
            seen.push(key);
        }
        Ok(opts)
    }
}

fn parse_limit(value: &str) -> Result<u32, ProtoError> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(bad_arg(format!(
            "limit must be a whole number from 1 to {MAX_LIMIT}, not {}",
            quote(value)
        ))),
    }
}

/// The longest command word (`UNLOCK`, `STATUS`) with room to spare.
const COMMAND_MAX: usize = 8;

/// `command` in capitals, in `buf`: the commands are ASCII words of at most
/// [`COMMAND_MAX`] letters, so a longer word is no command (the empty string), and no request
/// allocates for it.
fn upper_command<'b>(command: &str, buf: &'b mut [u8; COMMAND_MAX]) -> &'b str {
    let Some(upper) = buf.get_mut(..command.len()) else {
        return "";
    };
    upper.copy_from_slice(command.as_bytes());
    upper.make_ascii_uppercase();
    std::str::from_utf8(upper).unwrap_or("")
}

/// How many words after the command are kept on the stack: every request fits, a LOCK with
/// all its options too (name, id, ttl=, wait=, session, limit=, supersede; its note is split
/// off first), but for a set's `and=` names.
const WORDS_INLINE: usize = 8;

/// The words after the command, on the stack up to [`WORDS_INLINE`] of them (then in a
/// `Vec`): parsing a request allocates nothing for its words.
struct Words<'a> {
    inline: [&'a str; WORDS_INLINE],
    len: usize,
    spill: Vec<&'a str>,
}

impl<'a> Words<'a> {
    fn collect(words: impl Iterator<Item = &'a str>) -> Self {
        let mut this = Words {
            inline: [""; WORDS_INLINE],
            len: 0,
            spill: Vec::new(),
        };
        for word in words {
            if this.len < WORDS_INLINE {
                this.inline[this.len] = word;
                this.len += 1;
            } else {
                if this.spill.is_empty() {
                    this.spill.extend_from_slice(&this.inline);
                }
                this.spill.push(word);
            }
        }
        this
    }

    fn as_slice(&self) -> &[&'a str] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

fn exact<'a, const N: usize>(args: &[&'a str], usage: &str) -> Result<[&'a str; N], ProtoError> {
    <[&str; N]>::try_from(args).map_err(|_| syntax(usage))
}

fn optional_name(args: &[&str], usage: &str) -> Result<Option<String>, ProtoError> {
    match args {
        [] => Ok(None),
        [name] => Ok(Some(valid_name("name", name)?)),
        _ => Err(syntax(usage)),
    }
}

fn syntax(message: impl Into<String>) -> ProtoError {
    ProtoError::new(ErrorCode::Syntax, message)
}

fn bad_arg(message: impl Into<String>) -> ProtoError {
    ProtoError::new(ErrorCode::BadArg, message)
}

/// Checks a lock name or client id: 1 to 255 bytes, no whitespace or control characters, so
/// it always fits in one word of one line.
pub fn validate_name(what: &str, value: &str) -> Result<(), ProtoError> {
    if value.is_empty() {
        return Err(bad_arg(format!("{what} is empty")));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(bad_arg(format!(
            "{what} is {} bytes; at most {MAX_NAME_LEN}",
            value.len()
        )));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad_arg(format!(
            "{what} {} has whitespace or control characters",
            quote(value)
        )));
    }
    Ok(())
}

/// The prefix a name pattern of STATUS and WATCH stands for: `<prefix>*` is every name that
/// starts with `<prefix>` (`*` alone, every name); `None` for a plain name.
pub fn prefix_of(pattern: &str) -> Option<&str> {
    pattern.strip_suffix('*')
}

/// Whether `pattern` (a name, or a `<prefix>*`) covers lock `name`.
pub fn covers(pattern: &str, name: &str) -> bool {
    match prefix_of(pattern) {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

fn valid_name(what: &str, value: &str) -> Result<String, ProtoError> {
    validate_name(what, value)?;
    Ok(value.to_owned())
}

/// A fencing token: a positive decimal integer.
pub fn parse_token(word: &str) -> Result<Token, ProtoError> {
    match word.parse::<Token>() {
        Ok(t) if t > 0 && word.bytes().all(|b| b.is_ascii_digit()) => Ok(t),
        _ => Err(bad_arg(format!(
            "token {} is not a positive integer",
            quote(word)
        ))),
    }
}

/// Longest duration the protocol accepts anywhere (limits are narrower).
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration: humantime (`250ms`, `30s`, `5m`, `1h 30m` written `1h30m`) or plain seconds
/// (`30`, `1.5`).
pub fn parse_duration(what: &str, word: &str) -> Result<Duration, ProtoError> {
    let bad = || {
        bad_arg(format!(
            "{what}={} is not a duration (as 250ms, 30s, 5m or plain seconds)",
            quote(word)
        ))
    };
    let plain = !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let d = if plain {
        let secs: f64 = word.parse().map_err(|_| bad())?;
        Duration::try_from_secs_f64(secs).map_err(|_| bad())?
    } else {
        humantime::parse_duration(word).map_err(|_| bad())?
    };
    if d > MAX_DURATION {
        return Err(bad_arg(format!("{what}={} is too long", quote(word))));
    }
    Ok(d)
}

/// Debug-quotes client text for an error message, cut short, so a reply stays one line.
fn quote(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{:?}...", &text[..cut]),
        None => format!("{text:?}"),
    }
}

impl fmt::Display for Request {
    /// The request as a wire line (without the newline), as `lockctl` sends it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Lock(req) => {
                let LockRequest {
                    name,
                    id,
                    ttl,
                    wait,
                    tie,
                    mode,
                    note,
                    supersede,
                    and,
                    delay,
                    ..
                } = &**req;
                write!(f, "LOCK {name} {id}")?;
                match mode {
                    Mode::Exclusive => {}
                    Mode::Shared => f.write_str(" shared")?,
                    Mode::Limit(n) => write!(f, " limit={n}")?,
                }
                if let Some(ttl) = ttl {
                    write!(f, " ttl={}ms", ttl.as_millis().max(1))?;
                }
                if let Some(wait) = wait {
                    write!(f, " wait={}ms", wait.as_millis())?;
                }
                match tie {
                    Tie::Plain => {}
                    Tie::Detach => f.write_str(" detach")?,
                    Tie::Session(grace) if grace.is_zero() => f.write_str(" session")?,
                    Tie::Session(grace) => write!(f, " session={}ms", grace.as_millis().max(1))?,
                }
                if *supersede {
                    f.write_str(" supersede")?;
                }
                if let Some(delay) = delay {
                    write!(f, " delay={}ms", delay.as_millis())?;
                }
                for further in and {
                    write!(f, " and={further}")?;
                }
                // Last: it takes the rest of the line.
                match note {
                    Some(note) => write!(f, " note={note}"),
                    None => Ok(()),
                }
            }
            Request::Unlock { name, token } => write!(f, "UNLOCK {name} {token}"),
            Request::Renew(RenewRequest {
                name,
                token,
                ttl,
                detach,
            }) => {
                write!(f, "RENEW {name} {token}")?;
                if let Some(ttl) = ttl {
                    write!(f, " ttl={}ms", ttl.as_millis().max(1))?;
                }
                if *detach {
                    f.write_str(" detach")?;
                }
                Ok(())
            }
            Request::Check { name, token } => write!(f, "CHECK {name} {token}"),
            Request::Status { name: None } => f.write_str("STATUS"),
            Request::Status { name: Some(n) } => write!(f, "STATUS {n}"),
            Request::StatusDetail { name } => write!(f, "STATUS {name} detail"),
            Request::Watch { name: None } => f.write_str("WATCH"),
            Request::Watch { name: Some(n) } => write!(f, "WATCH {n}"),
            Request::Auth { user, secret } => write!(f, "AUTH {user} {secret}"),
            Request::Ping => f.write_str("PING"),
            Request::Help => f.write_str("HELP"),
            Request::Quit => f.write_str("QUIT"),
            Request::Break { name, token, force } => {
                write!(f, "BREAK {name}")?;
                if let Some(token) = token {
                    write!(f, " {token}")?;
                }
                if *force {
                    f.write_str(" force")?;
                }
                Ok(())
            }
        }
    }
}

/// What a request is about, for the log line of its refusal: its lock name, client id and
/// token, where it has them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Subject<'a> {
    /// The lock name; empty for a request without one.
    pub name: &'a str,
    /// The client id; empty for a request without one.
    pub id: &'a str,
    /// The token, for UNLOCK, RENEW and CHECK.
    pub token: Option<Token>,
}

impl Request {
    /// The lock name, client id and token this request is about (empty where it has none).
    pub fn subject(&self) -> Subject<'_> {
        let (name, id, token) = match self {
            Request::Lock(req) => (&*req.name, req.id.as_str(), None),
            Request::Unlock { name, token }
            | Request::Renew(RenewRequest { name, token, .. })
            | Request::Check { name, token } => (name.as_str(), "", Some(*token)),
            Request::Break { name, token, .. } => (name.as_str(), "", *token),
            Request::Status { name: Some(name) }
            | Request::StatusDetail { name }
            | Request::Watch { name: Some(name) } => (name.as_str(), "", None),
            _ => ("", "", None),
        };
        Subject { name, id, token }
    }

    /// Checks the names and ids a request carries, so formatting it can never produce a
    /// second line or a word split.
    pub fn validate(&self) -> Result<(), ProtoError> {
        match self {
            Request::Lock(req) => {
                validate_name("name", &req.name)?;
                validate_name("id", &req.id)?;
                match &req.note {
                    Some(note) => note::valid_note(note).map(drop),
                    None => Ok(()),
                }
            }
            Request::Unlock { name, .. }
            | Request::Renew(RenewRequest { name, .. })
            | Request::Check { name, .. }
            | Request::Status { name: Some(name) }
            | Request::StatusDetail { name }
            | Request::Watch { name: Some(name) }
            | Request::Break { name, .. } => validate_name("name", name),
            Request::Auth { user, .. } => validate_name("user", user),
            _ => Ok(()),
        }
    }
}

impl Request {
    /// Refuses a LOCK's note longer than `max` bytes (`--max-note`).
    pub fn check_note_len(&self, max: usize) -> Result<(), ProtoError> {
        match self {
            Request::Lock(req) if req.note.as_ref().is_some_and(|n| n.len() > max) => {
                Err(bad_arg(format!(
                    "note is {} bytes; this server allows at most {max}",
                    req.note.as_ref().map_or(0, |n| n.len())
                )))
            }
            _ => Ok(()),
        }
    }

    /// Refuses a LOCK of more than `max` names (`--max-names`): a set is granted in one
    /// step of the table (one etcd transaction), whose size the server bounds.
    pub fn check_names(&self, max: usize) -> Result<(), ProtoError> {
        match self {
            Request::Lock(req) if req.and.len() + 1 > max => Err(ProtoError::new(
                ErrorCode::Limit,
                format!(
                    "LOCK of {} names; this server allows at most {max} in one LOCK",
                    req.and.len() + 1
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl Request {
    /// Refuses names and ids longer than `max` bytes: a server may set a limit below
    /// [`MAX_NAME_LEN`].
    pub fn check_name_len(&self, max: usize) -> Result<(), ProtoError> {
        let words: [(&str, Option<&str>); 2] = match self {
            Request::Lock(req) => [("name", Some(&*req.name)), ("id", Some(&req.id))],
            Request::Unlock { name, .. }
            | Request::Renew(RenewRequest { name, .. })
            | Request::Check { name, .. }
            | Request::StatusDetail { name }
            | Request::Break { name, .. } => [("name", Some(name)), ("id", None)],
            Request::Status { name } | Request::Watch { name } => {
                [("name", name.as_deref()), ("id", None)]
            }
            Request::Auth { .. } | Request::Ping | Request::Help | Request::Quit => {
                [("name", None), ("id", None)]
            }
        };
        for (what, value) in words {
            if let Some(v) = value.filter(|v| v.len() > max) {
                return Err(bad_arg(format!(
                    "{what} is {} bytes; this server allows at most {max}",
                    v.len()
                )));
            }
        }
        if let Request::Lock(req) = self {
            if let Some(v) = req.and.iter().find(|v| v.len() > max) {
                return Err(bad_arg(format!(
                    "name is {} bytes; this server allows at most {max}",
                    v.len()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_of_a_set() {
        let r =
            parse("LOCK db-migrate ci-7 ttl=5m and=cache-flush AND=search note=two names").unwrap();
        let Request::Lock(req) = &r else {
            panic!("not a LOCK: {r:?}");
        };
        assert_eq!(&*req.name, "db-migrate");
        assert_eq!(&*req.and, ["cache-flush", "search"]);
        assert_eq!(
            r.to_string(),
            "LOCK db-migrate ci-7 ttl=300000ms and=cache-flush and=search note=two names"
        );
        assert_eq!(parse(&r.to_string()), Ok(r.clone()));
        let code = |line: &str| parse(line).map_err(|e| e.code);
        assert_eq!(code("LOCK a me and=a"), Err(ErrorCode::Syntax));
        assert_eq!(code("LOCK a me and=b and=b"), Err(ErrorCode::Syntax));
        assert_eq!(code("LOCK a me and"), Err(ErrorCode::Syntax));
        assert_eq!(code("LOCK a me and="), Err(ErrorCode::BadArg));
        assert_eq!(code("LOCK a me and=b supersede"), Err(ErrorCode::Syntax));
        assert_eq!(code("LOCK a me supersede and=b"), Err(ErrorCode::Syntax));
        assert_eq!(r.check_names(3), Ok(()));
        assert_eq!(r.check_names(2).map_err(|e| e.code), Err(ErrorCode::Limit));
        let long = parse("LOCK a me and=longer-name").unwrap();
        assert_eq!(
            long.check_name_len(4).map_err(|e| e.code),
            Err(ErrorCode::BadArg)
        );
    }

    /// Words are kept on the stack up to [`WORDS_INLINE`], and a command is put in capitals
    /// in a fixed buffer: past either bound the request means the same as before.
    #[test]
    fn many_words_and_long_or_foreign_commands() {
        let names: Vec<String> = (1..=2 * WORDS_INLINE).map(|i| format!("n{i}")).collect();
        let ands: Vec<String> = names.iter().map(|n| format!("and={n}")).collect();
        let line = format!("LOCK first me ttl=5s wait=1s {} note=x y", ands.join(" "));
        let Ok(Request::Lock(req)) = parse(&line) else {
            panic!("not a LOCK: {line}");
        };
        assert_eq!((&*req.name, req.id.as_str()), ("first", "me"));
        assert_eq!(&*req.and, &names[..]);
        assert_eq!(req.note.as_deref(), Some("x y"));
        let over: Vec<&str> = vec!["a"; WORDS_INLINE + 1];
        let code = |line: &str| parse(line).map_err(|e| e.code);
        assert_eq!(
            code(&format!("UNLOCK {}", over.join(" "))),
            Err(ErrorCode::Syntax)
        );
        assert_eq!(
            code("uNlOcK a 1").ok(),
            Some(Request::Unlock {
                name: "a".into(),
                token: 1
            })
        );
        for unknown in ["UNLOCKING a 1", "STATUSXXX", "LÖCK a me", "ÜNLOCK a 1"] {
            assert_eq!(code(unknown), Err(ErrorCode::Unknown), "{unknown}");
        }
    }

    #[test]
    fn lock_with_options() {
        let r = parse("lock build me ttl=5s WAIT=250ms session").unwrap();
        assert_eq!(
            r,
            Request::Lock(Box::new(LockRequest {
                name: "build".into(),
                id: "me".into(),
                ttl: Some(Duration::from_secs(5)),
                wait: Some(Duration::from_millis(250)),
                tie: Tie::Session(Duration::ZERO),
                ..LockRequest::default()
            }))
        );
        assert_eq!(r.to_string(), "LOCK build me ttl=5000ms wait=250ms session");
        assert_eq!(parse(&r.to_string()).unwrap(), r);
    }

    #[test]
    fn lock_note_is_last_and_takes_the_rest_of_the_line() {
        let note = |line: &str| match parse(line) {
            Ok(Request::Lock(req)) => Ok(req.note.as_deref().map(String::from)),
            Ok(other) => panic!("not a LOCK: {other:?}"),
            Err(e) => Err(e.code),
        };
        assert_eq!(
            note("LOCK deploy ci-42 ttl=5m note=release 1.4.2 by ci job 8812"),
            Ok(Some("release 1.4.2 by ci job 8812".into()))
        );
        assert_eq!(
            note("LOCK a b note=x wait=0  \t"),
            Ok(Some("x wait=0".into()))
        );
        assert_eq!(note("LOCK a b note=   "), Ok(None));
        assert_eq!(note("LOCK a b note=a\u{7}b"), Err(ErrorCode::BadArg));
        assert_eq!(note("LOCK a b"), Ok(None));
        let r = parse("LOCK a b wait=0 note=  two  spaces").unwrap();
        assert_eq!(r.to_string(), "LOCK a b wait=0ms note=  two  spaces");
        assert_eq!(parse(&r.to_string()).unwrap(), r);
        assert_eq!(r.check_note_len(12).unwrap_err().code, ErrorCode::BadArg);
        assert!(r.check_note_len(13).is_ok());
    }

    #[test]
    fn lock_ties() {
        let tie = |line: &str| match parse(line) {
            Ok(Request::Lock(req)) => Ok(req.tie),
            Ok(other) => panic!("not a LOCK: {other:?}"),
            Err(e) => Err(e.code),
        };
        assert_eq!(tie("LOCK a b"), Ok(Tie::Plain));
        assert_eq!(tie("LOCK a b DETACH"), Ok(Tie::Detach));
        assert_eq!(
            tie("LOCK a b session=10s"),
            Ok(Tie::Session(Duration::from_secs(10)))
        );
        assert_eq!(tie("LOCK a b session detach"), Err(ErrorCode::Syntax));
        assert_eq!(tie("LOCK a b detach session=1s"), Err(ErrorCode::Syntax));
        assert_eq!(tie("LOCK a b detach=1"), Err(ErrorCode::Syntax));
        assert_eq!(tie("LOCK a b session=soon"), Err(ErrorCode::BadArg));
        assert_eq!(tie("LOCK a b supersede=1"), Err(ErrorCode::Syntax));
        assert_eq!(tie("LOCK a b supersede supersede"), Err(ErrorCode::Syntax));
        for line in [
            "LOCK a b detach",
            "LOCK a b session=1500ms",
            "LOCK a b session",
            "LOCK a b shared",
            "LOCK a b limit=3 session",
            "LOCK a b shared wait=2s supersede",
            "RENEW a 7 detach",
            "RENEW a 7 ttl=5s detach",
        ] {
            let r = parse(line).unwrap();
            assert_eq!(parse(&r.to_string()).unwrap(), r, "{line}");
        }
    }

    #[test]
    fn plain_seconds() {
        assert_eq!(
            parse_duration("ttl", "30").unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse_duration("ttl", "1.5").unwrap(),
            Duration::from_millis(1500)
        );
        assert!(parse_duration("ttl", "-1").is_err());
        assert!(parse_duration("ttl", "1e9999").is_err());
        assert!(parse_duration("ttl", "99999999999999999999999").is_err());
        assert!(parse_duration("ttl", "").is_err());
        assert!(parse_duration("ttl", ".").is_err());
    }

    #[test]
    fn errors_have_codes() {
        let code = |l: &str| parse(l).unwrap_err().code;
        assert_eq!(code(""), ErrorCode::Syntax);
        assert_eq!(code("   "), ErrorCode::Syntax);
        assert_eq!(code("FROB x"), ErrorCode::Unknown);
        assert_eq!(code("LOCK a"), ErrorCode::Syntax);
        assert_eq!(code("LOCK a b ttl"), ErrorCode::Syntax);
        assert_eq!(code("LOCK a b ttl=1s ttl=2s"), ErrorCode::Syntax);
        assert_eq!(code("LOCK a b color=red"), ErrorCode::Syntax);
        assert_eq!(code("LOCK a b ttl=soon"), ErrorCode::BadArg);
        assert_eq!(code("UNLOCK a"), ErrorCode::Syntax);
        assert_eq!(code("UNLOCK a 1 2"), ErrorCode::Syntax);
        assert_eq!(code("UNLOCK a x"), ErrorCode::BadArg);
        assert_eq!(code("UNLOCK a 0"), ErrorCode::BadArg);
        assert_eq!(code("UNLOCK a +5"), ErrorCode::BadArg);
        assert_eq!(code("UNLOCK a 99999999999999999999999"), ErrorCode::BadArg);
        assert_eq!(code("PING now"), ErrorCode::Syntax);
        assert_eq!(code("STATUS a b"), ErrorCode::Syntax);
        assert_eq!(code("LOCK a\u{7} b"), ErrorCode::BadArg);
        assert_eq!(
            code(&format!("LOCK {} b", "n".repeat(256))),
            ErrorCode::BadArg
        );
        assert!(parse(&format!("LOCK {} b", "n".repeat(255))).is_ok());
    }

    #[test]
    fn error_messages_stay_on_one_line() {
        let e = ProtoError::new(ErrorCode::Syntax, "a\nb\rc");
        assert_eq!(e.to_string(), "ERR SYNTAX a b c");
        let e = parse("X\u{1b}[2J").unwrap_err();
        assert!(!e.to_string().contains('\u{1b}'));
    }

    #[test]
    fn reply_lines() {
        assert_eq!(parse_reply("OK 12"), ReplyLine::Ok("12"));
        assert_eq!(parse_reply("OK"), ReplyLine::Ok(""));
        assert_eq!(
            parse_reply("ERR TIMEOUT waited 1s"),
            ReplyLine::Err(ProtoError::new(ErrorCode::Timeout, "waited 1s"))
        );
        assert_eq!(parse_reply("EVENT x"), ReplyLine::Other("EVENT x"));
        assert_eq!(field("a held id=me token=7", "token"), Some("7"));
    }

    #[test]
    fn server_name_limit() {
        let r = parse("LOCK abcd ef").unwrap();
        assert!(r.check_name_len(4).is_ok());
        assert_eq!(r.check_name_len(3).unwrap_err().code, ErrorCode::BadArg);
        let r = parse("LOCK ab cdef").unwrap();
        assert_eq!(r.check_name_len(3).unwrap_err().code, ErrorCode::BadArg);
        assert!(parse("PING").unwrap().check_name_len(1).is_ok());
    }

    #[test]
    fn auth_never_shows_its_secret() {
        let r = parse("auth alice s3cret-token-0123456789").unwrap();
        let Request::Auth { user, secret } = &r else {
            panic!("not AUTH: {r:?}");
        };
        assert_eq!(user, "alice");
        assert_eq!(secret.expose(), "s3cret-token-0123456789");
        assert_eq!(r.to_string(), "AUTH alice ***");
        assert!(!format!("{r:?}").contains("s3cret"));
        let line = AuthLine {
            user: "alice",
            secret: secret.expose(),
        };
        assert_eq!(parse(&line.to_string()).unwrap(), r);
        for bad in ["AUTH", "AUTH alice", "AUTH alice s3cret extra"] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::Syntax);
            assert!(!e.message.contains("s3cret"), "{e}");
        }
        assert_eq!(
            parse("AUTH al\u{7}ice s3cret").unwrap_err().code,
            ErrorCode::BadArg
        );
    }

    #[test]
    fn error_codes_round_trip() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
        }
    }
}
