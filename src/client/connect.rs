//! Reaching lockd: one address, or several (the front-ends of one lockd cluster) tried in
//! turn; a bounded retry with backoff, or a single round; over TLS ([`super::tls`]) and logged
//! in ([`super::auth`]) when asked for. What it has to say along the way (which address it
//! tries next, that it retries) goes to a [`Notes`] callback, so a program decides whether and
//! how it is shown.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

use super::auth::{Credentials, LoggedIn};
use super::retry::Retry;
use super::tls::Tls;
use super::{Client, ClientError};
use crate::proto::{ErrorCode, ProtoError};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
const TIMED_OUT: &str = "connection attempt timed out";
/// The least time [`Connector::reconnect_for`] gives a connection, even at the very end of a
/// wait.
const MIN_TRY: Duration = Duration::from_millis(200);

/// The addresses of one lockd: one `host:port`, or several, each a front-end of the same
/// lockd cluster, so that any of them can serve any request and knows every token. Never
/// empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addrs(Vec<String>);

impl Addrs {
    /// `None` for an empty list: there is always an address to try.
    pub fn new(list: Vec<String>) -> Option<Addrs> {
        (!list.is_empty()).then_some(Addrs(list))
    }

    /// A lockd with one address: the common case.
    pub fn one(addr: String) -> Addrs {
        Addrs(vec![addr])
    }

    /// How many addresses (at least one): with one, there is no failover to tell of.
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `i`th address, counting round the list.
    pub fn get(&self, i: usize) -> &str {
        &self.0[i % self.0.len()]
    }
}

/// As given: comma-separated, the form `LOCKD_ADDR` hands on to other clients.
impl fmt::Display for Addrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// Where a connection's progress is told, one line at a time (`lockctl -v` prints them).
pub type Notes = Arc<dyn Fn(&str) + Send + Sync>;

