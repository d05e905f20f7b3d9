//! Clients that stop reading: watchers that never read are disconnected (lag is noticed while
//! the write is stuck), and any reply left unread past `--write-timeout` ends the connection,
//! without holding up anyone else or growing the server's memory.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{config, token, Lockd, Raw, GUARD};

/// A receive buffer small enough that a client that does not read fills it at once.
const SMALL: u32 = 4096;

/// Locks and unlocks `rounds * 500` long names on `c`, pipelined: two events of about 500
/// bytes each per name. Returns the number of events.
async fn churn(c: &mut Raw, rounds: usize) -> usize {
    let id = "i".repeat(200);
    for round in 0..rounds {
        let names: Vec<String> = (0..500)
            .map(|i| format!("{}{round:03}{i:04}", "n".repeat(240)))
            .collect();
        let batch: String = names.iter().map(|n| format!("LOCK {n} {id}\n")).collect();
        c.send_raw(batch.as_bytes()).await;
        let mut tokens = Vec::new();
        for _ in &names {
            tokens.push(token(&c.line().await));
        }
        let batch: String = names
            .iter()
            .zip(&tokens)
            .map(|(n, t)| format!("UNLOCK {n} {t}\n"))
            .collect();
        c.send_raw(batch.as_bytes()).await;
        for _ in &names {
            c.expect("OK").await;
        }
    }
    rounds * 1000
}

/// A watcher with a small receive buffer that has been told `OK watching *`.
async fn small_watcher(addr: SocketAddr) -> Raw {
    let mut w = Raw::connect_small(addr, SMALL).await;
    assert_eq!(w.req("WATCH").await, "OK watching *");
    w
}

/// Only events, fewer than half of the `sent`, then at most an `ERR LAGGED` as the last line.
fn assert_cut_off(lines: &[String], sent: usize) {
    let events = lines.iter().filter(|l| l.starts_with("EVENT ")).count();
    for (i, line) in lines.iter().enumerate() {
        let last = i + 1 == lines.len();
        assert!(
            line.starts_with("EVENT ") || (last && line.starts_with("ERR LAGGED ")),
            "unexpected line {i} of {}: {line:?}",
            lines.len()
        );
    }
    assert!(
        events < sent / 2,
        "the watcher was not cut off: {events} of {sent} events"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_that_never_read_are_disconnected() {
    // A short write timeout, so the lagged watchers' connections, whose ERR LAGGED can't be
    // written, are closed soon and the test can see lockd let go of them.
    let lockd = Lockd::new()
        .args(["--watch-buffer", "64", "--write-timeout", "1s"])
        .spawn();
    let mut admin = lockd.raw().await;
    assert_eq!(admin.req("PING").await, "OK PONG");
    let idle_fds = lockd.open_fds();
    let idle_rss = lockd.rss_kib();

    const WATCHERS: usize = 8;
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        watchers.push(small_watcher(lockd.addr).await);
    }
    let mut worker = lockd.raw().await;
    // 20,000 events of about 500 bytes: 10 MB for each watcher, far more than its socket holds.
    let sent = tokio::time::timeout(Duration::from_secs(120), churn(&mut worker, 20))
        .await
        .expect("lock and unlock stalled behind watchers that do not read");
    let busy_rss = lockd.rss_kib();

    // lockd closed every watcher's connection on its own, though none of them read.
    lockd
        .wait_fds("watchers still connected", |fds| fds <= idle_fds + 1)
        .await;
    assert!(
        busy_rss < idle_rss + 64 * 1024,
        "lockd grew from {idle_rss} KiB to {busy_rss} KiB"
    );
    // Everyone else was unaffected.
    assert_eq!(worker.req("STATUS").await, "OK 0");
    assert_eq!(admin.req("PING").await, "OK PONG");
    assert_eq!(lockd.raw().await.req("PING").await, "OK PONG");

    // What the watchers can still read is a few events, then the end.
    for mut w in watchers {
        let (lines, _) = w.read_to_end().await;
        assert_cut_off(&lines, sent);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagged_watcher_that_reads_again_is_told_why() {
    let mut cfg = config();
    cfg.watch_buffer = 16;
    let server = Lockd::new().config(cfg).serve().await;
    let mut watchers = Vec::new();
    for _ in 0..4 {
        watchers.push(small_watcher(server.addr).await);
    }
    let mut worker = server.raw().await;
    let sent = churn(&mut worker, 4).await;
    // Within the write timeout they read: what was queued, then ERR LAGGED, then EOF.
    for mut w in watchers {
        let (lines, reset) = w.read_to_end().await;
        assert!(!reset, "the close was a reset");
        assert_cut_off(&lines, sent);
        let last = lines.last().expect("a line");
        assert!(last.starts_with("ERR LAGGED "), "{last:?}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_behind_its_window_is_disconnected_by_the_write_timeout() {
    // Never more than --watch-buffer events behind (the buffer is huge), but the client
    // takes nothing for longer than the write timeout.
    let mut cfg = config();
    cfg.watch_buffer = 100_000;
    cfg.write_timeout = Duration::from_millis(500);
    let server = Lockd::new().config(cfg).serve().await;
    let mut w = small_watcher(server.addr).await;
    let mut worker = server.raw().await;
    // 15 MB of events: more than the kernel buffers for one socket (a few MB).
    let sent = churn(&mut worker, 30).await;
    // No more events come; without the timeout the stream would now sit there forever, so
    // reading to its end would hit the guard.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (lines, _) = w.read_to_end().await;
    assert_cut_off(&lines, sent);
    assert_eq!(worker.req("PING").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_stops_reading_replies_is_disconnected() {
    // One connection slot: the stuck client holds it until lockd gives up on it.
    let mut cfg = config();
    cfg.max_connections = 1;
    cfg.write_timeout = Duration::from_millis(500);
    let server = Lockd::new().config(cfg).serve().await;
    let mut hog = Raw::connect_small(server.addr, SMALL).await;
    assert_eq!(hog.req("PING").await, "OK PONG");
    // Far more replies than the sockets hold (12 MB), never read.
    const PINGS: usize = 1_500_000;
    let pings = "PING\n".repeat(PINGS);
    let hog = tokio::spawn(async move {
        let _ = tokio::time::timeout(GUARD, hog.try_send_raw(pings.as_bytes())).await;
        hog
    });
    // Until then, others are refused; soon, the slot is free again.
    server
        .wait_for_a_free_slot("the client that does not read still holds its connection")
        .await;
    let mut hog = hog.await.unwrap();
    let (lines, _) = hog.read_to_end().await;
    assert!(lines.len() < PINGS, "every reply was written");
    assert!(lines.iter().all(|l| l == "OK PONG"), "only replies");
    server.shutdown().await;
}
