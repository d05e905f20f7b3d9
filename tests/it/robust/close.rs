//! When lockd ends a connection itself (an over-long line, QUIT) while the client still has
//! input on its way, every reply sent before the close still reaches the client: the close is
//! a FIN after the replies, not a reset that destroys them.

use crate::common;

use std::time::Duration;

use common::{config, status_shape, token, wait_status, Lockd, Raw, TestServer};

/// A receive buffer small enough that the replies wait in the kernel until the client reads.
const SMALL: u32 = 4096;
/// Requests before the one that matters: their replies (24 KB) are more than the client's
/// receive window, so some are still queued at lockd's side when it closes.
const BEFORE: usize = 3000;

/// Checks the replies: `BEFORE` PONGs, the `OK <token>` of a LOCK of `name`, then a line
/// starting with `last`; and that the lock is held with that token.
async fn assert_every_reply(server: &TestServer, lines: &[String], name: &str, last: &str) {
    assert_eq!(lines.len(), BEFORE + 2, "{:?}", lines.last());
    assert!(lines[..BEFORE].iter().all(|l| l == "OK PONG"));
    let t = token(&lines[BEFORE]);
    assert!(lines[BEFORE + 1].starts_with(last), "{:?}", lines.last());
    // The lock the client was told about is the one held.
    let status = server.raw().await.req(&format!("STATUS {name}")).await;
    assert_eq!(
        status_shape(&status),
        format!("OK {name} held id=me token={t} ttl_ms=* session=0 waiters=0")
    );
}

/// Sends `requests` in one write, waits for lockd to have acted on them, and only then
/// reads: the lines up to the end of the connection, which must be a clean EOF.
async fn send_then_read(c: &mut Raw, requests: &[u8]) -> Vec<String> {
    c.send_raw(requests).await;
    // Long enough for lockd to answer, close and (without a drain) reset the connection.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (lines, reset) = c.read_to_end().await;
    assert!(
        !reset,
        "lockd reset the connection after {} lines, the last {:?}",
        lines.len(),
        lines.last()
    );
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_before_an_over_long_line_are_delivered() {
    let mut cfg = config();
    cfg.max_line = 256;
    let server = Lockd::new().config(cfg).serve().await;
    let mut c = Raw::connect_small(server.addr, SMALL).await;
    let mut requests = "PING\n".repeat(BEFORE);
    requests.push_str("LOCK n me ttl=30s\n");
    // 64 KB without a line end: lockd refuses it after max_line and leaves the rest unread.
    requests.push_str(&"x".repeat(64 * 1024));
    let lines = send_then_read(&mut c, requests.as_bytes()).await;
    assert_every_reply(&server, &lines, "n", "ERR TOOLONG ").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_with_more_input_behind_it_still_gets_every_reply() {
    let server = Lockd::new().serve().await;
    let mut c = Raw::connect_small(server.addr, SMALL).await;
    let mut requests = "PING\n".repeat(BEFORE);
    requests.push_str("LOCK q me ttl=30s\nQUIT\n");
    requests.push_str(&"PING\n".repeat(2000));
    let lines = send_then_read(&mut c, requests.as_bytes()).await;
    assert_every_reply(&server, &lines, "q", "OK bye").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lease_ends_at_quit_though_the_client_keeps_its_side_open() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    c.lock("s me session").await;
    // QUIT, then the client keeps its side open: lockd waits a moment for it to close (or
    // for more input to discard), but the session lease ends with the OK bye.
    assert_eq!(c.req("QUIT").await, "OK bye");
    c.expect_eof().await;
    let mut admin = server.raw().await;
    wait_status(&mut admin, "s", |l| l == "OK s free").await;
    server.shutdown().await;
}
