//! The one-request commands: acquire, release, renew.

use lockd::client::{self, retryable, Client, ClientError, Retry};
use lockd::proto::{ErrorCode, Tie};
use tokio::time::sleep;

use crate::cli::{AcquireArgs, RenewArgs, TokenArgs};
use crate::fail::{Failure, LOST, UNAVAILABLE};
use crate::net::Server;
use crate::out::{held_tokens, print_line, Printed};
use crate::request::{self, Terms};

/// LOCK with `detach`: the lease must outlive this process, but its wait must not (a waiter
/// that is killed, as a cancelled CI job, must not be granted the lock later). Prints the
/// token, or a set's tokens one per line in the order the names were given.
pub async fn acquire(server: &Server, id: &str, args: &AcquireArgs) -> Result<u8, Failure> {
    if args.ttl.is_some_and(|t| t.is_zero()) {
        return Err(Failure::usage("--ttl must be more than 0"));
    }
    if args.names.len() > 1 && args.wait.supersede {
        return Err(Failure::usage(
            "--supersede takes one name: a set waits in the queue of each of its names, and \
             would take every one of them",
        ));
    }
    let terms = Terms {
        ttl: args.ttl,
        tie: Tie::Detach,
        mode: args.mode,
        note: args.note.clone(),
    };
    let what = format!("acquire {}", args.names.join(" "));
    let granted =
        request::lock_retrying(server, &what, (&args.names, id), terms, &args.wait).await?;
    let tokens = granted.tokens;
    if server.verbose {
        let ttl = match args.ttl {
            Some(t) => format!("ttl {}", humantime::format_duration(t)),
            None => "the server's default ttl".into(),
        };
        let set = if tokens.len() > 1 {
            " (one lease for the set: release or renew any one name to release or renew all)"
        } else {
            ""
        };
        eprintln!(
            "lockctl: acquired {} ({}, a plain lease, {ttl}: release or renew it with this \
             token){set}",
            held_tokens(&args.names, &tokens),
            args.mode.describe()
        );
    }
    for token in tokens {
        print_line(&token.to_string())?;
    }
    Ok(0)
}

pub async fn release(server: &Server, args: &TokenArgs) -> Result<u8, Failure> {
    let what = format!("release {} {}", args.name, args.token);
    let unlock = async |c: &mut Client| c.unlock(&args.name, args.token).await;
    match one_shot(server, &what, unlock).await? {
        Ok(()) => {
            if server.verbose {
                eprintln!("lockctl: released {} token {}", args.name, args.token);
            }
            Ok(0)
        }
        // An earlier UNLOCK answered ERR UNAVAILABLE may have been carried out all the same.
        Err((e, retry)) if retry.failures() > 0 && e.code() == Some(ErrorCode::NotHeld) => {
            let mut f = not_held_is_lost(&what, server.addr(), e);
            if let Some(m) = f.message.as_mut() {
                m.push_str(&format!(
                    " (an earlier try, {}, may have released it)",
                    retry.last_cause().unwrap_or("unanswered")
                ));
            }
            Err(f)
        }
        Err((e, _)) => Err(not_held_is_lost(&what, server.addr(), e)),
    }
}

pub async fn renew(server: &Server, args: &RenewArgs) -> Result<u8, Failure> {
    if args.ttl.is_some_and(|t| t.is_zero()) {
        return Err(Failure::usage("--ttl must be more than 0"));
    }
    let lock = &args.lock;
    let what = format!("renew {} {}", lock.name, lock.token);
    let renew = async |c: &mut Client| c.renew(&lock.name, lock.token, args.ttl).await;
    match one_shot(server, &what, renew).await? {
        Ok(left) => {
            if server.verbose {
                eprintln!(
                    "lockctl: renewed {} token {}: {} left",
                    lock.name,
                    lock.token,
                    humantime::format_duration(left)
                );
            }
            Ok(0)
        }
        Err((e, _)) => Err(not_held_is_lost(&what, server.addr(), e)),
    }
}

/// The request of a one-shot command (release, renew), sent again through the next address
/// while what comes back may be mended by trying again ([`retryable`]: `ERR UNAVAILABLE`, a
/// lost connection), with backoff, for up to --connect-timeout: a script that asks is told
/// soon. Gives up with [`UNAVAILABLE`] naming the last front-end and what it said; any other
/// answer is returned, with the retries it took.
async fn one_shot<T>(
    server: &Server,
    what: &str,
    mut ask: impl AsyncFnMut(&mut Client) -> client::Result<T>,
) -> Result<Result<T, (ClientError, Retry)>, Failure> {
    let mut retry = Retry::within(Some(server.connect_timeout()));
    let mut client = server.connect().await?;
    loop {
        let e = match ask(&mut client).await {
            Ok(answer) => return Ok(Ok(answer)),
            Err(e) if retryable(&e) => e,
            Err(e) => return Ok(Err((e, retry))),
        };
        let Some(pause) = server.retry_after(&mut retry, what, &e) else {
            return Err(Failure::new(
                UNAVAILABLE,
                format!(
                    "{what}: lockd was unavailable for {}: last, {}",
                    humantime::format_duration(server.connect_timeout()),
                    retry.last_cause().unwrap_or("no answer")
                ),
            ));
        };
        // The next address, or with one address the same connection (it stays open after
        // ERR UNAVAILABLE).
        let keep = server.addrs().len() == 1 && e.code() == Some(ErrorCode::Unavailable);
        sleep(pause).await;
        if !keep {
            client = server.reconnect_for(&retry).await?;
        }
    }
}

/// `ERR NOTHELD` of a release or renewal: exit 4, saying what the server knows (already
/// released or expired, or broken by whom and when); any other failure as any request's.
fn not_held_is_lost(what: &str, addr: &str, e: ClientError) -> Failure {
    match e {
        ClientError::Refused(e) if e.code == ErrorCode::NotHeld => {
            let why = match e.message.contains(" was broken by ") {
                true => crate::out::broken_words(&e.message),
                false => "not held with this token: released already, its lease ran out, or                           the token is not one of it"
                    .to_owned(),
            };
            Failure::new(LOST, format!("{what}: {why}"))
        }
        e => Failure::request(what, addr, e),
    }
}

impl From<Printed> for Failure {
    fn from(_: Printed) -> Failure {
        // stdout is closed (as with `| head -1`): nobody is left to read an error either.
        Failure::silent(0)
    }
}
