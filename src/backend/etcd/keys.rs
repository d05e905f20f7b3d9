//! Where each piece of lock state lives in etcd, and how it is written: pure, no I/O.
//!
//! Under the deployment's prefix `P`:
//! - `P h/<name>/<slot>`: one holder of `name` (its create revision, plus the token base, is its
//!   fencing token). The slot is the front-end's (`<fe>.<n>`), used again once its keys are
//!   gone (`slots.rs`); the request's own uid, unique, is in the value (`uid=`; a record of
//!   an older lockd has none: its slot is its uid). A set of names (`LOCK ... and=`) is one
//!   holder key per name, all in the same slot, written by one transaction (so one create revision: one token), their
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
//! - `P meta/base`: the token base, chosen once.
//!
//! Names and ids may hold any printable character but whitespace, `/` included: in keys they
//! are percent-encoded. Values are `key=value` words, values percent-encoded too.

use std::fmt::Write as _;

use crate::locks::{EventKind, Mode, Origin};

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

/// A holder's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderValue {
    /// The request it was granted to (its waiter's uid, for a grant from the queue): what
    /// the front-ends' own tables know it by. Empty in an older lockd's record.
    pub uid: String,
    pub id: String,
    /// The user (of `--auth-file`) that owns the lease; empty for none.
    pub user: String,
    pub mode: Mode,
    pub ttl_ms: u64,
    /// Wall-clock milliseconds when the lease ends unless renewed.
    pub deadline_ms: u64,
    /// `Some(grace)` for a session lease.
    pub session_ms: Option<u64>,
    /// The front-end and connection a session lease is bound to.
    pub fe: String,
    pub conn: u64,
    /// Wall-clock milliseconds when a session lease whose connection closed ends (its grace
    /// runs); 0 while it is bound to an open connection.
    pub cut_ms: u64,
    pub granted_ms: u64,
    /// How long it waited in the queue; `None` for a grant made at once.
    pub waited_ms: Option<u64>,
    /// The writer's wall clock when this record was written. `deadline_ms` and `cut_ms` are
    /// on the same clock, so their distance from it is the time the lease had left when it
    /// was written, whatever the other front-ends' clocks say (see [`HolderValue::left_ms`]).
    pub at_ms: u64,
    /// The `ip:port` of the client that took it, for the audit trail (every front-end's
    /// STATUS and logs); empty where not known (a record of an older lockd).
    pub peer: String,
    /// The holder's note (`LOCK ... note=`); empty for none (and in an older lockd's record).
    pub note: String,
    /// Every name of its set, in the request's order (the name of this key among them);
    /// empty for a lease of one name.
    pub set: Vec<String>,
    /// Who broke it, if a BREAK (without `force`) did: the lease is over for its holder, but
    /// its key keeps its place on the name until the holder lets go or its deadline passes.
    /// An older lockd's record has none.
    pub broken_by: Option<Origin>,
    /// Its lock-delay (`LOCK ... delay=`) in milliseconds; 0 for none.
    pub delay_ms: u64,
    /// In its lock-delay: its time ran out (`Expired`) or its session ended (`Dropped`)
    /// without a release, and it keeps its place until `deadline_ms`, then ends as that.
    pub delaying: Option<EventKind>,
}

/// A waiter's record: all it asked for, so that whichever front-end releases the lock can
/// grant it in the same write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaiterValue {
    /// The request's uid, unique (see [`HolderValue::uid`]).
    pub uid: String,
    pub id: String,
    pub user: String,
    pub mode: Mode,
    pub ttl_ms: u64,
    /// `Some(grace)` for a session lease.
    pub session_ms: Option<u64>,
    pub fe: String,
    pub conn: u64,
    /// Its front-end's etcd lease, which a session lease granted to it hangs on.
    pub lease: i64,
    pub queued_ms: u64,
    /// The client's `ip:port`, which the holder it becomes carries on; empty: not known.
    pub peer: String,
    /// The note the holder it becomes will have; empty for none.
    pub note: String,
    /// Every name of its set, as [`HolderValue::set`]; empty for one name.
    pub set: Vec<String>,
    /// The lock-delay of the lease it will hold, in milliseconds.
    pub delay_ms: u64,
}

