//! The session leases bound to each open connection, kept beside the holders so that a
//! connection's close finds its leases without a scan of the table.
//!
//! Only session leases bound to an open connection are in it (plain leases and session leases
//! in their grace are not), so a table of plain leases pays nothing for it. The table keeps it
//! exact at every change of a holder's binding: a grant, a LOCK of the same id again or a
//! RENEW that binds it, the start of a grace, and every end of a lease (release, expiry,
//! revoke, the close itself).

use std::collections::HashMap;

use super::types::{ConnId, Token};

/// Open connection -> its session leases (token -> the slot of their lock).
#[derive(Debug, Default)]
pub(super) struct Bound {
    by_conn: HashMap<ConnId, HashMap<Token, u32>>,
}

/// Past this many connections' worth of buckets, an emptied index gives its memory back.
const SHRINK_AT: usize = 1024;

impl Bound {
    /// Lease `token` of the lock in `slot` is bound to `conn` from now on.
    pub(super) fn add(&mut self, conn: ConnId, token: Token, slot: u32) {
        self.by_conn.entry(conn).or_default().insert(token, slot);
    }

    /// Lease `token` is no longer bound to `conn`.
    pub(super) fn remove(&mut self, conn: ConnId, token: Token) {
        let Some(leases) = self.by_conn.get_mut(&conn) else {
            return;
        };
        leases.remove(&token);
        if leases.is_empty() {
            self.by_conn.remove(&conn);
            if self.by_conn.is_empty() && self.by_conn.capacity() > SHRINK_AT {
                self.by_conn = HashMap::new();
            }
        }
    }

    /// Lease `token` of `slot` was bound to `from` and is bound to `to` now.
    pub(super) fn moved(
        &mut self,
        token: Token,
        slot: u32,
        from: Option<ConnId>,
        to: Option<ConnId>,
    ) {
        if from == to {
            return;
        }
        if let Some(conn) = from {
            self.remove(conn, token);
        }
        if let Some(conn) = to {
            self.add(conn, token, slot);
        }
    }

    /// Takes out every lease bound to `conn`, in token order (the order they were granted).
    pub(super) fn take(&mut self, conn: ConnId) -> Vec<(Token, u32)> {
        let mut leases: Vec<(Token, u32)> = self
            .by_conn
            .remove(&conn)
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        leases.sort_unstable();
        leases
    }

    /// Whether a session lease is bound to `conn`.
    pub(super) fn holds(&self, conn: ConnId) -> bool {
        self.by_conn.contains_key(&conn)
    }

