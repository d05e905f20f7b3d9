//! A simulated etcd for lockd's cluster simulator (its `tests/sim`): the in-memory etcd
//! ([`super::mem`]) behind a network whose every delay, lost answer, failed write, cut and
//! leader election a seeded random source chooses, on tokio's clock. In a simulation that
//! clock is paused (time passes only while every task waits) and everything runs on one
//! thread, so a seed is one run, replayed exactly.
//!
//! What the network does to a request (a transaction, a read, a lease grant): it travels
//! for a while, is applied (or refused: a cut or dead front-end's, one sent while etcd has
//! no leader, or a write that fails without being applied), and its answer travels back or
//! is lost (the client hears a timeout after `--etcd-request-timeout`, though the write was
//! made). A request slower than the timeout is applied when it arrives, after its client
//! gave up on it. Watches deliver the history in batches cut at random revisions, late;
//! keep-alives are answered late or, while cut off, not at all.
//!
//! This file: the world the network and etcd share, and the handle ([`Net`]) the simulator
//! holds; `control.rs`: the faults the simulator's director makes; `observe.rs`: the trace,
//! and what its checker asks of the run; `exchange.rs`: one request's round trip; `link.rs`:
//! one front-end's connection (requests, keep-alives, watch); `words.rs`: what etcd says;
//! `rng.rs`: the random source.

mod control;
mod exchange;
mod link;
mod observe;
mod rng;
mod words;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::mem::MemEtcd;

pub use link::Link;
pub use rng::Rng;

/// The trace keeps this many of the latest lines.
const TRACE_LINES: usize = 3000;

/// The faults the network makes while they are on ([`Net::faults`]); with them off, every
/// request takes up to `delay` each way and nothing fails.
#[derive(Clone, Debug)]
pub struct Faults {
    /// How long a request or answer takes, at most, most of the time. Zero: an instant
    /// network, where a request is applied and answered without waiting for the timer (for
    /// runs in real time, such as the protocol scripts' simulated cluster).
    pub delay: Duration,
    /// Per mille of requests and answers that take up to [`Faults::slow`] instead.
    pub slow_per_mille: u32,
    /// How long a slow request or answer takes, at most.
    pub slow: Duration,
    /// Per mille of writes refused without being applied.
    pub fail_per_mille: u32,
    /// Per mille of requests applied whose answer is lost.
    pub lose_per_mille: u32,
}

impl Default for Faults {
    fn default() -> Faults {
        Faults {
            delay: Duration::from_millis(20),
            slow_per_mille: 20,
            slow: Duration::from_millis(3000),
            fail_per_mille: 30,
            lose_per_mille: 30,
        }
    }
}

/// What became of one front-end's link.
#[derive(Clone, Copy, Debug, Default)]
struct Front {
    /// Cut off from etcd: its requests and keep-alives go unanswered, its watch is silent.
    cut: bool,
    /// Crashed: as cut, for good (a new front-end takes its place under another number).
    dead: bool,
    /// The latest revision its watch brought it: it may know what every write up to it did.
    /// (An answer tells what its own request did, and that the store moved on, not what
    /// another write did: a front-end whose delete finds its waiter's key gone learns from
    /// its watch, or a read, that a grant took it.)
    learned: i64,
    /// When it crashed (ms since the start), if it did.
    crashed_ms: u64,
}

