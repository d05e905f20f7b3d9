//! The LOCK request lockctl sends, built in this one place for `run` and `acquire`.

use std::time::Duration;

use lockd::client::{self, Client};
use lockd::locks::{Mode, Token};
use lockd::proto::Tie;

use crate::cli::ModeArgs;

/// What to ask for, besides the name and id.
#[derive(Clone, Copy, Debug)]
pub struct Terms {
    pub ttl: Option<Duration>,
    /// `None` waits as long as it takes.
    pub wait: Option<Duration>,
    pub tie: Tie,
    pub mode: ModeArgs,
}

/// LOCK; returns the fencing token.
pub async fn lock(
    client: &mut Client,
    name: &str,
    id: &str,
    terms: Terms,
) -> client::Result<Token> {
    client
        .lock_mode(
            name,
            id,
            terms.ttl,
            terms.wait,
            terms.tie,
            terms.mode.mode(),
        )
        .await
}

impl ModeArgs {
    /// The mode the flags ask for (`--limit 1` is an exclusive hold).
    pub fn mode(&self) -> Mode {
        match (self.shared, self.limit) {
            (true, _) => Mode::Shared,
            (false, Some(n)) => Mode::limit(n),
            (false, None) => Mode::Exclusive,
        }
    }

    /// For -v: `exclusive`, `shared`, `one of 3 slots`.
    pub fn describe(&self) -> String {
        match self.mode() {
            Mode::Limit(n) => format!("one of {n} slots"),
            m => m.to_string(),
        }
    }
}
