//! Session leases and the same id again (proto.md): what a connection's end does to a lease,
//! and how a repeated LOCK by one id is answered.

use crate::common;

use common::{assert_event, field, status_shape, token, wait_waiters, Lockd};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lease_ends_when_its_connection_closes() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH s").await, "OK watching s");

    let mut a = server.raw().await;
    let ta = a.lock("s a session").await;
    let status = admin.req("STATUS s").await;
    assert_eq!(
        status_shape(&status),
        format!("OK s held id=a token={ta} ttl_ms=* session=1 waiters=0")
    );
    let mut b = server.raw().await;
    b.send("LOCK s b").await;
    wait_waiters(&mut admin, "s", 1).await;

    drop(a);
    let tb = token(&b.line().await);
    assert!(tb > ta);

    assert_event(&watcher.line().await, "acquired", "s", "a", ta);
    assert_event(&watcher.line().await, "dropped", "s", "a", ta);
    assert_event(&watcher.line().await, "acquired", "s", "b", tb);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_locking_again_gets_the_same_token_and_a_new_lease() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("i a ttl=5s").await;
    assert_eq!(c.req("LOCK i a ttl=1m").await, format!("OK {t}"));
    let status = c.req("STATUS i").await;
    let left: u64 = field(&status, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(left > 5_000, "lease restarted with ttl=1m: {status}");
    // From another connection too (a retry after a lost reply), and it may add `session`.
    let mut other = server.raw().await;
    assert_eq!(other.req("LOCK i a session").await, format!("OK {t}"));
    assert_eq!(
        status_shape(&c.req("STATUS i").await),
        format!("OK i held id=a token={t} ttl_ms=* session=1 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_id_on_another_connection_conflicts_with_a_session_lease() {
    let server = Lockd::new().serve().await;
    let mut a = server.raw().await;
    let t = a.lock("c a session").await;
    let before = status_shape(&a.req("STATUS c").await);
    let mut b = server.raw().await;
    b.send("LOCK c a").await;
    b.expect_prefix("ERR CONFLICT ").await;
    b.send("LOCK c a session").await;
    b.expect_prefix("ERR CONFLICT ").await;
    assert_eq!(status_shape(&b.req("STATUS c").await), before);
    // On its own connection the holder may retry.
    assert_eq!(a.req("LOCK c a session").await, format!("OK {t}"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_id_is_replaced_by_a_newer_lock() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("r h").await;
    let mut old = server.raw().await;
    old.send("LOCK r w").await;
    wait_waiters(&mut admin, "r", 1).await;
    let mut new = server.raw().await;
    new.send("LOCK r w ttl=1m").await;
    old.expect_prefix("ERR REPLACED ").await;
    // The newer request took the old one's place: still one waiter.
    let status = admin.req("STATUS r").await;
    assert_eq!(field(&status, "waiters").as_deref(), Some("1"), "{status}");

    assert_eq!(holder.req(&format!("UNLOCK r {th}")).await, "OK");
    let tw = token(&new.line().await);
    assert_eq!(
        status_shape(&admin.req("STATUS r").await),
        format!("OK r held id=w token={tw} ttl_ms=* session=0 waiters=0")
    );
    // The old connection stays open and got nothing more than its ERR.
    assert_eq!(old.req("PING").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_relock_takes_the_new_ttl_and_session_option() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("i a ttl=1m session").await;
    let status = c.req("STATUS i").await;
    let left: u64 = field(&status, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(left > 30_000, "{status}");
    assert_eq!(field(&status, "session").as_deref(), Some("1"));

    // No ttl= means the default (30s), no `session` means a plain lease.
    assert_eq!(c.req("LOCK i a").await, format!("OK {t}"));
    let status = c.req("STATUS i").await;
    let left: u64 = field(&status, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        left <= 30_000,
        "lease restarted with the default ttl: {status}"
    );
    assert_eq!(
        status_shape(&status),
        format!("OK i held id=a token={t} ttl_ms=* session=0 waiters=0")
    );
    // A plain lease outlives its connection, though it was a session lease before.
    assert_eq!(c.req("QUIT").await, "OK bye");
    c.expect_eof().await;
    let mut admin = server.raw().await;
    stays(
        &mut admin,
        "i",
        &format!("OK i held id=a token={t} ttl_ms=* session=0 waiters=0"),
    )
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_relock_does_not_wait_behind_its_own_waiters() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut a = server.raw().await;
    let t = a.lock("q a").await;
    let mut b = server.raw().await;
    b.send("LOCK q b").await;
    wait_waiters(&mut admin, "q", 1).await;
    let mut again = server.raw().await;
    assert_eq!(again.req("LOCK q a ttl=1m").await, format!("OK {t}"));
    assert_eq!(
        status_shape(&admin.req("STATUS q").await),
        format!("OK q held id=a token={t} ttl_ms=* session=0 waiters=1")
    );
    assert_eq!(again.req(&format!("UNLOCK q {t}")).await, "OK");
    let tb = token(&b.line().await);
    assert!(tb > t);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lease_is_bound_to_the_connection_that_asked_last() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH x").await, "OK watching x");
    let mut plain = server.raw().await;
    let t = plain.lock("x a").await;
    let mut bound = server.raw().await;
    assert_eq!(bound.req("LOCK x a session").await, format!("OK {t}"));

    // The first connection no longer has anything to do with the lease.
    assert_eq!(plain.req("QUIT").await, "OK bye");
    plain.expect_eof().await;
    stays(
        &mut admin,
        "x",
        &format!("OK x held id=a token={t} ttl_ms=* session=1 waiters=0"),
    )
    .await;
    // The second one's close ends it.
    drop(bound);
    wait_status_free(&mut admin, "x").await;
    assert_event(&watcher.line().await, "acquired", "x", "a", t);
    assert_event(&watcher.line().await, "dropped", "x", "a", t);
    server.shutdown().await;
}

/// Checks for a while that `STATUS <name>` stays `want` (`ttl_ms` blanked): the server sees
/// a close on its own time, so a change it should not make can't be waited for directly.
async fn stays(admin: &mut common::Raw, name: &str, want: &str) {
    for _ in 0..10 {
        assert_eq!(
            status_shape(&admin.req(&format!("STATUS {name}")).await),
            want
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn wait_status_free(admin: &mut common::Raw, name: &str) {
    let free = format!("OK {name} free");
    common::wait_status(admin, name, |l| l == free).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_after_a_session_lease_expired_leaves_the_next_holder_alone() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut a = server.raw().await;
    let ta = a.lock("e a ttl=200ms session").await;
    wait_status_free(&mut admin, "e").await;
    let mut b = server.raw().await;
    let tb = b.lock("e b session").await;
    assert!(tb > ta);
    assert_eq!(a.req("QUIT").await, "OK bye");
    a.expect_eof().await;
    stays(
        &mut admin,
        "e",
        &format!("OK e held id=b token={tb} ttl_ms=* session=1 waiters=0"),
    )
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_session_holder_gets_its_token_then_loses_the_lease() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut c = server.raw().await;
    c.send("LOCK h a session").await;
    c.shutdown_write().await;
    token(&c.line().await);
    c.expect_eof().await;
    wait_status_free(&mut admin, "h").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_session_waiter_leaves_the_queue() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("w h").await;
    let mut c = server.raw().await;
    c.send("LOCK w a session").await;
    wait_waiters(&mut admin, "w", 1).await;
    c.shutdown_write().await;
    c.expect_eof().await;
    wait_waiters(&mut admin, "w", 0).await;
    assert_eq!(holder.req(&format!("UNLOCK w {th}")).await, "OK");
    assert_eq!(admin.req("STATUS w").await, "OK w free");
    server.shutdown().await;
}
