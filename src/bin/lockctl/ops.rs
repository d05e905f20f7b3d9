//! The one-request commands: acquire, release, renew.

use lockd::client::ClientError;
use lockd::proto::{ErrorCode, Tie};

use crate::cli::{AcquireArgs, RenewArgs, TokenArgs};
use crate::fail::{Failure, LOST};
use crate::net::Server;
use crate::out::{print_line, Printed};
use crate::request::{self, Terms};

/// LOCK with `detach`: the lease must outlive this process, but its wait must not (a waiter
/// that is killed, as a cancelled CI job, must not be granted the lock later). Prints the token.
pub async fn acquire(server: &Server, id: &str, args: &AcquireArgs) -> Result<u8, Failure> {
    if args.ttl.is_some_and(|t| t.is_zero()) {
        return Err(Failure::usage("--ttl must be more than 0"));
    }
    let terms = Terms {
        ttl: args.ttl,
        wait: None,
        tie: Tie::Detach,
        mode: args.mode,
    };
    let what = format!("acquire {}", args.name);
    let granted = request::lock_retrying(server, &what, (&args.name, id), terms, &args.wait).await?;
    let token = granted.token;
    if server.verbose {
        let ttl = match args.ttl {
            Some(t) => format!("ttl {}", humantime::format_duration(t)),
            None => "the server's default ttl".into(),
        };
        eprintln!(
            "lockctl: acquired {} token {token} ({}, a plain lease, {ttl}: release \
             or renew it with this token)",
            args.name,
            args.mode.describe()
        );
    }
    print_line(&token.to_string())?;
    Ok(0)
}

pub async fn release(server: &Server, args: &TokenArgs) -> Result<u8, Failure> {
    let mut client = server.connect().await?;
    let what = format!("release {} {}", args.name, args.token);
    match client.unlock(&args.name, args.token).await {
        Ok(()) => {
            if server.verbose {
                eprintln!("lockctl: released {} token {}", args.name, args.token);
            }
            Ok(0)
        }
        Err(e) => Err(not_held_is_lost(&what, server.addr(), e)),
    }
}

pub async fn renew(server: &Server, args: &RenewArgs) -> Result<u8, Failure> {
    if args.ttl.is_some_and(|t| t.is_zero()) {
        return Err(Failure::usage("--ttl must be more than 0"));
    }
    let lock = &args.lock;
    let mut client = server.connect().await?;
    let what = format!("renew {} {}", lock.name, lock.token);
    match client.renew(&lock.name, lock.token, args.ttl).await {
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
        Err(e) => Err(not_held_is_lost(&what, server.addr(), e)),
    }
}

fn not_held_is_lost(what: &str, addr: &str, e: ClientError) -> Failure {
    match e {
        ClientError::Refused(e) if e.code == ErrorCode::NotHeld => Failure::new(
            LOST,
            format!(
                "{what}: lock lost: the token is not the live lease ({} {})",
                e.code, e.message
            ),
        ),
        e => Failure::request(what, addr, e),
    }
}

impl From<Printed> for Failure {
    fn from(_: Printed) -> Failure {
        // stdout is closed (as with `| head -1`): nobody is left to read an error either.
        Failure::silent(0)
    }
}