struct World {
    etcd: MemEtcd,
    rng: Rng,
    faults: Faults,
    faulty: bool,
    /// etcd is electing a leader: every request is refused at once.
    leaderless: bool,
    fronts: Vec<Front>,
    request_timeout: Duration,
    start: Instant,
    trace: VecDeque<String>,
    /// Lines noted in all (the run's steps).
    steps: u64,
    /// Which front-end took each lease.
    owners: Vec<(i64, usize)>,
    /// Which front-end's transaction made each revision (in order).
    writers: Vec<(i64, usize)>,
    /// When a front-end's lease expired (ms since the start).
    lapsed: Vec<(usize, u64)>,
    /// Writes of requests that arrived after their client gave up on them: the front-end,
    /// when (ms since the start), the revision.
    late: Vec<(usize, u64, i64)>,
    /// Each front-end's watches, in order: `Some(from)` for one created from revision `from`,
    /// `None` for one cancelled as compacted (the front-end then reads every lock again).
    watches: Vec<(usize, Option<i64>)>,
    /// Keys deleted by a lease's expiry: their create revision, when (ms since the start),
    /// the revision of the delete, and the key (one write may make several keys: a batch's).
    expired_keys: Vec<(i64, u64, i64, Vec<u8>)>,
    /// Writes applied whose answer never reached their front-end (lost, later than its
    /// request timeout, or come after it crashed): the front-end, the revision.
    lost: Vec<(usize, i64)>,
    /// Writes whose answer reached their front-end: the front-end, the revision, when (ms
    /// since the start).
    answered: Vec<(usize, i64, u64)>,
    /// Transactions etcd refused as malformed (a key written twice, or put and deleted, in
    /// one branch): the front-end, when (ms since the start), and the transaction.
    malformed: Vec<(usize, u64, String)>,
}

impl World {
    fn now_ms(&self) -> u64 {
        Instant::now().duration_since(self.start).as_millis() as u64
    }

    /// Time passes in etcd: leases whose time is up expire.
    fn tick(&mut self) {
        let now = self.now_ms();
        for (id, created) in self.etcd.advance(now) {
            let deleted = self.etcd.revision();
            self.expired_keys.extend(
                created
                    .into_iter()
                    .map(|(key, rev)| (rev, now, deleted, key)),
            );
            let owner = self
                .owners
                .iter()
                .find(|(lease, _)| *lease == id)
                .map(|(_, fe)| *fe);
            if let Some(fe) = owner {
                self.lapsed.push((fe, now));
                let rev = self.etcd.revision();
                self.note(format_args!(
                    "etcd: fe{fe}'s lease {id} expired (revision {rev})"
                ));
            }
        }
    }

    fn note(&mut self, what: std::fmt::Arguments<'_>) {
        let ms = self.now_ms();
        let mut line = String::new();
        let _ = write!(line, "{:>4}.{:03}s {what}", ms / 1000, ms % 1000);
        if self.trace.len() == TRACE_LINES {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
        self.steps += 1;
    }

    /// One way's travel time.
    fn delay(&mut self) -> Duration {
        if self.faulty && self.rng.chance(self.faults.slow_per_mille) {
            self.rng.upto(self.faults.slow)
        } else {
            self.rng.upto(self.faults.delay)
        }
    }

    fn front(&mut self, fe: usize) -> &mut Front {
        if self.fronts.len() <= fe {
            self.fronts.resize(fe + 1, Front::default());
        }
        &mut self.fronts[fe]
    }

    /// Front-end `fe`'s watch brought it revision `rev` (unless it crashed meanwhile).
    fn learned(&mut self, fe: usize, rev: i64) {
        let f = self.front(fe);
        if !f.dead {
            f.learned = f.learned.max(rev);
        }
    }

    fn reachable(&mut self, fe: usize) -> bool {
        let f = *self.front(fe);
        !f.cut && !f.dead
    }
}

/// The simulated etcd and its network; cheap to clone (a handle).
#[derive(Clone)]
pub struct Net(Arc<Mutex<World>>);

impl Net {
    /// An empty etcd; front-ends' requests give up after `request_timeout`.
    pub fn new(seed: u64, faults: Faults, request_timeout: Duration) -> Net {
        Net(Arc::new(Mutex::new(World {
            etcd: MemEtcd::new(),
            rng: Rng::new(seed ^ 0x6574_6364),
            faults,
            faulty: false,
            leaderless: false,
            fronts: Vec::new(),
            request_timeout,
            start: Instant::now(),
            trace: VecDeque::new(),
            steps: 0,
            owners: Vec::new(),
            writers: Vec::new(),
            lapsed: Vec::new(),
            late: Vec::new(),
            malformed: Vec::new(),
            lost: Vec::new(),
            answered: Vec::new(),
            watches: Vec::new(),
            expired_keys: Vec::new(),
        })))
    }

    fn world(&self) -> MutexGuard<'_, World> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Front-end `fe`'s connection to etcd.
    pub fn link(&self, fe: usize) -> Link {
        self.world().front(fe);
        Link {
            net: self.clone(),
            fe,
        }
    }
}
