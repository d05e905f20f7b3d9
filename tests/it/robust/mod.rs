//! Clients that misbehave: connections closed with input still on its way, floods of
//! connections, stuck STATUS readers, leases too short to hold, watchers that never read.

mod close;
mod refuse;
mod status;
mod ttl;
mod watch;
