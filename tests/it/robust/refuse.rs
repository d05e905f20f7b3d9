//! A burst of connections past `--max-connections`: every refused client is told `ERR LIMIT`
//! before the close, and the log says so once per interval with a count, not once per
//! connection.

use crate::common;

use std::net::SocketAddr;

use common::{field, Lockd, Raw};

/// Opens `n` connections at once; each, once all are open, optionally sends a PING, then
/// reads what it gets until the end. Returns each one's lines.
async fn burst(addr: SocketAddr, n: usize, ping_first: bool) -> Vec<Vec<String>> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(Raw::connect(addr).await);
    }
    let mut tasks = Vec::new();
    for mut c in conns {
        tasks.push(tokio::spawn(async move {
            if ping_first {
                c.send("PING").await;
            }
            c.read_to_end().await.0
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.expect("reader"));
    }
    all
}

fn assert_all_refused(replies: &[Vec<String>]) {
    for (i, lines) in replies.iter().enumerate() {
        assert_eq!(lines.len(), 1, "connection {i}: {lines:?}");
        assert!(
            lines[0].starts_with("ERR LIMIT too many connections (max 2)"),
            "connection {i}: {lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_in_a_burst_past_the_limit_is_told() {
    let lockd = Lockd::new().args(["--max-connections", "2"]).spawn();
    let mut a = lockd.raw().await;
    let mut b = lockd.raw().await;
    assert_eq!(a.req("PING").await, "OK PONG");
    assert_eq!(b.req("PING").await, "OK PONG");

    // Far more than the refusals lockd drains at once (64), all open before any reads.
    let quiet = burst(lockd.addr, 200, false).await;
    assert_all_refused(&quiet);
    // Clients that send a request before they read are told too.
    let talkers = burst(lockd.addr, 40, true).await;
    assert_all_refused(&talkers);

    // The two inside were not disturbed.
    assert_eq!(a.req("PING").await, "OK PONG");
    assert_eq!(b.req("PING").await, "OK PONG");
    drop((a, b));

    // Refusals are logged at most once per interval, with a count: here (well within one
    // interval, or a few on a slow machine) a handful of lines that add up to 240.
    let log = lockd.stop();
    let lines: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("connection limit reached"))
        .collect();
    assert!(
        !lines.is_empty() && lines.len() <= 4,
        "refusals logged {} times: {lines:#?}",
        lines.len()
    );
    let counted: u64 = lines
        .iter()
        .map(|l| field(l, "refused").map_or(1, |n| n.parse().expect("a count")))
        .sum();
    assert_eq!(counted, 240, "{lines:#?}");
}
