//! Reaching the server: lockctl's settings for [`lockd::client::Connector`], which does the
//! work (the addresses in turn, retry with backoff, TLS, AUTH), and its failures as exit codes.

use std::sync::Arc;
use std::time::Duration;

use lockd::client::{Addrs, Client, ClientError, ConnectError, Connector, Retry, Tls};
use lockd::proto::ErrorCode;

use crate::auth::Login;
use crate::fail::{Failure, UNREACHABLE};

/// --connect-timeout of the commands that wait anyway (run, acquire, watch): patient enough
/// to ride out a server restart or a network blip at boot.
pub const PATIENT_CONNECT: Duration = Duration::from_secs(10);
/// --connect-timeout of the one-shot commands (status, release, renew, acquire -n): a script
/// that asks a question learns at once that the server is down.
pub const ONE_SHOT_CONNECT: Duration = Duration::from_secs(2);

/// Where the server is and how patient to be with it. Clones share the connector's current
/// address: the keeper's reconnects move it for the rest of lockctl too.
#[derive(Clone, Debug)]
pub struct Server {
    connector: Connector,
    pub verbose: bool,
    /// TLS for every connection, if asked for (`run` hands its files on).
    pub tls: Option<Tls>,
    /// Who every connection logs in as, if anyone (`run` hands on how).
    pub auth: Option<Login>,
}

impl Server {
    pub fn new(
        addrs: Addrs,
        connect_timeout: Duration,
        verbose: bool,
        tls: Option<Tls>,
        auth: Option<Login>,
    ) -> Server {
        let connector = Connector::new(addrs, connect_timeout)
            .tls(tls.clone())
            .auth(auth.as_ref().map(|a| a.credentials.clone()))
            .notes(verbose.then(|| Arc::new(|note: &str| eprintln!("lockctl: {note}")) as _));
        Server {
            connector,
            verbose,
            tls,
            auth,
        }
    }

    /// The library's connector, for what lockctl sends through it as it is (a LOCK).
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    pub fn addrs(&self) -> &Addrs {
        self.connector.addrs()
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connector.connect_timeout()
    }

    /// The address of the latest connection (the first address before any).
    pub fn addr(&self) -> &str {
        self.connector.addr()
    }

    /// [`Connector::connect`]: gives up with exit code 3 naming every address; a TLS failure
    /// ends it at once, also with 3; a refused login at once with 2.
    pub async fn connect(&self) -> Result<Client, Failure> {
        self.connector.connect().await.map_err(failure)
    }

    /// [`Connector::connect_once`]: a refused login is exit 2 and [`Failure::is_denied`];
    /// anything else exit 3.
    pub async fn connect_once(&self, limit: Duration) -> Result<Client, Failure> {
        self.connector.connect_once(limit).await.map_err(failure)
    }

    /// [`Connector::reconnect_once`].
    pub async fn reconnect_once(&self, limit: Duration) -> Result<Client, Failure> {
        self.connector.reconnect_once(limit).await.map_err(failure)
    }

    /// [`Connector::reconnect_for`]: the connection for the next try of `retry`.
    pub async fn reconnect_for(&self, retry: &Retry) -> Result<Client, Failure> {
        self.connector.reconnect_for(retry).await.map_err(failure)
    }

    /// [`Connector::retry_after`]: records a retryable failure of `what`, says it with -v, and
    /// returns the pause before the next try (`None`: `retry` is over).
    pub fn retry_after(&self, retry: &mut Retry, what: &str, e: &ClientError) -> Option<Duration> {
        self.connector.retry_after(retry, what, e)
    }
}

/// A connection that could not be made, as lockctl exits on it.
pub fn failure(e: ConnectError) -> Failure {
    match e {
        ConnectError::Denied(why) => Failure::refused(ErrorCode::Denied, why),
        ConnectError::Unreachable(why) => Failure::new(UNREACHABLE, why),
    }
}
