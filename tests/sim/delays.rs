//! The lock-delay's promise (proto.md, `delay=`), checked over a run: a session lease that
//! went with its front-end's etcd lease (that front-end crashed, or was cut off past its
//! lease) keeps its name for its delay from then: no other client is granted that name
//! sooner. The exceptions proto.md states: a front-end started after the lease went does not
//! know of it, nor one whose watch an etcd compaction cancelled before the lease began, if
//! it read every lock again only after the lease's key went (it never saw the lease).

use std::sync::Mutex;
use std::time::Duration;

use crate::history::Sharing;

/// Where holder keys are (the simulator's prefix, `run::config`): a holder's token names its
/// key's create revision, which other keys made in the same write share (a set's keys, and
/// on a dense prefix other names' grants: `src/backend/etcd/tokens.rs`), so a hold's key is
/// found by its name and that revision.
const HOLDERS: &str = "/lockd-sim/h/";

/// Where the holder keys of `name` are (the simulator's names need no percent-encoding).
fn holders_of(name: &str) -> String {
    format!("{HOLDERS}{name}/")
}

/// A hold of a lease with a lock-delay.
pub struct Hold {
    pub client: usize,
    pub names: Vec<String>,
    /// Its holder key's create revision.
    pub rev: i64,
    pub delay: Duration,
    /// How it held: a share's delay keeps the name from exclusive holders only.
    pub sharing: Sharing,
}

/// A grant as its client saw it: through which front-end, and when the `OK` came.
pub struct Grant {
    pub client: usize,
    pub names: Vec<String>,
    pub token: u64,
    /// Its holder key's create revision, as the answering front-end reads the token.
    pub rev: Option<i64>,
    pub fe: usize,
    pub at: Duration,
    pub sharing: Sharing,
}

/// What a run records for the check.
#[derive(Default)]
pub struct Delays {
    pub holds: Mutex<Vec<Hold>>,
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
    pub fn violations(
        &self,
        net: &lockd_etcd::sim::Net,
        events: &[crate::history::Seen],
    ) -> Vec<String> {
        let holds = self.holds.lock().unwrap();
        let grants = self.grants.lock().unwrap();
        let started = self.started.lock().unwrap();
        let mut out = Vec::new();
        for l in holds.iter() {
            // The next holder of each of its names is the one the delay is for (after a
            // grant through a front-end that could not know, the name is handed on as usual).
            for name in &l.names {
                // Its key went with an etcd lease's expiry (not by a write): the delay runs
                // from then.
                let Some(went) = net.expired_key(l.rev, &holders_of(name)) else {
                    continue;
                };
                let went = Duration::from_millis(went);
                // A grant that may sit beside the lease in its delay (a share beside a
                // share, a semaphore's slot beside another) is no violation, and no hand-over.
                let after: Vec<&Grant> = grants
                    .iter()
                    .filter(|g| g.at > went && g.client != l.client && g.names.contains(name))
                    .collect();
                let beside = |token: u64| {
                    after
                        .iter()
                        .any(|g| g.token == token && fits_beside(l.sharing, g.sharing))
                };
                let next = after
                    .iter()
                    .filter(|g| !fits_beside(l.sharing, g.sharing))
                    .min_by_key(|g| g.at);
                let Some(g) = next else {
                    continue;
                };
                // The first lease of the name after it went, as the front-ends' events show
                // it: if it is no grant a client was told of (one given up on, taken back),
                // which front-end decided it can't be told here, nor whether it knew.
                let first = events
                    .iter()
                    .filter(|e| e.kind == "acquired" && e.name == *name && e.at > went)
                    .filter(|e| !beside(e.token))
                    .min_by_key(|e| e.at);
                if first.is_some_and(|e| e.token != g.token) {
                    continue;
                }
                // What the front-end that decided the grant knew: the one whose write made
                // the holder key, which may not be the one that answered (a LOCK sent again
                // through another front-end takes up the grant its first try was given;
                // simulator seeds 303335, 623408).
                let fe = g.rev.and_then(|rev| net.writer_of(rev)).unwrap_or(g.fe);
                let within = g.at < went + l.delay;
                let started_before = started.get(fe).is_some_and(|s| *s <= went);
                let knew = started_before && !net.never_saw(fe, l.rev, &holders_of(name));
                if within && knew {
                    let through = if fe == g.fe {
                        format!("through fe{fe}")
                    } else {
                        format!("decided by fe{fe}, answered through fe{}", g.fe)
                    };
                    out.push(format!(
                        "c{} was granted {name} at {:?} {through}, within the {:?} lock-delay \
                         of c{}'s lease that went with an etcd lease at {went:?}",
                        g.client, g.at, l.delay, l.client,
                    ));
                }
            }
        }
        out
    }
}

/// Whether a grant held as `next` may sit beside a lease held as `delayed` in its lock-delay:
/// the delayed lease still holds the name in its way. (A semaphore's slots are not counted:
/// a grant of a slot beside a delayed one is taken as fitting.)
fn fits_beside(delayed: Sharing, next: Sharing) -> bool {
    match (delayed, next) {
        (Sharing::Shared, Sharing::Shared) => true,
        (Sharing::Slots(a), Sharing::Slots(b)) => a == b,
        _ => false,
    }
}