/// Why no connection came of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectError {
    /// No address answered (each named with its error), or TLS failed: see the message.
    Unreachable(String),
    /// lockd refused to log this client in: trying again would be refused alike.
    Denied(String),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Unreachable(why) | ConnectError::Denied(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ConnectError {}

/// Why one attempt at one address failed (TCP, TLS or, after them, the login).
pub(crate) enum Refusal {
    /// The network failed before TLS could say anything: worth another try.
    Retry(String),
    /// TLS itself failed; the same attempt will fail the same way.
    Final(String),
    /// lockd refused to log this client in: final.
    Denied(String),
}

/// How a round over the addresses ended without a connection.
enum Unreached {
    /// Every address failed in a way another try may mend: each with its error.
    Retry(Vec<(String, String)>),
    /// TLS or the login failed: trying again (or elsewhere) would fail the same way.
    Final(ConnectError),
}

/// Opens connections to one lockd, with failover between its addresses. Cheap to clone; the
/// clones share which address the latest connection went to.
#[derive(Clone)]
pub struct Connector {
    addrs: Addrs,
    /// Which of `addrs` the latest connection went to (the first before any): messages name
    /// it, and a reconnect after a failure starts at the one after it, so that a front-end
    /// that just went away is tried last rather than first.
    current: Arc<AtomicUsize>,
    connect_timeout: Duration,
    tls: Option<Tls>,
    auth: Option<Credentials>,
    notes: Option<Notes>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("addrs", &self.addrs)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Plain TCP, no login, nothing told; [`Connector::connect`] keeps trying for
    /// `connect_timeout`.
    pub fn new(addrs: Addrs, connect_timeout: Duration) -> Connector {
        Connector {
            addrs,
            current: Arc::new(AtomicUsize::new(0)),
            connect_timeout,
            tls: None,
            auth: None,
            notes: None,
        }
    }

    /// Every connection over TLS.
    pub fn tls(mut self, tls: Option<Tls>) -> Connector {
        self.tls = tls;
        self
    }

    /// Every connection starts with AUTH as this user.
    pub fn auth(mut self, auth: Option<Credentials>) -> Connector {
        self.auth = auth;
        self
    }

    /// Progress is told to `notes`.
    pub fn notes(mut self, notes: Option<Notes>) -> Connector {
        self.notes = notes;
        self
    }

    /// The addresses, as given (to hand on, as `LOCKD_ADDR`).
    pub fn addrs(&self) -> &Addrs {
        &self.addrs
    }

    /// How long [`Connector::connect`] keeps trying: callers bound their own retries by it.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The address of the latest connection (the first address before any): the one that
    /// messages about the connection name.
    pub fn addr(&self) -> &str {
        self.addrs.get(self.current.load(Ordering::Relaxed))
    }

    /// The address after the current one: where a reconnect starts (the same one when there
    /// is only one).
    pub fn next_addr(&self) -> &str {
        self.addrs.get(self.next())
    }

    /// The index of the address after the current one: where a reconnect starts.
    fn next(&self) -> usize {
        self.current.load(Ordering::Relaxed) + 1
    }

    pub(super) fn note(&self, text: impl FnOnce() -> String) {
        if let Some(notes) = &self.notes {
            notes(&text());
        }
    }

    /// Connects, trying the addresses in turn from the first, and again round them with
    /// backoff for up to the connect timeout (a server being restarted, a network blip at
    /// boot); then gives up naming every address. A TLS failure (an untrusted certificate, a
    /// refused client certificate, a plain port) or a refused login ends it at once: trying
    /// again would fail the same way.
    pub async fn connect(&self) -> Result<Client, ConnectError> {
        self.patient(0, self.connect_timeout).await
    }

    /// [`Connector::connect`] after the connection was lost: from the address after the one
    /// it went to, which is tried last.
    pub async fn reconnect(&self) -> Result<Client, ConnectError> {
        self.patient(self.next(), self.connect_timeout).await
    }

    /// The connection for the next try of `retry`, after a try failed: from the address after
    /// the current one (the one that failed is tried last), for up to the connect timeout but
    /// not past the end of `retry`'s wait (though never for less than 200 ms, so that the
    /// last try still gets a fair chance); a single round when `retry` answers at once.
    pub async fn reconnect_for(&self, retry: &Retry) -> Result<Client, ConnectError> {
        if retry.answers_at_once() {
            return self.reconnect_once(self.connect_timeout).await;
        }
        let limit = match retry.left() {
            Some(left) => left.max(MIN_TRY).min(self.connect_timeout),
            None => self.connect_timeout,
        };
        self.patient(self.next(), limit).await
    }

    /// A request on the current connection failed with `e` (one that [`super::retryable`]
    /// allows): records it in `retry` as `lockd at <addr> answered ERR ...`, tells it (which
    /// address comes next, and when) and returns the pause before the next try, or `None` when
    /// `retry` is over. `what` names the request for the note (`lock deploy`).
    pub fn retry_after(&self, retry: &mut Retry, what: &str, e: &ClientError) -> Option<Duration> {
        let cause = format!("lockd at {} {}", self.addr(), said(e));
        let pause = retry.failed(cause.clone());
        match pause {
            Some(p) => self.note(|| {
                format!(
                    "{what}: {cause}; trying {} in {}",
                    self.addrs.get(self.next()),
                    humantime::format_duration(round_ms(p))
                )
            }),
            None => self.note(|| format!("{what}: {cause}; giving up")),
        }
        pause
    }

    /// One round over the addresses from the current one, bounded by `limit`.
    pub async fn connect_once(&self, limit: Duration) -> Result<Client, ConnectError> {
        let start = self.current.load(Ordering::Relaxed);
        self.once(start, limit).await
    }

    /// [`Connector::connect_once`] after the connection was lost: from the address after the
    /// one it went to.
    pub async fn reconnect_once(&self, limit: Duration) -> Result<Client, ConnectError> {
        self.once(self.next(), limit).await
    }

    /// Whether the front-end of the latest connection can still serve the LOCK waiting on it,
    /// asked on a connection of its own every `every`; resolves only when it can't. A cluster
    /// front-end cut off from etcd tells its waiters `ERR UNAVAILABLE` only once the cut has
    /// outlasted its etcd lease, and one that is merely stuck never does, so a client with
    /// other front-ends would wait there in vain. The question is `STATUS <name>`: a cluster
    /// front-end ends it with how old its view is, and one past its readiness bound has not
    /// heard from an etcd quorum (no etcd read is spent on the question). An older server says
    /// no age: then a CHECK of the lock's holder, which a front-end answers from etcd itself,
    /// or `ERR UNAVAILABLE` within its `--etcd-request-timeout`. A stale view, that answer, or
    /// no answer within `every`, is what this resolves to; a front-end that can't be reached
    /// for the question, or any other answer, says nothing.
    pub async fn until_cut_off(&self, name: &str, every: Duration) -> ClientError {
        loop {
            sleep(every).await;
            if let Some(e) = self.cut_off(name, every).await {
                return e;
            }
        }
    }

    async fn cut_off(&self, name: &str, limit: Duration) -> Option<ClientError> {
        let addr = self.addr().to_owned();
        let started = Instant::now();
        let mut client = self.attempt(&addr, limit).await.ok()?;
        let left = limit.saturating_sub(started.elapsed());
        let asked = timeout(left, async {
            let (status, aged) = client.lock_status_aged(name).await?;
            match (aged, status.held()) {
                // A cluster front-end says how old its view is: past its readiness bound it
                // has not heard from an etcd quorum, and the LOCK waiting there is stuck.
                (Some(aged), _) if aged.stale() => Err(ClientError::Refused(ProtoError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "this front-end has not heard from etcd for {:.1}s",
                        aged.age.as_secs_f64()
                    ),
                ))),
                (Some(_), _) | (None, None) => Ok(()),
                // An older server: a CHECK reads etcd itself.
                (None, Some(held)) => client.check(name, held.token).await.map(|_| ()),
            }
        })
        .await;
        match asked {
            Err(_) => Some(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer to a CHECK within {} while the LOCK waited there",
                    humantime::format_duration(limit)
                ),
            ))),
            Ok(Err(ClientError::Refused(e))) if e.code == ErrorCode::Unavailable => {
                Some(ClientError::Refused(e))
            }
            Ok(_) => None,
        }
    }

    async fn patient(&self, start: usize, limit: Duration) -> Result<Client, ConnectError> {
        let give_up = Instant::now() + limit;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let failed = match self.round(start, give_up).await {
                Ok(client) => {
                    match &self.auth {
                        Some(auth) => self.note(|| {
                            format!("connected to lockd at {} as {}", self.addr(), auth.user())
                        }),
                        // With one address there is nothing to tell.
                        None if self.addrs.len() > 1 => {
                            self.note(|| format!("connected to lockd at {}", self.addr()))
                        }
                        None => {}
                    }
                    return Ok(client);
                }
                Err(Unreached::Final(e)) => return Err(e),
                Err(Unreached::Retry(failed)) => failed,
            };
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConnectError::Unreachable(format!(
                    "{} (tried for {})",
                    unreachable(&failed),
                    humantime::format_duration(limit)
                )));
            }
            if let Some((addr, error)) = failed.last() {
                self.note(|| format!("cannot reach lockd at {addr}: {error}; retrying"));
            }
            sleep(backoff.min(left)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn once(&self, start: usize, limit: Duration) -> Result<Client, ConnectError> {
        match self.round(start, Instant::now() + limit).await {
            Ok(client) => Ok(client),
            Err(Unreached::Final(e)) => Err(e),
            // One address: its error alone, as it has always been said.
            Err(Unreached::Retry(failed)) if failed.len() == 1 => Err(ConnectError::Unreachable(
                failed.into_iter().map(|(_, e)| e).collect::<String>(),
            )),
            Err(Unreached::Retry(failed)) => Err(ConnectError::Unreachable(unreachable(&failed))),
        }
    }

    /// Tries each address once, from the `start`th on (round the list), until `until`; the
    /// first that answers is the one. Each attempt gets an equal share of the time left, so
    /// that an address that does not answer at all (its packets dropped) cannot use up the
    /// time of those after it; one that refuses at once leaves its share to them.
    async fn round(&self, start: usize, until: Instant) -> Result<Client, Unreached> {
        let n = self.addrs.len();
        let mut failed = Vec::new();
        for k in 0..n {
            let i = (start + k) % n;
            let addr = self.addrs.get(i);
            let left = until.saturating_duration_since(Instant::now());
            let share = left / u32::try_from(n - k).unwrap_or(u32::MAX);
            match self.attempt(addr, share).await {
                Ok(client) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(client);
                }
                Err(Refusal::Denied(why)) => {
                    return Err(Unreached::Final(ConnectError::Denied(why)))
                }
                Err(Refusal::Final(why)) => {
                    return Err(Unreached::Final(ConnectError::Unreachable(why)))
                }
                Err(Refusal::Retry(why)) => {
                    if k + 1 < n {
                        self.note(|| {
                            format!(
                                "cannot reach lockd at {addr}: {why}; trying {}",
                                self.addrs.get(i + 1)
                            )
                        });
                    }
                    failed.push((addr.to_owned(), why));
                }
            }
        }
        Err(Unreached::Retry(failed))
    }

    /// One connection attempt to `addr`, bounded by `limit`: TCP, then TLS if asked for, then
    /// AUTH if a user is given.
    async fn attempt(&self, addr: &str, limit: Duration) -> Result<Client, Refusal> {
        let started = Instant::now();
        let mut client = self.open(addr, limit).await?;
        if let Some(auth) = &self.auth {
            let left = limit.saturating_sub(started.elapsed());
            if auth.login(&mut client, addr, left).await? == LoggedIn::AuthOff {
                // Every connection may do everything there: nothing to log in to.
                self.note(|| {
                    format!(
                        "lockd at {addr} has authentication off; --user {} is not needed",
                        auth.user()
                    )
                });
            }
        }
        Ok(client)
    }

    /// A connection to `addr`, over TLS if asked for (its certificate checked against the
    /// host of `addr`), within `limit`.
    async fn open(&self, addr: &str, limit: Duration) -> Result<Client, Refusal> {
        let Some(tls) = &self.tls else {
            return match timeout(limit, Client::connect(addr)).await {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(ClientError::Io(e))) => Err(Refusal::Retry(e.to_string())),
                Ok(Err(e)) => Err(Refusal::Retry(e.to_string())),
                Err(_) => Err(Refusal::Retry(TIMED_OUT.into())),
            };
        };
        let started = Instant::now();
        let stream = match timeout(limit, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(Refusal::Retry(e.to_string())),
            Err(_) => return Err(Refusal::Retry(TIMED_OUT.into())),
        };
        tls.open(addr, stream, limit.saturating_sub(started.elapsed()))
            .await
    }
}