    /// Every (connection, token, slot), for the tests' comparison with a scan of the holders.
    #[cfg(test)]
    pub(super) fn all(&self) -> std::collections::BTreeSet<(ConnId, Token, u32)> {
        self.by_conn
            .iter()
            .flat_map(|(c, m)| m.iter().map(move |(t, s)| (*c, *t, *s)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    use super::super::{ConnId, LockOutcome, LockRequest, Locks, Mode, Token, NO_USER};
    use crate::locks::Limits;

    /// What the index should hold: a scan of every holder of every lock.
    fn scan(t: &Locks) -> BTreeSet<(ConnId, Token, u32)> {
        let mut all = BTreeSet::new();
        for &slot in t.index.values() {
            let Some(entry) = t.slab.get(slot) else {
                continue;
            };
            for h in entry.holders() {
                if let Some(conn) = h.open_conn() {
                    all.insert((conn, h.token, slot));
                }
            }
        }
        all
    }

    fn req(
        name: &str,
        id: &str,
        session: Option<Duration>,
        conn: ConnId,
        mode: Mode,
    ) -> LockRequest {
        LockRequest {
            name: name.into(),
            id: id.into(),
            ttl: Some(Duration::from_secs(2)),
            wait: None,
            tie: session.map_or(super::super::Tie::Plain, super::super::Tie::Session),
            conn,
            mode,
            user: NO_USER,
            origin: Default::default(),
            note: None,
            supersede: false,
            and: Box::default(),
            delay: None,
        }
    }

    fn granted(out: Result<LockOutcome, crate::locks::TableError>) -> Token {
        match out {
            Ok(LockOutcome::Granted { token, .. }) => token,
            other => panic!("not granted: {other:?}"),
        }
    }

    #[test]
    fn a_close_ends_only_the_session_leases_of_that_connection() {
        let at = Instant::now();
        let mut t = Locks::new(Limits::default(), 1);
        let a = granted(t.lock(at, req("a", "x", Some(Duration::ZERO), 1, Mode::Exclusive)));
        let b = granted(t.lock(at, req("b", "x", Some(Duration::ZERO), 2, Mode::Exclusive)));
        let c = granted(t.lock(at, req("c", "x", None, 1, Mode::Exclusive)));
        assert!(t.holds_sessions(1) && t.holds_sessions(2));
        t.close_connection(at, 1);
        assert!(t.check(at, "a", a).is_err());
        assert!(t.check(at, "b", b).is_ok());
        assert!(t.check(at, "c", c).is_ok());
        assert!(!t.holds_sessions(1));
        assert_eq!(t.bound.all(), scan(&t));
    }

    #[test]
    fn a_lease_follows_its_binding() {
        let at = Instant::now();
        let mut t = Locks::new(Limits::default(), 1);
        let grace = Some(Duration::from_secs(1));
        let a = granted(t.lock(at, req("a", "x", grace, 1, Mode::Exclusive)));
        // Its grace starts: bound to none.
        t.close_connection(at, 1);
        assert!(!t.holds_sessions(1));
        // A RENEW binds it to connection 2.
        assert!(
            t.renew(at, "a", a, (None, false), 2, NO_USER)
                .unwrap()
                .bound
        );
        assert!(t.holds_sessions(2));
        // The same id again, as a plain lease: bound to none.
        assert_eq!(
            granted(t.lock(at, req("a", "x", None, 2, Mode::Exclusive))),
            a
        );
        assert!(!t.holds_sessions(2));
        // And as a session lease again, on connection 3.
        assert_eq!(
            granted(t.lock(at, req("a", "x", grace, 3, Mode::Exclusive))),
            a
        );
        assert!(t.holds_sessions(3));
        assert_eq!(t.bound.all(), scan(&t));
        // Its expiry unbinds it.
        t.expire(at + Duration::from_secs(3));
        assert!(!t.holds_sessions(3));
        assert_eq!(t.bound.all(), scan(&t));
    }

    /// A small deterministic generator, so the test needs no crate.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// After any sequence of operations, the index is exactly what a scan of the holders
    /// finds.
    #[test]
    fn the_index_equals_a_scan_after_any_history() {
        const NAMES: [&str; 3] = ["a", "b", "c"];
        const IDS: [&str; 4] = ["p", "q", "r", "s"];
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let start = Instant::now();
            let mut now = start;
            let limits = Limits {
                max_waiters: 3,
                ..Limits::default()
            };
            let mut t = Locks::new(limits, 1);
            let mut tokens: Vec<(usize, Token)> = Vec::new();
            for _ in 0..200 {
                now += Duration::from_millis(rng.below(400));
                let name = rng.below(3) as usize;
                let conn = 1 + rng.below(3);
                let token = match tokens.len() {
                    0 => 1,
                    n => tokens[rng.below(n as u64) as usize].1,
                };
                match rng.below(8) {
                    0..=2 => {
                        let session = match rng.below(3) {
                            0 => None,
                            1 => Some(Duration::ZERO),
                            _ => Some(Duration::from_millis(700)),
                        };
                        let mode = match rng.below(3) {
                            0 => Mode::Exclusive,
                            1 => Mode::Shared,
                            _ => Mode::Limit(2),
                        };
                        let mut r =
                            req(NAMES[name], IDS[rng.below(4) as usize], session, conn, mode);
                        r.ttl = Some(Duration::from_millis(500 + rng.below(2000)));
                        r.wait = match rng.below(3) {
                            0 => Some(Duration::ZERO),
                            1 => Some(Duration::from_millis(300)),
                            _ => None,
                        };
                        if let Ok(LockOutcome::Granted { token, .. }) = t.lock(now, r) {
                            tokens.push((name, token));
                        }
                    }
                    3 => {
                        let _ = t.unlock(now, NAMES[name], token, NO_USER);
                    }
                    4 => {
                        let _ = t.renew(now, NAMES[name], token, (None, false), conn, NO_USER);
                    }
                    5 => t.close_connection(now, conn),
                    6 => {
                        let _ = t.revoke(now, NAMES[name], token);
                    }
                    _ => t.expire(now),
                }
                // Grants to waiters come back as effects.
                for effect in t.take_effects() {
                    if let crate::locks::Effect::Granted { name, token, .. } = effect {
                        let i = NAMES.iter().position(|n| **n == *name).unwrap_or(0);
                        tokens.push((i, token));
                    }
                }
                assert_eq!(t.bound.all(), scan(&t), "seed {seed}");
            }
            // Every lease ends in time (waiters left are granted and end too): so do their
            // bindings.
            for step in 1..=20 {
                t.expire(now + Duration::from_secs(3 * step));
                t.take_effects();
            }
            assert!(t.is_empty() && t.bound.all().is_empty(), "seed {seed}");
        }
    }
}
