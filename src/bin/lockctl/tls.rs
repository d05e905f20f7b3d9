//! TLS to lockd: the connector built once from --tls-ca and --client-cert/--client-key, the
//! handshake of each connection, and what its failures mean, said in one line.
//!
//! A failed handshake is a configuration problem (a CA that does not fit, a certificate that
//! expired or names another host, a refused client certificate, a plain port), not a network
//! blip: retrying it would only make the user wait for --connect-timeout. So every error that
//! comes from TLS itself is final; only the network's own errors (refused, reset, a close
//! before any TLS reply) are retried.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockd::client::{Client, ClientError};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, AlertDescription, CertificateError, InvalidMessage};
use tokio_rustls::TlsConnector;

use crate::cli::TlsArgs;
use crate::fail::Failure;

/// Longest wait for lockd's side of the handshake. A lockd answers it in one round trip; a
/// plain-TCP port waits for a newline that never comes, so silence means "not TLS here".
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The TLS settings every connection of this lockctl uses.
#[derive(Clone)]
pub struct Tls {
    connector: TlsConnector,
    ca: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Why a connection attempt failed (TLS or, after it, the login).
pub enum Refusal {
    /// The network failed before TLS could say anything: worth another try.
    Retry(String),
    /// TLS itself failed; the same attempt will fail the same way.
    Final(String),
    /// lockd refused to log this client in (its --user or secret): final, exit 2.
    Denied(String),
}

impl Tls {
    /// The settings the flags ask for, or `None` without TLS. Unreadable or unusable files
    /// are a usage error, named.
    pub fn from_args(args: &TlsArgs) -> Result<Option<Tls>, Failure> {
        if !args.wanted() {
            return Ok(None);
        }
        let identity = args.client_cert.clone().zip(args.client_key.clone());
        let connector = lockd::tls::client(
            args.tls_ca.as_deref(),
            identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        )
        .map_err(|e| {
            // The hint is for the system bundle only when that is the file at fault.
            let bundle_failed = e.starts_with(lockd::tls::SYSTEM_CA_BUNDLE);
            let hint = if args.tls_ca.is_none() && bundle_failed {
                " (the system's CA bundle; give the CA that signed lockd's certificate with \
                 --tls-ca)"
            } else {
                ""
            };
            Failure::usage(format!("cannot set up TLS: {e}{hint}"))
        })?;
        Ok(Some(Tls {
            connector,
            ca: args.tls_ca.clone(),
            identity,
        }))
    }

    /// The variables that make a lockctl started by `run`'s command reach lockd the same way
    /// (paths made absolute: the command may change directory).
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Path| {
            std::path::absolute(p)
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string()
        };
        let mut env = vec![("LOCKD_TLS", "1".to_owned())];
        if let Some(ca) = &self.ca {
            env.push(("LOCKD_TLS_CA", path(ca)));
        }
        if let Some((cert, key)) = &self.identity {
            env.push(("LOCKD_CLIENT_CERT", path(cert)));
            env.push(("LOCKD_CLIENT_KEY", path(key)));
        }
        env
    }

    /// The handshake on `stream`, then a PING: in TLS 1.3 lockd judges the client's
    /// certificate after the client's side of the handshake is done, so a refusal only shows
    /// on the first reply. Asking for it here makes a refused certificate a connect error,
    /// which is final, and not a failure of whatever request comes first.
    pub async fn open(
        &self,
        addr: &str,
        stream: TcpStream,
        limit: Duration,
    ) -> Result<Client, Refusal> {
        let shake = limit.min(HANDSHAKE_TIMEOUT);
        let client = match tokio::time::timeout(
            shake,
            Client::handshake(stream, host(addr), &self.connector),
        )
        .await
        {
            Err(_) => {
                return Err(Refusal::Final(format!(
                    "lockd at {addr} accepted the connection but sent no TLS handshake within \
                     {}: is it serving plain TCP there (started without --tls-cert)?",
                    humantime::format_duration(Duration::from_millis(shake.as_millis() as u64))
                )))
            }
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(self.refusal(addr, e)),
        };
        let mut client = client;
        match tokio::time::timeout(limit, client.ping()).await {
            Err(_) => Err(Refusal::Retry(
                "no reply to PING after the TLS handshake".into(),
            )),
            Ok(Ok(())) => Ok(client),
            Ok(Err(e)) => Err(self.refusal(addr, e)),
        }
    }

