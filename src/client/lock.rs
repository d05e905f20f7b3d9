//! A LOCK as a program asks for it: its options ([`LockOptions`]), and the same LOCK sent again
//! (same id) through the next address while what comes back may be mended by trying again:
//! `ERR UNAVAILABLE`, `ERR SHUTDOWN`, a lost connection ([`super::retryable`]), within its
//! wait. This is what `lockctl` does with `--server a,b,c` (proto.md, "Cluster mode": a LOCK
//! answered `ERR UNAVAILABLE` may have been granted after all, and the same id again gets that
//! grant back; a waiter whose front-end went away takes its place back through another).
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let live = listener.local_addr()?.to_string();
//! # let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
//! # let stop = tokio_util::sync::CancellationToken::new();
//! # tokio::spawn(lockd::server::run(Default::default(), listener, stop.clone()));
//! use std::time::Duration;
//! use lockd::client::{Addrs, Connector, LockOptions};
//! use lockd::proto::ErrorCode;
//!
//! // The first front-end is down: the LOCK goes to the next one.
//! let addrs = Addrs::new(vec![dead, live]).expect("two addresses");
//! let lockd = Connector::new(addrs, Duration::from_secs(10));
//! let opts = LockOptions::new().ttl(Duration::from_secs(60)).wait(Duration::from_secs(5));
//! let mut locked = lockd.lock("deploy", "web-1", &opts).await?;
//!
//! // Taken: another LOCK that does not wait is refused, and says so in its type.
//! let now = LockOptions::new().wait(Duration::ZERO);
//! let refused = lockd.lock("deploy", "web-2", &now).await.unwrap_err();
//! assert_eq!(refused.code(), Some(ErrorCode::Timeout));
//!
//! locked.client.unlock("deploy", locked.token).await?;
//! # stop.cancel();
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::connect::{ConnectError, Connector};
use super::retry::{retryable, Retry};
use super::{Client, ClientError};
use crate::locks::{Mode, Token};
use crate::proto::{ErrorCode, Tie};

/// How often a LOCK waiting on one of several front-ends asks whether its front-end still
/// reaches the cluster ([`Connector::until_cut_off`]): as `lockctl` does.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long the connection of a LOCK left on a cut-off front-end stays open once the same LOCK
/// went through the next one: time for that one to take its place in the queue first.
const HANDED_OVER: Duration = Duration::from_secs(2);

/// Every option a LOCK has (proto.md, "LOCK"): built with the methods, each one word of the
/// request. The default is the server's: its default ttl, no wait limit, a plain lease, an
/// exclusive hold, no `supersede`, no note.
///
/// ```
/// use std::time::Duration;
/// use lockd::client::LockOptions;
/// use lockd::locks::Mode;
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(30))
///     .wait(Duration::ZERO)
///     .session(Duration::from_secs(5))
///     .limit(3)
///     .supersede()
///     .note("release 1.4.2 by ci job 8812");
/// assert_eq!(opts.mode, Mode::limit(3));
/// assert_eq!(opts.note.as_deref(), Some("release 1.4.2 by ci job 8812"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockOptions {
    /// `ttl=`: the lease's length (`None`: the server's default).
    pub ttl: Option<Duration>,
    /// `wait=`: how long to wait in the queue (`None`: as long as it takes; zero: not at all).
    /// The resends of [`Connector::lock`] share it.
    pub wait: Option<Duration>,
    /// `session`, `session=<grace>`, `detach`, or none of them.
    pub tie: Tie,
    /// `shared`, `limit=<n>`, or exclusive.
    pub mode: Mode,
    /// `supersede`: newest wins. A LOCK that must wait takes the whole queue: every request
    /// waiting on the name is answered `ERR SUPERSEDED` ([`ErrorCode::Superseded`]), and this
    /// one waits at its head (proto.md, "Newest-wins queues").
    pub supersede: bool,
    /// `note=`: a short note for people, shown with the holder by `STATUS` (decoded, in
    /// [`crate::proto::StatusLine`]'s `note`), `STATUS <name> detail`, `WATCH`'s `acquired`
    /// events and a refused LOCK. Sent as it is, the LOCK's last word (it takes the rest of the
    /// line); printable UTF-8, at most the server's `--max-note` bytes (256 by default), else
    /// `ERR BADARG`. `None` or empty: no note (a repeat LOCK by the holder keeps its note).
    pub note: Option<String>,
    /// `and=`: the further names of a set (proto.md, "Several names at once"), taken with the
    /// LOCK's own name all at once, as one lease: RENEW, CHECK or UNLOCK of any one of them
    /// with its token applies to every one. Empty: the one name. Not with `supersede`.
    pub and: Vec<String>,
}

impl LockOptions {
    /// The server's defaults (see [`LockOptions`]).
    pub fn new() -> LockOptions {
        LockOptions::default()
    }

    /// `ttl=`.
    pub fn ttl(mut self, ttl: Duration) -> LockOptions {
        self.ttl = Some(ttl);
        self
    }

    /// `wait=`: zero answers `ERR TIMEOUT` at once when the lock is taken.
    pub fn wait(mut self, wait: Duration) -> LockOptions {
        self.wait = Some(wait);
        self
    }

