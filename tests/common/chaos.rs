//! A fenced-counter chaos run for cluster mode: clients spread over several front-ends take
//! one lock in turn and increment a counter that refuses a token not above the last it saw,
//! while the test breaks things (kills processes, cuts links). Every operation goes into a
//! [`History`]; an observer on a front-end the test leaves alone records the queue and the
//! WATCH events, and the checker judges the whole run at the end.
//!
//! A LOCK whose answer was lost, or answered `ERR UNAVAILABLE`, is sent again with the same
//! id through the next front-end (the same id gets the grant if one was made); so is, half
//! the time, one whose `wait=` (1 to 4 s) ran out. A new LOCK gets a new id.
//!
//! [`Run::start_sets`] runs the same clients over two locks, each protecting a counter of
//! its own: a request takes one of them, or both as a set (`and=`, in either order), and a
//! set's section counts on both counters with the token of each. Its clients pause between
//! requests, so that grants at once race each other as well as hand-overs.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::history::{Call, History, Sharing, Verdict};
use super::line::Line;

/// The one lock every client takes ([`Run::start`]).
const NAME: &str = "counter";

/// The two locks of [`Run::start_sets`].
const SET_NAMES: [&str; 2] = ["left", "right"];

/// How often a LOCK is sent again after a lost answer or `ERR UNAVAILABLE` before the
/// client gives that request up.
const RESENDS: usize = 40;

/// The resource the lock protects: it refuses a token not above the last it saw.
#[derive(Default)]
struct Counter {
    last_token: u64,
    value: u64,
    inside: bool,
    violations: Vec<String>,
    intervals: Vec<(Instant, Instant, u64)>,
}

/// A connection that reports failures instead of panicking: front-ends die under it.
struct Conn(Line);

impl Conn {
    fn open(addr: SocketAddr) -> Option<Conn> {
        Line::open(
            addr,
            Some(Duration::from_secs(1)),
            Some(Duration::from_secs(30)),
        )
        .ok()
        .map(Conn)
    }

    fn req(&mut self, line: &str) -> Option<String> {
        self.0.try_req(line).ok()
    }

    fn line(&mut self) -> Option<String> {
        self.0.try_line().ok()
    }
}

/// The open connection, or a new one to `addrs[at]`; `None` (and the next address, after a
/// pause) if that front-end is down.
fn connected<'a>(
    conn: &'a mut Option<Conn>,
    addrs: &[SocketAddr],
    at: &mut usize,
) -> Option<&'a mut Conn> {
    if conn.is_none() {
        *conn = Conn::open(addrs[*at]);
        if conn.is_none() {
            *at = (*at + 1) % addrs.len();
            thread::sleep(Duration::from_millis(50));
        }
    }
    conn.as_mut()
}

struct Shared {
    history: History,
    /// The locks taken (each with its counter, in `counters`), and whether a request may
    /// take them all at once, as a set.
    names: &'static [&'static str],
    sets: bool,
    counters: Mutex<Vec<Counter>>,
    stop: AtomicBool,
    sections: AtomicU64,
}

impl Shared {
    /// The names the next request takes, in the order it gives them: one lock, or (with
    /// sets) both in either order.
    fn pick(&self, rng: u64) -> Vec<usize> {
        match (self.sets, rng >> 61) {
            (false, _) => vec![0],
            (true, 0 | 1) => vec![0],
            (true, 2 | 3) => vec![1],
            (true, 4 | 5) => vec![0, 1],
            (true, _) => vec![1, 0],
        }
    }
}

/// A chaos run in progress.
pub struct Run {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// What a run did, judged.
pub struct Outcome {
    /// Critical sections completed.
    pub sections: u64,
    pub verdict: Verdict,
    /// What the counter itself saw go wrong (sections overlapping, tokens refused).
    pub counter_violations: Vec<String>,
}

impl Outcome {
    /// Prints the checker's verdict (and what it found), then fails the test if the checker
    /// or the counter found anything.
    pub fn assert_clean(&self) {
        eprintln!("{}", self.verdict);
        for v in &self.verdict.violations {
            eprintln!("  {v}");
        }
        if !self.verdict.trail.is_empty() {
            eprintln!("the ids they name, and what the test did around them:");
            for line in &self.verdict.trail {
                eprintln!("  {line}");
            }
        }
        assert!(
            self.counter_violations.is_empty(),
            "{:#?}",
            self.counter_violations
        );
        assert!(
            self.verdict.violations.is_empty(),
            "{:#?}",
            self.verdict.violations
        );
    }
}

impl Run {
    /// Starts `clients` clients over `addrs` and an observer on `observer` (a front-end the
    /// test leaves alone, so its view is not itself cut off).
    pub fn start(clients: usize, addrs: Vec<SocketAddr>, observer: SocketAddr) -> Run {
        Run::with(&[NAME], false, clients, addrs, observer)
    }

