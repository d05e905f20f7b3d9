//! Refusals: TLS and authentication (`--etcd-ca`, `--etcd-cert`, `--etcd-user`). A start
//! that etcd refuses for one of these reasons ends at once with the sentence (no retry mends
//! it). Kept apart from the causes of `cause.rs`, which are all worth a retry.

use std::error::Error as _;
use std::io;
use std::path::Path;

use super::rpc;
use tokio_rustls::rustls;

/// What a refusal names: the flags an operator would change.
pub struct Who<'a> {
    pub ca: Option<&'a Path>,
    pub cert: Option<&'a Path>,
    pub user: Option<&'a str>,
    pub prefix: &'a str,
}

/// How a TLS handshake with etcd failed, as far as a sentence tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    /// etcd's certificate is not signed by `--etcd-ca`.
    UnknownIssuer,
    /// etcd's certificate does not name the address in `--etcd`.
    WrongName,
    /// etcd's certificate has expired, or is not valid yet.
    Expired,
    /// etcd ended the handshake over this front-end's certificate (or the lack of one).
    ClientRefused,
    /// The other end does not speak TLS (an `http://` client URL).
    NotTls,
}

/// Why etcd refused this front-end for good, in one plain sentence; `None` if `e` is no
/// such refusal (it may be worth a retry).
pub fn refusal(e: &rpc::Error, who: &Who<'_>) -> Option<String> {
    let (message, source) = parts(e)?;
    refusal_of(tls_failure(&message, source), &message, who)
}

