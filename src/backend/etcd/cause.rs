//! Why an etcd request failed, as one plain sentence for a client's `ERR UNAVAILABLE`, the
//! log and `/readyz`, and as the `kind` of `lockd_etcd_errors_total`.
//!
//! The etcd client's own `Display` is gRPC debug text (`code: 'The operation was cancelled',
//! ... tonic::transport::Error(Transport, TimeoutExpired(()))`): nothing a user can act on.
//! The cause is read from what the error carries instead: the gRPC code (by number: the codes
//! are fixed by the gRPC spec, so the sentences don't follow tonic's names), etcd's own message
//! (`etcdserver: no leader`, ...) and an I/O error anywhere in its source chain. The debug
//! text is kept for a `debug!` line.

use std::error::Error as _;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::rpc;
use tokio_rustls::rustls;

/// gRPC status codes (the gRPC spec's numbers).
const CANCELLED: i32 = 1;
const DEADLINE_EXCEEDED: i32 = 4;
const UNAVAILABLE: i32 = 14;

/// What went wrong, as `lockd_etcd_errors_total` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// No member could be reached, or the cluster can't commit (lost quorum, stopping).
    Unavailable,
    /// The request got no answer within `--etcd-request-timeout`.
    Timeout,
    /// The member has no leader (an election, or it is cut off from the others).
    NoLeader,
    /// A guarded transaction failed its comparison (someone else changed the name first).
    Conflict,
    /// Anything else.
    Other,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Unavailable,
        Kind::Timeout,
        Kind::NoLeader,
        Kind::Conflict,
        Kind::Other,
    ];

    /// The `kind` label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Unavailable => "unavailable",
            Kind::Timeout => "timeout",
            Kind::NoLeader => "no_leader",
            Kind::Conflict => "conflict",
            Kind::Other => "other",
        }
    }
}

/// A failed request: its kind and its sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub kind: Kind,
    pub sentence: String,
}

/// What the sentence may name besides the error: where etcd is and how long a request may
/// take.
pub struct Context<'a> {
    pub endpoints: &'a [String],
    pub request_timeout: Duration,
}

impl Context<'_> {
    /// The endpoints as an operator wrote them, without a scheme.
    fn at(&self) -> String {
        let bare: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| {
                e.strip_prefix("http://")
                    .or_else(|| e.strip_prefix("https://"))
                    .unwrap_or(e)
            })
            .collect();
        bare.join(",")
    }
}

/// The cause of `e`, in one plain sentence.
pub fn cause(e: &rpc::Error, cx: &Context<'_>) -> Cause {
    use rpc::Error as E;
    if let Some(tls) = tls_cause(e) {
        return tls;
    }
    match e {
        E::GRpcStatus(status) => classify(
            Some(i32::from(status.code())),
            status.message(),
            io_kind(status.source()),
            cx,
        ),
        E::TransportError(t) => {
            classify(Some(UNAVAILABLE), &t.to_string(), io_kind(t.source()), cx)
        }
        E::IoError(io) => classify(None, &io.to_string(), Some(io.kind()), cx),
        E::WatchError(why) => classify(None, &format!("watch: {why}"), None, cx),
        E::LeaseKeepAliveError(why) => classify(None, &format!("keep-alive: {why}"), None, cx),
        other => Cause {
            kind: Kind::Other,
            sentence: format!("etcd request failed ({})", first_line(&other.to_string())),
        },
    }
}

