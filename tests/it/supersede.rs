//! Newest-wins queues (proto.md, "supersede"): a `supersede` LOCK that must wait takes the
//! whole queue; those waiting are answered `ERR SUPERSEDED`, the holder keeps the lock.

use crate::common;

use common::blocking::client_process as client;
use common::lockctl::{code, finish, lockd, spawn, stderr};
use common::{field, status_shape, token, wait_waiters, Lockd, TestServer};

/// Two waiters superseded by a third request: both told, the holder keeps it, and the
/// superseding request is granted next with a higher token.
async fn two_waiters_are_superseded(server: &TestServer) {
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("deploy h").await;
    let mut a = server.raw().await;
    a.send("LOCK deploy a").await;
    wait_waiters(&mut admin, "deploy", 1).await;
    let mut b = server.raw().await;
    b.send("LOCK deploy b wait=1m").await;
    wait_waiters(&mut admin, "deploy", 2).await;

    let mut c = server.raw().await;
    c.send("LOCK deploy c supersede").await;
    assert_eq!(
        a.line().await,
        "ERR SUPERSEDED deploy: a newer LOCK by c took the queue"
    );
    assert_eq!(
        b.line().await,
        "ERR SUPERSEDED deploy: a newer LOCK by c took the queue"
    );
    // The holder keeps it; c alone waits.
    assert_eq!(
        status_shape(&admin.req("STATUS deploy").await),
        format!("OK deploy held id=h token={th} ttl_ms=* session=0 waiters=1")
    );
    // The superseded connections stay open.
    assert_eq!(a.req("PING").await, "OK PONG");
    assert_eq!(b.req("PING").await, "OK PONG");

    assert_eq!(holder.req(&format!("UNLOCK deploy {th}")).await, "OK");
    let tc = token(&c.line().await);
    assert!(tc > th, "{tc} after {th}");
    assert_eq!(
        status_shape(&admin.req("STATUS deploy").await),
        format!("OK deploy held id=c token={tc} ttl_ms=* session=0 waiters=0")
    );
    assert_eq!(c.req(&format!("UNLOCK deploy {tc}")).await, "OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supersede_takes_the_queue_and_the_holder_keeps_the_lock() {
    let server = Lockd::new().serve().await;
    two_waiters_are_superseded(&server).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supersede_works_with_a_data_dir() {
    let dir = common::lockctl::scratch("supersede-data-dir");
    let server = Lockd::new().data_dir(&dir).serve().await;
    two_waiters_are_superseded(&server).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supersede_on_a_free_lock_is_a_plain_grant() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = c.lock("free me supersede ttl=10s").await;
    let status = c.req("STATUS free").await;
    assert_eq!(
        status_shape(&status),
        format!("OK free held id=me token={t} ttl_ms=* session=0 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_supersede_changes_nothing() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("q h").await;
    let mut a = server.raw().await;
    a.send("LOCK q a").await;
    wait_waiters(&mut admin, "q", 1).await;

    // wait=0 finds it held: TIMEOUT, and a keeps its place.
    let mut c = server.raw().await;
    c.send("LOCK q c wait=0 supersede").await;
    c.expect_prefix("ERR TIMEOUT ").await;
    // A shape that can't join (a semaphore on an exclusive lock): CONFLICT first.
    c.send("LOCK q c limit=3 supersede").await;
    c.expect_prefix("ERR CONFLICT ").await;
    assert_eq!(
        field(&admin.req("STATUS q").await, "waiters").as_deref(),
        Some("1")
    );

    assert_eq!(holder.req(&format!("UNLOCK q {th}")).await, "OK");
    let ta = token(&a.line().await);
    assert!(ta > th);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supersede_running_out_leaves_the_superseded_answered() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("o h").await;
    let mut a = server.raw().await;
    a.send("LOCK o a").await;
    wait_waiters(&mut admin, "o", 1).await;
    let mut c = server.raw().await;
    c.send("LOCK o c wait=300ms supersede").await;
    a.expect_prefix("ERR SUPERSEDED ").await;
    c.expect_prefix("ERR TIMEOUT ").await;
    assert_eq!(
        status_shape(&admin.req("STATUS o").await),
        format!("OK o held id=h token={th} ttl_ms=* session=0 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_waiting_is_replaced_the_others_superseded() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("s h").await;
    let mut old = server.raw().await;
    old.send("LOCK s me").await;
    wait_waiters(&mut admin, "s", 1).await;
    let mut other = server.raw().await;
    other.send("LOCK s other").await;
    wait_waiters(&mut admin, "s", 2).await;

    let mut new = server.raw().await;
    new.send("LOCK s me supersede").await;
    old.expect_prefix("ERR REPLACED ").await;
    assert_eq!(
        other.line().await,
        "ERR SUPERSEDED s: a newer LOCK by me took the queue"
    );
    assert_eq!(
        field(&admin.req("STATUS s").await, "waiters").as_deref(),
        Some("1")
    );
    assert_eq!(holder.req(&format!("UNLOCK s {th}")).await, "OK");
    assert!(token(&new.line().await) > th);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supersede_in_shared_and_semaphore_queues() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    // Shared holders, an exclusive writer waiting: a shared supersede takes the queue, and
    // then fits beside the readers at once.
    let mut r1 = server.raw().await;
    let t1 = r1.lock("rw r1 shared").await;
    let mut w = server.raw().await;
    w.send("LOCK rw w").await;
    wait_waiters(&mut admin, "rw", 1).await;
    let mut r2 = server.raw().await;
    r2.send("LOCK rw r2 shared supersede").await;
    w.expect_prefix("ERR SUPERSEDED ").await;
    let t2 = token(&r2.line().await);
    assert!(t2 > t1);
    let status = admin.req("STATUS rw").await;
    assert_eq!(field(&status, "holders").as_deref(), Some("2"), "{status}");
    assert_eq!(field(&status, "waiters").as_deref(), Some("0"), "{status}");

    // A semaphore of 2, full, two waiting: the superseder waits alone for the next slot.
    let mut s1 = server.raw().await;
    let ts1 = s1.lock("sem s1 limit=2").await;
    let mut s2 = server.raw().await;
    s2.lock("sem s2 limit=2").await;
    let mut q1 = server.raw().await;
    q1.send("LOCK sem q1 limit=2").await;
    let mut q2 = server.raw().await;
    wait_waiters(&mut admin, "sem", 1).await;
    q2.send("LOCK sem q2 limit=2").await;
    wait_waiters(&mut admin, "sem", 2).await;
    let mut n = server.raw().await;
    n.send("LOCK sem n limit=2 supersede").await;
    q1.expect_prefix("ERR SUPERSEDED ").await;
    q2.expect_prefix("ERR SUPERSEDED ").await;
    assert_eq!(
        field(&admin.req("STATUS sem").await, "waiters").as_deref(),
        Some("1")
    );
    assert_eq!(s1.req(&format!("UNLOCK sem {ts1}")).await, "OK");
    assert!(token(&n.line().await) > ts1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_lockctl_exits_6() {
    let d = lockd().await;
    let mut c = d.client().await;
    let th = c
        .lock("job", "holder", None, None, lockd::proto::Tie::Plain)
        .await
        .unwrap();
    let waiting = spawn(d.lockctl(&["run", "job", "--", "true"]));
    d.wait_waiters("job", 1).await;
    let newer = spawn(d.lockctl(&["acquire", "job", "--supersede", "--ttl", "10s"]));
    let out = finish(waiting).await;
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(stderr(&out).contains("superseded"), "{}", stderr(&out));
    // The holder still holds it; the newer one gets it once it is released.
    assert_eq!(d.holder("job").await, Some(th));
    c.unlock("job", th).await.unwrap();
    let out = finish(newer).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let tn = d.wait_held("job").await;
    assert!(tn > th);
}

#[test]
fn the_bash_and_python_clients_supersede_and_are_superseded() {
    use common::blocking::{eventually, Server};
    use std::time::Duration;
    let guard = Duration::from_secs(60);
    let lockd = Server::start();
    let addr = lockd.addr.to_string();
    let held = lockd.request("LOCK deploy holder");
    let th: u64 = held.trim_start_matches("OK ").parse().expect(&held);

    // A bash waiter, superseded by a Python request: lockd_lock returns 6.
    let bash_waiter = client(
        "bash",
        &addr,
        "lockd_lock deploy ttl=10s >/dev/null; echo \"rc=$?\"",
    );
    eventually(guard, "the bash waiter waits", || {
        lockd.waiters("deploy") == 1
    });
    let python = client(
        "python3",
        &addr,
        "c = lockd_client.Client(os.environ['LOCKD_ADDR'], id='py')\n\
         try:\n    c.lock('deploy', ttl=10, supersede=True)\n    print('granted')\n\
         except lockd_client.Superseded as e:\n    print('superseded', e.exit_code)",
    );
    let out = common::blocking::finish(bash_waiter, "", guard);
    assert!(out.stdout.contains("rc=6"), "{} {}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("ERR SUPERSEDED deploy"),
        "{}",
        out.stderr
    );
    eventually(guard, "the python request waits alone", || {
        lockd.waiters("deploy") == 1
    });

    // And a bash `supersede` takes the queue from Python: Superseded, exit code 6.
    let bash_newer = client(
        "bash",
        &addr,
        "t=$(lockd_lock deploy ttl=10s supersede) && echo \"token=$t\"",
    );
    let out = common::blocking::finish(python, "", guard);
    assert_eq!(out.stdout.trim(), "superseded 6", "{}", out.stderr);
    eventually(guard, "the bash request waits", || {
        lockd.waiters("deploy") == 1
    });
    assert_eq!(lockd.request(&format!("UNLOCK deploy {th}")), "OK");
    let out = common::blocking::finish(bash_newer, "", guard);
    let token: u64 = out
        .stdout
        .trim()
        .strip_prefix("token=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{} {}", out.stdout, out.stderr));
    assert!(token > th);
}
