//! Cluster mode (`lockd --etcd`, cargo feature `etcd`) against real etcd clusters of child
//! processes: `cargo test --features etcd --test cluster`. The etcd test harness itself and
//! the chaos runs' history checker need no feature and run with plain `cargo test` too.

#[path = "../common/mod.rs"]
mod common;

mod basics;
mod chaos;
mod etcd_harness;
mod failover;
mod features;
mod flapping;
mod fronts;
mod health;
mod history_checker;
mod netsplit;
mod observability;
mod partition;
mod secure;
mod skew;
