//! The protocol as proto.md writes it: exact reply lines over real TCP, one server per test.

use crate::common;

mod bad_input;
mod caps;

use std::time::Duration;

use common::{
    assert_event, config, field, status_shape, token, wait_status, wait_waiters, Lockd, Raw,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_lock_is_granted_at_once() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("build alice").await;
    assert!(t > 0);
    let status = c.req("STATUS build").await;
    assert_eq!(
        status_shape(&status),
        format!("OK build held id=alice token={t} ttl_ms=* session=0 waiters=0")
    );
    let left: u64 = field(&status, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(left > 0 && left <= 30_000, "default ttl is 30s: {status}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_fifo_order_one_at_a_time() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let mut token0 = holder.lock("q h").await;

    let mut waiters = Vec::new();
    for i in 1..=4 {
        let mut w = server.raw().await;
        w.send(&format!("LOCK q w{i}")).await;
        // Queue them in a known order: each is in the queue before the next is sent.
        wait_waiters(&mut admin, "q", i).await;
        waiters.push(w);
    }

    assert_eq!(holder.req(&format!("UNLOCK q {token0}")).await, "OK");
    for (i, w) in waiters.iter_mut().enumerate() {
        let t = token(&w.line().await);
        assert!(t > token0, "tokens must increase: {t} after {token0}");
        // Exactly the head was granted: it holds, the rest still wait.
        let status = admin.req("STATUS q").await;
        let left = 4 - i - 1;
        assert_eq!(
            status_shape(&status),
            format!(
                "OK q held id=w{} token={t} ttl_ms=* session=0 waiters={left}",
                i + 1
            )
        );
        assert_eq!(w.req(&format!("UNLOCK q {t}")).await, "OK");
        token0 = t;
    }
    assert_eq!(admin.req("STATUS q").await, "OK q free");
    // Each waiter got exactly one reply: the next line on each is the answer to PING.
    for w in &mut waiters {
        assert_eq!(w.req("PING").await, "OK PONG");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_hands_the_lock_to_the_next_waiter() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut a = server.raw().await;
    let ta = a.lock("e a ttl=300ms").await;
    let mut b = server.raw().await;
    b.send("LOCK e b").await;
    // Nobody unlocks: the expiry alone must grant b.
    let tb = token(&b.line().await);
    assert!(tb > ta);
    let status = admin.req("STATUS e").await;
    assert_eq!(
        status_shape(&status),
        format!("OK e held id=b token={tb} ttl_ms=* session=0 waiters=0")
    );
    // The old holder lost the lock.
    a.send(&format!("UNLOCK e {ta}")).await;
    a.expect_prefix("ERR NOTHELD").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_refused_and_changes_nothing() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("w a").await;
    let before = status_shape(&c.req("STATUS w").await);
    for bad in [
        format!("UNLOCK w {}", t + 1),
        format!("UNLOCK w {}", t - 1),
        format!("RENEW w {}", t + 1),
        format!("CHECK w {}", t + 1),
        format!("UNLOCK other {t}"),
        format!("CHECK other {t}"),
    ] {
        let reply = c.req(&bad).await;
        assert!(reply.starts_with("ERR NOTHELD "), "{bad}: {reply}");
    }
    assert_eq!(status_shape(&c.req("STATUS w").await), before);
    assert_eq!(c.req("STATUS other").await, "OK other free");
    // UNLOCK twice: the second is refused.
    assert_eq!(c.req(&format!("UNLOCK w {t}")).await, "OK");
    c.send(&format!("UNLOCK w {t}")).await;
    c.expect_prefix("ERR NOTHELD ").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_and_check_report_the_lease_left() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("r a ttl=10s").await;

    let renewed = c.req(&format!("RENEW r {t} ttl=20s")).await;
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    let ms: u64 = field(&renewed, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(ms > 10_000 && ms <= 20_000, "renewed to 20s: {renewed}");

    // Without ttl= the lease's own (last set) ttl is used again.
    let again = c.req(&format!("RENEW r {t}")).await;
    let ms: u64 = field(&again, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(ms > 10_000 && ms <= 20_000, "renewed to 20s again: {again}");

    let checked = c.req(&format!("CHECK r {t}")).await;
    assert!(checked.starts_with("OK ttl_ms="), "{checked}");
    let ms: u64 = field(&checked, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(ms > 0 && ms <= 20_000, "{checked}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_after_expiry_is_refused() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("x a ttl=200ms").await;
    wait_status(&mut c, "x", |l| l == "OK x free").await;
    for req in [
        format!("RENEW x {t}"),
        format!("RENEW x {t} ttl=5s"),
        format!("CHECK x {t}"),
        format!("UNLOCK x {t}"),
    ] {
        let reply = c.req(&req).await;
        assert!(reply.starts_with("ERR NOTHELD "), "{req}: {reply}");
    }
    assert_eq!(c.req("STATUS x").await, "OK x free");
    server.shutdown().await;
}

/// Holder `h` holds `name`; `gone` and then `next` wait. `leave` makes `gone`'s client vanish;
/// once the server has noticed, the holder unlocks and `next` must get the lock.
async fn vanished_waiter_is_skipped(lock_args: &str, leave: impl FnOnce(Raw)) {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("d h").await;
    let mut gone = server.raw().await;
    gone.send(&format!("LOCK d gone {lock_args}")).await;
    wait_waiters(&mut admin, "d", 1).await;
    let mut next = server.raw().await;
    next.send("LOCK d next").await;
    wait_waiters(&mut admin, "d", 2).await;

    leave(gone);
    // The server notices the departure on its own, without waiting for the grant.
    wait_waiters(&mut admin, "d", 1).await;

    assert_eq!(holder.req(&format!("UNLOCK d {th}")).await, "OK");
    let tn = token(&next.line().await);
    let status = admin.req("STATUS d").await;
    assert_eq!(
        status_shape(&status),
        format!("OK d held id=next token={tn} ttl_ms=* session=0 waiters=0")
    );
    assert_eq!(next.req(&format!("UNLOCK d {tn}")).await, "OK");
    // No ghost holder left behind.
    assert_eq!(admin.req("STATUS d").await, "OK d free");
    assert_eq!(admin.req("STATUS").await, "OK 0");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_session_waiter_is_skipped() {
    vanished_waiter_is_skipped("session", drop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_waiter_is_skipped() {
    vanished_waiter_is_skipped("", Raw::reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_option_times_out_while_held() {
    let server = Lockd::new().serve().await;
    let mut holder = server.raw().await;
    let th = holder.lock("t h").await;
    let mut c = server.raw().await;
    c.send("LOCK t c wait=0").await;
    c.expect_prefix("ERR TIMEOUT ").await;
    c.send("LOCK t c wait=200ms").await;
    c.expect_prefix("ERR TIMEOUT ").await;
    let status = c.req("STATUS t").await;
    assert_eq!(
        status_shape(&status),
        format!("OK t held id=h token={th} ttl_ms=* session=0 waiters=0")
    );
    // wait=0 on a free lock is an ordinary grant.
    let tc = c.lock("t2 c wait=0").await;
    assert!(tc > th);
    // The timed-out waiter is gone: unlocking leaves the lock free.
    assert_eq!(holder.req(&format!("UNLOCK t {th}")).await, "OK");
    assert_eq!(c.req("STATUS t").await, "OK t free");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_events_in_order() {
    let server = Lockd::new().serve().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");
    let mut c = server.raw().await;
    let t1 = c.lock("x a").await;
    assert_eq!(c.req(&format!("UNLOCK x {t1}")).await, "OK");
    let t2 = c.lock("x a ttl=200ms").await;

    let mut last = 0;
    for (kind, t) in [
        ("acquired", t1),
        ("released", t1),
        ("acquired", t2),
        ("expired", t2),
    ] {
        let ms = assert_event(&watcher.line().await, kind, "x", "a", t);
        assert!(ms >= last, "unix-ms must not go back: {ms} after {last}");
        last = ms;
    }
    // QUIT still works on a watch connection.
    assert_eq!(watcher.req("QUIT").await, "OK bye");
    watcher.expect_eof().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_with_a_name_sees_only_that_lock() {
    let server = Lockd::new().serve().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH x").await, "OK watching x");
    let mut c = server.raw().await;
    let ty = c.lock("y a").await;
    assert_eq!(c.req(&format!("UNLOCK y {ty}")).await, "OK");
    let tx = c.lock("x a").await;
    let _ = c.lock("xx a").await;
    assert_eq!(c.req(&format!("UNLOCK x {tx}")).await, "OK");
    assert_event(&watcher.line().await, "acquired", "x", "a", tx);
    assert_event(&watcher.line().await, "released", "x", "a", tx);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_one_lock_and_of_all() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    assert_eq!(c.req("STATUS z").await, "OK z free");
    assert_eq!(c.req("STATUS").await, "OK 0");

    let tb = c.lock("b id-b ttl=1m session").await;
    let ta = c.lock("a id-a").await;
    let tc = c.lock("c id-c ttl=5s").await;
    let mut w = server.raw().await;
    w.send("LOCK a waiter").await;
    wait_waiters(&mut c, "a", 1).await;

    c.send("STATUS").await;
    let mut lines = Vec::new();
    for _ in 0..4 {
        lines.push(status_shape(&c.line().await));
    }
    assert_eq!(
        lines,
        [
            format!("INFO a held id=id-a token={ta} ttl_ms=* session=0 waiters=1"),
            format!("INFO b held id=id-b token={tb} ttl_ms=* session=1 waiters=0"),
            format!("INFO c held id=id-c token={tc} ttl_ms=* session=0 waiters=0"),
            "OK 3".to_owned(),
        ]
    );
    let single = c.req("STATUS b").await;
    assert_eq!(
        status_shape(&single),
        format!("OK b held id=id-b token={tb} ttl_ms=* session=1 waiters=0")
    );
    let left: u64 = field(&single, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(left > 0 && left <= 60_000, "{single}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_help_quit() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    assert_eq!(c.req("PING").await, "OK PONG");
    // Command names are case-insensitive; \r\n endings and extra blanks are accepted.
    assert_eq!(c.req("ping").await, "OK PONG");
    c.send_raw(b"  PiNg \t\r\n").await;
    c.expect("OK PONG").await;
    let help = c.req("HELP").await;
    assert!(help.starts_with("OK commands: "), "{help}");
    for cmd in [
        "LOCK", "UNLOCK", "RENEW", "CHECK", "STATUS", "WATCH", "PING", "HELP", "QUIT",
    ] {
        assert!(help.contains(cmd), "HELP lacks {cmd}: {help}");
    }
    assert_eq!(c.req("QUIT").await, "OK bye");
    c.expect_eof().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_waiter_still_gets_its_grant() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("x h").await;
    let mut b = server.raw().await;
    b.send("LOCK x b").await;
    b.shutdown_write().await;
    wait_waiters(&mut admin, "x", 1).await;

    assert_eq!(holder.req(&format!("UNLOCK x {th}")).await, "OK");
    let tb = token(&b.line().await);
    assert!(tb > th);
    b.expect_eof().await;
    // Not a session lease: it outlives the connection.
    assert_eq!(
        status_shape(&admin.req("STATUS x").await),
        format!("OK x held id=b token={tb} ttl_ms=* session=0 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_line_without_newline_counts_at_half_close() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    c.send_raw(b"PING\nLOCK n a").await;
    c.shutdown_write().await;
    c.expect("OK PONG").await;
    let t = token(&c.line().await);
    c.expect_eof().await;
    let mut admin = server.raw().await;
    assert_eq!(
        status_shape(&admin.req("STATUS n").await),
        format!("OK n held id=a token={t} ttl_ms=* session=0 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order() {
    let server = Lockd::new().serve().await;
    let mut holder = server.raw().await;
    let th = holder.lock("p h").await;

    let mut c = server.raw().await;
    // The waiting LOCK holds up the requests behind it.
    c.send_raw(b"PING\nSTATUS p\nLOCK p c\nSTATUS p\nBOGUS\nPING\n")
        .await;
    c.expect("OK PONG").await;
    assert_eq!(
        status_shape(&c.line().await),
        format!("OK p held id=h token={th} ttl_ms=* session=0 waiters=0")
    );
    let mut admin = server.raw().await;
    wait_waiters(&mut admin, "p", 1).await;
    assert_eq!(holder.req(&format!("UNLOCK p {th}")).await, "OK");
    let tc = token(&c.line().await);
    assert_eq!(
        status_shape(&c.line().await),
        format!("OK p held id=c token={tc} ttl_ms=* session=0 waiters=0")
    );
    c.expect_prefix("ERR UNKNOWN ").await;
    c.expect("OK PONG").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_waiters_and_watchers() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    holder.lock("g h").await;
    let mut waiter = server.raw().await;
    waiter.send("LOCK g w").await;
    wait_waiters(&mut admin, "g", 1).await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");

    server.cancel();
    waiter.expect_prefix("ERR SHUTDOWN ").await;
    waiter.expect_eof().await;
    watcher.expect_prefix("ERR SHUTDOWN ").await;
    watcher.expect_eof().await;
    // Idle connections are just closed.
    holder.expect_eof().await;
    admin.expect_eof().await;
    // `run` returns once every connection has ended (its own guard fails a hang).
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_are_seen_as_end_then_grant() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");
    let mut a = server.raw().await;
    let ta = a.lock("h a").await;
    let mut b = server.raw().await;
    b.send("LOCK h b ttl=200ms").await;
    wait_waiters(&mut admin, "h", 1).await;
    let mut c = server.raw().await;
    c.send("LOCK h c").await;
    wait_waiters(&mut admin, "h", 2).await;

    assert_eq!(a.req(&format!("UNLOCK h {ta}")).await, "OK");
    let tb = token(&b.line().await);
    // b never unlocks: its lease runs out and c is next.
    let tc = token(&c.line().await);
    assert!(ta < tb && tb < tc);
    for (kind, id, t) in [
        ("acquired", "a", ta),
        ("released", "a", ta),
        ("acquired", "b", tb),
        ("expired", "b", tb),
        ("acquired", "c", tc),
    ] {
        assert_event(&watcher.line().await, kind, "h", id, t);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_connection_ignores_requests_but_quit() {
    let server = Lockd::new().serve().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");
    watcher
        .send_raw(b"PING\nSTATUS\nLOCK y w\nBOGUS\n\xff\n\n")
        .await;
    let mut c = server.raw().await;
    let t = c.lock("y a").await;
    // The first line after the ignored ones is the event; nobody locked y as w.
    assert_event(&watcher.line().await, "acquired", "y", "a", t);
    assert_eq!(
        status_shape(&c.req("STATUS y").await),
        format!("OK y held id=a token={t} ttl_ms=* session=0 waiters=0")
    );
    assert_eq!(watcher.req("quit").await, "OK bye");
    watcher.expect_eof().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_line_on_a_watch_connection_closes_it() {
    let mut cfg = config();
    cfg.max_line = 64;
    let server = Lockd::new().config(cfg).serve().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");
    watcher.send(&"x".repeat(100)).await;
    // proto.md: an over-long line is answered ERR TOOLONG and closes the connection, on a
    // watch connection too.
    let line = watcher.line().await;
    assert!(line.starts_with("ERR TOOLONG "), "{line:?}");
    watcher.expect_closed().await;
    assert_eq!(server.raw().await.req("PING").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_lock_holds_up_a_long_pipeline() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("p h").await;
    let mut c = server.raw().await;
    // Far more than the server buffers while a LOCK waits: the rest waits in the socket.
    let pings = 4000;
    let mut batch = b"LOCK p c\n".to_vec();
    for _ in 0..pings {
        batch.extend_from_slice(b"PING\n");
    }
    c.send_raw(&batch).await;
    wait_waiters(&mut admin, "p", 1).await;
    assert_eq!(holder.req(&format!("UNLOCK p {th}")).await, "OK");
    token(&c.line().await);
    for _ in 0..pings {
        c.expect("OK PONG").await;
    }
    assert_eq!(c.req("PING").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_that_cannot_be_delivered_passes_to_the_next_waiter() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("u h").await;
    // This waiter fills the server's input buffer, so the server stops reading from it and
    // only learns that it is gone when the grant can't be written.
    let mut gone = server.raw().await;
    let mut batch = b"LOCK u gone\n".to_vec();
    batch.extend_from_slice(&b"PING\n".repeat(4000));
    gone.send_raw(&batch).await;
    wait_waiters(&mut admin, "u", 1).await;
    let mut next = server.raw().await;
    next.send("LOCK u next").await;
    wait_waiters(&mut admin, "u", 2).await;
    gone.reset();

    assert_eq!(holder.req(&format!("UNLOCK u {th}")).await, "OK");
    let tn = token(&next.line().await);
    assert_eq!(
        status_shape(&admin.req("STATUS u").await),
        format!("OK u held id=next token={tn} ttl_ms=* session=0 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_forever_on_a_client_that_never_reads() {
    let mut cfg = config();
    cfg.shutdown_grace = Duration::from_millis(300);
    let server = Lockd::new().config(cfg).serve().await;
    let mut hog = server.raw().await;
    // Far more replies than the socket buffers hold, never read: the server's writes block.
    let pings = "PING\n".repeat(200_000);
    let writer = tokio::spawn(async move {
        hog.send_raw(pings.as_bytes()).await;
        hog
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Returns (within the helper's guard) although the session is stuck in a write.
    server.shutdown().await;
    writer.abort();
}
