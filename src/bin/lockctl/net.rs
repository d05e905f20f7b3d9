//! Reaching the server: a bounded retry with backoff at start, single attempts later; over
//! TLS when asked for ([`crate::tls`]).

use std::time::Duration;

use lockd::client::{Client, ClientError};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

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
}

impl Server {
    /// Connects, retrying with backoff for up to `connect_timeout` (a server being restarted, a
    /// network blip at boot), then gives up with exit code 3 naming the address. A TLS
    /// failure (an untrusted certificate, a refused client certificate, a plain port) ends it
    /// at once, also with 3: trying again would fail the same way.
    pub async fn connect(&self) -> Result<Client, Failure> {
        let give_up = Instant::now() + self.connect_timeout;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            let error = match self.attempt(left).await {
                Ok(client) => return Ok(client),
                Err(Refusal::Final(why)) => return Err(Failure::new(UNREACHABLE, why)),
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

    /// One connection attempt, bounded by `limit`.
    pub async fn connect_once(&self, limit: Duration) -> Result<Client, String> {
        self.attempt(limit).await.map_err(|e| match e {
            Refusal::Retry(why) | Refusal::Final(why) => why,
        })
    }

    /// One connection attempt, bounded by `limit`: TCP, then TLS if asked for.
    async fn attempt(&self, limit: Duration) -> Result<Client, Refusal> {
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

const TIMED_OUT: &str = "connection attempt timed out";
