//! Logging in to a lockd started with `--auth-file`: the AUTH a connection starts with, and
//! what its refusals mean, said in one line that names what to change. The secret is printed
//! nowhere (its type shows `***`), whatever happens.

use std::fmt;
use std::time::Duration;

use super::connect::Refusal;
use super::{Client, ClientError};
use crate::proto::{ErrorCode, ProtoError, Secret};

/// The variable lockd's clients (`lockctl`, the Python and bash ones) take the secret from:
/// never a flag, since a command line is visible to every user of the machine.
pub const SECRET_VAR: &str = "LOCKD_SECRET";

/// Who to log in as (its `Debug` shows the secret as `***`).
#[derive(Clone, Debug)]
pub struct Credentials {
    user: String,
    secret: Secret,
}

/// How a login ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoggedIn {
    /// lockd accepted the user and secret.
    AsUser,
    /// Mutual TLS: the client certificate had logged this very user in already.
    ByCertificate,
    /// lockd has authentication off: every connection may do everything, nothing to log in to.
    AuthOff,
}

/// Why a login did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginError {
    /// lockd refused the user or the secret, or cannot log anyone in: trying again will not
    /// help.
    Refused(String),
    /// The connection failed, or lockd is busy: worth another try.
    Retry(String),
}

impl fmt::Display for LoginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoginError::Refused(why) | LoginError::Retry(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for LoginError {}

impl From<LoginError> for Refusal {
    fn from(e: LoginError) -> Refusal {
        match e {
            LoginError::Refused(why) => Refusal::Denied(why),
            LoginError::Retry(why) => Refusal::Retry(why),
        }
    }
}

impl Credentials {
    /// `user` with `secret`; both are checked by the server, not here.
    pub fn new(user: String, secret: Secret) -> Credentials {
        Credentials { user, secret }
    }

    /// `user` with the secret in [`SECRET_VAR`] (`LOCKD_SECRET`), as `lockctl` takes it: never
    /// a command-line argument, which every user of the machine can see.
    ///
    /// ```
    /// use lockd::client::Credentials;
    /// std::env::set_var("LOCKD_SECRET", "alice-secret-0123456789abcdef");
    /// let alice = Credentials::from_env("alice").expect("LOCKD_SECRET is set");
    /// assert_eq!(alice.user(), "alice");
    /// assert!(!format!("{alice:?}").contains("alice-secret"));
    /// ```
    pub fn from_env(user: &str) -> Result<Credentials, String> {
        match std::env::var(SECRET_VAR) {
            Ok(secret) if !secret.is_empty() => {
                Ok(Credentials::new(user.into(), Secret::new(secret)))
            }
            Ok(_) | Err(std::env::VarError::NotPresent) => Err(format!(
                "{SECRET_VAR} is not set: the secret of user {user} comes from it"
            )),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(format!("{SECRET_VAR} is not valid UTF-8"))
            }
        }
    }

    /// `user` with the secret on the first line of the file at `path` (as `lockctl
    /// --secret-file`); the error names the file, never the secret.
    pub fn from_file(user: &str, path: &std::path::Path) -> Result<Credentials, String> {
        use std::io::Read as _;
        // A secret is one short line: more than this is the wrong file (or /dev/zero).
        const MAX_FILE: u64 = 64 * 1024;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_FILE).read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("the secret file {} is not UTF-8", path.display()))?;
        let secret = text
            .lines()
            .next()
            .unwrap_or_default()
            .trim_end_matches('\r');
        if secret.is_empty() {
            return Err(format!(
                "the secret file {} has no secret on its first line",
                path.display()
            ));
        }
        Ok(Credentials::new(user.into(), Secret::new(secret)))
    }

    /// The user name: messages name it (the secret is never shown).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// AUTH on `client`, a new connection to `addr`, within `limit`.
    pub async fn login(
        &self,
        client: &mut Client,
        addr: &str,
        limit: Duration,
    ) -> Result<LoggedIn, LoginError> {
        let reply =
            tokio::time::timeout(limit, client.auth(&self.user, self.secret.expose())).await;
        let e = match reply {
            Err(_) => return Err(LoginError::Retry("no reply to AUTH".into())),
            Ok(Ok(_)) => return Ok(LoggedIn::AsUser),
            Ok(Err(ClientError::Refused(e))) => e,
            Ok(Err(e)) => return Err(LoginError::Retry(e.to_string())),
        };
        let user = &self.user;
        if e == ProtoError::auth_off() {
            return Ok(LoggedIn::AuthOff);
        }
        if e == ProtoError::already_authenticated(user) {
            return Ok(LoggedIn::ByCertificate);
        }
        let text = format!("{} {}", e.code, e.message);
        Err(match e.code {
            ErrorCode::Denied if e.message.starts_with("already authenticated") => {
                LoginError::Refused(format!(
                    "lockd at {addr} logged this connection in by its client certificate, not \
                     as --user {user} ({text}): drop --user, or use a certificate for {user}"
                ))
            }
            ErrorCode::Denied => LoginError::Refused(format!(
                "lockd at {addr} refused to log in user {user} ({text}): check --user \
                 (LOCKD_USER) and the secret ({SECRET_VAR} or --secret-file)"
            )),
            ErrorCode::Unknown => LoginError::Refused(format!(
                "lockd at {addr} does not know AUTH ({text}): it is older than --user; drop \
                 --user, or upgrade it"
            )),
            ErrorCode::Limit | ErrorCode::Shutdown => LoginError::Retry(text),
            _ => LoginError::Refused(format!("lockd at {addr} refused AUTH: {text}")),
        })
    }
}
