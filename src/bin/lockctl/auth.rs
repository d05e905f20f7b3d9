//! Logging in to a lockd started with `--auth-file`: the user and secret from the flags and
//! environment, made into the library's [`Credentials`] (whose AUTH every connection starts
//! with, and which explains its refusals), and the variables that hand them on to `run`'s
//! command.
//!
//! The secret never comes from a flag: a command line is visible to every user of the machine
//! (`ps`, /proc) and lands in shell history. It comes from `LOCKD_SECRET` or from the first
//! line of `--secret-file`, and is printed nowhere (its type shows `***`).

use std::io::Read as _;
use std::path::{Path, PathBuf};

use lockd::client::auth::SECRET_VAR;
use lockd::client::Credentials;
use lockd::proto::Secret;

use crate::cli::AuthArgs;
use crate::fail::Failure;

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

/// Who to log in as, and where the secret came from.
#[derive(Clone, Debug)]
pub struct Login {
    pub credentials: Credentials,
    source: Source,
}

impl Login {
    /// The credentials the flags and environment give, or `None` without `--user`. A user
    /// without a secret, a secret without a user, or a secret given two ways is a usage error.
    pub fn from_args(args: &AuthArgs) -> Result<Option<Login>, Failure> {
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
        Ok(Some(Login {
            credentials: Credentials::new(user, Secret::new(secret)),
            source,
        }))
    }

    /// The variables that make a lockctl started by `run`'s command log in the same way:
    /// `LOCKD_USER`, and `LOCKD_SECRET_FILE` (made absolute: the command may change
    /// directory) when the secret came from a file. A secret from `LOCKD_SECRET` is in the
    /// command's environment already, inherited; lockctl never writes a secret into one.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("LOCKD_USER", self.credentials.user().to_owned())];
        if let Source::File(path) = &self.source {
            let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            env.push(("LOCKD_SECRET_FILE", path.display().to_string()));
        }
        env
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
    let file = std::fs::File::open(path).map_err(|e| cannot(&e))?;
    warn_if_others_may_read(path, &file);
    file.take(MAX_FILE)
        .read_to_end(&mut bytes)
        .map_err(|e| cannot(&e))?;
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8(line.to_vec()).map_err(|_| cannot(&"its first line is not valid UTF-8"))
}

/// Says so on stderr when the group or others may read the secret file (as ssh does of a
/// private key, but going on: the secret is still good, and the job should run).
fn warn_if_others_may_read(path: &Path, file: &std::fs::File) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(meta) = file.metadata() else {
        return;
    };
    let mode = meta.permissions().mode();
    if mode & 0o044 != 0 {
        eprintln!(
            "lockctl: warning: the secret file {} may be read by {} (mode {:04o}): \
             chmod 600 it",
            path.display(),
            if mode & 0o004 != 0 {
                "every user"
            } else {
                "its group"
            },
            mode & 0o7777
        );
    }
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
