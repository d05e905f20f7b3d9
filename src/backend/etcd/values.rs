//! The records under a holder's and a waiter's key (`keys.rs`): all a lease or a queued
//! request is, so that whichever front-end reads one can renew, end or grant it. Pure, no
//! I/O; written as `key=value` words (`words.rs`).

use crate::locks::{EventKind, LockRequest, Mode, Origin};

use super::words::{mode_word, parse_mode, parse_set, set_word, uid_word, word, Words};

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
    /// The mod revision of the record the BREAK marked (0: not broken, or broken by an older
    /// lockd). Nobody is told of a broken lease any more (no RENEW, no LOCK of its id takes it
    /// up), so a grant handed over at that revision is one no client was told of since: its
    /// take-back still ends it ([`super::delivery::take_back_at`]; simulator seed 140536).
    pub broken_over: i64,
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
            if self.broken_over > 0 {
                word(&mut s, "broken_over", &self.broken_over.to_string());
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
            broken_over: w.num("broken_over").unwrap_or(0),
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
            broken_over: 0,
            delay_ms: self.delay_ms,
            delaying: None,
        }
    }
}

#[cfg(test)]
#[path = "values_tests.rs"]
mod tests;

/// Every name of `req`'s set, in the request's order, as records keep it; empty for a LOCK
/// of one name.
pub(super) fn set_names(req: &LockRequest) -> Vec<String> {
    if req.and.is_empty() {
        return Vec::new();
    }
    std::iter::once(req.name.to_string())
        .chain(req.and.iter().cloned())
        .collect()
}

/// The lock-delay `req` carries, in milliseconds (resolved by [`Cluster::lock`]).
pub(super) fn delay_ms(req: &LockRequest) -> u64 {
    req.delay.map_or(0, |d| d.as_millis() as u64)
}
