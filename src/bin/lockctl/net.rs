//! Reaching the server: one address, or several (the front-ends of one lockd cluster) tried in
//! turn; a bounded retry with backoff at start, single rounds later; over TLS when asked for
//! ([`crate::tls`]), and logged in as --user when given ([`crate::auth`]).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockd::client::{Client, ClientError};
use lockd::proto::ErrorCode;
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

use crate::auth::Credentials;
use crate::fail::{Failure, UNREACHABLE};
use crate::tls::{Refusal, Tls};

/// --connect-timeout of the commands that wait anyway (run, acquire, watch): patient enough
/// to ride out a server restart or a network blip at boot.
pub const PATIENT_CONNECT: Duration = Duration::from_secs(10);
/// --connect-timeout of the one-shot commands (status, release, renew, acquire -n): a script
/// that asks a question learns at once that the server is down.
pub const ONE_SHOT_CONNECT: Duration = Duration::from_secs(2);

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The addresses of --server (LOCKD_ADDR): one `host:port`, or several, comma-separated, each
/// a front-end of the same lockd cluster, so that any of them can serve any request and knows
/// every token. Never empty; each one checked by the flag's parser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addrs(Vec<String>);

impl Addrs {
    /// `None` for an empty list: there is always an address to try.
    pub fn new(list: Vec<String>) -> Option<Addrs> {
        (!list.is_empty()).then_some(Addrs(list))
    }

    pub fn one(addr: String) -> Addrs {
        Addrs(vec![addr])
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `i`th address, counting round the list.
    fn get(&self, i: usize) -> &str {
        &self.0[i % self.0.len()]
    }
}

/// As given: comma-separated, so that it can be handed on as LOCKD_ADDR.
impl fmt::Display for Addrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// Where the server is and how patient to be with it.
#[derive(Clone, Debug)]
pub struct Server {
    pub addrs: Addrs,
    /// Which of `addrs` the latest connection went to (the first before any): messages name
    /// it, and a reconnect after a failure starts at the one after it, so that a front-end
    /// that just went away is tried last rather than first. Shared by every clone: the
    /// keeper's reconnects move it for the rest of lockctl too.
    current: Arc<AtomicUsize>,
    pub connect_timeout: Duration,
    pub verbose: bool,
    /// TLS for every connection, if asked for.
    pub tls: Option<Tls>,
    /// Who every connection logs in as, if anyone.
    pub auth: Option<Credentials>,
}

/// How a round over the addresses ended without a connection.
enum Unreached {
    /// Every address failed in a way another try may mend: each with its error.
    Retry(Vec<(String, String)>),
    /// TLS or the login failed: trying again (or elsewhere) would fail the same way.
    Final(Failure),
}

impl Server {
    pub fn new(
        addrs: Addrs,
        connect_timeout: Duration,
        verbose: bool,
        tls: Option<Tls>,
        auth: Option<Credentials>,
    ) -> Server {
        Server {
            addrs,
            current: Arc::new(AtomicUsize::new(0)),
            connect_timeout,
            verbose,
            tls,
            auth,
        }
    }

    /// The address of the latest connection (the first address before any): the one that
    /// messages about the connection name.
    pub fn addr(&self) -> &str {
        self.addrs.get(self.current.load(Ordering::Relaxed))
    }

    /// The index of the address after the current one: where a reconnect starts.
    fn next(&self) -> usize {
        self.current.load(Ordering::Relaxed) + 1
    }

    /// Connects, trying the addresses in turn from the first, and again round them with
    /// backoff for up to `connect_timeout` (a server being restarted, a network blip at boot);
    /// then gives up with exit code 3 naming every address. A TLS failure (an untrusted
    /// certificate, a refused client certificate, a plain port) ends it at once, also with 3:
    /// trying again would fail the same way. A refused login ends it at once with 2.
    pub async fn connect(&self) -> Result<Client, Failure> {
        self.patient(0).await
    }

    /// [`Server::connect`] after the connection was lost: from the address after the one it
    /// went to, which is tried last.
    pub async fn reconnect(&self) -> Result<Client, Failure> {
        self.patient(self.next()).await
    }

    /// One round over the addresses from the current one, bounded by `limit`. A refused login
    /// is exit 2 and [`Failure::is_denied`]; anything else exit 3.
    pub async fn connect_once(&self, limit: Duration) -> Result<Client, Failure> {
        let start = self.current.load(Ordering::Relaxed);
        self.once(start, limit).await
    }

    /// [`Server::connect_once`] after the connection was lost: from the address after the one
    /// it went to.
    pub async fn reconnect_once(&self, limit: Duration) -> Result<Client, Failure> {
        self.once(self.next(), limit).await
    }

    async fn patient(&self, start: usize) -> Result<Client, Failure> {
        let give_up = Instant::now() + self.connect_timeout;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let failed = match self.round(start, give_up).await {
                Ok(client) => {
                    if self.verbose {
                        match &self.auth {
                            Some(auth) => eprintln!(
                                "lockctl: connected to lockd at {} as {}",
                                self.addr(),
                                auth.user
                            ),
                            // With one address there is nothing to tell.
                            None if self.addrs.len() > 1 => {
                                eprintln!("lockctl: connected to lockd at {}", self.addr())
                            }
                            None => {}
                        }
                    }
                    return Ok(client);
                }
                Err(Unreached::Final(f)) => return Err(f),
                Err(Unreached::Retry(failed)) => failed,
            };
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::new(
                    UNREACHABLE,
                    format!(
                        "{} (tried for {})",
                        unreachable(&failed),
                        humantime::format_duration(self.connect_timeout)
                    ),
                ));
            }
            if let (true, Some((addr, error))) = (self.verbose, failed.last()) {
                eprintln!("lockctl: cannot reach lockd at {addr}: {error}; retrying");
            }
            sleep(backoff.min(left)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn once(&self, start: usize, limit: Duration) -> Result<Client, Failure> {
        match self.round(start, Instant::now() + limit).await {
            Ok(client) => Ok(client),
            Err(Unreached::Final(f)) => Err(f),
            // One address: its error alone, as the callers have always said it.
            Err(Unreached::Retry(failed)) if failed.len() == 1 => Err(Failure::new(
                UNREACHABLE,
                failed.into_iter().map(|(_, e)| e).collect::<String>(),
            )),
            Err(Unreached::Retry(failed)) => Err(Failure::new(UNREACHABLE, unreachable(&failed))),
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
                Err(e @ (Refusal::Final(_) | Refusal::Denied(_))) => {
                    return Err(Unreached::Final(final_failure(e)))
                }
                Err(Refusal::Retry(why)) => {
                    if self.verbose && k + 1 < n {
                        eprintln!(
                            "lockctl: cannot reach lockd at {addr}: {why}; trying {}",
                            self.addrs.get(i + 1)
                        );
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
            auth.login(&mut client, addr, left, self.verbose).await?;
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

/// A failure trying again cannot mend: TLS (exit 3) or the login (exit 2).
fn final_failure(e: Refusal) -> Failure {
    match e {
        Refusal::Denied(why) => Failure::refused(ErrorCode::Denied, why),
        Refusal::Final(why) | Refusal::Retry(why) => Failure::new(UNREACHABLE, why),
    }
}

const TIMED_OUT: &str = "connection attempt timed out";

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
