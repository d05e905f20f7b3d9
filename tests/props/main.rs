//! The model and property tests: the lock table against a reference model (random histories
//! with proptest), and properties of the protocol's parser and of the server's framing.

#[path = "../common/mod.rs"]
mod common;

mod framing;
mod model;
mod proto;
mod sets;
