//! The small records that tell the other front-ends what happened: a name's change marker
//! (what the last grant or end was, and by whom), a broken lease's record for its holder,
//! and a superseded waiter's mark. Pure, no I/O; written as `key=value` words (`words.rs`).

use crate::locks::EventKind;

use super::words::{word, Words};

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
    /// Who broke it, as the holder is told ([`crate::locks::Origin::who`]).
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