/// An error's message and the start of its source chain, for the kinds that carry them.
pub(super) fn parts(
    e: &rpc::Error,
) -> Option<(String, Option<&(dyn std::error::Error + 'static)>)> {
    use rpc::Error as E;
    Some(match e {
        E::GRpcStatus(status) => (status.message().to_owned(), status.source()),
        E::TransportError(t) => (t.to_string(), t.source()),
        E::IoError(io) => (
            io.to_string(),
            Some(io as &(dyn std::error::Error + 'static)),
        ),
        _ => return None,
    })
}
/// The refusal from its parts: the TLS failure under the error, if any, and its message.
pub fn refusal_of(tls: Option<TlsFailure>, message: &str, who: &Who<'_>) -> Option<String> {
    let ca = who
        .ca
        .map_or_else(String::new, |p| format!(" {}", p.display()));
    if let Some(tls) = tls {
        return Some(match tls {
            TlsFailure::UnknownIssuer => format!("etcd's certificate is not signed by --etcd-ca{ca}"),
            TlsFailure::WrongName => "etcd's certificate does not name the address in --etcd (the host lockd connects to must be among its subject alternative names)".into(),
            TlsFailure::Expired => "etcd's certificate has expired or is not valid yet".into(),
            TlsFailure::ClientRefused => match who.cert {
                Some(cert) => format!(
                    "etcd refused the client certificate --etcd-cert {} (is it signed by the CA of etcd's --trusted-ca-file, and valid?)",
                    cert.display()
                ),
                None => "etcd requires a client certificate: give --etcd-cert and --etcd-key".into(),
            },
            TlsFailure::NotTls => "etcd does not speak TLS there: its client URLs are http:// (use http:// endpoints without --etcd-ca, or turn on TLS in etcd)".into(),
        });
    }
    let m = message.to_ascii_lowercase();
    let user = who.user.unwrap_or("(none)");
    if m.contains("authentication failed") || m.contains("invalid user id or password") {
        Some(format!("etcd refused user {user}: wrong user or password"))
    } else if m.contains("user name is empty") {
        Some(format!(
            "etcd requires a user: give --etcd-user, with its password in {} or --etcd-password-file (or a client certificate whose common name is an etcd user)",
            crate::backend::ETCD_PASSWORD_ENV
        ))
    } else if m.contains("user name not found") {
        Some(match who.user {
            Some(user) => format!("etcd has no user {user}"),
            None => "etcd has no user named by the client certificate's common name".into(),
        })
    } else if m.contains("authentication is not enabled") {
        Some(format!(
            "etcd has authentication turned off, so --etcd-user {user} means nothing to it: turn it on (etcdctl auth enable) or drop --etcd-user"
        ))
    } else if m.contains("permission denied") {
        let prefix = who.prefix;
        Some(match who.user {
            Some(user) => format!(
                "etcd user {user} may not read and write --etcd-prefix {prefix} (permission denied): its role needs readwrite on that prefix"
            ),
            None => format!(
                "etcd denied this front-end --etcd-prefix {prefix} (permission denied): the etcd user it authenticates as (the client certificate's common name) needs a role with readwrite on that prefix"
            ),
        })
    } else {
        None
    }
}

/// The TLS failure in an error: a rustls error anywhere in its source chain (an I/O error's
/// inner error included, which its `source` skips), else the words rustls would have used
/// in the message.
pub(super) fn tls_failure(
    message: &str,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> Option<TlsFailure> {
    let mut words = message.to_owned();
    while let Some(e) = source {
        if let Some(tls) = e.downcast_ref::<rustls::Error>().and_then(rustls_failure) {
            return Some(tls);
        }
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            if let Some(tls) = inner
                .downcast_ref::<rustls::Error>()
                .and_then(rustls_failure)
            {
                return Some(tls);
            }
            words.push_str(&format!(": {inner}"));
        }
        words.push_str(&format!(": {e}"));
        source = e.source();
    }
    tls_words(&words)
}

/// A rustls error as a [`TlsFailure`]; `None` for one no certificate or flag explains.
fn rustls_failure(e: &rustls::Error) -> Option<TlsFailure> {
    use rustls::{AlertDescription as A, CertificateError as C, Error as R};
    Some(match e {
        R::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => TlsFailure::UnknownIssuer,
        R::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            TlsFailure::WrongName
        }
        R::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => TlsFailure::Expired,
        R::AlertReceived(
            A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::AccessDenied
            | A::CertificateRequired,
        ) => TlsFailure::ClientRefused,
        R::InvalidMessage(_) => TlsFailure::NotTls,
        _ => return None,
    })
}

/// [`rustls_failure`] from the words of rustls's `Display`, for an error chain that kept
/// only its text.
fn tls_words(text: &str) -> Option<TlsFailure> {
    let t = text.to_ascii_lowercase();
    if t.contains("unknownissuer") || t.contains("unknown issuer") || t.contains("badsignature") {
        Some(TlsFailure::UnknownIssuer)
    } else if t.contains("notvalidforname") || t.contains("not valid for name") {
        Some(TlsFailure::WrongName)
    } else if t.contains("certificate expired")
        || t.contains("notvalidyet")
        || t.contains("invalid peer certificate: expired")
    {
        Some(TlsFailure::Expired)
    } else if t.contains("received fatal alert: badcertificate")
        || t.contains("received fatal alert: certificaterequired")
        || t.contains("received fatal alert: unknownca")
        || t.contains("received fatal alert: certificateunknown")
        || t.contains("received fatal alert: accessdenied")
    {
        Some(TlsFailure::ClientRefused)
    } else if t.contains("received corrupt message") {
        Some(TlsFailure::NotTls)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who<'a>(user: Option<&'a str>, cert: Option<&'a Path>) -> Who<'a> {
        Who {
            ca: Some(Path::new("/etc/lockd/etcd/ca.pem")),
            cert,
            user,
            prefix: "/lockd/",
        }
    }

    #[test]
    fn tls_refusals_name_the_flag() {
        let plain = who(None, None);
        assert_eq!(
            refusal_of(Some(TlsFailure::UnknownIssuer), "", &plain).as_deref(),
            Some("etcd's certificate is not signed by --etcd-ca /etc/lockd/etcd/ca.pem")
        );
        assert_eq!(
            refusal_of(Some(TlsFailure::ClientRefused), "", &plain).as_deref(),
            Some("etcd requires a client certificate: give --etcd-cert and --etcd-key")
        );
        let cert = Path::new("fe.pem");
        let with_cert = who(None, Some(cert));
        let c = refusal_of(Some(TlsFailure::ClientRefused), "", &with_cert).expect("refused");
        assert!(
            c.starts_with("etcd refused the client certificate --etcd-cert fe.pem"),
            "{c}"
        );
        for tls in [
            TlsFailure::WrongName,
            TlsFailure::Expired,
            TlsFailure::NotTls,
        ] {
            let c = refusal_of(Some(tls), "", &plain).expect("a refusal");
            assert!(c.starts_with("etcd"), "{c}");
        }
    }

    #[test]
    fn tls_failures_are_read_from_rustls_errors_or_their_words() {
        use rustls::{AlertDescription, CertificateError};
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        // Inside an I/O error, as tokio-rustls reports it: `source` skips the inner error.
        let io = io::Error::new(io::ErrorKind::InvalidData, unknown.clone());
        assert_eq!(
            tls_failure("transport error", Some(&io)),
            Some(TlsFailure::UnknownIssuer)
        );
        let alert = rustls::Error::AlertReceived(AlertDescription::BadCertificate);
        assert_eq!(
            tls_failure("", Some(&alert)),
            Some(TlsFailure::ClientRefused)
        );
        assert_eq!(
            tls_failure(&format!("error trying to connect: {unknown}"), None),
            Some(TlsFailure::UnknownIssuer)
        );
        assert_eq!(
            tls_failure("received fatal alert: CertificateRequired", None),
            Some(TlsFailure::ClientRefused)
        );
        let closed = rustls::Error::AlertReceived(AlertDescription::CloseNotify);
        assert_eq!(tls_failure("connection reset", Some(&closed)), None);
    }

    #[test]
    fn auth_refusals_name_the_user_and_the_prefix() {
        let user = who(Some("lockd"), None);
        let said = |m: &str, w: &Who<'_>| refusal_of(None, m, w);
        assert_eq!(
            said(
                "etcdserver: authentication failed, invalid user ID or password",
                &user
            )
            .as_deref(),
            Some("etcd refused user lockd: wrong user or password")
        );
        let c = said("etcdserver: permission denied", &user).expect("denied");
        assert!(
            c.starts_with("etcd user lockd may not read and write --etcd-prefix /lockd/"),
            "{c}"
        );
        let c = said("etcdserver: permission denied", &who(None, None)).expect("denied");
        assert!(c.contains("common name"), "{c}");
        let c = said("etcdserver: user name is empty", &who(None, None)).expect("no user");
        assert!(
            c.starts_with("etcd requires a user: give --etcd-user"),
            "{c}"
        );
        let c = said("etcdserver: authentication is not enabled", &user).expect("off");
        assert!(c.starts_with("etcd has authentication turned off"), "{c}");
        // What is worth a retry is no refusal.
        for m in ["etcdserver: no leader", "etcdserver: request timed out", ""] {
            assert_eq!(said(m, &user), None, "{m}");
        }
    }
}
