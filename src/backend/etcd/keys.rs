//! Where each piece of lock state lives in etcd (the key layout): pure, no I/O. What is
//! written under each key: `values.rs` (holders, waiters), `marks.rs` (markers, broken-lease
//! records, superseded marks), both as `key=value` words (`words.rs`).
//!
//! Under the deployment's prefix `P`:
//! - `P h/<name>/<slot>`: one holder of `name` (its create revision and its slot make its
//!   fencing token, `tokens.rs`). The slot is the front-end's (`<fe>.<n>`), used again once its keys are
//!   gone (`slots.rs`); the request's own uid, unique, is in the value (`uid=`; a record of
//!   an older lockd has none: its slot is its uid). A set of names (`LOCK ... and=`) is one
//!   holder key per name, all in the same slot, written by one transaction (so one create revision and one slot: one token), their
//!   values alike and naming every name of the set (`set=`): whichever name a request
//!   names, the write that renews or ends it reaches every key of the set. A plain lease's
//!   key has no etcd lease, so it outlives its front-end; a
//!   session lease's key hangs on its front-end's etcd lease, so it ends with the front-end.
//!   A plain lease granted by one front-end to another's waiter hangs on the waiter's
//!   front-end's etcd lease until that front-end takes it off, before telling its client.
//! - `P q/<name>/<slot>`: one waiter, on its front-end's etcd lease; the queue's order is the
//!   keys' create revisions, so FIFO holds across front-ends. Its grant's holder key takes
//!   its slot and its uid. A set waits as one key per name, same slot, put by one
//!   transaction (one create revision: every queue agrees on its place), granted, left or replaced by one transaction over all of them.
//! - `P n/<name>`: the name's change marker. Every grant and every release of `name` writes
//!   it in the same transaction, so a grant can be made conditional on "no holder came or
//!   went since I looked" with one comparison; its value says what the last change was
//!   (released, expired, dropped), for watchers on every front-end.
//! - `P b/<name>/<token>`: a lease a BREAK ended (who, when, and the deadline it had), on an
//!   etcd lease of its own that runs out about then: its holder's RENEW or CHECK is told who
//!   broke it. The mirror passes over these keys; they are read when a RENEW or CHECK is
//!   refused.
//! - `P s/<name>/<uid>`: the waiter `uid` of `name` was superseded: written in the same
//!   transaction that deletes its waiter key (before the delete, so a watch sees it first),
//!   naming the superseding LOCK's id, so that the waiter's front-end answers `ERR
//!   SUPERSEDED` (or `ERR REPLACED` for the same id) rather than "lost"; deleted right after.
//! - `P fe/<id>`: a live front-end, on its etcd lease.
//! - `P meta/base`: the token base, chosen once, and the tokens' form (`tokens.rs`).
//!
//! Names and ids may hold any printable character but whitespace, `/` included: in keys they
//! are percent-encoded (as are the values of the words).

use std::fmt::Write as _;

/// The key of one holder, waiter or name marker, parsed back from etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Holder { name: String, slot: String },
    Waiter { name: String, slot: String },
    Marker { name: String },
    FrontEnd { id: String },
    Base,
    Superseded { name: String, uid: String },
}

/// The key layout under one prefix.
#[derive(Debug, Clone)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    pub fn new(prefix: &str) -> Layout {
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Layout { prefix }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn holder(&self, name: &str, slot: &str) -> String {
        format!("{}h/{}/{}", self.prefix, encode(name), encode(slot))
    }

    /// Every holder of `name` (a range prefix).
    pub fn holders(&self, name: &str) -> String {
        format!("{}h/{}/", self.prefix, encode(name))
    }

    pub fn waiter(&self, name: &str, slot: &str) -> String {
        format!("{}q/{}/{}", self.prefix, encode(name), encode(slot))
    }

    /// Every waiter of `name` (a range prefix).
    pub fn waiters(&self, name: &str) -> String {
        format!("{}q/{}/", self.prefix, encode(name))
    }

    pub fn marker(&self, name: &str) -> String {
        format!("{}n/{}", self.prefix, encode(name))
    }

    /// The record of the broken lease `token` of `name`.
    pub fn broken(&self, name: &str, token: u64) -> String {
        format!("{}b/{}/{token}", self.prefix, encode(name))
    }

    /// The mark that the waiter `uid` of `name` was superseded.
    pub fn superseded(&self, name: &str, uid: &str) -> String {
        format!("{}s/{}/{}", self.prefix, encode(name), encode(uid))
    }

    pub fn front_end(&self, id: &str) -> String {
        format!("{}fe/{}", self.prefix, encode(id))
    }

    pub fn base(&self) -> String {
        format!("{}meta/base", self.prefix)
    }

    /// What `key` is, if it is one of ours.
    pub fn parse(&self, key: &[u8]) -> Option<Key> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.prefix)?;
        let (kind, rest) = rest.split_once('/')?;
        match kind {
            "h" | "q" => {
                let (name, slot) = rest.split_once('/')?;
                let (name, slot) = (decode(name)?, decode(slot)?);
                Some(if kind == "h" {
                    Key::Holder { name, slot }
                } else {
                    Key::Waiter { name, slot }
                })
            }
            "n" => Some(Key::Marker {
                name: decode(rest)?,
            }),
            "fe" => Some(Key::FrontEnd { id: decode(rest)? }),
            "meta" if rest == "base" => Some(Key::Base),
            "s" => {
                let (name, uid) = rest.split_once('/')?;
                Some(Key::Superseded {
                    name: decode(name)?,
                    uid: decode(uid)?,
                })
            }
            _ => None,
        }
    }
}

impl Layout {
    /// The lock name a key (or the first key of a range: `h/<name>/`) belongs to, if any.
    pub fn name_of(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.prefix)?;
        let (kind, rest) = rest.split_once('/')?;
        match kind {
            "h" | "q" | "n" | "b" | "s" => decode(rest.split('/').next()?),
            _ => None,
        }
    }
}

/// The names a record of `name` with the set `set` stands for: its set, or itself alone.
pub fn names_of<'a>(name: &'a str, set: &'a [String]) -> Vec<&'a str> {
    if set.is_empty() {
        vec![name]
    } else {
        set.iter().map(String::as_str).collect()
    }
}

/// Percent-encodes everything but letters, digits and `-_.:@`.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.:@".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

pub fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
