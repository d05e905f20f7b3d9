//! A test seam, in debug builds only: a front-end whose watch applies each message late, so
//! that its mirror is stale for as long as a test needs. How a test makes "the mirror missed
//! a change" happen every time rather than once in a while (`tests/cluster/mirror_lag.rs`):
//! a decision from the mirror must be checked by the write it leads to, and this shows that
//! it is.

use std::time::Duration;

/// The environment variable a test sets on a front-end: how late (a humantime duration,
/// such as `1500ms`) its watch applies each message. Read in debug builds only; a release
/// build has no such seam.
pub const WATCH_LAG_ENV: &str = "LOCKD_TEST_WATCH_LAG";

/// The lag this process was started with, if any (debug builds).
pub(super) fn watch_lag() -> Option<Duration> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let value = std::env::var(WATCH_LAG_ENV).ok()?;
    humantime::parse_duration(&value).ok()
}
