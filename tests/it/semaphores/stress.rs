//! Semaphores and shared locks under contention: many clients, one name, real TCP, random
//! short holds from a seeded generator. Each hold is recorded as an interval on the test's
//! monotonic clock, from the moment its client read `OK <token>` to the moment before it sent
//! `UNLOCK`: a subset of the server's lease, so intervals that overlap are real overlaps.

use crate::common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{wait_status, Lockd, Raw, TestServer, GUARD};
use lockd::client::Client;
use lockd::locks::{LockRequest, Mode};
use lockd::proto::{Request, Tie};

/// One hold as its client saw it.
#[derive(Clone, Copy, Debug)]
struct Held {
    token: u64,
    start: Instant,
    end: Instant,
    mode: Mode,
}

/// A small deterministic generator (xorshift64*): the same holds on every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// LOCK `name` in `mode`, hold it for a random 0 to 3 ms (0: one scheduling point), UNLOCK.
async fn hold(c: &mut Client, name: &str, id: &str, mode: Mode, tie: Tie, rng: &mut Rng) -> Held {
    let token = c
        .lock_mode(name, id, Some(Duration::from_secs(60)), None, tie, mode)
        .await
        .unwrap_or_else(|e| panic!("{id}: LOCK {name}: {e}"));
    let start = Instant::now();
    match rng.below(4) {
        0 => tokio::task::yield_now().await,
        ms => tokio::time::sleep(Duration::from_millis(ms)).await,
    }
    let end = Instant::now();
    c.unlock(name, token)
        .await
        .unwrap_or_else(|e| panic!("{id}: UNLOCK {name} {token}: {e}"));
    Held {
        token,
        start,
        end,
        mode,
    }
}

/// The tie of client `i`: plain, session and detach leases take turns.
fn tie(i: usize) -> Tie {
    match i % 3 {
        0 => Tie::Plain,
        1 => Tie::Session(Duration::ZERO),
        _ => Tie::Detach,
    }
}

/// What a client does in one round.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A hold in this mode (see [`hold`]).
    Hold(Mode),
    /// A ghost: a `session` LOCK in this mode on a new connection, which then dies with a
    /// reset after a few scheduling points, granted or not.
    Ghost(Mode),
}

/// Runs `clients` clients of lock `name` for `rounds` rounds each, client `i` with its own
/// generator (seeded `seed + i`) doing `plan(i, round, rng)` each round; returns every
/// hold, once all clients finished.
async fn run_clients(
    server: &TestServer,
    name: &'static str,
    (clients, rounds): (usize, usize),
    seed: u64,
    plan: fn(usize, usize, &mut Rng) -> Step,
) -> Vec<Held> {
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let (addr, sock) = (server.addr.to_string(), server.addr);
            tokio::spawn(async move {
                let mut c = Client::connect(&addr).await.expect("connect");
                let mut rng = Rng::new(seed + i as u64);
                let id = format!("client-{i}");
                let mut held = Vec::with_capacity(rounds);
                for round in 0..rounds {
                    match plan(i, round, &mut rng) {
                        Step::Hold(mode) => {
                            held.push(hold(&mut c, name, &id, mode, tie(i), &mut rng).await)
                        }
                        Step::Ghost(mode) => ghost(sock, name, i, mode, &mut rng).await,
                    }
                }
                held
            })
        })
        .collect();
    let mut log = Vec::new();
    for task in tasks {
        let held = tokio::time::timeout(GUARD * 6, task)
            .await
            .expect("a client hung")
            .expect("a client failed");
        // Tokens grow across the server, so one client's tokens grow too.
        for pair in held.windows(2) {
            assert!(pair[0].token < pair[1].token, "{pair:?}");
        }
        log.extend(held);
    }
    log
}

/// The most intervals open at one instant. An end and a start at the same instant do not
/// overlap (ends sort first).
fn most_at_once(log: &[Held]) -> usize {
    let mut edges: Vec<(Instant, i8)> = log
        .iter()
        .flat_map(|h| [(h.start, 1), (h.end, -1)])
        .collect();
    edges.sort();
    let (mut open, mut most) = (0i64, 0i64);
    for (_, step) in edges {
        open += i64::from(step);
        most = most.max(open);
    }
    usize::try_from(most).unwrap_or(0)
}