    /// [`Run::start`] over two locks, taken one at a time or both as a set.
    pub fn start_sets(clients: usize, addrs: Vec<SocketAddr>, observer: SocketAddr) -> Run {
        Run::with(&SET_NAMES, true, clients, addrs, observer)
    }

    fn with(
        names: &'static [&'static str],
        sets: bool,
        clients: usize,
        addrs: Vec<SocketAddr>,
        observer: SocketAddr,
    ) -> Run {
        let shared = Arc::new(Shared {
            history: History::new(),
            names,
            sets,
            counters: Mutex::new(names.iter().map(|_| Counter::default()).collect()),
            stop: AtomicBool::new(false),
            sections: AtomicU64::new(0),
        });
        let mut threads: Vec<JoinHandle<()>> = (0..clients)
            .map(|i| {
                let (addrs, shared) = (addrs.clone(), Arc::clone(&shared));
                thread::spawn(move || client(i, addrs, &shared))
            })
            .collect();
        for name in names {
            let s = Arc::clone(&shared);
            threads.push(thread::spawn(move || watch(observer, name, &s)));
            let s = Arc::clone(&shared);
            threads.push(thread::spawn(move || queues(observer, name, &s)));
        }
        Run { shared, threads }
    }

    /// Records in the history what the test does to a process now, for a failure's trail.
    pub fn mark(&self, what: impl Into<String>) {
        self.shared.history.mark(what);
    }

    /// Critical sections completed so far.
    pub fn sections(&self) -> u64 {
        self.shared.sections.load(Ordering::Relaxed)
    }

    /// Stops every client and the observer, and checks the history.
    pub fn finish(self) -> Outcome {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("chaos thread");
        }
        let verdict = self.shared.history.check();
        let mut counters = self.shared.counters.lock().expect("counter");
        let mut violations = Vec::new();
        for (name, k) in self.shared.names.iter().zip(counters.iter_mut()) {
            violations.extend(k.violations.drain(..).map(|v| format!("{name}: {v}")));
            let mut intervals = k.intervals.clone();
            intervals.sort_by_key(|(start, _, _)| *start);
            for pair in intervals.windows(2) {
                if pair[0].1 > pair[1].0 {
                    violations.push(format!(
                        "{name}: sections of tokens {} and {} overlap",
                        pair[0].2, pair[1].2
                    ));
                }
            }
            if k.value as usize != k.intervals.len() {
                violations.push(format!(
                    "{name}: counter {} after {} sections",
                    k.value,
                    k.intervals.len()
                ));
            }
        }
        Outcome {
            sections: self.shared.sections.load(Ordering::Relaxed),
            verdict,
            counter_violations: violations,
        }
    }
}

