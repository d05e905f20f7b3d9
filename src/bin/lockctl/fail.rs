//! Exit codes and the one-line failures that lead to them.

use lockd::client::ClientError;
use lockd::proto::ErrorCode;

/// Usage errors and requests the server refused.
pub const USAGE: u8 = 2;
/// The server cannot be reached, or the connection was lost for good.
pub const UNREACHABLE: u8 = 3;
/// The lease was lost (or a token given to release/renew is not the live lease).
pub const LOST: u8 = 4;
/// lockd was reached but could not serve the request for the whole wait (-w; -n's one try
/// per address; --connect-timeout for release and renew): every try was answered `ERR
/// UNAVAILABLE` (or its connection lost), through every address given.
pub const UNAVAILABLE: u8 = 5;
/// A newer `--supersede` request took this waiting request's place in the queue.
pub const SUPERSEDED: u8 = 6;
/// `run --until`: the test did not pass within --until-timeout (as timeout(1)'s 124).
pub const UNTIL_TIMEOUT: u8 = 124;
/// The command exists but could not be started (as the shell's 126).
pub const CANNOT_EXEC: u8 = 126;
/// The command was not found (as the shell's 127).
pub const NOT_FOUND: u8 = 127;

/// Why lockctl stops early: an exit code and, unless the code speaks for itself (a conflict,
/// as with flock), one line for stderr.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: Option<String>,
    /// The server's code, if the server refused: `NOAUTH` and `DENIED` end even the commands
    /// that otherwise keep trying (top), since asking again gets the same answer.
    pub refusal: Option<ErrorCode>,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: Some(message.into()),
            refusal: None,
        }
    }

    /// Exits with `code` and says nothing (flock is silent when the lock is taken).
    pub fn silent(code: u8) -> Failure {
        Failure {
            code,
            message: None,
            refusal: None,
        }
    }

    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, message)
    }

    /// lockd refused to log this client in, or refused what it asked for: exit 2, and no
    /// command tries again.
    pub fn refused(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure {
            refusal: Some(code),
            ..Failure::usage(message)
        }
    }

    /// Whether lockd refused this client its login or its rights.
    pub fn is_denied(&self) -> bool {
        matches!(self.refusal, Some(ErrorCode::NoAuth | ErrorCode::Denied))
    }

    /// A failed request: connection trouble is exit 3, a refusal exit 2 with the server's text.
    pub fn request(what: &str, addr: &str, e: ClientError) -> Failure {
        match e {
            ClientError::Refused(e) if e.code == ErrorCode::NoAuth => Failure::refused(
                e.code,
                format!(
                    "{what}: lockd at {addr} requires authentication ({} {}): give --user (or \
                     LOCKD_USER) and a secret (LOCKD_SECRET or --secret-file)",
                    e.code, e.message
                ),
            ),
            // A TLS port spoken to in plain TCP: a failed handshake, as the README's exit
            // codes have it (3), not a refused request.
            ClientError::Refused(e) if e.code == ErrorCode::Tls => Failure::new(
                UNREACHABLE,
                format!("{what}: lockd at {addr}: {}", e.message),
            ),
            ClientError::Refused(e) => Failure::refused(
                e.code,
                format!("{what}: lockd refused: {} {}", e.code, e.message),
            ),
            ClientError::Unexpected(line) => Failure::usage(format!(
                "{what}: unexpected reply from lockd at {addr}: {line:?}"
            )),
            ClientError::Io(e) => Failure::new(
                UNREACHABLE,
                format!("{what}: connection to lockd at {addr} failed: {e}"),
            ),
            ClientError::Closed => Failure::new(
                UNREACHABLE,
                format!("{what}: lockd at {addr} closed the connection"),
            ),
        }
    }
}

/// The shell's convention for a child killed by a signal.
pub fn signal_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}
