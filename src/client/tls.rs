//! TLS to lockd: the connector built once from a CA and an optional client identity, the
//! handshake of each connection, and what its failures mean, said in one line.
//!
//! A failed handshake is a configuration problem (a CA that does not fit, a certificate that
//! expired or names another host, a refused client certificate, a plain port), not a network
//! blip: retrying it would only make the user wait for the connect timeout. So every error
//! that comes from TLS itself is final; only the network's own errors (refused, reset, a close
//! before any TLS reply) are retried. The explanations name the settings to change by
//! `lockctl`'s flags (`--tls-ca`, `--client-cert`) and lockd's (`--tls-cert`,
//! `--tls-client-ca`).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, AlertDescription, CertificateError, InvalidMessage};
use tokio_rustls::TlsConnector;

use super::connect::Refusal;
use super::{Client, ClientError};

/// Longest wait for lockd's side of the handshake. A lockd answers it in one round trip; a
/// plain-TCP port waits for a newline that never comes, so silence means "not TLS here".
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The TLS settings every connection of a [`super::Connector`] uses: the connector, and the
/// files it came from, which the explanations of a failure name.
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

impl Tls {
    /// Trusts the CA in `ca` (the system's bundle without one) and, with `identity` (a
    /// certificate and its key), presents it for mutual TLS. The error names the file at
    /// fault; one that starts with [`crate::tls::SYSTEM_CA_BUNDLE`] is about the system's
    /// bundle.
    pub fn new(ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> Result<Tls, String> {
        let connector = crate::tls::client(ca, identity)?;
        Ok(Tls {
            connector,
            ca: ca.map(Path::to_path_buf),
            identity: identity.map(|(c, k)| (c.to_path_buf(), k.to_path_buf())),
        })
    }

    /// The CA file, if one was given.
    pub fn ca(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// The client certificate and key files, if given.
    pub fn identity(&self) -> Option<(&Path, &Path)> {
        self.identity
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// The handshake on `stream`, then a PING: in TLS 1.3 lockd judges the client's
    /// certificate after the client's side of the handshake is done, so a refusal only shows
    /// on the first reply. Asking for it here makes a refused certificate a connect error,
    /// which is final, and not a failure of whatever request comes first.
    pub(crate) async fn open(
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
            // lockd says no more than that it refused it: name what is most likely wrong.
            A::BadCertificate | A::CertificateUnknown | A::DecryptError => format!(
                "it is not signed by a CA lockd trusts (its --tls-client-ca), or not valid now \
                 (lockd answered {alert:?}; its log says which)"
            ),
            A::AccessDenied | A::HandshakeFailure => format!("{alert:?}"),
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
