//! The integration tests: one binary, a module per feature, all on the one harness in
//! `tests/common` (a [`common::Lockd`] builder, one free-port helper, one line client).
//!
//! Run one feature with a filter: `cargo test --test it lockctl::`.

#[path = "../common/mod.rs"]
mod common;

mod at_least;
mod audit;
mod auth;
mod breaks;
mod cli;
mod client_hold;
mod client_sets;
mod compat;
mod contrib;
mod durability;
mod etcd_proto;
mod expiry;
mod hardening;
mod liveness;
mod lockctl;
mod multi;
mod notes;
mod observe;
mod robust;
mod semaphores;
mod sessions;
mod stress;
mod supersede;
mod tls;
mod web;
mod wire;
