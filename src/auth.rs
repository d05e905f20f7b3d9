//! Users and their rights (`--auth-file`): the file parsed, a secret checked, and the one
//! question the connection handler asks before every command: may this user do this to this name?
//!
//! Pure apart from [`load`], which reads the file. The table never sees a user's name or
//! rights, only its number ([`UserId`]), to tell whose a lease is.
//!
//! # The file
//! One user per line, `#` comments and blank lines ignored:
//!
//! ```text
//! user <name> sha256:<salt-hex>:<digest-hex> [lock=<pattern>,...] [read=<pattern>,...]
//!      [admin=<pattern>,...]
//! ```
//!
//! The digest is SHA-256 of the salt's bytes followed by the secret's. A fast salted hash is
//! enough because the secrets are not passwords: `lockd --auth-hash-new` makes them 256 random
//! bits and `--auth-hash` refuses one shorter than [`MIN_SECRET`] bytes, so a stolen file can't
//! be turned back into a secret by guessing, and an AUTH costs one hash. Digests are compared in
//! constant time.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::locks::{UserId, NO_USER};

/// Shortest secret `lockd --auth-hash` accepts, in bytes (128 bits of a random token's text).
pub const MIN_SECRET: usize = 16;
/// Longest secret, in bytes: one word of a request line.
pub const MAX_SECRET: usize = 255;
/// Bytes of salt in a hash.
pub const SALT_LEN: usize = 16;
const DIGEST_LEN: usize = 32;
const SCHEME: &str = "sha256";

/// What a command needs: `lock` for LOCK, UNLOCK and RENEW; `read` for STATUS, CHECK and
/// WATCH; `admin` for BREAK. None implies another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    /// `lock`: LOCK, UNLOCK and RENEW.
    Lock,
    /// `read`: STATUS, CHECK and WATCH.
    Read,
    /// `admin`: BREAK, ending other users' leases (an operator's right).
    Admin,
}

impl Right {
    /// The right as the auth file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Right::Lock => "lock",
            Right::Read => "read",
            Right::Admin => "admin",
        }
    }
}

/// Which names a right covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: every name.
    All,
    /// `<prefix>*`: names that start with the prefix.
    Prefix(String),
    /// A name exactly.
    Exact(String),
}

impl Pattern {
    /// A pattern of an auth-file line. The error does not repeat the pattern: the caller
    /// says where it is (a secret may have been pasted there).
    fn parse(word: &str) -> Result<Pattern, String> {
        if word == "*" {
            return Ok(Pattern::All);
        }
        let (text, prefix) = match word.strip_suffix('*') {
            Some(text) => (text, true),
            None => (word, false),
        };
        if text.contains('*') {
            return Err("`*` may only end a pattern (`*`, `prefix*` or a name)".into());
        }
        name_problem(text)?;
        Ok(if prefix {
            Pattern::Prefix(text.to_owned())
        } else {
            Pattern::Exact(text.to_owned())
        })
    }

    /// Whether lock `name` falls under this pattern.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Prefix(prefix) => name.starts_with(prefix.as_str()),
            Pattern::Exact(exact) => name == exact,
        }
    }
}

/// A salted SHA-256 of a secret, as the file holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct Hash {
    salt: [u8; SALT_LEN],
    digest: [u8; DIGEST_LEN],
}

impl Hash {
    /// The hash of `secret` with `salt`.
    pub fn new(salt: [u8; SALT_LEN], secret: &str) -> Hash {
        Hash {
            salt,
            digest: digest(&salt, secret),
        }
    }

    /// `sha256:<salt-hex>:<digest-hex>`. The error never repeats the word: it may be a secret
    /// pasted into the wrong place.
    fn parse(word: &str) -> Result<Hash, String> {
        let bad = || {
            format!(
                "is not a valid salted hash: expected {SCHEME}:<salt-hex>:<digest-hex> \
                 ({} and {} hex digits; make one with lockd --auth-hash)",
                2 * SALT_LEN,
                2 * DIGEST_LEN
            )
        };
        let mut parts = word.split(':');
        let (Some(SCHEME), Some(salt), Some(digest), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(Hash {
            salt: from_hex(salt).ok_or_else(bad)?,
            digest: from_hex(digest).ok_or_else(bad)?,
        })
    }

    /// Whether `secret` is the one hashed, in time that does not depend on where it differs.
    pub fn matches(&self, secret: &str) -> bool {
        digest(&self.salt, secret).ct_eq(&self.digest).into()
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}:{}:{}", hex(&self.salt), hex(&self.digest))
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hash(..)")
    }
}

