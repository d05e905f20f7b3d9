//! Logging in to a lockd started with `--auth-file`: the user and secret from the flags and
//! environment, the AUTH every connection starts with, and what its refusals mean.
//!
//! The secret never comes from a flag: a command line is visible to every user of the machine
//! (`ps`, /proc) and lands in shell history. It comes from `LOCKD_SECRET` or from the first
//! line of `--secret-file`, and is printed nowhere (its type shows `***`).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockd::client::{Client, ClientError};
use lockd::proto::{ErrorCode, ProtoError, Secret};

use crate::cli::AuthArgs;
use crate::fail::Failure;
use crate::tls::Refusal;

/// The variable the secret itself may come from (there is no flag for it).
pub const SECRET_VAR: &str = "LOCKD_SECRET";

/// The most of a secret file lockctl reads: a secret is one short line, so anything longer
/// is the wrong file (or /dev/zero), and must not be read whole into memory.
const MAX_FILE: u64 = 64 * 1024;

/// Where the secret came from: `run` passes on the way to reach it, never the secret itself
/// unless the command inherits it anyway (`LOCKD_SECRET`).
#[derive(Clone, Debug)]
enum Source {
    Env,
    File(PathBuf),
}

/// Who to log in as.
#[derive(Clone, Debug)]
pub struct Credentials {
    pub user: String,
    secret: Secret,
    source: Source,
}

/// Why a login did not happen, as the connection code needs to know it.
pub enum LoginError {
    /// lockd refused the user or the secret, or cannot log anyone in: trying again will not
    /// help (exit 2).
    Refused(String),
    /// The connection failed, or lockd is busy: worth another try.
    Retry(String),
}

impl From<LoginError> for Refusal {
    fn from(e: LoginError) -> Refusal {
        match e {
            LoginError::Refused(why) => Refusal::Denied(why),
            LoginError::Retry(why) => Refusal::Retry(why),
        }
    }
}

impl Credentials {
    /// The credentials the flags and environment give, or `None` without `--user`. A user
    /// without a secret, a secret without a user, or a secret given two ways is a usage error.
    pub fn from_args(args: &AuthArgs) -> Result<Option<Credentials>, Failure> {
        let env_secret = std::env::var_os(SECRET_VAR).filter(|s| !s.is_empty());
        let user = args.user.clone().filter(|u| !u.is_empty());
        let (secret, source) = match (env_secret, &args.secret_file) {
            (Some(_), Some(_)) => {
                return Err(Failure::usage(format!(
                    "the secret is given twice ({SECRET_VAR} and --secret-file or \
                     LOCKD_SECRET_FILE): give it one way"
                )))
            }
            (Some(s), None) => {
                let s = s
                    .into_string()
                    .map_err(|_| Failure::usage(format!("{SECRET_VAR} is not valid UTF-8")))?;
                (s, Source::Env)
            }
            (None, Some(path)) => (read_secret_file(path)?, Source::File(path.clone())),
            (None, None) => {
                return match user {
                    Some(user) => Err(Failure::usage(format!(
                        "--user {user} needs a secret: set {SECRET_VAR}, or give \
                         --secret-file (LOCKD_SECRET_FILE)"
                    ))),
                    None => Ok(None),
                };
            }
        };
        let Some(user) = user else {
            return Err(Failure::usage(
                "a secret was given without a user: give --user (or LOCKD_USER)",
            ));
        };
        lockd::proto::validate_name("--user", &user).map_err(|e| Failure::usage(e.message))?;
        check_secret(&secret, &source)?;
        Ok(Some(Credentials {
            user,
            secret: Secret::new(secret),
            source,
        }))
    }

    /// The variables that make a lockctl started by `run`'s command log in the same way:
    /// `LOCKD_USER`, and `LOCKD_SECRET_FILE` (made absolute: the command may change
    /// directory) when the secret came from a file. A secret from `LOCKD_SECRET` is in the
    /// command's environment already, inherited; lockctl never writes a secret into one.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("LOCKD_USER", self.user.clone())];
        if let Source::File(path) = &self.source {
            let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            env.push(("LOCKD_SECRET_FILE", path.display().to_string()));
        }
        env
    }

    /// AUTH on a new connection, within `limit`. Says nothing of the secret, whatever happens.
    pub async fn login(
        &self,
        client: &mut Client,
        addr: &str,
        limit: Duration,
        verbose: bool,
    ) -> Result<(), LoginError> {
        let reply =
            tokio::time::timeout(limit, client.auth(&self.user, self.secret.expose())).await;
        let e = match reply {
            Err(_) => return Err(LoginError::Retry("no reply to AUTH".into())),
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(ClientError::Refused(e))) => e,
            Ok(Err(e)) => return Err(LoginError::Retry(e.to_string())),
        };
        let user = &self.user;
        if e == ProtoError::auth_off() {
            // Every connection may do everything there: nothing to log in to.
            if verbose {
                eprintln!(
                    "lockctl: lockd at {addr} has authentication off; --user {user} is not needed"
                );
            }
            return Ok(());
        }
        if e == ProtoError::already_authenticated(user) {
            // Mutual TLS: the client certificate named this very user.
            return Ok(());
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

/// The first line of `path`, its line ending stripped.
fn read_secret_file(path: &Path) -> Result<String, Failure> {
    let cannot = |e: &dyn std::fmt::Display| {
        Failure::usage(format!(
            "cannot read the secret file {}: {e}",
            path.display()
        ))
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE).read_to_end(&mut bytes))
        .map_err(|e| cannot(&e))?;
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8(line.to_vec()).map_err(|_| cannot(&"its first line is not valid UTF-8"))
}

/// One word that fits an AUTH line. The message names where the secret came from, never
/// the secret.
fn check_secret(secret: &str, source: &Source) -> Result<(), Failure> {
    let from = match source {
        Source::Env => SECRET_VAR.to_owned(),
        Source::File(path) => format!("the first line of {}", path.display()),
    };
    let problem = if secret.is_empty() {
        Some("is empty".to_owned())
    } else if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("has whitespace or control characters (a secret is one word)".to_owned())
    } else if secret.len() > lockd::auth::MAX_SECRET {
        Some(format!(
            "is over {} bytes, longer than any lockd accepts",
            lockd::auth::MAX_SECRET
        ))
    } else {
        None
    };
    match problem {
        Some(p) => Err(Failure::usage(format!("the secret in {from} {p}"))),
        None => Ok(()),
    }
}