fn client(i: usize, addrs: Vec<SocketAddr>, shared: &Shared) {
    let history = &shared.history;
    let mut at = i % addrs.len();
    let mut conn: Option<Conn> = None;
    let mut rng = i as u64 * 7919 + 1;
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        n += 1;
        let id = format!("c{i}-{n}");
        rng = next(rng);
        let picked = shared.pick(rng);
        let names: Vec<&str> = picked.iter().map(|&k| shared.names[k]).collect();
        let and: String = names[1..].iter().map(|n| format!(" and={n}")).collect();
        let mut again = false;
        let mut tokens: Option<Vec<u64>> = None;
        for _ in 0..RESENDS {
            if shared.stop.load(Ordering::Relaxed) {
                break;
            }
            let Some(c) = connected(&mut conn, &addrs, &mut at) else {
                continue;
            };
            let call = Call::Lock {
                name: names[0].into(),
                and: names[1..].iter().map(|n| n.to_string()).collect(),
                id: id.clone(),
                again,
                sharing: Sharing::Alone,
            };
            rng = next(rng);
            let wait = 1 + (rng >> 62);
            let reply = history.record(i, call, || {
                c.req(&format!("LOCK {} {id} ttl=10s wait={wait}s{and}", names[0]))
            });
            again = true;
            match reply.as_deref() {
                Some(r) if r.starts_with("OK ") => {
                    // A token per name; a grant with one missing is for the checker to judge.
                    tokens = r[3..].split(' ').map(|t| t.parse().ok()).collect();
                    tokens = tokens.filter(|t| t.len() == names.len());
                    break;
                }
                // Half the time a wait that ran out is asked again, as the same LOCK: a grant
                // made meanwhile (and about to be taken back) is then this client's.
                Some(r) if r.starts_with("ERR TIMEOUT") && rng & 1 == 0 => {}
                // Through the next front-end, as lockctl does.
                Some(r) if r.starts_with("ERR UNAVAILABLE") => {
                    at = (at + 1) % addrs.len();
                    conn = None;
                    thread::sleep(Duration::from_millis(20));
                }
                Some(_) => break,
                None => {
                    conn = None;
                    at = (at + 1) % addrs.len();
                }
            }
        }
        let Some(tokens) = tokens else {
            continue;
        };
        // The critical section, fenced: on each of its names' counters, with that name's token.
        let start = Instant::now();
        {
            let mut counters = shared.counters.lock().expect("counter");
            for (&k, &token) in picked.iter().zip(&tokens) {
                let k = &mut counters[k];
                if k.inside {
                    k.violations.push(format!(
                        "{id} entered with {token} while another was inside"
                    ));
                }
                let last = k.last_token;
                if token <= last {
                    k.violations
                        .push(format!("{id}: token {token} not above {last}"));
                }
                k.inside = true;
                k.last_token = k.last_token.max(token);
                k.value += 1;
            }
        }
        rng = next(rng);
        thread::sleep(Duration::from_millis(1 + (rng >> 60)));
        {
            let mut counters = shared.counters.lock().expect("counter");
            for (&k, &token) in picked.iter().zip(&tokens) {
                counters[k].inside = false;
                counters[k].intervals.push((start, Instant::now(), token));
            }
        }
        shared.sections.fetch_add(1, Ordering::Relaxed);
        // A set is released through its first name, with that name's token.
        let (name, token) = (names[0], tokens[0]);
        // Release, through whichever front-end answers (the lease outlives its front-end).
        for _ in 0..100 {
            let Some(c) = connected(&mut conn, &addrs, &mut at) else {
                continue;
            };
            let call = Call::Unlock {
                name: name.into(),
                token,
            };
            let reply = history.record(i, call, || c.req(&format!("UNLOCK {name} {token}")));
            match reply.as_deref() {
                Some("OK") => break,
                Some(r) if r.starts_with("ERR NOTHELD") => break,
                Some(_) => thread::sleep(Duration::from_millis(50)),
                None => {
                    conn = None;
                    at = (at + 1) % addrs.len();
                }
            }
        }
        if shared.sets {
            // A pause before the next request (0 to 15 ms), so that names are often free
            // and LOCKs race to take them at once, each front-end deciding from its own
            // mirror, rather than always queueing.
            rng = next(rng);
            thread::sleep(Duration::from_millis(rng >> 60));
        }
    }
}

/// A step of the clients' pseudo-random sequence (a fixed seed per client: runs differ only
/// by timing).
fn next(rng: u64) -> u64 {
    rng.wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
}

/// Records every WATCH event of `name`.
fn watch(addr: SocketAddr, name: &str, shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        let Some(mut c) = Conn::open(addr) else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        if c.req(&format!("WATCH {name}")).is_none() {
            continue;
        }
        let _ = c.0.set_read_timeout(Some(Duration::from_millis(100)));
        let mut line = String::new();
        while !shared.stop.load(Ordering::Relaxed) {
            match c.0.read_line_into(&mut line) {
                Ok(0) => break,
                Ok(_) => {
                    shared.history.add_event_line(line.trim_end());
                    line.clear();
                }
                // A partial line stays in `line` until the rest comes.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
    }
}

/// Records the queue of `name` as the observer's front-end shows it, every few milliseconds.
fn queues(addr: SocketAddr, name: &str, shared: &Shared) {
    let mut conn: Option<Conn> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(20));
        if conn.is_none() {
            conn = Conn::open(addr);
        }
        let Some(c) = conn.as_mut() else {
            continue;
        };
        let invoke = shared.history.now();
        let mut lines = Vec::new();
        let mut answered = false;
        let mut next = c.req(&format!("STATUS {name} detail"));
        while let Some(l) = next.take() {
            if l.starts_with("OK ") || l.starts_with("ERR ") {
                answered = true;
                break;
            }
            lines.push(l);
            next = c.line();
        }
        if !answered {
            conn = None;
            continue;
        }
        shared.history.add_detail(name, &lines, invoke);
    }
}
