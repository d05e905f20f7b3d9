//! The index of the session leases this front-end granted or bound, by connection (see
//! `sessions.rs`, which keeps it up to date and ends a closing connection's leases). Part of
//! the core's state: plain data, no I/O.

use super::hashing::HashMap;

use crate::locks::{ConnId, Token};

/// Session leases by connection, and the connection of each.
#[derive(Debug, Default)]
pub(super) struct BoundLeases {
    by_conn: HashMap<ConnId, HashMap<Token, String>>,
    conn_of: HashMap<Token, ConnId>,
}

impl BoundLeases {
    /// Lease `token` of `name` is bound to `conn` from now on.
    pub(super) fn add(&mut self, conn: ConnId, token: Token, name: &str) {
        if let Some(old) = self.conn_of.insert(token, conn) {
            if old != conn {
                self.remove_from(old, token);
            }
        }
        self.by_conn
            .entry(conn)
            .or_default()
            .insert(token, name.to_owned());
    }

    /// Lease `token` ended.
    pub(super) fn ended(&mut self, token: Token) {
        if let Some(conn) = self.conn_of.remove(&token) {
            self.remove_from(conn, token);
        }
    }

    fn remove_from(&mut self, conn: ConnId, token: Token) {
        if let Some(leases) = self.by_conn.get_mut(&conn) {
            leases.remove(&token);
            if leases.is_empty() {
                self.by_conn.remove(&conn);
            }
        }
    }

    /// The leases bound to `conn`, by token, with their names.
    pub(super) fn of(&self, conn: ConnId) -> Option<&HashMap<Token, String>> {
        self.by_conn.get(&conn)
    }

    /// Takes out every lease bound to `conn`.
    pub(super) fn take(&mut self, conn: ConnId) -> HashMap<Token, String> {
        let leases = self.by_conn.remove(&conn).unwrap_or_default();
        for token in leases.keys() {
            self.conn_of.remove(token);
        }
        leases
    }
}

#[cfg(test)]
mod tests {
    use super::BoundLeases;

    fn tokens(b: &BoundLeases, conn: u64) -> Vec<u64> {
        let mut t: Vec<u64> = b
            .by_conn
            .get(&conn)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        t.sort_unstable();
        t
    }

    #[test]
    fn a_lease_is_under_the_connection_it_was_last_bound_to() {
        let mut b = BoundLeases::default();
        b.add(1, 10, "a");
        b.add(1, 11, "b");
        b.add(2, 12, "a");
        assert_eq!(tokens(&b, 1), [10, 11]);
        // Rebound (a RENEW in its grace, or the same id's LOCK) through connection 2.
        b.add(2, 10, "a");
        assert_eq!(tokens(&b, 1), [11]);
        assert_eq!(tokens(&b, 2), [10, 12]);
        // Ended (an UNLOCK, or the watch showing its end).
        b.ended(11);
        assert!(!b.by_conn.contains_key(&1));
        // A close takes what is left, once.
        let taken = b.take(2);
        assert_eq!(taken.len(), 2);
        assert!(b.take(2).is_empty());
        assert!(b.by_conn.is_empty() && b.conn_of.is_empty());
    }
}
