//! The clocks a backend reads: the monotonic one leases count on, and the wall clock that
//! token bases and the etcd backend's deadlines are written in.
//!
//! Both follow tokio's clock, so a test or the cluster simulator that pauses tokio's time
//! drives them. The monotonic one does so always; the wall clock only on a thread that
//! [`simulate_wall`] pinned (a simulation's single thread), since outside a simulation it
//! must be the system's: front-ends on several machines share deadlines written in it.

use std::cell::Cell;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::locks::Token;

thread_local! {
    /// This thread's simulated wall clock: its milliseconds at a moment of tokio's clock.
    static SIMULATED: Cell<Option<(u64, tokio::time::Instant)>> = const { Cell::new(None) };
}

/// The current time as leases count it. Tokio's clock, so paused-time tests drive leases.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Wall-clock milliseconds (the Unix epoch's): the system's, or the simulated clock's.
pub fn unix_ms() -> u64 {
    match SIMULATED.get() {
        Some((at_ms, at)) => {
            at_ms + tokio::time::Instant::now().duration_since(at).as_millis() as u64
        }
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    }
}

/// Where tokens start: wall-clock microseconds, so a restarted server continues above the
/// tokens it granted before (as long as it granted fewer than a million a second on average
/// and the clock did not step back). The etcd backend starts its tokens here too, so a
/// deployment that moves from one backend to the other keeps its tokens growing.
pub fn first_token() -> Token {
    match SIMULATED.get() {
        Some(_) => unix_ms() * 1000,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Token)
            .unwrap_or(1),
    }
}

/// From now on this thread's wall clock reads `epoch_ms` now and moves with tokio's clock
/// (paused, in a simulation): every run of a seed sees the same wall-clock times.
#[doc(hidden)]
pub fn simulate_wall(epoch_ms: u64) {
    SIMULATED.set(Some((epoch_ms, tokio::time::Instant::now())));
}