    /// What a failed handshake or first request means.
    fn refusal(&self, addr: &str, e: ClientError) -> Refusal {
        let ClientError::Io(io) = &e else {
            return Refusal::Retry(e.to_string());
        };
        match rustls_error(io) {
            Some(tls) => Refusal::Final(self.explain(addr, tls)),
            None if io.kind() == io::ErrorKind::UnexpectedEof => Refusal::Retry(
                "closed during the TLS handshake (at its --max-connections, or not a TLS port)"
                    .into(),
            ),
            None => Refusal::Retry(io.to_string()),
        }
    }

    /// One line naming the cause and what to do about it.
    fn explain(&self, addr: &str, e: &rustls::Error) -> String {
        let ca = match &self.ca {
            Some(ca) => format!("{}", ca.display()),
            None => "the system's CA bundle".into(),
        };
        match e {
            rustls::Error::InvalidCertificate(cert) => {
                let why = match cert {
                    CertificateError::UnknownIssuer => {
                        format!("no CA in {ca} signed it (give the CA that did with --tls-ca)")
                    }
                    CertificateError::ExpiredContext { not_after, .. } => {
                        format!("it expired at {}", unix_time(not_after.as_secs()))
                    }
                    CertificateError::Expired => "it has expired".into(),
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. } => {
                        format!("{cert} (connect with a name or address the certificate lists)")
                    }
                    other => other.to_string(),
                };
                format!("the certificate of lockd at {addr} is not trusted: {why}")
            }
            rustls::Error::AlertReceived(alert) => self.alert(addr, *alert),
            // A plain lockd answers the handshake with an ERR line: no TLS record starts
            // with "E".
            rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType) => format!(
                "lockd at {addr} did not answer in TLS: is it serving plain TCP there (started \
                 without --tls-cert)? Drop --tls, or use its TLS port"
            ),
            rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. } => format!(
                "lockd at {addr} did not answer in TLS ({e}): is it serving plain TCP there?"
            ),
            other => format!("TLS with lockd at {addr} failed: {other}"),
        }
    }

    /// An alert lockd sent: mostly about the client certificate.
    fn alert(&self, addr: &str, alert: AlertDescription) -> String {
        use AlertDescription as A;
        let Some((cert, _)) = &self.identity else {
            return match alert {
                A::CertificateRequired | A::HandshakeFailure | A::BadCertificate => format!(
                    "lockd at {addr} requires a client certificate (mutual TLS): give \
                     --client-cert and --client-key"
                ),
                other => format!("lockd at {addr} refused the TLS connection: {other:?}"),
            };
        };
        let why = match alert {
            A::UnknownCA => "it is not signed by a CA lockd trusts (its --tls-client-ca)".into(),
            A::CertificateExpired => "it has expired".into(),
            A::CertificateRevoked => "it was revoked".into(),
            A::UnsupportedCertificate => {
                "lockd does not take it for a client certificate (is clientAuth among its \
                 extended key usages?)"
                    .into()
            }
            A::BadCertificate
            | A::CertificateUnknown
            | A::AccessDenied
            | A::DecryptError
            | A::HandshakeFailure => format!("{alert:?}"),
            other => {
                return format!("lockd at {addr} refused the TLS connection: {other:?}");
            }
        };
        format!(
            "lockd at {addr} refused the client certificate {}: {why}",
            cert.display()
        )
    }
}

/// The rustls error inside an I/O error of a TLS stream, if that is what it is.
fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// The host part of `host:port`: the name lockd's certificate must be valid for.
fn host(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

fn unix_time(secs: u64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(at).to_string()
}
