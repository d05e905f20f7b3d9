//! Test certificates made at run time with rcgen: a CA, a server certificate for 127.0.0.1
//! and localhost, and client certificates whose common name is a user. Nothing is committed.
//! They are the workspace's testpki crate, shared with contrib/bench.

// Not every test binary that has `common` makes certificates.
#[allow(unused_imports)]
pub use testpki::Pki;
