//! The LOCK request lockctl sends, built in this one place for `run` and `acquire`: the
//! library's [`Connector::lock`](lockd::client::Connector::lock) sends it again (the same
//! LOCK, the same id) while what comes back may be mended by trying again; lockctl adds what
//! it says with -v and its exit codes.

use std::time::Duration;

use lockd::client::{ClientError, LockError, LockOptions, Locked};
use lockd::locks::Mode;
use lockd::proto::{ErrorCode, Tie};

use crate::cli::{ModeArgs, WaitArgs};
use crate::fail::{Failure, LOST, SUPERSEDED, UNAVAILABLE};
use crate::holder::{say_conflict, say_if_waiting};
use crate::net::Server;

/// What to ask for, besides the name and id.
#[derive(Clone, Debug)]
pub struct Terms {
    pub ttl: Option<Duration>,
    pub tie: Tie,
    pub mode: ModeArgs,
    /// `note=`: for people; `None` (or empty) sends none.
    pub note: Option<String>,
}

/// The longest note lockctl makes up itself (`run`'s command line): the server's default
/// --max-note.
pub const DEFAULT_NOTE_MAX: usize = 256;

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn cut_note(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// LOCK `names` (one, or a set: all at once, as one lease) as `id` on `terms`, its wait and
/// `supersede` from `wait`, through [`Connector::lock`]: what may be mended by trying again
/// (`ERR UNAVAILABLE`, `ERR SHUTDOWN`, a lost connection) is tried again through the next
/// address, with backoff, for the rest of the wait: as long as it takes without -w, each
/// address once with -n. `what` names the request in messages.
///
/// The conflict (-n found it held, -w ran out) is [`Failure::silent`] with the conflict code;
/// a wait spent on front-ends that could not serve it exits [`UNAVAILABLE`], naming the last
/// one and what it said; no address reachable for --connect-timeout exits 3. What is said
/// about a wait (-v) is about the first name held by someone else.
pub async fn lock_retrying(
    server: &Server,
    what: &str,
    (names, id): (&[String], &str),
    terms: Terms,
    wait: &WaitArgs,
) -> Result<Locked, Failure> {
    let opts = LockOptions {
        ttl: terms.ttl,
        wait: wait.server_wait(),
        tie: terms.tie,
        mode: terms.mode.mode(),
        supersede: wait.supersede,
        note: terms.note.filter(|n| !n.is_empty()),
        and: names[1..].to_vec(),
    };
    let asked = server.connector().lock(&names[0], id, &opts);
    match say_if_waiting(server, names, id, asked).await {
        Ok(locked) => Ok(locked),
        Err(e) => Err(failure(server, what, names, wait, e).await),
    }
}

/// What lockctl says of, and how it exits on, a LOCK that was not granted.
async fn failure(
    server: &Server,
    what: &str,
    names: &[String],
    wait: &WaitArgs,
    e: LockError,
) -> Failure {
    match e {
        LockError::Request(ClientError::Refused(e)) if e.code == ErrorCode::Superseded => {
            Failure::new(SUPERSEDED, format!("{what}: superseded: {}", e.message))
        }
        LockError::Request(ClientError::Refused(e)) if e.code == ErrorCode::Timeout => {
            if server.verbose {
                say_conflict(server, names, wait).await;
                // The server's own answer, in words: who blocks, for how long, with what note.
                eprintln!("lockctl: {}", crate::out::blocked_by_words(&e.message));
            }
            Failure::silent(wait.conflict_exit_code)
        }
        // Held in another mode (or by this id's session elsewhere): not available now, as a
        // held name is (exit 1 with -n, so cron does not mail a usage error), with the reason.
        LockError::Request(ClientError::Refused(e)) if e.code == ErrorCode::Conflict => {
            Failure::new(
                wait.conflict_exit_code,
                format!("{what}: not available now: {}", e.message),
            )
        }
        LockError::Unavailable(last) => {
            let how = match (wait.nonblock, wait.wait) {
                (true, _) => "no address could answer it (-n tries each once)".to_owned(),
                (false, Some(w)) => format!(
                    "lockd was unavailable for the whole wait ({})",
                    humantime::format_duration(w)
                ),
                (false, None) => "lockd was unavailable".to_owned(),
            };
            Failure::new(UNAVAILABLE, format!("{what}: {how}: last, {last}"))
        }
        LockError::Connect(e) => crate::net::failure(e),
        LockError::Request(e) => Failure::request(what, server.addr(), e),
        // Only a held lock is lost; a LOCK is granted or not.
        LockError::Lost(why) => Failure::new(LOST, format!("{what}: {why}")),
    }
}

impl ModeArgs {
    /// The mode the flags ask for (`--limit 1` is an exclusive hold).
    pub fn mode(&self) -> Mode {
        match (self.shared, self.limit) {
            (true, _) => Mode::Shared,
            (false, Some(n)) => Mode::limit(n),
            (false, None) => Mode::Exclusive,
        }
    }

    /// For -v: `exclusive`, `shared`, `one of 3 slots`.
    pub fn describe(&self) -> String {
        match self.mode() {
            Mode::Limit(n) => format!("one of {n} slots"),
            m => m.to_string(),
        }
    }
}
