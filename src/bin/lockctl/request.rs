//! The LOCK request lockctl sends, built in this one place for `run` and `acquire`.

use std::time::Duration;

use lockd::proto::{Request, Tie};

use crate::cli::ModeArgs;
use crate::fail::Failure;

/// What to ask for, besides the name and id.
#[derive(Clone, Copy, Debug)]
pub struct Terms {
    pub ttl: Option<Duration>,
    /// `None` waits as long as it takes.
    pub wait: Option<Duration>,
    pub tie: Tie,
    pub mode: ModeArgs,
}

pub fn lock(name: &str, id: &str, terms: Terms) -> Result<Request, Failure> {
    if terms.mode.shared || terms.mode.limit.is_some_and(|n| n > 1) {
        return Err(Failure::usage(
            "--shared and --limit need a lockd with shared locks and semaphores",
        ));
    }
    Ok(Request::Lock {
        name: name.into(),
        id: id.into(),
        ttl: terms.ttl,
        wait: terms.wait,
        tie: terms.tie,
    })
}

impl ModeArgs {
    /// For -v: `exclusive`, `shared`, `one of 3 slots`.
    pub fn describe(&self) -> String {
        match (self.shared, self.limit) {
            (true, _) => "shared".into(),
            (false, Some(n)) if n > 1 => format!("one of {n} slots"),
            _ => "exclusive".into(),
        }
    }
}
