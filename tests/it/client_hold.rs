//! The library's held-lock helper (`lockd::client::hold`) beyond the conformance suite: it
//! releases the lock however its block ends (a panic, the helper's own future dropped), and a
//! refused renewal stops the block at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockd::client::{hold, Addrs, Client, Connector, LockOptions};
use lockd::proto::Tie;

use crate::common::{Lockd, GUARD};

fn connector(addr: std::net::SocketAddr) -> Connector {
    Connector::new(Addrs::one(addr.to_string()), GUARD)
}

/// Polls STATUS until `name` is free, for at most the guard.
async fn eventually_free(addr: std::net::SocketAddr, name: &str) -> bool {
    let mut client = Client::connect(&addr.to_string()).await.expect("connect");
    let until = tokio::time::Instant::now() + GUARD;
    while tokio::time::Instant::now() < until {
        if client
            .lock_status(name)
            .await
            .expect("status")
            .held()
            .is_none()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_that_panics_still_releases_the_lock() {
    let server = Lockd::new().serve().await;
    let lockd = connector(server.addr);
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let task = tokio::spawn(async move {
        hold(&lockd, "p", "a", &opts, |_lease| async move {
            panic!("the work failed");
        })
        .await
    });
    assert!(task.await.is_err(), "the panic reaches the caller");
    // Well before its 60s ttl.
    assert!(
        eventually_free(server.addr, "p").await,
        "still held after the panic"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_helper_releases_the_lock() {
    let server = Lockd::new().serve().await;
    let lockd = connector(server.addr);
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let started = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&started);
    let task = tokio::spawn(async move {
        hold(&lockd, "d", "a", &opts, |_lease| async move {
            flag.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await
        })
        .await
    });
    let until = tokio::time::Instant::now() + GUARD;
    while !started.load(Ordering::SeqCst) && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started.load(Ordering::SeqCst), "the block never ran");
    task.abort();
    assert!(
        eventually_free(server.addr, "d").await,
        "still held after the drop"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_renewal_stops_the_block_and_is_the_error() {
    let server = Lockd::new().serve().await;
    let lockd = connector(server.addr);
    // Renewed every 300ms.
    let opts = LockOptions::new().ttl(Duration::from_millis(900));
    let (token_tx, token_rx) = tokio::sync::oneshot::channel();
    let finished = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&finished);
    let task = tokio::spawn(async move {
        hold(&lockd, "r", "a", &opts, |lease| async move {
            let _ = token_tx.send(lease.token());
            tokio::time::sleep(GUARD).await;
            flag.store(true, Ordering::SeqCst);
        })
        .await
    });
    let token = token_rx.await.expect("the block got the lock");
    // Someone with the token ends the lease: the next renewal is refused.
    let mut other = Client::connect(&server.addr.to_string())
        .await
        .expect("connect");
    other.unlock("r", token).await.expect("unlock");
    let got = tokio::time::timeout(GUARD, task)
        .await
        .expect("the helper returns")
        .expect("no panic");
    let err = got.expect_err("the loss is the helper's error");
    assert!(err.is_lost(), "{err}");
    assert!(err.to_string().contains("NOTHELD"), "{err}");
    assert!(!finished.load(Ordering::SeqCst), "the block ran on");
    // And the lock is another's to take.
    other
        .lock("r", "b", None, Some(Duration::ZERO), Tie::Plain)
        .await
        .expect("free for the next");
    server.shutdown().await;
}

/// The default session lease: a connection cut (as a firewall's reset) is ridden out by
/// renewing on a new one within the grace, and the block runs on; the lease is still this
/// token's after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_ridden_out_within_the_grace() {
    let server = Lockd::new().serve().await;
    let proxy = crate::common::blocking::Proxy::start(server.addr);
    let lockd = connector(proxy.addr);
    let opts = LockOptions::new().ttl(Duration::from_secs(3));
    let (token_tx, token_rx) = tokio::sync::oneshot::channel();
    let (end, end_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        hold(&lockd, "c", "a", &opts, |lease| async move {
            let _ = token_tx.send(lease.token());
            let _ = end_rx.await;
        })
        .await
    });
    let token = token_rx.await.expect("the block got the lock");
    let mut admin = Client::connect(&server.addr.to_string())
        .await
        .expect("connect");
    let status = admin.lock_status("c").await.expect("status");
    assert!(status.held().is_some_and(|h| h.session), "{status:?}");
    proxy.cut();
    // Past the 3s ttl and grace: renewed through new connections meanwhile.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!task.is_finished(), "the helper gave up after a cut");
    assert!(admin.check("c", token).await.is_ok(), "the lease ended");
    let _ = end.send(());
    let got = tokio::time::timeout(GUARD, task)
        .await
        .expect("the helper returns")
        .expect("no panic");
    assert!(got.is_ok(), "{got:?}");
    assert!(
        eventually_free(server.addr, "c").await,
        "not released at the end"
    );
    server.shutdown().await;
}

/// A LOCK that waited longer than its lease's window: the lease runs from its grant, not from
/// the LOCK's send, so the helper holds it on (renewed) rather than counting it lost at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_waited_past_its_ttl_is_held_from_its_grant() {
    let server = Lockd::new().serve().await;
    let mut first = Client::connect(&server.addr.to_string())
        .await
        .expect("connect");
    let t1 = first
        .lock("w", "x", Some(Duration::from_secs(60)), None, Tie::Plain)
        .await
        .expect("lock");
    let lockd = connector(server.addr);
    let opts = LockOptions::new().ttl(Duration::from_secs(1));
    let task = tokio::spawn(async move {
        hold(&lockd, "w", "a", &opts, |lease| async move {
            // Twice the ttl, under the lock.
            tokio::time::sleep(Duration::from_secs(2)).await;
            lease.is_lost()
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    first.unlock("w", t1).await.expect("unlock");
    let got = tokio::time::timeout(GUARD, task)
        .await
        .expect("the helper returns")
        .expect("no panic");
    assert!(!got.expect("held to the end"), "the lease was lost");
    server.shutdown().await;
}

/// With two addresses, the renewals move to the second when the first front-end goes away
/// (its connections cut, new ones refused): the block runs on past the lease's window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_move_to_the_next_address_when_a_front_end_goes() {
    let server = Lockd::new().serve().await;
    let proxy = crate::common::blocking::Proxy::start(server.addr);
    let addrs = Addrs::new(vec![proxy.addr.to_string(), server.addr.to_string()]).expect("two");
    let lockd = Connector::new(addrs, GUARD);
    let opts = LockOptions::new().ttl(Duration::from_secs(3));
    let (token_tx, token_rx) = tokio::sync::oneshot::channel();
    let (end, end_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        hold(&lockd, "m", "a", &opts, |lease| async move {
            let _ = token_tx.send(lease.token());
            let _ = end_rx.await;
        })
        .await
    });
    let token = token_rx.await.expect("the block got the lock");
    proxy.refuse(true);
    proxy.cut();
    // Past the 3s window: renewed through the second address meanwhile.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !task.is_finished(),
        "the helper gave up when a front-end went"
    );
    let mut admin = Client::connect(&server.addr.to_string())
        .await
        .expect("connect");
    assert!(admin.check("m", token).await.is_ok(), "the lease ended");
    let _ = end.send(());
    let got = tokio::time::timeout(GUARD, task)
        .await
        .expect("the helper returns")
        .expect("no panic");
    assert!(got.is_ok(), "{got:?}");
    server.shutdown().await;
}
