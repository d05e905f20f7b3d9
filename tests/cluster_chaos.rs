//! Chaos: 18 clients spread over three front-ends take one lock in turn and increment a
//! fenced counter, while front-ends are killed with SIGKILL and restarted and etcd members
//! are killed and restarted (one at a time, so etcd keeps its quorum). Every critical section
//! must see a token above the last one the counter saw, and no two sections may overlap.
#![cfg(feature = "etcd")]

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::etcd::{EtcdCluster, LockdFrontEnd};

const CLIENTS: usize = 18;
const CHAOS: Duration = Duration::from_secs(20);

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
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(addr: SocketAddr) -> Option<Conn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let writer = s.try_clone().ok()?;
        Some(Conn {
            reader: BufReader::new(s),
            writer,
        })
    }

    fn req(&mut self, line: &str) -> Option<String> {
        self.writer.write_all(format!("{line}\n").as_bytes()).ok()?;
        let mut reply = String::new();
        match self.reader.read_line(&mut reply) {
            Ok(n) if n > 0 => Some(reply.trim_end().to_owned()),
            _ => None,
        }
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

fn client(
    i: usize,
    addrs: Vec<SocketAddr>,
    counter: Arc<Mutex<Counter>>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) {
    let id = format!("c{i}");
    let mut at = i % addrs.len();
    let mut conn: Option<Conn> = None;
    let mut rng = i as u64 * 7919 + 1;
    while !stop.load(Ordering::Relaxed) {
        // Ask (again, with the same id, after a lost connection: the same grant comes back).
        let Some(c) = connected(&mut conn, &addrs, &mut at) else {
            continue;
        };
        let reply = c.req(&format!("LOCK counter {id} ttl=10s wait=5s"));
        let token = match reply.as_deref().and_then(|r| r.strip_prefix("OK ")) {
            Some(t) => t.parse::<u64>().expect("token"),
            None => {
                if reply.is_none() {
                    conn = None;
                    at = (at + 1) % addrs.len();
                }
                continue;
            }
        };
        // The critical section, fenced.
        let start = Instant::now();
        {
            let mut k = counter.lock().expect("counter");
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
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        thread::sleep(Duration::from_millis(1 + (rng >> 60)));
        {
            let mut k = counter.lock().expect("counter");
            k.inside = false;
            k.intervals.push((start, Instant::now(), token));
        }
        done.fetch_add(1, Ordering::Relaxed);
        // Release, through whichever front-end answers (the lease outlives its front-end).
        for _ in 0..100 {
            let Some(c) = connected(&mut conn, &addrs, &mut at) else {
                continue;
            };
            match c.req(&format!("UNLOCK counter {token}")).as_deref() {
                Some("OK") => break,
                Some(r) if r.starts_with("ERR NOTHELD") => break,
                Some(_) => thread::sleep(Duration::from_millis(50)),
                None => {
                    conn = None;
                    at = (at + 1) % addrs.len();
                }
            }
        }
    }
}

#[test]
fn a_fenced_counter_sees_no_double_grant_while_processes_die() {
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut fes: Vec<LockdFrontEnd> = (0..3)
        .map(|_| LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "1s"]))
        .collect();
    let addrs: Vec<SocketAddr> = fes.iter().map(LockdFrontEnd::addr).collect();
    let counter = Arc::new(Mutex::new(Counter::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (addrs, counter, stop, done) = (
                addrs.clone(),
                Arc::clone(&counter),
                Arc::clone(&stop),
                Arc::clone(&done),
            );
            thread::spawn(move || client(i, addrs, counter, stop, done))
        })
        .collect();

    let began = Instant::now();
    let mut round = 0usize;
    let mut kills = Vec::new();
    while began.elapsed() < CHAOS {
        thread::sleep(Duration::from_millis(700));
        if round.is_multiple_of(2) {
            let f = (round / 2) % fes.len();
            fes[f].kill();
            kills.push(format!("front-end {f}"));
            thread::sleep(Duration::from_millis(500));
            fes[f].restart();
        } else {
            let m = (round / 2) % 3;
            etcd.kill(m);
            kills.push(format!("etcd member {m}"));
            thread::sleep(Duration::from_millis(800));
            etcd.restart(m);
            etcd.wait_healthy();
        }
        round += 1;
    }
    let during = done.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    let k = counter.lock().expect("counter");
    assert!(k.violations.is_empty(), "{:#?}", k.violations);
    let mut intervals = k.intervals.clone();
    intervals.sort_by_key(|(start, _, _)| *start);
    for pair in intervals.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "sections of tokens {} and {} overlap",
            pair[0].2,
            pair[1].2
        );
    }
    assert_eq!(k.value as usize, k.intervals.len());
    // Progress despite the chaos (a number of hand-overs, not a speed).
    assert!(
        during >= 50,
        "only {during} critical sections in {CHAOS:?} of {kills:?}"
    );
    eprintln!(
        "{} critical sections, {} kills: {kills:?}",
        k.value,
        kills.len()
    );
}