fn digest(salt: &[u8], secret: &str) -> [u8; DIGEST_LEN] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(secret.as_bytes());
    h.finalize().into()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// One user of the file.
#[derive(Clone, Debug)]
struct User {
    name: String,
    hash: Hash,
    lock: Vec<Pattern>,
    read: Vec<Pattern>,
    admin: Vec<Pattern>,
}

impl User {
    fn patterns(&self, right: Right) -> &[Pattern] {
        match right {
            Right::Lock => &self.lock,
            Right::Read => &self.read,
            Right::Admin => &self.admin,
        }
    }
}

/// A line of the file that is not right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    /// What is wrong with it, without the line number.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// The users of an auth file.
pub struct Users {
    users: HashMap<UserId, User>,
    /// Every user name seen since the server started, with its number: a user keeps its
    /// number across reloads (even removed and added back), so the leases it holds stay its.
    numbers: HashMap<String, UserId>,
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.users.values().map(|u| u.name.as_str()).collect();
        names.sort_unstable();
        f.debug_struct("Users").field("names", &names).finish()
    }
}

const USAGE_LINE: &str =
    "expected `user <name> <hash> [lock=<pattern>,...] [read=<pattern>,...] [admin=<pattern>,...]`";

impl Users {
    /// Parses an auth file's text. Users also in `previous` (the file in force before a
    /// reload) keep their numbers.
    pub fn parse(text: &str, previous: Option<&Users>) -> Result<Users, ParseError> {
        let mut numbers = previous.map(|p| p.numbers.clone()).unwrap_or_default();
        let mut users = HashMap::new();
        let mut lines_of: HashMap<String, usize> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let at = |message: String| ParseError {
                line: i + 1,
                message,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let user = parse_user(line).map_err(at)?;
            if let Some(first) = lines_of.insert(user.name.clone(), i + 1) {
                return Err(at(format!(
                    "field 2: that user is already defined on line {first}"
                )));
            }
            let next = numbers.len() as UserId + 1;
            let number = *numbers.entry(user.name.clone()).or_insert(next);
            users.insert(number, user);
        }
        Ok(Users { users, numbers })
    }

    /// How many users the file has.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether the file has no users (then nobody can log in).
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The number of user `name` if `secret` is its secret. An unknown name costs a hash
    /// too, so the time taken does not tell which names exist.
    pub fn authenticate(&self, name: &str, secret: &str) -> Option<UserId> {
        let found = self
            .numbers
            .get(name)
            .and_then(|n| Some((*n, self.users.get(n)?)));
        match found {
            Some((number, user)) => user.hash.matches(secret).then_some(number),
            None => {
                let _ = Hash::new([0; SALT_LEN], "").matches(secret);
                None
            }
        }
    }

    /// The number of user `name`, if the file has it: for a client that proved who it is
    /// another way (a client certificate whose common name is `name`).
    pub fn find(&self, name: &str) -> Option<UserId> {
        self.numbers
            .get(name)
            .copied()
            .filter(|n| self.users.contains_key(n))
    }

    /// The name of user `user`; `None` if the file no longer has it.
    pub fn name(&self, user: UserId) -> Option<&str> {
        self.users.get(&user).map(|u| u.name.as_str())
    }

    /// Whether `user` has `right` on the lock `name`.
    pub fn may(&self, user: UserId, right: Right, name: &str) -> bool {
        user != NO_USER
            && self
                .users
                .get(&user)
                .is_some_and(|u| u.patterns(right).iter().any(|p| p.matches(name)))
    }
}

