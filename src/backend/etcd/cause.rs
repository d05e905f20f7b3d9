//! Why an etcd request failed, as one plain sentence for a client's `ERR UNAVAILABLE`, the
//! log and `/readyz`, and as the `kind` of `lockd_etcd_errors_total`.
//!
//! The etcd client's own `Display` is gRPC debug text (`code: 'The operation was cancelled',
//! ... tonic::transport::Error(Transport, TimeoutExpired(()))`): nothing a user can act on.
//! The cause is read from what the error carries instead: the gRPC code (by number: the codes
//! are fixed by the gRPC spec, so the sentences don't follow tonic's names), etcd's own message
//! (`etcdserver: no leader`, ...) and an I/O error anywhere in its source chain. The debug
//! text is kept for a `debug!` line.
//!
//! A refusal for good at the start (TLS, authentication) is `refusal.rs`'s; a TLS failure after
//! the start is said here in the refusal's words, as worth a retry.

use std::error::Error as _;
use std::io;
use std::time::Duration;

use super::rpc;

use super::refusal::{parts, refusal_of, tls_failure, TlsFailure, Who};

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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_rustls::rustls;

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
        let c = of_error(rpc::Error::from(refused));
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

    #[test]
    fn a_tls_failure_after_the_start_is_a_plain_unavailable() {
        let expired = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let io = io::Error::new(io::ErrorKind::InvalidData, expired);
        let c = of_error(rpc::Error::from(io));
        assert_eq!(c.kind, Kind::Unavailable);
        assert_eq!(
            c.sentence,
            "etcd's certificate has expired or is not valid yet"
        );
    }
}
