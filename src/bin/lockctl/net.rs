//! Reaching the server: a bounded retry with backoff at start, single attempts later; over
//! TLS when asked for ([`crate::tls`]), and logged in as --user when given ([`crate::auth`]).

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

/// Where the server is and how patient to be with it.
#[derive(Clone, Debug)]
pub struct Server {
    pub addr: String,
    pub connect_timeout: Duration,
    pub verbose: bool,
    /// TLS for every connection, if asked for.
    pub tls: Option<Tls>,
    /// Who every connection logs in as, if anyone.
    pub auth: Option<Credentials>,
}

impl Server {
    /// Connects, retrying with backoff for up to `connect_timeout` (a server being restarted, a
    /// network blip at boot), then gives up with exit code 3 naming the address. A TLS
    /// failure (an untrusted certificate, a refused client certificate, a plain port) ends it
    /// at once, also with 3: trying again would fail the same way. A refused login ends it at
    /// once with 2.
    pub async fn connect(&self) -> Result<Client, Failure> {
        let give_up = Instant::now() + self.connect_timeout;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            let error = match self.attempt(left).await {
                Ok(client) => {
                    if let (true, Some(auth)) = (self.verbose, &self.auth) {
                        eprintln!(
                            "lockctl: connected to lockd at {} as {}",
                            self.addr, auth.user
                        );
                    }
                    return Ok(client);
                }
                Err(e @ (Refusal::Final(_) | Refusal::Denied(_))) => return Err(final_failure(e)),
                Err(Refusal::Retry(e)) => e,
            };
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::new(
                    UNREACHABLE,
                    format!(
                        "cannot reach lockd at {}: {error} (tried for {})",
                        self.addr,
                        humantime::format_duration(self.connect_timeout)
                    ),
                ));
            }
            if self.verbose {
                eprintln!(
                    "lockctl: cannot reach lockd at {}: {error}; retrying",
                    self.addr
                );
            }
            sleep(backoff.min(left)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One connection attempt, bounded by `limit`. A refused login is exit 2 and
    /// [`Failure::is_denied`]; anything else exit 3.
    pub async fn connect_once(&self, limit: Duration) -> Result<Client, Failure> {
        self.attempt(limit).await.map_err(|e| match e {
            Refusal::Retry(why) => Failure::new(UNREACHABLE, why),
            e => final_failure(e),
        })
    }

    /// One connection attempt, bounded by `limit`: TCP, then TLS if asked for, then AUTH if
    /// a user is given.
    async fn attempt(&self, limit: Duration) -> Result<Client, Refusal> {
        let started = Instant::now();
        let mut client = self.open(limit).await?;
        if let Some(auth) = &self.auth {
            let left = limit.saturating_sub(started.elapsed());
            auth.login(&mut client, &self.addr, left, self.verbose)
                .await?;
        }
        Ok(client)
    }

    /// A connection, over TLS if asked for, within `limit`.
    async fn open(&self, limit: Duration) -> Result<Client, Refusal> {
        let Some(tls) = &self.tls else {
            return match timeout(limit, Client::connect(&self.addr)).await {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(ClientError::Io(e))) => Err(Refusal::Retry(e.to_string())),
                Ok(Err(e)) => Err(Refusal::Retry(e.to_string())),
                Err(_) => Err(Refusal::Retry(TIMED_OUT.into())),
            };
        };
        let started = Instant::now();
        let stream = match timeout(limit, TcpStream::connect(&self.addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(Refusal::Retry(e.to_string())),
            Err(_) => return Err(Refusal::Retry(TIMED_OUT.into())),
        };
        tls.open(&self.addr, stream, limit.saturating_sub(started.elapsed()))
            .await
    }
}

/// A failure trying again cannot mend: TLS (exit 3) or the login (exit 2).
fn final_failure(e: Refusal) -> Failure {
    match e {
        Refusal::Denied(why) => Failure::refused(ErrorCode::Denied, why),
        Refusal::Final(why) | Refusal::Retry(why) => Failure::new(UNREACHABLE, why),
    }
}

const TIMED_OUT: &str = "connection attempt timed out";
