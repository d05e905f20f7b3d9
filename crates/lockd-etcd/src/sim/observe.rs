//! What the simulator reads from a run: the trace, and the facts its checker asks about
//! (leases lapsed, keys deleted by an expiry or never seen, writes that arrived late, a
//! key's value, the revision), so that it can tell a real violation from what a client
//! could not have known.

use super::super::pb;
use super::Net;
use std::time::Duration;

impl Net {
    /// Adds a line to the trace.
    pub fn note(&self, line: &str) {
        self.world().note(format_args!("{line}"));
    }

    /// The latest lines of the trace.
    pub fn trace(&self) -> Vec<String> {
        self.world().trace.iter().cloned().collect()
    }

    /// How many steps the run took (every request, answer, delivery and fault).
    pub fn steps(&self) -> u64 {
        self.world().steps
    }

    /// When a lease of front-end `fe` expired at or after `since_ms` (ms since the start),
    /// the first such time: the session leases it granted ended then.
    pub fn lapsed(&self, fe: usize, since_ms: u64) -> Option<u64> {
        let mut w = self.world();
        w.tick();
        w.lapsed
            .iter()
            .filter(|(f, at)| *f == fe && *at >= since_ms)
            .map(|(_, at)| *at)
            .min()
    }

    /// When the key under `under` of create revision `rev` was deleted by its etcd lease's
    /// expiry, if it was (a holder's create revision is its token less the cluster's base;
    /// other keys made in the same write share it).
    pub fn expired_key(&self, rev: i64, under: &str) -> Option<u64> {
        let mut w = self.world();
        w.tick();
        w.expired_keys
            .iter()
            .find(|(r, _, _, key)| *r == rev && key.starts_with(under.as_bytes()))
            .map(|(_, at, _, _)| *at)
    }

    /// Whether front-end `fe` never saw the key of create revision `rev`, which an etcd
    /// lease's expiry deleted: it read every lock and began to watch only after the key went,
    /// or a compaction cancelled its watch before the key was made and it watched again
    /// (having read every lock) only after the key went. What happened in between, it never
    /// learns.
    pub fn never_saw(&self, fe: usize, rev: i64, under: &str) -> bool {
        let w = self.world();
        let expired = w
            .expired_keys
            .iter()
            .find(|(r, _, _, key)| *r == rev && key.starts_with(under.as_bytes()));
        let Some(&(_, _, deleted, _)) = expired else {
            return false;
        };
        let mine: Vec<Option<i64>> = w
            .watches
            .iter()
            .filter(|(f, _)| *f == fe)
            .map(|(_, from)| *from)
            .collect();
        // Its first watch came after the key went: it read every lock only then (a front-end
        // that started as the key went, at the same moment by the clock; simulator seed
        // 170563).
        if mine
            .iter()
            .flatten()
            .next()
            .is_some_and(|from| *from > deleted)
        {
            return true;
        }
        // A watch from `from` that was cancelled, then the next one from `again`.
        mine.windows(3).any(|ws| match ws {
            [Some(from), None, Some(again)] => *from <= rev && *again > deleted,
            _ => false,
        })
    }

    /// A write of front-end `fe` at revision `from` or later whose answer was lost, and which
    /// `fe`'s watch had not brought it by the time it crashed: its revision. What such a
    /// write made, `fe` had not learned.
    pub fn never_learned(&self, fe: usize, from: i64) -> Option<i64> {
        let mut w = self.world();
        let f = *w.front(fe);
        if !f.dead {
            return None;
        }
        w.lost
            .iter()
            .find(|(f2, rev)| *f2 == fe && *rev >= from && *rev > f.learned)
            .map(|(_, rev)| *rev)
    }

    /// A write of front-end `fe` at revision `from` or later whose answer reached it at most
    /// `within` before it crashed, with no later write of it applied in between: its revision.
    /// What that answer called for (a take-back), `fe` had no time to do.
    pub fn crashed_on_answer(&self, fe: usize, from: i64, within: Duration) -> Option<i64> {
        let mut w = self.world();
        let f = *w.front(fe);
        if !f.dead {
            return None;
        }
        let last_write = w
            .writers
            .iter()
            .filter(|(_, by)| *by == fe)
            .map(|(rev, _)| *rev)
            .max()?;
        w.answered
            .iter()
            .find(|(by, rev, at)| {
                *by == fe
                    && *rev >= from
                    && *rev == last_write
                    && f.crashed_ms.saturating_sub(*at) <= within.as_millis() as u64
            })
            .map(|(_, rev, _)| *rev)
    }

    /// The front-end whose transaction made revision `rev` (a grant's holder key was
    /// made by the front-end that decided the grant, whichever front-end its client was
    /// answered through; a holder's create revision is its token less the cluster's base).
    pub fn writer_of(&self, rev: i64) -> Option<usize> {
        let w = self.world();
        let at = w.writers.binary_search_by_key(&rev, |(r, _)| *r).ok()?;
        Some(w.writers[at].1)
    }

    /// The writes of requests that arrived after their client gave up on them: the
    /// front-end, when (ms since the start) and the revision of each.
    pub fn late_writes(&self) -> Vec<(usize, u64, i64)> {
        self.world().late.clone()
    }

    /// The transactions etcd refused as malformed (a key written twice in one branch, or put
    /// and deleted): the front-end, when (ms since the start), the transaction. A front-end
    /// never means to send one: etcd refuses the whole write, so what it was for (an UNLOCK,
    /// a grant) fails for a reason no retry mends.
    pub fn malformed(&self) -> Vec<(usize, u64, String)> {
        self.world().malformed.clone()
    }

    /// Puts `key` as an operator (or an older lockd) did before the run began: no fault, no
    /// delay.
    pub fn put(&self, key: &str, value: &str) {
        let txn = crate::Txn::new().and_then([crate::TxnOp::put(key, value, None)]);
        let put = self.world().etcd.apply(&txn);
        assert!(put.is_ok(), "the in-memory etcd refused a lone put");
    }

    /// The value of `key`, if it exists.
    pub fn value(&self, key: &str) -> Option<String> {
        let req = pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        };
        let resp = self.world().etcd.range(&req);
        let kv = resp.kvs.first()?;
        Some(String::from_utf8_lossy(&kv.value).into_owned())
    }

    /// Every key under `prefix` with its create revision, in key order, and etcd's revision
    /// they are as of.
    pub fn keys(&self, prefix: &str) -> (i64, Vec<(String, i64)>) {
        let mut w = self.world();
        w.tick();
        let req = pb::RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: crate::options::prefix_end(prefix.as_bytes()),
            ..Default::default()
        };
        let kvs = w.etcd.range(&req).kvs;
        let keys = kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    kv.create_revision,
                )
            })
            .collect();
        (w.etcd.revision(), keys)
    }

    /// etcd's current revision.
    pub fn revision(&self) -> i64 {
        self.world().etcd.revision()
    }
}
