//! How to reach etcd: the options a client is made with ([`ConnectOptions`]: timeouts, HTTP/2
//! keep-alives, `hasleader`, TLS, a user) and every member's endpoint made from them, so that
//! all the channels [`Client::connect`](super::Client::connect) builds have the same settings.

use std::fmt;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::auth::Credentials;
use super::Error;

/// How to reach etcd.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    /// HTTP/2 keep-alive: (interval, timeout).
    keep_alive: Option<(Duration, Duration)>,
    pub(crate) require_leader: bool,
    tls: Option<TlsOptions>,
    pub(crate) user: Option<Credentials>,
}

/// TLS to etcd: the CA that signed the members' certificates, and this client's own
/// certificate and key when etcd asks for one (`--client-cert-auth`). All PEM.
#[derive(Clone, Default)]
pub struct TlsOptions {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl TlsOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust the members' certificates this CA signed (and no other: lockd has no system
    /// roots for etcd).
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Show etcd this certificate (chain, leaf first) and prove it with this key.
    pub fn with_identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}

impl ConnectOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every request fails with a deadline status after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Connecting to one member gives up after `timeout`.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// HTTP/2 pings every `interval` (also on an idle connection); a connection whose ping
    /// goes unanswered for `timeout` is dropped, so a member that vanished is noticed.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }

    /// Sends `hasleader: true` on every call.
    pub fn with_require_leader(mut self, require_leader: bool) -> Self {
        self.require_leader = require_leader;
        self
    }

    /// TLS to every member: an endpoint without a scheme becomes `https://`, and an
    /// `http://` one is refused (it would send the credentials in the clear).
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticate as this etcd user: [`Client::connect`] asks for a token, every call
    /// carries it, and a call refused for an expired or unknown token gets a new one and
    /// is sent once more.
    ///
    /// [`Client::connect`]: super::Client::connect
    pub fn with_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(Credentials {
            name: name.into(),
            password: password.into(),
        });
        self
    }
}

/// Each member's URL and endpoint (at least one), from which [`Client::connect`] makes the
/// channels: one balanced over every endpoint (each connected lazily, reconnected when it
/// drops; a request goes to a member whose connection is up), and one per member for the
/// route to the leader.
///
/// [`Client::connect`]: super::Client::connect
pub(crate) fn members<E: AsRef<str>>(
    endpoints: &[E],
    options: &ConnectOptions,
) -> Result<Vec<(String, Endpoint)>, Error> {
    let mut list = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        let endpoint = endpoint(e.as_ref(), options)?;
        let url = endpoint.uri().to_string();
        list.push((url.trim_end_matches('/').to_owned(), endpoint));
    }
    if list.is_empty() {
        return Err(Error::InvalidArgs("no etcd endpoint".into()));
    }
    Ok(list)
}

/// One member's endpoint: `http://` assumed when the URL has no scheme (`https://` with TLS).
pub(crate) fn endpoint(url: &str, options: &ConnectOptions) -> Result<Endpoint, Error> {
    let url = if url.contains("://") {
        url.to_owned()
    } else if options.tls.is_some() {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    };
    let https = url.starts_with("https://");
    if options.tls.is_some() && !https {
        return Err(Error::InvalidArgs(format!(
            "etcd endpoint {url}: TLS is set, so the endpoint must be https://"
        )));
    }
    if https && options.tls.is_none() {
        return Err(Error::InvalidArgs(format!(
            "etcd endpoint {url}: https needs the CA that signed etcd's certificate"
        )));
    }
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| Error::InvalidArgs(format!("etcd endpoint {url}: {e}")))?;
    if let Some(tls) = &options.tls {
        endpoint = endpoint.tls_config(tls.config())?;
    }
    if let Some((interval, timeout)) = options.keep_alive {
        endpoint = endpoint
            .keep_alive_while_idle(true)
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(timeout);
    }
    if let Some(timeout) = options.timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if let Some(timeout) = options.connect_timeout {
        endpoint = endpoint.connect_timeout(timeout);
    }
    Ok(endpoint)
}
