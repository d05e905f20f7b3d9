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

mod link;
mod rng;
mod words;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::mem::MemEtcd;
use super::pb;
use super::Error;

pub use link::Link;
pub use rng::Rng;
use words::{status, timed_out};

/// The trace keeps this many of the latest lines.
const TRACE_LINES: usize = 3000;

/// The faults the network makes while they are on ([`Net::faults`]); with them off, every
/// request takes up to `delay` each way and nothing fails.
#[derive(Clone, Debug)]
pub struct Faults {
    /// How long a request or answer takes, at most, most of the time.
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
    /// When a front-end's lease expired (ms since the start).
    lapsed: Vec<(usize, u64)>,
    /// Writes of requests that arrived after their client gave up on them: the front-end,
    /// when (ms since the start), the revision.
    late: Vec<(usize, u64, i64)>,
    /// Each front-end's watches, in order: `Some(from)` for one created from revision `from`,
    /// `None` for one cancelled as compacted (the front-end then reads every lock again).
    watches: Vec<(usize, Option<i64>)>,
    /// Keys deleted by a lease's expiry: their create revision, when (ms since the start),
    /// and the revision of the delete.
    expired_keys: Vec<(i64, u64, i64)>,
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
            self.expired_keys
                .extend(created.into_iter().map(|rev| (rev, now, deleted)));
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
            lapsed: Vec::new(),
            late: Vec::new(),
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

    /// Switches the random faults on or off (cuts and deaths are the caller's).
    pub fn faults(&self, on: bool) {
        let mut w = self.world();
        w.faulty = on;
        w.note(format_args!("faults {}", if on { "on" } else { "off" }));
    }

    /// Cuts front-end `fe` off from etcd, or joins it again.
    pub fn cut(&self, fe: usize, cut: bool) {
        let mut w = self.world();
        w.front(fe).cut = cut;
        w.note(format_args!(
            "fe{fe}: {}",
            if cut {
                "cut off from etcd"
            } else {
                "reaches etcd again"
            }
        ));
    }

    /// Front-end `fe` crashed: nothing it sends arrives any more.
    pub fn kill(&self, fe: usize) {
        let mut w = self.world();
        w.front(fe).dead = true;
        w.note(format_args!("fe{fe}: crashed"));
    }

    /// etcd loses its leader (every request refused) or has one again.
    pub fn leaderless(&self, on: bool) {
        let mut w = self.world();
        w.leaderless = on;
        w.note(format_args!(
            "etcd: {}",
            if on {
                "leader lost, electing"
            } else {
                "leader elected"
            }
        ));
    }

    /// Compacts etcd's history up to its current revision.
    pub fn compact(&self) {
        let mut w = self.world();
        let rev = w.etcd.revision();
        w.etcd.compact(rev);
        w.note(format_args!("etcd: compacted at revision {rev}"));
    }

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

    /// When the key of create revision `rev` was deleted by its etcd lease's expiry, if it
    /// was (a holder's create revision is its token less the cluster's base).
    pub fn expired_key(&self, rev: i64) -> Option<u64> {
        let mut w = self.world();
        w.tick();
        w.expired_keys
            .iter()
            .find(|(r, _, _)| *r == rev)
            .map(|(_, at, _)| *at)
    }

    /// Whether front-end `fe` never saw the key of create revision `rev`, which an etcd
    /// lease's expiry deleted: it read every lock and began to watch only after the key went,
    /// or a compaction cancelled its watch before the key was made and it watched again
    /// (having read every lock) only after the key went. What happened in between, it never
    /// learns.
    pub fn never_saw(&self, fe: usize, rev: i64) -> bool {
        let w = self.world();
        let Some(&(_, _, deleted)) = w.expired_keys.iter().find(|(r, _, _)| *r == rev) else {
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

    /// The writes of requests that arrived after their client gave up on them: the
    /// front-end, when (ms since the start) and the revision of each.
    pub fn late_writes(&self) -> Vec<(usize, u64, i64)> {
        self.world().late.clone()
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

    /// etcd's current revision.
    pub fn revision(&self) -> i64 {
        self.world().etcd.revision()
    }

    /// One request's round trip: out, applied by `apply` (unless refused), back; see the
    /// module's description. `apply` returns the answer and how it went, in words.
    async fn exchange<T, F>(&self, fe: usize, what: String, apply: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut World) -> Result<(T, String), Error> + Send + 'static,
    {
        let (there, back, timeout, lose, reachable) = {
            let mut w = self.world();
            let per_mille = w.faults.lose_per_mille;
            let lose = w.faulty && w.rng.chance(per_mille);
            let reachable = w.reachable(fe);
            (w.delay(), w.delay(), w.request_timeout, lose, reachable)
        };
        if !reachable {
            sleep(timeout).await;
            return Err(timed_out());
        }
        if there >= timeout {
            let net = self.clone();
            tokio::spawn(async move {
                sleep(there).await;
                let before = net.revision();
                if net.arrive(fe, &what, apply, true).is_ok() && net.revision() != before {
                    let mut w = net.world();
                    let (at, rev) = (w.now_ms(), w.etcd.revision());
                    w.late.push((fe, at, rev));
                }
            });
            sleep(timeout).await;
            return Err(timed_out());
        }
        sleep(there).await;
        let result = self.arrive(fe, &what, apply, lose || there + back >= timeout);
        if lose || there + back >= timeout {
            sleep(timeout - there).await;
            return Err(timed_out());
        }
        sleep(back).await;
        result
    }

    /// A request reaches etcd (`lost`: its answer will not reach the client).
    fn arrive<T, F>(&self, fe: usize, what: &str, apply: F, lost: bool) -> Result<T, Error>
    where
        F: FnOnce(&mut World) -> Result<(T, String), Error>,
    {
        let mut w = self.world();
        if !w.reachable(fe) {
            return Err(timed_out());
        }
        if w.leaderless {
            w.note(format_args!("fe{fe}: {what}: refused, no leader"));
            return Err(status(tonic::Code::Unavailable, "etcdserver: no leader"));
        }
        let per_mille = w.faults.fail_per_mille;
        if w.faulty && w.rng.chance(per_mille) {
            let why = match w.rng.below(3) {
                0 => "etcdserver: leader changed",
                1 => "etcdserver: request timed out",
                _ => "etcdserver: too many requests",
            };
            w.note(format_args!("fe{fe}: {what}: refused, not applied ({why})"));
            return Err(status(tonic::Code::Unavailable, why));
        }
        w.tick();
        let result = apply(&mut w);
        let rev = w.etcd.revision();
        let lost = if lost { ", answer lost" } else { "" };
        match &result {
            Ok((_, how)) if how.is_empty() && lost.is_empty() => {}
            Ok((_, how)) => w.note(format_args!("fe{fe}: {what}: {how}{lost} (revision {rev})")),
            Err(e) => w.note(format_args!("fe{fe}: {what}: failed: {e}")),
        }
        result.map(|(t, _)| t)
    }
}
