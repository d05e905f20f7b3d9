//! Promises judged in etcd's own order, which the simulator knows and a history of real
//! times cannot tell (the chaos checker proves "after" only through another grant):
//!
//! - **a grant to a waiter after it was told its wait ended**: its client was answered
//!   `ERR TIMEOUT`, `SUPERSEDED` or `REPLACED` and never sent that LOCK again, yet a holder
//!   key for it was made at a later revision (the lock-features merge's bug: a client told
//!   `TIMEOUT` before its place was out, its front-end killed in between);
//! - **a dead front-end's waiter holding for its ttl**: a grant made after its waiter's
//!   front-end crashed, to a LOCK never sent again since, must end with that front-end's etcd
//!   lease (`dropped`), not run out its ttl (`expired`): nobody can ever be told of it
//!   (81b659c).
//!
//! "After" is by etcd's revision at the moment the client sent or was answered, or the
//! front-end crashed.

use std::sync::Mutex;

use lockd::backend::etcd::sim;
use lockd::backend::Backend;

use crate::history::Seen;

/// A moment in one LOCK's life.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Sent through this front-end.
    Sent(usize),
    /// Answered that its wait ended.
    Told,
}

/// What a run records for the checks, each with etcd's revision at that moment.
#[derive(Default)]
pub struct EtcdOrder {
    /// Every LOCK's sends and wait-ended answers, by id, in the order they happened.
    pub locks: Mutex<Vec<(String, Mark, i64)>>,
    /// A front-end crashed: which.
    pub crashes: Mutex<Vec<(usize, i64)>>,
}

impl EtcdOrder {
    pub fn mark(&self, id: &str, mark: Mark, rev: i64) {
        self.locks.lock().unwrap().push((id.to_owned(), mark, rev));
    }

    /// The violations of both promises in `events` (any live front-end, `front`, reads a
    /// token's revision).
    pub fn violations(&self, front: &Backend, events: &[Seen]) -> Vec<String> {
        let locks = self.locks.lock().unwrap();
        let crashes = self.crashes.lock().unwrap();
        let mut found = Vec::new();
        for e in events {
            let Some(rev) = sim::revision_of(front, e.token) else {
                continue;
            };
            let Some(&(_, last, at)) = locks.iter().rev().find(|l| l.0 == e.id) else {
                continue;
            };
            match (e.kind.as_str(), last) {
                ("acquired", Mark::Told) if rev > at => found.push(format!(
                    "{} was granted {} (token {}, revision {rev}) after it was told its wait \
                     ended (etcd at revision {at})",
                    e.id, e.name, e.token
                )),
                ("expired", Mark::Sent(fe)) => {
                    let crashed = crashes.iter().find(|(f, _)| *f == fe).map(|c| c.1);
                    if crashed.is_some_and(|c| at <= c && c < rev) {
                        found.push(format!(
                            "the grant of {} to {} (token {}), made after its front-end fe{fe} \
                             crashed, sat out its ttl",
                            e.name, e.id, e.token
                        ));
                    }
                }
                _ => {}
            }
        }
        found
    }
}
