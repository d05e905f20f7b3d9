//! Mutual exclusion under contention: many clients, one lock, real TCP.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{wait_status, Lockd, Raw, GUARD};
use lockd::client::Client;
use lockd::proto::Tie;
use tokio::sync::Mutex;

const CLIENTS: usize = 32;
const ROUNDS: usize = 20;

/// One grant as a client saw it: its token and when (on the test's monotonic clock) the
/// client knew it held the lock and when it let go.
#[derive(Clone, Copy, Debug)]
struct Held {
    token: u64,
    start: Instant,
    end: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_never_overlap_and_tokens_increase() {
    let server = Lockd::new().serve().await;
    let addr = server.addr.to_string();
    let log = Arc::new(Mutex::new(Vec::with_capacity(CLIENTS * ROUNDS)));

    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let (addr, log) = (addr.clone(), Arc::clone(&log));
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(&addr).await.expect("connect");
            let id = format!("client-{i}");
            for round in 0..ROUNDS {
                critical_section(&mut c, &id, round, Tie::Plain, &log).await;
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(GUARD * 6, task)
            .await
            .expect("a client hung")
            .expect("a client failed");
    }

    let log = log.lock().await.clone();
    assert_eq!(log.len(), CLIENTS * ROUNDS);
    assert_exclusive(log);
    let mut c = Client::connect(&addr).await.expect("connect");
    assert_eq!(
        c.status(Some("shared")).await.expect("status"),
        ["shared free"]
    );
    server.shutdown().await;
}

/// Asserts the intervals never overlap and tokens increase in grant order.
/// LOCK "shared", hold it across a scheduling point (so overlaps would have room to show),
/// record the interval, UNLOCK.
async fn critical_section(
    c: &mut Client,
    id: &str,
    round: usize,
    tie: Tie,
    log: &Mutex<Vec<Held>>,
) {
    let token = c
        .lock("shared", id, Some(Duration::from_secs(60)), None, tie)
        .await
        .unwrap_or_else(|e| panic!("{id} round {round}: LOCK: {e}"));
    let start = Instant::now();
    tokio::task::yield_now().await;
    let end = Instant::now();
    log.lock().await.push(Held { token, start, end });
    c.unlock("shared", token)
        .await
        .unwrap_or_else(|e| panic!("{id} round {round}: UNLOCK: {e}"));
}

fn assert_exclusive(mut log: Vec<Held>) {
    log.sort_by_key(|h| h.start);
    for pair in log.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(a.end <= b.start, "two holders at once: {a:?} and {b:?}");
        assert!(
            a.token < b.token,
            "tokens must strictly increase in grant order: {a:?} then {b:?}"
        );
    }
}

/// Same, with waiters and holders vanishing (reset connections, session leases) among the
/// clients: the lock is never lost and never shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanishing_clients_neither_lose_nor_share_the_lock() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 12;
    let server = Lockd::new().serve().await;
    let addr = server.addr.to_string();
    let log = Arc::new(Mutex::new(Vec::new()));

    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let (addr, log, sock) = (addr.clone(), Arc::clone(&log), server.addr);
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(&addr).await.expect("connect");
            let id = format!("client-{i}");
            for round in 0..ROUNDS {
                if (i + round) % 4 == 0 {
                    // A ghost: asks, then dies with a reset, granted or not.
                    let mut ghost = Raw::connect(sock).await;
                    ghost.send(&format!("LOCK shared ghost-{i} session")).await;
                    for _ in 0..(i % 3) {
                        tokio::task::yield_now().await;
                    }
                    ghost.reset();
                    continue;
                }
                let tie = match (i + round) % 4 {
                    1 => Tie::Session(Duration::ZERO),
                    2 => Tie::Detach,
                    _ => Tie::Session(Duration::from_secs(1)),
                };
                critical_section(&mut c, &id, round, tie, &log).await;
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(GUARD * 6, task)
            .await
            .expect("a client hung: the lock was lost")
            .expect("a client failed");
    }
    let log = log.lock().await.clone();
    assert_eq!(log.len(), CLIENTS * ROUNDS - CLIENTS * ROUNDS / 4);
    assert_exclusive(log);
    // A ghost granted just before its reset loses its session lease with the connection.
    let mut admin = Raw::connect(server.addr).await;
    wait_status(&mut admin, "shared", |l| l == "OK shared free").await;
    server.shutdown().await;
}