/// What the last change of a name was, with the holder it was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerValue {
    pub kind: EventKind,
    /// The create revision of the holder key that changed.
    pub rev: i64,
    /// The front-end that made the change (it logs and counts it).
    pub fe: String,
    /// For a BREAK: who sent it (its user, its client's `ip:port`); empty otherwise.
    pub by_user: String,
    pub by_peer: String,
}

/// A broken lease's record (`P b/<name>/<token>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenValue {
    /// Who broke it, as the holder is told ([`Origin::who`]).
    pub by: String,
    /// When, in wall-clock milliseconds.
    pub at_ms: u64,
    /// The deadline the lease had: past it the record says nothing any more.
    pub deadline_ms: u64,
}

impl BrokenValue {
    pub fn encode(&self) -> String {
        let mut s = String::new();
        word(&mut s, "by", &self.by);
        word(&mut s, "at", &self.at_ms.to_string());
        word(&mut s, "deadline", &self.deadline_ms.to_string());
        s
    }

    pub fn decode(text: &[u8]) -> Option<BrokenValue> {
        let w = Words::parse(text)?;
        Some(BrokenValue {
            by: w.get("by")?,
            at_ms: w.num("at")?,
            deadline_ms: w.num("deadline")?,
        })
    }
}

impl HolderValue {
    pub fn encode(&self) -> String {
        let mut s = String::new();
        uid_word(&mut s, &self.uid);
        word(&mut s, "id", &self.id);
        word(&mut s, "user", &self.user);
        word(&mut s, "mode", &mode_word(self.mode));
        word(&mut s, "ttl", &self.ttl_ms.to_string());
        word(&mut s, "deadline", &self.deadline_ms.to_string());
        if let Some(grace) = self.session_ms {
            word(&mut s, "session", &grace.to_string());
        }
        word(&mut s, "fe", &self.fe);
        word(&mut s, "conn", &self.conn.to_string());
        word(&mut s, "cut", &self.cut_ms.to_string());
        word(&mut s, "granted", &self.granted_ms.to_string());
        if let Some(waited) = self.waited_ms {
            word(&mut s, "waited", &waited.to_string());
        }
        word(&mut s, "at", &self.at_ms.to_string());
        if !self.peer.is_empty() {
            word(&mut s, "peer", &self.peer);
        }
        if !self.note.is_empty() {
            word(&mut s, "note", &self.note);
        }
        if !self.set.is_empty() {
            word(&mut s, "set", &set_word(&self.set));
        }
        if let Some(by) = &self.broken_by {
            word(&mut s, "broken", by.user().unwrap_or_default());
            if let Some(peer) = by.peer() {
                word(&mut s, "broken_peer", &peer.to_string());
            }
        }
        if self.delay_ms > 0 {
            word(&mut s, "delay", &self.delay_ms.to_string());
        }
        if let Some(kind) = self.delaying {
            word(&mut s, "delaying", kind.as_str());
        }
        s
    }

    pub fn decode(text: &[u8]) -> Option<HolderValue> {
        let w = Words::parse(text)?;
        let ttl_ms: u64 = w.num("ttl")?;
        let deadline_ms: u64 = w.num("deadline")?;
        Some(HolderValue {
            uid: w.get("uid").unwrap_or_default(),
            id: w.get("id")?,
            user: w.get("user").unwrap_or_default(),
            mode: parse_mode(&w.get("mode")?)?,
            ttl_ms,
            deadline_ms,
            session_ms: w.num("session"),
            fe: w.get("fe").unwrap_or_default(),
            conn: w.num("conn").unwrap_or(0),
            cut_ms: w.num("cut").unwrap_or(0),
            granted_ms: w.num("granted").unwrap_or(0),
            waited_ms: w.num("waited"),
            // A record of an older lockd: its deadline was a ttl after its write.
            at_ms: w
                .num("at")
                .unwrap_or_else(|| deadline_ms.saturating_sub(ttl_ms)),
            peer: w.get("peer").unwrap_or_default(),
            note: w.get("note").unwrap_or_default(),
            set: parse_set(w.get("set").as_deref())?,
            broken_by: w.get("broken").map(|user| {
                let peer = w.get("broken_peer").and_then(|p| p.parse().ok());
                Origin::new((!user.is_empty()).then_some(user.as_str()), peer)
            }),
            delay_ms: w.num("delay").unwrap_or(0),
            delaying: w.get("delaying").map(|k| match k.as_str() {
                "dropped" => EventKind::Dropped,
                _ => EventKind::Expired,
            }),
        })
    }