fn assert_unique_tokens(log: &[Held]) {
    let tokens: HashSet<u64> = log.iter().map(|h| h.token).collect();
    assert_eq!(tokens.len(), log.len(), "a token was granted twice");
}

async fn ghost(addr: SocketAddr, name: &str, i: usize, mode: Mode, rng: &mut Rng) {
    let mut ghost = Raw::connect(addr).await;
    let lock = Request::Lock(Box::new(LockRequest {
        name: name.into(),
        id: format!("ghost-{i}"),
        tie: Tie::Session(Duration::ZERO),
        mode,
        ..LockRequest::default()
    }));
    ghost.send(&lock.to_string()).await;
    for _ in 0..rng.below(3) {
        tokio::task::yield_now().await;
    }
    ghost.reset();
}

async fn assert_free(addr: SocketAddr, name: &str) {
    let mut admin = Raw::connect(addr).await;
    let free = format!("OK {name} free");
    wait_status(&mut admin, name, |l| l == free).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_three_inside_a_semaphore_of_three() {
    const CLIENTS: usize = 32;
    const ROUNDS: usize = 15;
    let server = Lockd::new().serve().await;
    let log = run_clients(&server, "sem", (CLIENTS, ROUNDS), 1, |_, _, _| {
        Step::Hold(Mode::limit(3))
    })
    .await;

    assert_eq!(log.len(), CLIENTS * ROUNDS);
    assert_unique_tokens(&log);
    let most = most_at_once(&log);
    assert!(most <= 3, "{most} holders at once");
    // Not a mutex in disguise: with 32 clients queued for 3 slots held for milliseconds,
    // slots are held side by side.
    assert!(most >= 2, "the semaphore never had two holders at once");
    assert_free(server.addr, "sem").await;
    server.shutdown().await;
}

/// Readers and writers on one name: a writer's interval never overlaps any other interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_always_alone_among_readers() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 15;
    let server = Lockd::new().serve().await;
    // One hold in four is a writer's.
    let log = run_clients(
        &server,
        "rw",
        (CLIENTS, ROUNDS),
        1000,
        |_, _, rng| match rng.below(4) {
            0 => Step::Hold(Mode::Exclusive),
            _ => Step::Hold(Mode::Shared),
        },
    )
    .await;

    assert_eq!(log.len(), CLIENTS * ROUNDS);
    assert_unique_tokens(&log);
    let writers: Vec<&Held> = log.iter().filter(|h| h.mode == Mode::Exclusive).collect();
    assert!(!writers.is_empty() && writers.len() < log.len());
    for w in &writers {
        for other in log.iter().filter(|o| o.token != w.token) {
            assert!(
                other.end <= w.start || other.start >= w.end,
                "a writer beside another holder: {w:?} and {other:?}"
            );
        }
    }
    assert_free(server.addr, "rw").await;
    server.shutdown().await;
}

/// Waiters and holders that vanish (reset connections with session LOCKs) among the clients
/// of a semaphore: a slot is never lost and never given twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanishing_clients_neither_lose_nor_add_a_slot() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 12;
    let server = Lockd::new().serve().await;
    let log = run_clients(
        &server,
        "sem",
        (CLIENTS, ROUNDS),
        2000,
        |i, round, _| match (i + round) % 4 {
            0 => Step::Ghost(Mode::limit(3)),
            _ => Step::Hold(Mode::limit(3)),
        },
    )
    .await;

    assert_eq!(log.len(), CLIENTS * ROUNDS - CLIENTS * ROUNDS / 4);
    assert_unique_tokens(&log);
    let most = most_at_once(&log);
    assert!(most <= 3, "{most} holders at once");
    // A ghost granted just before its reset loses its session lease with its connection.
    assert_free(server.addr, "sem").await;
    server.shutdown().await;
}