    /// `session=<grace>`: the lease also ends `grace` after the server sees this connection
    /// close (zero: `session`, at once).
    pub fn session(mut self, grace: Duration) -> LockOptions {
        self.tie = Tie::Session(grace);
        self
    }

    /// `detach`: the lease outlives its connection (the default of a plain LOCK on most
    /// servers; explicit here).
    pub fn detach(mut self) -> LockOptions {
        self.tie = Tie::Detach;
        self
    }

    /// `shared`: a reader among readers.
    pub fn shared(mut self) -> LockOptions {
        self.mode = Mode::Shared;
        self
    }

    /// `limit=<n>`: one of `n` slots (a semaphore; 1 is exclusive).
    pub fn limit(mut self, n: u32) -> LockOptions {
        self.mode = Mode::limit(n);
        self
    }

    /// `supersede`: newest wins; if this LOCK must wait, those waiting are answered
    /// `ERR SUPERSEDED` and it waits alone, at the head of the queue (see
    /// [`LockOptions::supersede`](LockOptions#structfield.supersede)).
    pub fn supersede(mut self) -> LockOptions {
        self.supersede = true;
        self
    }

    /// `note=<text>`: a note for people, kept with the holder (see
    /// [`LockOptions::note`](LockOptions#structfield.note)); an empty one is none.
    pub fn note(mut self, note: impl Into<String>) -> LockOptions {
        self.note = Some(note.into());
        self
    }

    /// `and=<name>`: one more name of a set, taken with the others all at once (see
    /// [`LockOptions::and`](LockOptions#structfield.and)); the reply has a token per name,
    /// in [`Locked::tokens`].
    pub fn and(mut self, name: impl Into<String>) -> LockOptions {
        self.and.push(name.into());
        self
    }
}

/// Why a LOCK (or a held lock, [`super::hold()`]) did not work out. Each kind is its own
/// variant, and a refusal carries the server's code: a caller tells `TIMEOUT` from `NOTHELD`
/// from `UNAVAILABLE` with [`LockError::code`], never by the text.
#[derive(Debug)]
pub enum LockError {
    /// No address could be reached, TLS failed, or the login was refused.
    Connect(ConnectError),
    /// The server refused (`ERR <code>`), or the reply made no sense.
    Request(ClientError),
    /// The wait ran out (with a zero wait: each address was tried once) and no try found a
    /// front-end that could serve the LOCK: each answered `ERR UNAVAILABLE` or `ERR SHUTDOWN`
    /// or lost the connection. The text is the last of those answers (and, when the next
    /// address could not be reached after it, why). [`LockError::code`] is `UNAVAILABLE`.
    Unavailable(String),
    /// [`super::hold()`]: the lease was lost while held (a refused renewal, or none that got
    /// through in time); the block was stopped. The text says why.
    Lost(String),
}

impl LockError {
    /// The server's `ERR` code, if the server refused.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            LockError::Request(e) => e.code(),
            LockError::Unavailable(_) => Some(ErrorCode::Unavailable),
            _ => None,
        }
    }

    /// Whether a held lock's lease was lost.
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost(_))
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Connect(e) => write!(f, "{e}"),
            LockError::Request(e) => write!(f, "{e}"),
            LockError::Unavailable(last) => {
                write!(
                    f,
                    "no front-end could serve the LOCK within its wait: last, {last}"
                )
            }
            LockError::Lost(why) => write!(f, "lease lost: {why}"),
        }
    }
}

impl std::error::Error for LockError {}

impl From<ClientError> for LockError {
    fn from(e: ClientError) -> LockError {
        LockError::Request(e)
    }
}

impl From<ConnectError> for LockError {
    fn from(e: ConnectError) -> LockError {
        LockError::Connect(e)
    }
}

/// A granted LOCK.
pub struct Locked {
    /// The connection it was granted on: a session lease ends with it (and its grace).
    pub client: Client,
    /// The fencing token (of a set: its first name's, which renews or releases the set).
    pub token: Token,
    /// Every name's token: the LOCK's own name first, then [`LockOptions::and`]'s in order.
    /// One for a single name. A client fences each resource with the token given for its name
    /// and assumes nothing about how they compare.
    pub tokens: Vec<Token>,
    /// When the LOCK that was granted was sent: the lease began no earlier.
    pub sent: Instant,
}

impl fmt::Debug for Locked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locked")
            .field("token", &self.token)
            .field("tokens", &self.tokens)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

/// The longest pause between connection attempts of a LOCK that waits without bound, while
/// no address answers (a lockd restarting): it is back within this long of answering again.
const MAX_UNBOUND_PAUSE: Duration = Duration::from_secs(2);

impl Connector {
    /// LOCK `name` as `id` on a connection of its own, sent again through the next address
    /// while the answer may be mended by trying again (see the module), always as `id` (so
    /// that lockd answers a resend with the grant it may have made already; two holders must
    /// not share an id: [`default_id`](super::default_id) makes a new one), within `opts.wait`:
    /// as long as it takes without one, each address once with zero. `ERR TIMEOUT` and every
    /// other refusal end it at once ([`LockError::code`] tells which).
    pub async fn lock(
        &self,
        name: &str,
        id: &str,
        opts: &LockOptions,
    ) -> Result<Locked, LockError> {
        self.lock_resending(None, name, id, opts).await
    }

