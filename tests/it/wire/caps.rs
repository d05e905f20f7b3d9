//! The caps that keep one client from starving the rest: connections per address, idle
//! connections, unfinished lines, waiters per lock. Real sockets on loopback only: the "other
//! address" is 127.0.0.2, which is loopback too.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{config, token, wait_status, wait_waiters, Lockd, Raw, GUARD};

/// A connection to `addr` from the local address `from` (port chosen by the kernel).
async fn connect_from(from: &str, addr: SocketAddr) -> Raw {
    Raw::connect_from(from.parse().expect("address"), addr).await
}

/// Asserts `c` is told exactly `want` and then closed cleanly.
async fn assert_told_and_closed(c: &mut Raw, want: &str) {
    let (lines, reset) = c.read_to_end().await;
    assert_eq!(lines, [want], "lines before the close");
    assert!(!reset, "closed with a reset after {lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_address_limit_are_refused_other_addresses_are_not() {
    let mut cfg = config();
    cfg.max_connections_per_ip = 2;
    let server = Lockd::new().config(cfg).serve().await;
    let mut a1 = connect_from("127.0.0.1", server.addr).await;
    let mut a2 = connect_from("127.0.0.1", server.addr).await;
    assert_eq!(a1.req("PING").await, "OK PONG");
    assert_eq!(a2.req("PING").await, "OK PONG");

    let mut a3 = connect_from("127.0.0.1", server.addr).await;
    assert_told_and_closed(
        &mut a3,
        "ERR LIMIT too many connections from this address (max 2); try again later",
    )
    .await;

    // Another address has its own count.
    let mut b1 = connect_from("127.0.0.2", server.addr).await;
    let mut b2 = connect_from("127.0.0.2", server.addr).await;
    assert_eq!(b1.req("PING").await, "OK PONG");
    assert_eq!(b2.req("PING").await, "OK PONG");
    let mut b3 = connect_from("127.0.0.2", server.addr).await;
    b3.expect_prefix("ERR LIMIT too many connections from this address")
        .await;

    // The ones inside were not disturbed, and a closed one frees its address's slot.
    assert_eq!(a1.req("PING").await, "OK PONG");
    assert_eq!(a2.req("QUIT").await, "OK bye");
    a2.expect_eof().await;
    // (From 127.0.0.1, as every test connection that names no address.)
    server
        .wait_for_a_free_slot("the closed connection's slot never came back")
        .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_address_limit_is_a_flag_and_its_refusals_are_logged_once() {
    let lockd = Lockd::new().args(["--max-connections-per-ip", "1"]).spawn();
    let mut inside = lockd.raw().await;
    assert_eq!(inside.req("PING").await, "OK PONG");
    for _ in 0..3 {
        let mut refused = lockd.raw().await;
        assert_told_and_closed(
            &mut refused,
            "ERR LIMIT too many connections from this address (max 1); try again later",
        )
        .await;
    }
    let mut other = connect_from("127.0.0.2", lockd.addr).await;
    assert_eq!(other.req("PING").await, "OK PONG");
    drop((inside, other));
    let log = lockd.stop();
    let lines: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("connection limit per address reached"))
        .collect();
    // Once at the first refusal (naming the address), then one count for the other two.
    assert_eq!(lines.len(), 2, "{log:#?}");
    assert!(lines[0].contains("from=127.0.0.1"), "{lines:#?}");
    assert!(lines[1].contains("refused=2"), "{lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_address_limit_is_never_above_the_connection_limit() {
    let lockd = Lockd::new()
        .args(["--max-connections", "1", "--max-connections-per-ip", "5"])
        .spawn();
    let mut inside = lockd.raw().await;
    assert_eq!(inside.req("PING").await, "OK PONG");
    let mut refused = connect_from("127.0.0.2", lockd.addr).await;
    assert_told_and_closed(
        &mut refused,
        "ERR LIMIT too many connections (max 1); try again later",
    )
    .await;
}

/// How long the idle and line timeouts are in the tests below, and how long a connection
/// that must survive them is left alone: several times over, so a slow machine does not
/// make a test fail.
const SHORT: Duration = Duration::from_millis(300);
const MANY_TIMES_SHORT: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_told_and_closed_unless_it_has_something_going_on() {
    let mut cfg = config();
    cfg.idle_timeout = SHORT;
    let server = Lockd::new().config(cfg).serve().await;

    // Nothing going on; a plain lease outlives its connection, so it does not count.
    let mut quiet = server.raw().await;
    assert_eq!(quiet.req("PING").await, "OK PONG");
    let mut plain = server.raw().await;
    let plain_token = plain.lock("plain me ttl=60s").await;
    // A session lease, a waiting LOCK, a watcher.
    let mut session = server.raw().await;
    let held = session.lock("s holder session ttl=60s").await;
    let mut waiter = server.raw().await;
    waiter.send("LOCK s waiter ttl=60s").await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH s").await, "OK watching s");
    let mut admin = server.raw().await;
    wait_waiters(&mut admin, "s", 1).await;
    drop(admin);

    assert_told_and_closed(&mut quiet, "ERR LIMIT idle for 300ms; closing").await;
    assert_told_and_closed(&mut plain, "ERR LIMIT idle for 300ms; closing").await;
    tokio::time::sleep(MANY_TIMES_SHORT).await;

    // All three are still there and served.
    assert_eq!(session.req("PING").await, "OK PONG");
    assert_eq!(session.req(&format!("UNLOCK s {held}")).await, "OK");
    let granted = token(&waiter.line().await);
    common::assert_event(&watcher.line().await, "released", "s", "holder", held);
    common::assert_event(&watcher.line().await, "acquired", "s", "waiter", granted);
    // The plain lease is still held by its closed connection's client.
    let mut admin = server.raw().await;
    let status = admin.req("STATUS plain").await;
    assert!(status.contains(&format!("token={plain_token}")), "{status}");

    // Having got its grant (a plain lease), the waiter has nothing going on any more.
    assert_told_and_closed(&mut waiter, "ERR LIMIT idle for 300ms; closing").await;
    // The session lease, once released, no longer keeps its connection.
    assert_told_and_closed(&mut session, "ERR LIMIT idle for 300ms; closing").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tls_connection_is_told_inside_tls() {
    let pki = common::pki::Pki::new("caps-idle");
    let (cert, key) = pki.server();
    let mut cfg = config();
    cfg.idle_timeout = SHORT;
    cfg.tls = Some(lockd::tls::server(&cert, &key, None).expect("server TLS"));
    let server = Lockd::new().config(cfg).serve().await;
    let connector = lockd::tls::client(Some(&pki.ca()), None).expect("client TLS");
    let mut c = lockd::client::Client::connect_tls(&server.addr.to_string(), &connector)
        .await
        .expect("TLS connect");
    c.ping().await.expect("PING over TLS");
    let told = tokio::time::timeout(GUARD, c.read_line()).await;
    assert_eq!(
        told.expect("told within the guard").expect("a line"),
        "ERR LIMIT idle for 300ms; closing"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_keep_a_connection_from_being_idle() {
    let mut cfg = config();
    cfg.idle_timeout = Duration::from_secs(1);
    let server = Lockd::new().config(cfg).serve().await;
    let mut c = server.raw().await;
    // A request every 100ms for well over the idle timeout.
    for _ in 0..25 {
        assert_eq!(c.req("PING").await, "OK PONG");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_told_and_closed(&mut c, "ERR LIMIT idle for 1s; closing").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_timeout_of_zero_never_closes() {
    let mut cfg = config();
    cfg.idle_timeout = Duration::ZERO;
    cfg.line_timeout = SHORT;
    let server = Lockd::new().config(cfg).serve().await;
    let mut c = server.raw().await;
    assert_eq!(c.req("PING").await, "OK PONG");
    // Nothing sent, so no unfinished line either: the line timeout does not apply.
    tokio::time::sleep(MANY_TIMES_SHORT).await;
    assert_eq!(c.req("PING").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_line_is_closed_after_the_line_timeout_and_changes_nothing() {
    let mut cfg = config();
    cfg.line_timeout = SHORT;
    let server = Lockd::new().config(cfg).serve().await;
    let mut c = server.raw().await;
    c.send_raw(b"LOCK a").await;
    assert_told_and_closed(&mut c, "ERR LIMIT line not finished within 300ms; closing").await;

    // Trickling the line a byte at a time does not restart the clock.
    let mut trickle = server.raw().await;
    assert_eq!(trickle.req("PING").await, "OK PONG");
    let deadline = tokio::time::Instant::now() + GUARD;
    let mut told = None;
    for byte in b"LOCK a me ttl=30s".iter().cycle() {
        if trickle.try_send_raw(&[*byte]).await.is_err() {
            break;
        }
        let line = tokio::time::timeout(Duration::from_millis(50), trickle.try_line()).await;
        if let Ok(line) = line {
            told = line.ok().flatten();
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never closed");
    }
    assert_eq!(
        told.as_deref(),
        Some("ERR LIMIT line not finished within 300ms; closing")
    );
    trickle.expect_closed().await;

    let mut admin = server.raw().await;
    assert_eq!(admin.req("STATUS a").await, "OK a free");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_finished_in_time_is_served() {
    let mut cfg = config();
    cfg.line_timeout = Duration::from_secs(2);
    let server = Lockd::new().config(cfg).serve().await;
    let mut c = server.raw().await;
    c.send_raw(b"PI").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.send_raw(b"NG\nPING\nPI").await;
    c.expect("OK PONG").await;
    c.expect("OK PONG").await;
    // The rest of the last line, after the first two were answered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(c.req("NG").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_past_max_waiters_is_refused_and_changes_nothing() {
    let mut cfg = config();
    cfg.limits.max_waiters = 2;
    let server = Lockd::new().config(cfg).serve().await;
    let mut holder = server.raw().await;
    let held = holder.lock("w h ttl=60s").await;
    let mut admin = server.raw().await;
    // One at a time: two connections' requests reach the queue in no fixed order.
    let mut first = server.raw().await;
    first.send("LOCK w a ttl=60s").await;
    wait_waiters(&mut admin, "w", 1).await;
    let mut second = server.raw().await;
    second.send("LOCK w b ttl=60s").await;
    wait_waiters(&mut admin, "w", 2).await;

    let mut third = server.raw().await;
    assert_eq!(
        third.req("LOCK w c ttl=60s wait=10s").await,
        "ERR LIMIT w: too many waiters for this lock (max 2)"
    );
    // Nothing changed, the connection stays open, and another lock is not affected.
    let status = admin.req("STATUS w").await;
    assert!(
        status.contains(&format!("token={held} ")) && status.contains(" waiters=2"),
        "{status}"
    );
    assert_eq!(third.req("PING").await, "OK PONG");
    third.lock("other c ttl=60s").await;

    // The queue moves on in order, and there is room again.
    assert_eq!(holder.req(&format!("UNLOCK w {held}")).await, "OK");
    token(&first.line().await);
    wait_waiters(&mut admin, "w", 1).await;
    third.send("LOCK w c ttl=60s").await;
    wait_status(&mut admin, "w", |l| l.contains(" waiters=2")).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_waiters_is_a_flag() {
    let lockd = Lockd::new().args(["--max-waiters", "1"]).spawn();
    let mut holder = lockd.raw().await;
    holder.lock("w h").await;
    let mut first = lockd.raw().await;
    first.send("LOCK w a").await;
    let mut admin = lockd.raw().await;
    wait_waiters(&mut admin, "w", 1).await;
    let mut second = lockd.raw().await;
    assert_eq!(
        second.req("LOCK w b").await,
        "ERR LIMIT w: too many waiters for this lock (max 1)"
    );
}
