//! Lease expiry and wait deadlines in paused time: the shared table's timer task ends a lease
//! at its deadline and hands the lock to the next waiter, with no client traffic at all.

use std::sync::Arc;
use std::time::Duration;

use lockd::backend::{Embedded, LockStart, WaitResult};
use lockd::locks::{Limits, LockRequest, RenewRequest, WaitEnd, NO_USER};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

fn table() -> (Arc<Embedded>, CancellationToken) {
    let shared = Embedded::new(Limits::default(), 1, 16, Default::default());
    let stop = CancellationToken::new();
    tokio::spawn(Arc::clone(&shared).run_timer(stop.clone()));
    (shared, stop)
}

fn req(name: &str, id: &str, ttl: u64, wait: Option<u64>) -> LockRequest {
    LockRequest {
        name: name.into(),
        id: id.into(),
        ttl: Some(Duration::from_secs(ttl)),
        wait: wait.map(Duration::from_secs),
        conn: 1,
        ..LockRequest::default()
    }
}

fn granted(start: LockStart) -> u64 {
    match start {
        LockStart::Granted { token, .. } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn waiting(start: LockStart) -> oneshot::Receiver<WaitResult> {
    match start {
        LockStart::Waiting { rx, .. } => rx,
        other => panic!("expected to wait, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn expiry_hands_the_lock_to_the_next_waiter() {
    let (shared, stop) = table();
    let first = granted(shared.lock(req("job", "a", 30, None)).expect("lock"));
    let mut rx = waiting(shared.lock(req("job", "b", 30, None)).expect("lock"));

    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(rx.try_recv().is_err(), "granted before the lease ended");
    assert!(shared.check("job", first).is_ok());

    // The timer fires at the deadline; paused time jumps straight there.
    let result = tokio::time::timeout(Duration::from_secs(2), &mut rx)
        .await
        .expect("granted soon after the deadline")
        .expect("sender kept");
    let WaitResult::Granted { token, .. } = result else {
        panic!("expected a grant, got {result:?}");
    };
    assert!(token > first);
    assert!(shared.check("job", first).is_err());
    assert_eq!(
        shared.status("job").map(|s| s.holder.to_string()),
        Some("b".into())
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn renewed_lease_outlives_its_first_deadline() {
    let (shared, stop) = table();
    let token = granted(shared.lock(req("job", "a", 10, None)).expect("lock"));
    let mut rx = waiting(shared.lock(req("job", "b", 10, None)).expect("lock"));
    tokio::time::sleep(Duration::from_secs(8)).await;
    let renew = RenewRequest {
        name: "job".into(),
        token,
        ttl: None,
        detach: false,
    };
    shared.renew(&renew, 0, NO_USER).expect("renew");
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        rx.try_recv().is_err(),
        "granted although the lease was renewed"
    );
    assert!(shared.check("job", token).is_ok());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(matches!(rx.try_recv(), Ok(WaitResult::Granted { .. })));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn wait_deadline_ends_the_wait() {
    let (shared, stop) = table();
    granted(shared.lock(req("job", "a", 3600, None)).expect("lock"));
    let rx = waiting(shared.lock(req("job", "b", 30, Some(5))).expect("lock"));
    let result = tokio::time::timeout(Duration::from_secs(6), rx)
        .await
        .expect("answered by the wait deadline")
        .expect("sender kept");
    assert!(matches!(result, WaitResult::Ended(WaitEnd::TimedOut)));
    assert_eq!(shared.status("job").map(|s| s.waiters), Some(0));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_grant_passes_to_the_next_waiter() {
    let (shared, stop) = table();
    let first = granted(shared.lock(req("job", "a", 30, None)).expect("lock"));
    let gone = waiting(shared.lock(req("job", "b", 30, None)).expect("lock"));
    let rx = waiting(shared.lock(req("job", "c", 30, None)).expect("lock"));
    // b's connection is gone: its receiver is dropped without a word to the table.
    drop(gone);
    shared.unlock("job", first, NO_USER).expect("unlock");
    let result = tokio::time::timeout(Duration::from_secs(1), rx)
        .await
        .expect("c granted at once")
        .expect("sender kept");
    assert!(matches!(result, WaitResult::Granted { .. }));
    assert_eq!(
        shared.status("job").map(|s| s.holder.to_string()),
        Some("c".into())
    );
    stop.cancel();
}