/// One `user` line. Every error names the field by its position on the line (1 is `user`),
/// never by its text: a secret pasted into the wrong field must not reach the log.
fn parse_user(line: &str) -> Result<User, String> {
    let mut words = line.split_whitespace();
    if words.next() != Some("user") {
        return Err(format!("field 1 is not `user`; {USAGE_LINE}"));
    }
    let (Some(name), Some(hash)) = (words.next(), words.next()) else {
        return Err(format!("fewer than 3 fields; {USAGE_LINE}"));
    };
    name_problem(name).map_err(|e| format!("field 2 (the user name) {e}"))?;
    let hash = Hash::parse(hash).map_err(|e| format!("field 3 {e}"))?;
    let mut user = User {
        name: name.to_owned(),
        hash,
        lock: Vec::new(),
        read: Vec::new(),
        admin: Vec::new(),
    };
    let mut seen = [false; 3];
    for (at, word) in (4..).zip(words) {
        let (key, value) = word.split_once('=').unwrap_or((word, ""));
        let (right, i) = match key {
            "lock" => (Right::Lock, 0),
            "read" => (Right::Read, 1),
            "admin" => (Right::Admin, 2),
            _ => {
                return Err(format!(
                    "field {at} is neither lock=<patterns>, read=<patterns> \
                     nor admin=<patterns>; {USAGE_LINE}"
                ))
            }
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(format!("field {at}: {key}= is given twice"));
        }
        let patterns = (1..)
            .zip(value.split(','))
            .map(|(n, p)| match p {
                "" => Err(format!("field {at}: {key}= has an empty pattern")),
                p => {
                    Pattern::parse(p).map_err(|e| format!("field {at}: pattern {n} of {key}=: {e}"))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        match right {
            Right::Lock => user.lock = patterns,
            Right::Read => user.read = patterns,
            Right::Admin => user.admin = patterns,
        }
    }
    Ok(user)
}

/// What is wrong with a user name or a pattern's name, said without repeating it.
fn name_problem(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("is empty".into());
    }
    if text.len() > crate::proto::MAX_NAME_LEN {
        return Err(format!(
            "is {} bytes; at most {}",
            text.len(),
            crate::proto::MAX_NAME_LEN
        ));
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("has control characters".into());
    }
    Ok(())
}

/// What the permissions of an auth file say, on unix: group or others may change it (then
/// anyone of them could give themselves every right), or others may read it (the hashes can't
/// be turned back into secrets, but they are nobody else's business).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exposure {
    /// Only its owner (and its group, to read) may use it.
    Private,
    /// Others may read it: a warning.
    ReadableByOthers,
    /// Its group or others may write it: refused.
    Writable,
}

impl Exposure {
    /// The exposure of a file with permission bits `mode` (as `st_mode`). Group-readable is
    /// private: that is how a file is shared with a service's group (root:lockd 0640).
    fn of_mode(mode: u32) -> Exposure {
        if mode & 0o022 != 0 {
            Exposure::Writable
        } else if mode & 0o004 != 0 {
            Exposure::ReadableByOthers
        } else {
            Exposure::Private
        }
    }
}

#[cfg(unix)]
fn exposure(file: &std::fs::File) -> io::Result<Exposure> {
    use std::os::unix::fs::PermissionsExt as _;
    Ok(Exposure::of_mode(file.metadata()?.permissions().mode()))
}

#[cfg(not(unix))]
fn exposure(_file: &std::fs::File) -> io::Result<Exposure> {
    Ok(Exposure::Private)
}

/// Reads and parses the auth file at `path`. Errors name the file (and the line). A file its
/// group or others may write is refused; one others may read is loaded with a warning in the
/// log. The permissions checked are those of the file read (one open), at every load: the
/// start and each reload.
pub fn load(path: &Path, previous: Option<&Users>) -> io::Result<Users> {
    use std::io::Read as _;
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(named)?;
    match exposure(&file).map_err(named)? {
        Exposure::Writable => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: group or others may write it, and so give themselves any right; \
                     chmod go-w it",
                    path.display()
                ),
            ))
        }
        Exposure::ReadableByOthers => tracing::warn!(
            target: "lockd::auth",
            file = %path.display(),
            "the auth file is readable by other users; chmod o-r it (its group may read it)"
        ),
        Exposure::Private => {}
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(named)?;
    Users::parse(&text, previous).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// Checks a secret for `lockd --auth-hash`: one word of [`MIN_SECRET`] to [`MAX_SECRET`]
/// bytes, no whitespace or control characters.
pub fn check_secret(secret: &str) -> Result<(), String> {
    if secret.len() < MIN_SECRET {
        return Err(format!(
            "the secret is {} bytes; at least {MIN_SECRET} are needed (lockd --auth-hash-new \
             makes one)",
            secret.len()
        ));
    }
    if secret.len() > MAX_SECRET {
        return Err(format!("the secret is over {MAX_SECRET} bytes"));
    }
    if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the secret has whitespace or control characters".into());
    }
    Ok(())
}

