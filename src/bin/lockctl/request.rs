//! The LOCK request lockctl sends, built in this one place for `run` and `acquire`, and sent
//! again (the same LOCK, the same id) while what comes back may be mended by trying again.

use std::time::Duration;

use lockd::client::{self, retryable, Client, ClientError, Retry};
use lockd::locks::{Mode, Token};
use lockd::proto::{ErrorCode, Tie};
use tokio::time::{sleep, Instant};

use crate::cli::{ModeArgs, WaitArgs};
use crate::fail::{Failure, SUPERSEDED, UNAVAILABLE};
use crate::holder::{say_conflict, say_if_waiting};
use crate::net::Server;

/// What to ask for, besides the name and id.
#[derive(Clone, Copy, Debug)]
pub struct Terms {
    pub ttl: Option<Duration>,
    /// `None` waits as long as it takes.
    pub wait: Option<Duration>,
    pub tie: Tie,
    pub mode: ModeArgs,
    /// `note=`: for people; `None` (or empty) sends none. `'static` so that the terms stay
    /// `Copy` for every retry: a lockctl sends one note in its life.
    pub note: Option<&'static str>,
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

/// A note as [`Terms`] carry it: kept for the rest of the process.
pub fn static_note(note: Option<String>) -> Option<&'static str> {
    note.filter(|n| !n.is_empty())
        .map(|n| &*Box::leak(n.into_boxed_str()))
}

/// How often a LOCK waiting on one of several front-ends checks that its front-end still
/// reaches the cluster ([`lockd::client::Connector::until_cut_off`]): a STATUS on a
/// connection of its own (the front-end answers from its view; older servers, a CHECK, one
/// etcd read), per waiting lockctl every so often.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long the connection of a LOCK left on a cut-off front-end stays open once the same
/// LOCK was sent through the next one: time for that one to take its place.
const HANDED_OVER: Duration = Duration::from_secs(2);

/// A granted LOCK.
pub struct Granted {
    /// The connection it was granted on (a session lease is bound to it).
    pub client: Client,
    /// One per name, in the order asked (one lease for them all: the first name's token
    /// renews or releases the set).
    pub tokens: Vec<Token>,
    /// When the granted LOCK was sent: the lease began no earlier.
    pub sent: Instant,
}