/// What the server did, after `lockd at <addr>`: `answered ERR UNAVAILABLE ...`, `closed the
/// connection`.
fn said(e: &ClientError) -> String {
    match e {
        ClientError::Refused(e) => format!("answered ERR {} {}", e.code, e.message),
        ClientError::Closed => "closed the connection".into(),
        ClientError::Io(e) => format!("failed: {e}"),
        ClientError::Unexpected(line) => format!("answered {line:?}"),
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `cannot reach lockd at a:1: <error>`, and `; nor at b:1: <error>` for every other address
/// tried: each address with the error it gave.
fn unreachable(failed: &[(String, String)]) -> String {
    let mut text = String::from("cannot reach lockd");
    for (k, (addr, error)) in failed.iter().enumerate() {
        let sep = if k == 0 { " at" } else { "; nor at" };
        text.push_str(&format!("{sep} {addr}: {error}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{unreachable, Addrs};

    #[test]
    fn every_address_is_named_with_its_error() {
        let one = [("a:1".to_owned(), "refused".to_owned())];
        assert_eq!(unreachable(&one), "cannot reach lockd at a:1: refused");
        let two = [
            ("a:1".to_owned(), "refused".to_owned()),
            ("b:2".to_owned(), "timed out".to_owned()),
        ];
        assert_eq!(
            unreachable(&two),
            "cannot reach lockd at a:1: refused; nor at b:2: timed out"
        );
    }

    #[test]
    fn addresses_count_round_the_list_and_print_as_given() {
        let addrs = Addrs::new(vec!["a:1".into(), "b:2".into()]).expect("two");
        assert_eq!(addrs.get(1), "b:2");
        assert_eq!(addrs.get(2), "a:1");
        assert_eq!(addrs.to_string(), "a:1,b:2");
        assert_eq!(Addrs::new(Vec::new()), None);
    }
}