    /// Over for its holder but still in its place: broken (without `force`), or in its
    /// lock-delay. It can't be renewed or taken up again; its holder's UNLOCK, or its
    /// deadline, ends it.
    pub fn lingering(&self) -> bool {
        self.broken_by.is_some() || self.delaying.is_some()
    }

    /// Its note, as STATUS and WATCH show it; `None` for none.
    pub fn note(&self) -> Option<crate::locks::Note> {
        (!self.note.is_empty()).then(|| self.note.as_str().into())
    }

    /// Who took it, as the log and STATUS show it.
    pub fn origin(&self) -> Origin {
        Origin::new(Some(&self.user), self.peer.parse().ok())
    }

    /// How long the lease had left when this record was written (its deadline, or the end
    /// of its grace if sooner), counted on the writer's own clock: a front-end that sees the
    /// write ends the lease no sooner than this long after it saw it, which is never before
    /// its time, whatever the clocks of the writer and of that front-end say.
    pub fn left_ms(&self) -> u64 {
        self.ends_ms().saturating_sub(self.at_ms)
    }

    /// When it ends: its deadline, or the end of its grace if sooner.
    pub fn ends_ms(&self) -> u64 {
        if self.cut_ms > 0 {
            self.deadline_ms.min(self.cut_ms)
        } else {
            self.deadline_ms
        }
    }
}

impl WaiterValue {
    pub fn encode(&self) -> String {
        let mut s = String::new();
        uid_word(&mut s, &self.uid);
        word(&mut s, "id", &self.id);
        word(&mut s, "user", &self.user);
        word(&mut s, "mode", &mode_word(self.mode));
        word(&mut s, "ttl", &self.ttl_ms.to_string());
        if let Some(grace) = self.session_ms {
            word(&mut s, "session", &grace.to_string());
        }
        word(&mut s, "fe", &self.fe);
        word(&mut s, "conn", &self.conn.to_string());
        word(&mut s, "lease", &self.lease.to_string());
        word(&mut s, "queued", &self.queued_ms.to_string());
        if !self.peer.is_empty() {
            word(&mut s, "peer", &self.peer);
        }
        if !self.note.is_empty() {
            word(&mut s, "note", &self.note);
        }
        if !self.set.is_empty() {
            word(&mut s, "set", &set_word(&self.set));
        }
        if self.delay_ms > 0 {
            word(&mut s, "delay", &self.delay_ms.to_string());
        }
        s
    }

    pub fn decode(text: &[u8]) -> Option<WaiterValue> {
        let w = Words::parse(text)?;
        Some(WaiterValue {
            uid: w.get("uid").unwrap_or_default(),
            id: w.get("id")?,
            user: w.get("user").unwrap_or_default(),
            mode: parse_mode(&w.get("mode")?)?,
            ttl_ms: w.num("ttl")?,
            session_ms: w.num("session"),
            fe: w.get("fe").unwrap_or_default(),
            conn: w.num("conn").unwrap_or(0),
            lease: w.num("lease").unwrap_or(0),
            queued_ms: w.num("queued").unwrap_or(0),
            peer: w.get("peer").unwrap_or_default(),
            note: w.get("note").unwrap_or_default(),
            set: parse_set(w.get("set").as_deref())?,
            delay_ms: w.num("delay").unwrap_or(0),
        })
    }

    /// The holder it becomes when granted at `now_ms` (wall clock).
    pub fn holder(&self, now_ms: u64) -> HolderValue {
        HolderValue {
            uid: self.uid.clone(),
            id: self.id.clone(),
            user: self.user.clone(),
            mode: self.mode,
            ttl_ms: self.ttl_ms,
            deadline_ms: now_ms + self.ttl_ms,
            session_ms: self.session_ms,
            fe: self.fe.clone(),
            conn: self.conn,
            cut_ms: 0,
            granted_ms: now_ms,
            waited_ms: Some(now_ms.saturating_sub(self.queued_ms)),
            at_ms: now_ms,
            peer: self.peer.clone(),
            note: self.note.clone(),
            set: self.set.clone(),
            broken_by: None,
            delay_ms: self.delay_ms,
            delaying: None,
        }
    }
}

