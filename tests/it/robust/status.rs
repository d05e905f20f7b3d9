//! STATUS under clients that ask and never read: the answer streams from one snapshot shared
//! while the table is unchanged, so a stuck reader costs a reference and a bounded buffer,
//! not a copy of the table; and copies of a changing table are bounded by `--status-copies`.

use crate::common;

use std::time::Duration;

use common::{config, field, token, Lockd, Raw, GUARD};

/// A receive buffer small enough that a client that does not read fills it at once.
const SMALL: u32 = 4096;
/// Locks in the table: with long names, a STATUS answer of about 6 MB, more than the kernel
/// buffers of one connection hold, so a client that does not read leaves most of it at lockd.
const LOCKS: usize = 20_000;

/// A name of about 200 bytes that sorts by `i`.
fn name(i: usize) -> String {
    format!("{}{i:06}", "n".repeat(200))
}

/// Takes `LOCKS` long names on `c`, pipelined.
async fn fill(c: &mut Raw) {
    for start in (0..LOCKS).step_by(1000) {
        let batch: String = (start..start + 1000)
            .map(|i| format!("LOCK {} holder-{} ttl=1h\n", name(i), i % 7))
            .collect();
        c.send_raw(batch.as_bytes()).await;
        for _ in 0..1000 {
            token(&c.line().await);
        }
    }
}

/// Reads a whole STATUS answer; checks its shape, order and count; returns the names.
async fn read_status(c: &mut Raw) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        let line = c.line().await;
        if let Some(info) = line.strip_prefix("INFO ") {
            let name = info.split(' ').next().unwrap_or_default().to_owned();
            assert!(info.contains(" held id="), "{line:?}");
            assert!(field(info, "ttl_ms").is_some(), "{line:?}");
            names.push(name);
            continue;
        }
        assert_eq!(line, format!("OK {}", names.len()));
        break;
    }
    assert!(names.windows(2).all(|w| w[0] < w[1]), "not sorted by name");
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_status_readers_cost_bounded_memory() {
    let lockd = Lockd::new().spawn();
    let mut c = lockd.raw().await;
    fill(&mut c).await;
    assert_eq!(c.req("PING").await, "OK PONG");
    let before = lockd.rss_kib();

    // 150 clients ask for everything and never read. Before, each kept a copy of the table
    // while stuck: about 1.4 MB each here, 200 MB in all.
    let mut stuck = Vec::new();
    for _ in 0..150 {
        let mut s = Raw::connect_small(lockd.addr, SMALL).await;
        s.send("STATUS").await;
        stuck.push(s);
    }
    // They have started their answers (more time only makes a copy per reader show more).
    tokio::time::sleep(Duration::from_secs(1)).await;
    for s in stuck.iter_mut().take(3) {
        s.expect_prefix("INFO ").await;
    }
    // Others are served meanwhile.
    assert_eq!(lockd.raw().await.req("PING").await, "OK PONG");
    assert_eq!(c.req("PING").await, "OK PONG");
    let after = lockd.rss_kib();
    assert!(
        after < before + 48 * 1024,
        "lockd grew from {before} KiB to {after} KiB with 150 stuck STATUS readers"
    );

    // A reader that reads again gets the whole answer, in order.
    let mut reader = stuck.pop().expect("a reader");
    assert_eq!(read_status(&mut reader).await.len(), LOCKS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_changing_table_are_bounded() {
    let mut cfg = config();
    cfg.status_copies = 1;
    let server = Lockd::new().config(cfg).serve().await;
    let mut c = server.raw().await;
    fill(&mut c).await;

    // A holds the only copy: it asked and reads no further than the first line.
    let mut a = Raw::connect_small(server.addr, SMALL).await;
    a.send("STATUS").await;
    a.expect_prefix("INFO ").await;
    // The table has not changed: B shares A's copy and is answered at once.
    let mut b = Raw::connect_small(server.addr, SMALL).await;
    b.send("STATUS").await;
    b.expect_prefix("INFO ").await;
    drop(b);

    // Now it has: D needs a copy of its own, and waits for A's to be let go.
    let t = c.lock("zzz-new me").await;
    let mut d = server.raw().await;
    d.send("STATUS").await;
    let early = tokio::time::timeout(Duration::from_millis(500), d.line()).await;
    assert!(early.is_err(), "answered with a second copy: {early:?}");
    // Nothing else waits.
    assert_eq!(server.raw().await.req("PING").await, "OK PONG");
    assert_eq!(
        c.req(&format!("CHECK zzz-new {t}")).await.split(' ').next(),
        Some("OK")
    );

    // A goes away: D gets the table as it is now.
    a.reset();
    let names = tokio::time::timeout(GUARD, read_status(&mut d))
        .await
        .expect("STATUS still waiting after the copy was let go");
    assert_eq!(names.len(), LOCKS + 1);
    assert_eq!(names.last().map(String::as_str), Some("zzz-new"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_snapshot_still_answers_as_of_the_request() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("x me ttl=10s").await;
    c.send("STATUS").await;
    let first = c.line().await;
    c.expect("OK 1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Same table, so the same snapshot; its time left still counts down.
    c.send("STATUS").await;
    let second = c.line().await;
    c.expect("OK 1").await;
    let ms = |l: &str| -> u64 { field(l, "ttl_ms").and_then(|v| v.parse().ok()).unwrap() };
    assert!(ms(&second) + 300 <= ms(&first), "{first:?} then {second:?}");
    // A change is seen by the next STATUS, on this connection and others.
    assert_eq!(c.req(&format!("UNLOCK x {t}")).await, "OK");
    assert_eq!(c.req("STATUS").await, "OK 0");
    assert_eq!(server.raw().await.req("STATUS").await, "OK 0");
    let t = c.lock("y me ttl=10s").await;
    c.send("RENEW y {t} ttl=1h".replace("{t}", &t.to_string()).as_str())
        .await;
    c.expect_prefix("OK ttl_ms=").await;
    let renewed = c.req("STATUS").await;
    assert!(ms(&renewed) > 10_000, "{renewed:?}");
    server.shutdown().await;
}
