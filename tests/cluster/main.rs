//! Cluster mode (`lockd --etcd`, cargo feature `etcd`, on by default) against real etcd
//! clusters of child processes: `cargo test --test cluster`. The etcd test harness itself and
//! the chaos runs' history checker need no feature and run with `--no-default-features` too.

#[path = "../common/mod.rs"]
mod common;

mod basics;
mod break_overlap;
mod breaks;
mod chaos;
mod etcd_harness;
mod failover;
mod features;
mod flapping;
mod fronts;
mod health;
mod history_checker;
mod membership;
mod mirror_lag;
mod multi;
mod netsplit;
mod notes;
mod observability;
mod partition;
mod routing;
mod secure;
mod sets_lockctl;
mod sets_wide;
mod skew;
mod slots;
mod supersede;
mod tokens;
mod wait_ends;