impl MarkerValue {
    pub fn encode(&self) -> String {
        let mut s = String::new();
        let kind = match self.kind {
            EventKind::Acquired => "acquired",
            EventKind::Released => "released",
            EventKind::Expired => "expired",
            EventKind::Dropped => "dropped",
            EventKind::Revoked => "revoked",
            EventKind::Broken => "broken",
            EventKind::Breaking => "breaking",
        };
        word(&mut s, "kind", kind);
        word(&mut s, "rev", &self.rev.to_string());
        word(&mut s, "fe", &self.fe);
        if !self.by_user.is_empty() {
            word(&mut s, "by_user", &self.by_user);
        }
        if !self.by_peer.is_empty() {
            word(&mut s, "by_peer", &self.by_peer);
        }
        s
    }

    pub fn decode(text: &[u8]) -> Option<MarkerValue> {
        let w = Words::parse(text)?;
        let kind = match w.get("kind")?.as_str() {
            "acquired" => EventKind::Acquired,
            "released" => EventKind::Released,
            "expired" => EventKind::Expired,
            "dropped" => EventKind::Dropped,
            "revoked" => EventKind::Revoked,
            "broken" => EventKind::Broken,
            "breaking" => EventKind::Breaking,
            _ => return None,
        };
        Some(MarkerValue {
            kind,
            rev: w.num("rev")?,
            fe: w.get("fe").unwrap_or_default(),
            by_user: w.get("by_user").unwrap_or_default(),
            by_peer: w.get("by_peer").unwrap_or_default(),
        })
    }
}

/// A superseded waiter's mark: the superseding LOCK's id, and whether it was the waiter's own
/// id (then its request was replaced, as a same-id LOCK replaces, not superseded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupersededValue {
    pub by: String,
    pub same_id: bool,
}

impl SupersededValue {
    pub fn encode(&self) -> String {
        let mut s = String::new();
        word(&mut s, "by", &self.by);
        word(&mut s, "same", if self.same_id { "1" } else { "0" });
        s
    }

    pub fn decode(text: &[u8]) -> Option<SupersededValue> {
        let w = Words::parse(text)?;
        Some(SupersededValue {
            by: w.get("by")?,
            same_id: w.get("same").is_some_and(|v| v == "1"),
        })
    }
}

/// A set's names as one word's value: each percent-encoded (so no name holds a comma), then
/// joined by commas.
fn set_word(names: &[String]) -> String {
    names
        .iter()
        .map(|n| encode(n))
        .collect::<Vec<_>>()
        .join(",")
}

/// [`set_word`] read back: `None` (a record that can't be read) if a name can't be decoded.
fn parse_set(word: Option<&str>) -> Option<Vec<String>> {
    match word {
        None | Some("") => Some(Vec::new()),
        Some(word) => word.split(',').map(decode).collect(),
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

fn mode_word(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "x".into(),
        Mode::Shared => "s".into(),
        Mode::Limit(n) => format!("l{n}"),
    }
}

fn parse_mode(word: &str) -> Option<Mode> {
    match word {
        "x" => Some(Mode::Exclusive),
        "s" => Some(Mode::Shared),
        _ => word.strip_prefix('l')?.parse().ok().map(Mode::limit),
    }
}

/// The uid's word, left out when empty (a record of an older lockd, written again).
fn uid_word(s: &mut String, uid: &str) {
    if !uid.is_empty() {
        word(s, "uid", uid);
    }
}

fn word(s: &mut String, key: &str, value: &str) {
    if !s.is_empty() {
        s.push(' ');
    }
    let _ = write!(s, "{key}={}", encode(value));
}

/// A value's words.
struct Words(Vec<(String, String)>);

impl Words {
    fn parse(text: &[u8]) -> Option<Words> {
        let text = std::str::from_utf8(text).ok()?;
        let mut words = Vec::new();
        for w in text.split(' ').filter(|w| !w.is_empty()) {
            let (k, v) = w.split_once('=')?;
            words.push((k.to_owned(), decode(v)?));
        }
        Some(Words(words))
    }

    fn get(&self, key: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn num<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.get(key)?.parse().ok()
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