/// The cause from the parts an error carries: its gRPC code, its message and the kind of an
/// I/O error under it.
pub fn classify(
    code: Option<i32>,
    message: &str,
    io: Option<io::ErrorKind>,
    cx: &Context<'_>,
) -> Cause {
    let m = message.to_ascii_lowercase();
    let (kind, sentence) = if m.contains("no leader") {
        (Kind::NoLeader, "etcd has no leader".to_owned())
    } else if m.contains("leader changed") {
        (
            Kind::NoLeader,
            "etcd changed its leader during the request".to_owned(),
        )
    } else if m.contains("etcdserver: request timed out") {
        // The member took the request but the cluster did not commit it in time.
        (Kind::Unavailable, "etcd lost quorum".to_owned())
    } else if m.contains("server stopped") {
        (Kind::Unavailable, "the etcd member is stopping".to_owned())
    } else if m.contains("too many requests") {
        (
            Kind::Other,
            "etcd is overloaded (too many requests)".to_owned(),
        )
    } else if m.contains("space exceeded") {
        (
            Kind::Other,
            "etcd is out of space (database space exceeded)".to_owned(),
        )
    } else if let Some(why) = io.and_then(unreachable) {
        (
            Kind::Unavailable,
            format!("cannot reach etcd at {}: {why}", cx.at()),
        )
    } else if matches!(code, Some(CANCELLED | DEADLINE_EXCEEDED))
        || matches!(io, Some(io::ErrorKind::TimedOut))
        || m.contains("timeout expired")
        || m.contains("deadline")
    {
        (
            Kind::Timeout,
            format!(
                "etcd request timed out after {}",
                humantime::format_duration(cx.request_timeout)
            ),
        )
    } else if code == Some(UNAVAILABLE) || m.contains("connect") || m.contains("transport") {
        (
            Kind::Unavailable,
            format!("cannot reach etcd at {}: no connection", cx.at()),
        )
    } else {
        let said = message.strip_prefix("etcdserver: ").unwrap_or(message);
        (
            Kind::Other,
            format!("etcd refused the request ({})", first_line(said)),
        )
    };
    Cause { kind, sentence }
}

/// An I/O error that means the member can't be reached, in words.
fn unreachable(kind: io::ErrorKind) -> Option<&'static str> {
    use io::ErrorKind as K;
    Some(match kind {
        K::ConnectionRefused => "connection refused",
        K::ConnectionReset => "connection reset",
        K::ConnectionAborted => "connection aborted",
        K::NotConnected | K::BrokenPipe | K::UnexpectedEof => "connection lost",
        K::AddrNotAvailable => "address not available",
        K::TimedOut => "connection timed out",
        _ => return None,
    })
}

/// The kind of the first I/O error in a source chain.
fn io_kind(mut source: Option<&(dyn std::error::Error + 'static)>) -> Option<io::ErrorKind> {
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        source = e.source();
    }
    None
}

/// At most the first line of `text`, bounded: a message is one line of an `ERR` reply.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    line.chars().take(200).collect()
}