    /// [`Connector::lock`], its first try on `client` (a connection of this connector).
    pub async fn lock_on(
        &self,
        client: Client,
        name: &str,
        id: &str,
        opts: &LockOptions,
    ) -> Result<Locked, LockError> {
        self.lock_resending(Some(client), name, id, opts).await
    }

    async fn lock_resending(
        &self,
        first: Option<Client>,
        name: &str,
        id: &str,
        opts: &LockOptions,
    ) -> Result<Locked, LockError> {
        let mut retry = match opts.wait {
            Some(w) if w.is_zero() => Retry::once(self.addrs().len()),
            w => Retry::within(w),
        };
        let names: Vec<&str> = std::iter::once(name)
            .chain(opts.and.iter().map(String::as_str))
            .collect();
        let what = format!("lock {}", names.join(" "));
        let mut client = match first {
            Some(c) => Some(c),
            None => Some(self.connect().await?),
        };
        // A LOCK still waiting on a cut-off front-end, kept open a moment after the same LOCK
        // went to the next one.
        let mut previous: Option<Client> = None;
        let several = self.addrs().len() > 1 && !retry.answers_at_once();
        loop {
            let mut c = match client.take() {
                Some(c) => c,
                None => match self.reconnect_for(&retry).await {
                    Ok(c) => c,
                    // The wait ran out on the way after a front-end had answered: what it
                    // answered is the reason, not the connect.
                    Err(ConnectError::Unreachable(why))
                        if retry.ran_out() && retry.failures() > 0 =>
                    {
                        return Err(gave_up(&retry, Some(why)))
                    }
                    // A LOCK that waits without bound waits through a restart of lockd,
                    // however long it takes, as it waits through a long queue.
                    Err(ConnectError::Unreachable(why)) if retry.deadline().is_none() => {
                        let pause = retry.failed(why.clone()).unwrap_or(MAX_UNBOUND_PAUSE);
                        let pause = pause.min(MAX_UNBOUND_PAUSE);
                        self.note(|| {
                            format!(
                                "{what}: {why}; trying again in {}",
                                humantime::format_duration(pause)
                            )
                        });
                        sleep(pause).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            // The rest of the wait (zero for a round, none without a wait).
            let wait = retry.left();
            let sent = Instant::now();
            let mut cut_off = false;
            let reply = {
                let asked = async {
                    if names.len() == 1 {
                        let token = c
                            .lock_with(
                                name,
                                id,
                                (opts.ttl, wait),
                                opts.tie,
                                opts.mode,
                                opts.supersede,
                                opts.note.as_deref(),
                            )
                            .await?;
                        return Ok(vec![token]);
                    }
                    if opts.supersede {
                        // Refused here as the server would (ERR SYNTAX), and nothing is sent.
                        return Err(ClientError::Refused(crate::proto::ProtoError::new(
                            ErrorCode::Syntax,
                            "supersede takes one name; not with and=",
                        )));
                    }
                    c.lock_set(
                        &names,
                        id,
                        (opts.ttl, wait),
                        opts.tie,
                        opts.mode,
                        opts.note.as_deref(),
                    )
                    .await
                };
                tokio::pin!(asked);
                loop {
                    tokio::select! {
                        r = &mut asked => break r,
                        e = self.until_cut_off(name, PROBE_EVERY), if several => {
                            cut_off = true;
                            break Err(e);
                        }
                        _ = sleep(HANDED_OVER), if previous.is_some() => previous = None,
                    }
                }
            };
            match reply {
                Ok(tokens) => {
                    return Ok(Locked {
                        client: c,
                        token: tokens[0],
                        tokens,
                        sent,
                    })
                }
                Err(e) if retryable(&e) => {
                    let Some(pause) = self.retry_after(&mut retry, &what, &e) else {
                        return Err(gave_up(&retry, None));
                    };
                    // One address and `ERR UNAVAILABLE`: the connection is still good, and a
                    // new one could find a session lease granted meanwhile bound to this one.
                    // Otherwise it goes now, so the server has seen it go when the same id
                    // comes back; unless its front-end is cut off, where the LOCK still waits
                    // until the next front-end has taken its place.
                    if self.addrs().len() == 1 && e.code() == Some(ErrorCode::Unavailable) {
                        client = Some(c);
                    } else if cut_off {
                        previous = Some(c);
                    } else {
                        drop(c);
                    }
                    sleep(pause).await;
                }
                Err(e) => return Err(LockError::Request(e)),
            }
        }
    }
}

/// The wait is over and no front-end could serve the LOCK: the last answer (and what came
/// after it).
fn gave_up(retry: &Retry, then: Option<String>) -> LockError {
    let mut last = retry.last_cause().unwrap_or("no answer").to_owned();
    if let Some(then) = then {
        last.push_str(&format!("; then {then}"));
    }
    LockError::Unavailable(last)
}