/// The auth file line for `spec` (`<name> [lock=...] [read=...]`, the rest of a line) with
/// `secret` hashed with `salt`; checked by parsing it back.
pub fn user_line(spec: &str, secret: &str, salt: [u8; SALT_LEN]) -> Result<String, String> {
    check_secret(secret)?;
    let mut words = spec.split_whitespace();
    let name = words.next().ok_or("no user name given")?;
    let rest: Vec<&str> = words.collect();
    let mut line = format!("user {name} {}", Hash::new(salt, secret));
    for word in rest {
        line.push(' ');
        line.push_str(word);
    }
    Users::parse(&line, None).map_err(|e| spec_words(&e.message))?;
    Ok(line)
}

/// A refusal of the file line made of a typed `<user> <rights>...`, told by the words typed:
/// the line's field 2 (the name) is word 1 of what was typed, and field N after the hash word
/// N-2.
fn spec_words(message: &str) -> String {
    let message = message.strip_prefix("line 1: ").unwrap_or(message);
    let Some(rest) = message.strip_prefix("field ") else {
        return message.to_owned();
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<usize>() {
        Ok(n) if n >= 4 => format!(
            "word {} of the user and rights given{}",
            n - 2,
            &rest[digits.len()..]
        ),
        Ok(2) => format!("word 1{}", &rest[1..]),
        _ => message.to_owned(),
    }
}

/// The users in force, shared by every connection and replaced whole on a reload. A
/// session reads it per command (never across an `.await`) and is woken when it changes, to
/// close itself if its user was removed.
#[derive(Debug)]
pub struct Gate {
    users: watch::Sender<Arc<Users>>,
}

impl Gate {
    /// A gate that lets `users` in until a reload replaces them.
    pub fn new(users: Users) -> Arc<Gate> {
        Arc::new(Gate {
            users: watch::Sender::new(Arc::new(users)),
        })
    }

    /// The users now in force.
    pub fn users(&self) -> Arc<Users> {
        Arc::clone(&self.users.borrow())
    }

    /// Tells of every replacement from now on.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Users>> {
        self.users.subscribe()
    }

    /// Reads `path` again and puts it in force; on an error the users in force stay. Returns
    /// how many users it has.
    pub fn reload(&self, path: &Path) -> io::Result<usize> {
        let users = load(path, Some(&self.users()))?;
        let count = users.len();
        self.users.send_replace(Arc::new(users));
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SALT: [u8; SALT_LEN] = [7; SALT_LEN];
    const SECRET: &str = "0123456789abcdef-secret";

    fn line(name: &str, rights: &str) -> String {
        format!("user {name} {} {rights}", Hash::new(SALT, SECRET))
    }

    #[test]
    fn parses_users_rights_comments_and_blank_lines() {
        let text = format!(
            "# lockd users\n\n{}\n   \n  # indented comment\n{}\n",
            line("alice", "lock=deploy*,build read=*"),
            line("bob", "read=deploy")
        );
        let users = Users::parse(&text, None).unwrap();
        assert_eq!(users.len(), 2);
        let alice = users.authenticate("alice", SECRET).unwrap();
        let bob = users.authenticate("bob", SECRET).unwrap();
        assert_ne!(alice, bob);
        assert_ne!(alice, NO_USER);
        assert_eq!(users.name(alice), Some("alice"));
        assert!(users.may(alice, Right::Lock, "deploy"));
        assert!(users.may(alice, Right::Lock, "deploy-web"));
        assert!(users.may(alice, Right::Lock, "build"));
        assert!(!users.may(alice, Right::Lock, "builds"));
        assert!(!users.may(alice, Right::Lock, "other"));
        assert!(users.may(alice, Right::Read, "anything"));
        // lock does not imply read, nor read lock.
        assert!(users.may(bob, Right::Read, "deploy"));
        assert!(!users.may(bob, Right::Lock, "deploy"));
        assert!(!users.may(bob, Right::Read, "deploy2"));
        // No user, no rights.
        assert!(!users.may(NO_USER, Right::Read, "deploy"));
        assert!(!users.may(99, Right::Read, "deploy"));
    }

    #[test]
    fn a_user_without_rights_may_do_nothing() {
        let users = Users::parse(&line("carol", ""), None).unwrap();
        let carol = users.authenticate("carol", SECRET).unwrap();
        assert!(!users.may(carol, Right::Lock, "x"));
        assert!(!users.may(carol, Right::Read, "x"));
    }

    #[test]
    fn patterns() {
        assert_eq!(Pattern::parse("*"), Ok(Pattern::All));
        assert_eq!(Pattern::parse("ci-*"), Ok(Pattern::Prefix("ci-".into())));
        assert_eq!(
            Pattern::parse("deploy"),
            Ok(Pattern::Exact("deploy".into()))
        );
        assert!(Pattern::parse("a*b").is_err());
        assert!(Pattern::parse("**").is_err());
        assert!(Pattern::parse("a\u{7}").is_err());
        assert!(Pattern::Prefix("ci-".into()).matches("ci-"));
        assert!(Pattern::Prefix("ci-".into()).matches("ci-7"));
        assert!(!Pattern::Prefix("ci-".into()).matches("ci"));
        assert!(!Pattern::Exact("a".into()).matches("ab"));
        assert!(Pattern::All.matches("x"));
    }

    #[test]
    fn checks_the_secret() {
        let users = Users::parse(&line("alice", "lock=*"), None).unwrap();
        assert!(users.authenticate("alice", SECRET).is_some());
        assert!(users.authenticate("alice", &format!("{SECRET}x")).is_none());
        assert!(users.authenticate("alice", &SECRET[1..]).is_none());
        assert!(users.authenticate("alice", "").is_none());
        assert!(users.authenticate("mallory", SECRET).is_none());
        // Another salt, another hash for the same secret.
        assert_ne!(
            Hash::new(SALT, SECRET).to_string(),
            Hash::new([8; SALT_LEN], SECRET).to_string()
        );
        let h = Hash::new(SALT, SECRET);
        assert_eq!(Hash::parse(&h.to_string()), Ok(h));
    }

    #[test]
    fn bad_lines_name_their_line_and_never_repeat_the_hash_field() {
        let good = line("alice", "lock=*");
        let err = |text: &str| Users::parse(text, None).unwrap_err();
        let cases = [
            (format!("{good}\nuser bob my-plain-secret-here lock=*"), 2),
            (format!("# c\n\n{good}\nfrobnicate"), 4),
            ("user".to_string(), 1),
            ("user bob".to_string(), 1),
            (format!("{good}\n{good}"), 2),
            (line("bob", "lock=*,"), 1),
            (line("bob", "lock=a lock=b"), 1),
            (line("bob", "write=*"), 1),
            (line("bob", "lock=a*b"), 1),
            ("user bob sha256:00:11".to_string(), 1),
            (
                format!("user bob md5:{}:{}", "0".repeat(32), "0".repeat(64)),
                1,
            ),
            (
                format!("user bob sha256:{}:{}", "g".repeat(32), "0".repeat(64)),
                1,
            ),
        ];
        for (text, at) in cases {
            let e = err(&text);
            assert_eq!(e.line, at, "{text:?}: {e}");
            assert!(e.to_string().starts_with(&format!("line {at}: ")));
        }
        let e = err("user bob my-plain-secret-here lock=*");
        assert!(!e.message.contains("my-plain-secret-here"), "{e}");
        assert!(err(&format!("{good}\n{good}"))
            .message
            .contains("already defined on line 1"));
    }

    #[test]
    fn a_typed_spec_is_told_by_its_own_words() {
        let salt = [7u8; SALT_LEN];
        let secret = "0123456789abcdef0123456789abcdef";
        let e = user_line("ci lock=ci-* bogus", secret, salt).unwrap_err();
        assert!(
            e.starts_with("word 3 of the user and rights given is neither lock="),
            "{e}"
        );
        let e = user_line("ci lock=a,,b", secret, salt).unwrap_err();
        assert!(
            e.starts_with("word 2 of the user and rights given: "),
            "{e}"
        );
        assert!(user_line("ci lock=ci-* read=*", secret, salt).is_ok());
    }

    #[test]
    fn bad_lines_name_the_field_by_position_never_by_its_text() {
        const PASTED: &str = "pasted-secret-0123456789abcdef";
        let hash = Hash::new(SALT, SECRET).to_string();
        let cases = [
            // The secret as the user name, a right in the hash's place.
            (
                format!("user {PASTED} lock=*"),
                "field 3 is not a valid salted hash",
            ),
            // The secret in the hash's place.
            (
                format!("user alice {PASTED} lock=*"),
                "field 3 is not a valid salted hash",
            ),
            // The secret as an extra word.
            (
                format!("user alice {hash} {PASTED}"),
                "field 4 is neither lock=",
            ),
            (
                format!("user alice {hash} lock=* {PASTED}"),
                "field 5 is neither lock=",
            ),
            (
                format!("user alice {hash} lock=a,{PASTED}*x"),
                "field 4: pattern 2 of lock=",
            ),
            (
                format!("user alice {hash} read=* read={PASTED}"),
                "field 5: read= is given twice",
            ),
            (format!("{PASTED} alice {hash}"), "field 1 is not `user`"),
            (
                format!("user {PASTED}\u{7} {hash}"),
                "field 2 (the user name) has control",
            ),
            (
                format!("user {PASTED} {hash}\nuser {PASTED} {hash}"),
                "field 2: that user is already defined on line 1",
            ),
        ];
        for (text, expected) in cases {
            let e = Users::parse(&text, None).expect_err(&text);
            let shown = e.to_string();
            assert!(shown.contains(expected), "{text:?}: {shown}");
            assert!(!shown.contains(PASTED), "{text:?}: {shown}");
        }
    }

    #[test]
    fn permissions_group_may_read_nobody_else_may_write() {
        assert_eq!(Exposure::of_mode(0o100600), Exposure::Private);
        assert_eq!(Exposure::of_mode(0o100640), Exposure::Private);
        assert_eq!(Exposure::of_mode(0o100644), Exposure::ReadableByOthers);
        assert_eq!(Exposure::of_mode(0o100604), Exposure::ReadableByOthers);
        assert_eq!(Exposure::of_mode(0o100660), Exposure::Writable);
        assert_eq!(Exposure::of_mode(0o100602), Exposure::Writable);
        assert_eq!(Exposure::of_mode(0o100666), Exposure::Writable);
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_write_is_refused_at_load() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("lockd-auth-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("users");
        std::fs::write(&file, line("alice", "lock=*")).unwrap();
        for (mode, ok) in [(0o600, true), (0o644, true), (0o620, false), (0o646, false)] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            match load(&file, None) {
                Ok(users) => assert!(ok && users.len() == 1, "{mode:o}"),
                Err(e) => {
                    assert!(!ok, "{mode:o}: {e}");
                    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
                    assert!(
                        e.to_string().contains("group or others may write it"),
                        "{e}"
                    );
                }
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn numbers_survive_a_reload_even_for_a_user_removed_and_added_back() {
        let both = format!("{}\n{}", line("alice", ""), line("bob", ""));
        let first = Users::parse(&both, None).unwrap();
        let alice = first.authenticate("alice", SECRET).unwrap();
        let bob = first.authenticate("bob", SECRET).unwrap();
        let second = Users::parse(&line("bob", ""), Some(&first)).unwrap();
        assert_eq!(second.name(alice), None);
        assert_eq!(second.authenticate("bob", SECRET), Some(bob));
        let third = Users::parse(
            &format!(
                "{}\n{}\n{}",
                line("carol", ""),
                line("alice", ""),
                line("bob", "")
            ),
            Some(&second),
        )
        .unwrap();
        assert_eq!(third.authenticate("alice", SECRET), Some(alice));
        assert_eq!(third.authenticate("bob", SECRET), Some(bob));
        let carol = third.authenticate("carol", SECRET).unwrap();
        assert!(carol != alice && carol != bob && carol != NO_USER);
    }

    #[test]
    fn user_lines_for_the_hash_tool() {
        let l = user_line("alice lock=ci-* read=*", SECRET, SALT).unwrap();
        assert!(l.starts_with("user alice sha256:"));
        assert!(l.ends_with(" lock=ci-* read=*"));
        let users = Users::parse(&l, None).unwrap();
        assert!(users.authenticate("alice", SECRET).is_some());
        assert!(user_line("alice", "short", SALT).is_err());
        assert!(user_line("alice", &"x".repeat(256), SALT).is_err());
        assert!(user_line("alice", "sixteen bytes ok!", SALT).is_err());
        assert!(user_line("", SECRET, SALT).is_err());
        assert!(user_line("alice write=*", SECRET, SALT).is_err());
    }

    #[test]
    fn debug_output_shows_no_hash() {
        let users = Users::parse(&line("alice", "lock=*"), None).unwrap();
        let shown = format!("{users:?}");
        assert!(shown.contains("alice"));
        assert!(!shown.contains(&hex(&SALT)));
    }
}