// Refusals: TLS and authentication (`--etcd-ca`, `--etcd-cert`, `--etcd-user`). A start
// that etcd refuses for one of these reasons ends at once with the sentence (no retry mends
// it). Kept apart from the causes above, which are all worth a retry.

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
fn parts(e: &rpc::Error) -> Option<(String, Option<&(dyn std::error::Error + 'static)>)> {
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

/// A TLS failure after the start (a certificate expired or replaced since), for
/// [`cause`]: the refusal's sentence, without the files the start named.
fn tls_cause(e: &rpc::Error) -> Option<Cause> {
    let (message, source) = parts(e)?;
    let sentence = match tls_failure(&message, source)? {
        TlsFailure::ClientRefused => {
            "etcd refused this front-end's client certificate (--etcd-cert)".to_owned()
        }
        tls => {
            let who = Who {
                ca: None,
                cert: None,
                user: None,
                prefix: "",
            };
            refusal_of(Some(tls), "", &who)?
        }
    };
    Some(Cause {
        kind: Kind::Unavailable,
        sentence,
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
fn tls_failure(
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

    fn cx() -> (Vec<String>, Duration) {
        (
            vec!["http://127.0.0.1:2379".to_owned()],
            Duration::from_secs(2),
        )
    }

    fn of(code: Option<i32>, message: &str, io: Option<io::ErrorKind>) -> Cause {
        let (endpoints, request_timeout) = cx();
        classify(
            code,
            message,
            io,
            &Context {
                endpoints: &endpoints,
                request_timeout,
            },
        )
    }

    fn of_error(e: rpc::Error) -> Cause {
        let (endpoints, request_timeout) = cx();
        cause(
            &e,
            &Context {
                endpoints: &endpoints,
                request_timeout,
            },
        )
    }

    #[test]
    fn no_leader() {
        let c = of(Some(UNAVAILABLE), "etcdserver: no leader", None);
        assert_eq!(c.kind, Kind::NoLeader);
        assert_eq!(c.sentence, "etcd has no leader");
    }

    #[test]
    fn server_timeout_is_lost_quorum() {
        for m in [
            "etcdserver: request timed out",
            "etcdserver: request timed out, possibly due to connection lost",
        ] {
            let c = of(Some(UNAVAILABLE), m, None);
            assert_eq!(
                (c.kind, c.sentence.as_str()),
                (Kind::Unavailable, "etcd lost quorum")
            );
        }
    }

    #[test]
    fn client_timeout_names_the_timeout() {
        // What tonic makes of its own deadline: Cancelled, "Timeout expired".
        let c = of(Some(CANCELLED), "Timeout expired", None);
        assert_eq!(c.kind, Kind::Timeout);
        assert_eq!(c.sentence, "etcd request timed out after 2s");
        assert_eq!(of(Some(DEADLINE_EXCEEDED), "", None).kind, Kind::Timeout);
    }

    #[test]
    fn refused_names_the_endpoint() {
        let c = of(
            Some(UNAVAILABLE),
            "tcp connect error",
            Some(io::ErrorKind::ConnectionRefused),
        );
        assert_eq!(c.kind, Kind::Unavailable);
        assert_eq!(
            c.sentence,
            "cannot reach etcd at 127.0.0.1:2379: connection refused"
        );
        let c = of(Some(UNAVAILABLE), "error trying to connect", None);
        assert_eq!(
            c.sentence,
            "cannot reach etcd at 127.0.0.1:2379: no connection"
        );
    }

    #[test]
    fn constructed_errors() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "os error 111");
        let c = of_error(rpc::Error::IoError(refused));
        assert_eq!(
            c.sentence,
            "cannot reach etcd at 127.0.0.1:2379: connection refused"
        );
        // A gRPC status made from an I/O error keeps the code tonic gives it.
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "deadline has elapsed");
        let c = of_error(rpc::Error::GRpcStatus(timed_out.into()));
        assert_eq!(c.kind, Kind::Timeout);
        let c = of_error(rpc::Error::WatchError("etcdserver: no leader".into()));
        assert_eq!(c.sentence, "etcd has no leader");
        let c = of_error(rpc::Error::InvalidArgs("bad\nsecond line".into()));
        assert_eq!(c.kind, Kind::Other);
        assert!(!c.sentence.contains('\n'), "{}", c.sentence);
    }

    #[test]
    fn other_server_messages_are_plain() {
        let c = of(Some(9), "etcdserver: mvcc: database space exceeded", None);
        assert_eq!(c.sentence, "etcd is out of space (database space exceeded)");
        let c = of(
            Some(3),
            "etcdserver: too many operations in txn request",
            None,
        );
        assert_eq!(c.kind, Kind::Other);
        assert_eq!(
            c.sentence,
            "etcd refused the request (too many operations in txn request)"
        );
    }

    #[test]
    fn no_sentence_carries_debug_text() {
        let cases = [
            of(Some(CANCELLED), "Timeout expired", None),
            of(Some(UNAVAILABLE), "transport error", None),
            of(None, "", None),
        ];
        for c in cases {
            for debug in ["tonic", "Transport", "code:", "Status {"] {
                assert!(!c.sentence.contains(debug), "{}", c.sentence);
            }
        }
    }

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
    fn a_tls_failure_after_the_start_is_a_plain_unavailable() {
        let expired = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let io = io::Error::new(io::ErrorKind::InvalidData, expired);
        let c = of_error(rpc::Error::IoError(io));
        assert_eq!(c.kind, Kind::Unavailable);
        assert_eq!(
            c.sentence,
            "etcd's certificate has expired or is not valid yet"
        );
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
