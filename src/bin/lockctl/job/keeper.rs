//! `run`'s lease kept alive by the library's renewal loop ([`lockd::client::keeper`]), with
//! what is lockctl's own: the kill schedule (the loss is told the kill grace before the
//! SIGKILL must land, so that SIGTERM goes first) and what -v says of the renewals.

use std::time::Duration;

use lockd::client::keeper::{Event, Held, Keeper, Loss, Timing};
use lockd::client::Client;
use lockd::locks::Token;
use lockd::proto::{ErrorCode, Tie};

use crate::net::Server;
use crate::out::{broken_words, round_ms};

/// The lock being held, as lockctl's messages name it.
#[derive(Clone, Debug)]
pub struct HeldLease {
    /// The name renewed and released: of a set, its first, which stands for the whole set.
    pub name: String,
    pub token: Token,
    /// A set's further names, for messages only (one lease: nothing is sent for them).
    pub also: Vec<String>,
}

impl HeldLease {
    /// The lease as messages name it: `deploy`, or `db-migrate (with cache-flush)`.
    pub fn shown(&self) -> String {
        if self.also.is_empty() {
            return self.name.clone();
        }
        format!("{} (with {})", self.name, self.also.join(", "))
    }
}

/// The timing of `run`'s lease: the library's, with `kill_grace` (SIGTERM to SIGKILL) as its
/// stop grace, capped at a quarter of the window: SIGTERM must not come before lockctl has
/// had a fair chance to renew, and SIGKILL must still land before the deadline.
/// `session_grace` of zero is a plain `session` lease: it ends when the server sees the
/// connection close, which lockctl cannot bound, so only the ttl counts. With several
/// `front_ends`, renewals come at least every 2s, so that they can move to another front-end
/// before a cut-off one's etcd lease ends.
pub fn timing(
    ttl: Duration,
    session_grace: Duration,
    kill_grace: Duration,
    front_ends: usize,
) -> Timing {
    Timing::new(ttl, Tie::Session(session_grace), front_ends).with_stop_grace(kill_grace)
}

/// Starts renewing `held`, granted on `client`, watching for a BREAK of it; says with -v what
/// the renewals do.
pub fn spawn(
    server: &Server,
    client: Client,
    held: Held,
    lease: &HeldLease,
    timing: Timing,
) -> Keeper {
    let (verbose, lease) = (server.verbose, lease.clone());
    let observe = move |event: &Event| {
        if verbose {
            say(&lease, event);
        }
    };
    Keeper::spawn(
        server.connector().clone(),
        client,
        held,
        timing,
        true,
        observe,
    )
}

/// What -v says of each renewal, failure and reconnection (the loss is said by whoever stops
/// the command).
fn say(lease: &HeldLease, event: &Event) {
    match event {
        Event::Renewed { left, again } => eprintln!(
            "lockctl: renewed {} token {}{}: {} left",
            lease.shown(),
            lease.token,
            if *again { " again" } else { "" },
            humantime::format_duration(round_ms(*left))
        ),
        Event::Failed {
            error,
            next_addr,
            retry_in,
            left,
        } => eprintln!(
            "lockctl: renewing {} failed: {error}; trying {next_addr} in {} ({} of lease left)",
            lease.shown(),
            humantime::format_duration(round_ms(*retry_in)),
            humantime::format_duration(round_ms(*left))
        ),
        Event::Disconnected { addr, why } => {
            eprintln!("lockctl: connection to lockd at {addr} ended ({why}); reconnecting")
        }
        Event::Reconnected { addr } => eprintln!("lockctl: reconnected to lockd at {addr}"),
        Event::Lost(_) => {}
    }
}

/// Why the lease was lost, in lockctl's words.
pub fn lost_words(why: &Loss) -> String {
    match why {
        Loss::OutOfTime {
            last_failure: Some(e),
        } => format!("could not renew the lease before it ends: {e}"),
        Loss::OutOfTime { last_failure: None } => "could not renew the lease before it ends".into(),
        Loss::NotHeld { message, .. } => format!(
            "the server no longer holds it for this token ({})",
            broken_words(&format!("{} {message}", ErrorCode::NotHeld))
        ),
        Loss::ConnectionEnded { .. } => why.to_string(),
    }
}
