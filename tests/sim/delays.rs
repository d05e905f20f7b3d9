//! The lock-delay's promise (proto.md, `delay=`), checked over a run: a session lease that
//! went with its front-end's etcd lease (that front-end crashed, or was cut off past its
//! lease) keeps its name for its delay from then: no other client is granted that name
//! sooner. The one exception proto.md states: a front-end started after the lease went does
//! not know of it.

use std::sync::Mutex;
use std::time::Duration;

/// A hold that ended with its front-end's etcd lease, and the delay its LOCK asked for.
pub struct Lapse {
    pub client: usize,
    pub names: Vec<String>,
    /// When the etcd lease expired (since the start).
    pub at: Duration,
    pub delay: Duration,
}

/// A grant as its client saw it: through which front-end, and when the `OK` came.
pub struct Grant {
    pub client: usize,
    pub names: Vec<String>,
    pub fe: usize,
    pub at: Duration,
}

/// What a run records for the check.
#[derive(Default)]
pub struct Delays {
    pub lapses: Mutex<Vec<Lapse>>,
    pub grants: Mutex<Vec<Grant>>,
    /// When each front-end started, by number.
    pub started: Mutex<Vec<Duration>>,
}

impl Delays {
    pub fn started(&self, fe: usize, at: Duration) {
        let mut started = self.started.lock().unwrap();
        if started.len() <= fe {
            started.resize(fe + 1, Duration::ZERO);
        }
        started[fe] = at;
    }

    /// Grants made within another client's lock-delay, in words.
    pub fn violations(&self) -> Vec<String> {
        let lapses = self.lapses.lock().unwrap();
        let grants = self.grants.lock().unwrap();
        let started = self.started.lock().unwrap();
        let mut out = Vec::new();
        for l in lapses.iter() {
            for g in grants.iter() {
                let same_name = g.names.iter().any(|n| l.names.contains(n));
                let within = g.at > l.at && g.at < l.at + l.delay;
                let knew = started.get(g.fe).is_some_and(|s| *s <= l.at);
                if g.client != l.client && same_name && within && knew {
                    out.push(format!(
                        "c{} was granted {} at {:?} through fe{}, within the {:?} lock-delay of \
                         c{}'s lease that went with its front-end's etcd lease at {:?}",
                        g.client,
                        g.names.join("+"),
                        g.at,
                        g.fe,
                        l.delay,
                        l.client,
                        l.at
                    ));
                }
            }
        }
        out
    }
}