/// LOCK `names` (one, or a set: all at once, as one lease) as `id` on `terms` (its `wait` is taken from `wait`), trying again what may be
/// mended by trying again ([`retryable`]: `ERR UNAVAILABLE`, `ERR SHUTDOWN`, a lost
/// connection) through the next address each time, with backoff, for the rest of the wait:
/// as long as it takes without -w, each address once with -n. Every try is the same LOCK with
/// the same id, so a LOCK granted although its answer was lost (an `ERR UNAVAILABLE` after the
/// write) gets that grant back, and a waiter whose front-end went away takes its place in the
/// queue back through another one (proto.md). `what` names the request in messages.
///
/// The conflict (-n found it held, -w ran out) is [`Failure::silent`] with the conflict code;
/// a wait spent on front-ends that could not serve it exits [`UNAVAILABLE`], naming the last
/// one and what it said; no address reachable for --connect-timeout exits 3. What is said
/// about a wait (-v) and the probes of a cut-off front-end are about the first name.
pub async fn lock_retrying(
    server: &Server,
    what: &str,
    (names, id): (&[String], &str),
    terms: Terms,
    wait: &WaitArgs,
) -> Result<Granted, Failure> {
    let name = names[0].as_str();
    let mut retry = match wait.server_wait() {
        Some(w) if w.is_zero() => Retry::once(server.addrs().len()),
        w => Retry::within(w),
    };
    let mut client = Some(server.connect().await?);
    // The connection of a LOCK still waiting on a cut-off front-end, kept open for a moment
    // after the same LOCK went to the next one (see below).
    let mut previous: Option<Client> = None;
    let several = server.addrs().len() > 1 && !retry.answers_at_once();
    loop {
        let mut c = match client.take() {
            Some(c) => c,
            None => match server.reconnect_for(&retry).await {
                Ok(c) => c,
                Err(f) => return Err(gave_up_connecting(f, &retry, what, wait)),
            },
        };
        // The rest of the wait (zero for -n, none without -w).
        let terms = Terms {
            wait: retry.left(),
            ..terms
        };
        let sent = Instant::now();
        // With somewhere else to go, a front-end cut off from etcd is not waited on.
        let mut cut_off = false;
        let reply = {
            let asked = say_if_waiting(
                server,
                names,
                id,
                lock_superseding(&mut c, names, id, terms, wait.supersede),
            );
            tokio::pin!(asked);
            loop {
                tokio::select! {
                    r = &mut asked => break r,
                    e = server.until_cut_off(name, PROBE_EVERY), if several => {
                        cut_off = true;
                        break Err(e);
                    }
                    _ = sleep(HANDED_OVER), if previous.is_some() => previous = None,
                }
            }
        };
        match reply {
            Ok(tokens) => {
                return Ok(Granted {
                    client: c,
                    tokens,
                    sent,
                })
            }
            Err(ClientError::Refused(e)) if e.code == ErrorCode::Superseded => {
                return Err(Failure::new(
                    SUPERSEDED,
                    format!("{what}: superseded: {}", e.message),
                ));
            }
            Err(ClientError::Refused(e)) if e.code == ErrorCode::Timeout => {
                if server.verbose {
                    say_conflict(&mut c, names, wait).await;
                    // The server's own answer: who blocks, for how long, with what note.
                    eprintln!("lockctl: {e}");
                }
                return Err(Failure::silent(wait.conflict_exit_code));
            }
            Err(e) if retryable(&e) => {
                let Some(pause) = server.retry_after(&mut retry, what, &e) else {
                    return Err(unavailable(&retry, what, wait));
                };
                // With one address there is nowhere else to go, and an `ERR UNAVAILABLE`
                // leaves the connection open: the same LOCK goes on it again (a new
                // connection could find a session lease granted meanwhile still bound to
                // this one, and be refused). Otherwise it is closed now, so that the server
                // has seen it go by the time the same id comes back.
                //
                // Left because its front-end is cut off, the LOCK still waits there: its
                // connection stays open until the same LOCK, sent through the next front-end,
                // has taken its place in the queue (were it closed first, a front-end that
                // can reach etcd after all would take the place out of the queue before).
                if server.addrs().len() == 1 && e.code() == Some(ErrorCode::Unavailable) {
                    client = Some(c);
                } else if cut_off {
                    previous = Some(c);
                } else {
                    drop(c);
                }
                sleep(pause).await;
            }
            Err(e) => return Err(Failure::request(what, server.addr(), e)),
        }
    }
}

/// The wait (or -n's round) is over and no front-end could serve the LOCK.
fn unavailable(retry: &Retry, what: &str, wait: &WaitArgs) -> Failure {
    let cause = retry.last_cause().unwrap_or("no answer");
    let how = match (wait.nonblock, wait.wait) {
        (true, _) => "no address could answer it (-n tries each once)".to_owned(),
        (false, Some(w)) => format!(
            "lockd was unavailable for the whole wait ({})",
            humantime::format_duration(w)
        ),
        (false, None) => "lockd was unavailable".to_owned(),
    };
    Failure::new(UNAVAILABLE, format!("{what}: {how}: last, {cause}"))
}

/// No connection for the next try: if the wait ran out on the way, after a front-end had
/// already answered, the wait was spent on a lockd that could not serve it
/// ([`UNAVAILABLE`]); a refused login, or nothing reachable for --connect-timeout, is what it
/// is.
fn gave_up_connecting(f: Failure, retry: &Retry, what: &str, wait: &WaitArgs) -> Failure {
    let over = retry.answers_at_once() || retry.left().is_some_and(|l| l.is_zero());
    if f.is_denied() || !over || retry.failures() == 0 {
        return f;
    }
    let mut gave_up = unavailable(retry, what, wait);
    if let (Some(m), Some(why)) = (gave_up.message.as_mut(), f.message) {
        m.push_str(&format!("; then {why}"));
    }
    gave_up
}

/// LOCK of one name, with `supersede` if asked, or of a set (`and=`; never with
/// `supersede`, refused before); returns the fencing tokens, one per name.
pub async fn lock_superseding(
    client: &mut Client,
    names: &[String],
    id: &str,
    terms: Terms,
    supersede: bool,
) -> client::Result<Vec<Token>> {
    if let [name] = names {
        let token = client
            .lock_with(
                name,
                id,
                (terms.ttl, terms.wait),
                terms.tie,
                terms.mode.mode(),
                supersede,
                terms.note,
            )
            .await?;
        return Ok(vec![token]);
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    client
        .lock_set(
            &names,
            id,
            (terms.ttl, terms.wait),
            terms.tie,
            terms.mode.mode(),
            terms.note,
        )
        .await
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
