//! A client that is gone never holds a lock (proto.md, "Waiting, closing and half-closing"):
//! waiters in real `nc` processes that are killed, or that half-close on purpose and still
//! read; `detach`; and session leases with a grace (`session=<dur>`).

use crate::common;
use crate::common::needs::{have, Need};

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{assert_event, config, field, token, wait_status, wait_waiters, Lockd, GUARD};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// `nc` connected to the server with its stdin kept open (a pipe this test holds), so it
/// never half-closes on its own: it reads the server's replies until it is killed.
fn nc(addr: std::net::SocketAddr, half_close: bool) -> Child {
    let mut cmd = Command::new("nc");
    if half_close {
        cmd.arg("-N");
    }
    cmd.arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd.spawn()
        .expect("nc is not installed: apt-get install -y netcat-openbsd")
}

/// Waits until the server has seen the holder's connection close: the grace has cut the
/// lease's time left to at most `grace_ms`.
async fn wait_in_grace(admin: &mut common::Raw, name: &str, grace_ms: u64) {
    wait_status(admin, name, |l| {
        field(l, "ttl_ms").and_then(|t| t.parse::<u64>().ok()) <= Some(grace_ms)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiter_is_never_left_holding_the_lock() {
    if !have(Need::Nc) {
        return;
    }
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH k").await, "OK watching k");
    let mut holder = server.raw().await;
    let th = holder.lock("k holder ttl=1m").await;

    // A plain waiter in a real process, which is then killed: the kernel closes its socket
    // with a FIN, exactly like a half-close, so the server can't tell yet.
    let mut ghost = nc(server.addr, false);
    let mut stdin = ghost.stdin.take().expect("stdin");
    stdin.write_all(b"LOCK k ghost ttl=10m\n").await.unwrap();
    wait_waiters(&mut admin, "k", 1).await;
    let mut next = server.raw().await;
    next.send("LOCK k next ttl=1m").await;
    wait_waiters(&mut admin, "k", 2).await;
    ghost.kill().await.expect("kill nc");
    drop(stdin);

    let released = Instant::now();
    assert_eq!(holder.req(&format!("UNLOCK k {th}")).await, "OK");
    let tn = token(&next.line().await);
    let handed_over = released.elapsed();
    eprintln!("killed waiter: next waiter granted {handed_over:?} after the release");
    assert!(handed_over < GUARD);

    assert_event(&watcher.line().await, "acquired", "k", "holder", th);
    assert_event(&watcher.line().await, "released", "k", "holder", th);
    let line = watcher.line().await;
    let tg: u64 = line.split(' ').nth(4).unwrap().parse().unwrap();
    assert_event(&line, "acquired", "k", "ghost", tg);
    assert_event(&watcher.line().await, "dropped", "k", "ghost", tg);
    assert_event(&watcher.line().await, "acquired", "k", "next", tn);
    assert!(tn > tg);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_reader_waits_and_keeps_its_grant() {
    if !have(Need::Nc) {
        return;
    }
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("h holder ttl=1m").await;

    // `printf 'LOCK h me\n' | nc -N host port`: sends, half-closes, and reads on.
    let mut reader = nc(server.addr, true);
    let mut stdin = reader.stdin.take().expect("stdin");
    stdin.write_all(b"LOCK h reader ttl=1m\n").await.unwrap();
    drop(stdin);
    wait_waiters(&mut admin, "h", 1).await;
    assert_eq!(holder.req(&format!("UNLOCK h {th}")).await, "OK");

    let mut out = String::new();
    let mut stdout = reader.stdout.take().expect("stdout");
    tokio::time::timeout(GUARD, stdout.read_to_string(&mut out))
        .await
        .expect("nc -N should exit once answered")
        .unwrap();
    let tr = token(out.trim_end());
    // Past the server's watch for a reset, the grant still stands.
    tokio::time::sleep(config().half_close_probe * 2).await;
    let status = admin.req("STATUS h").await;
    assert_eq!(field(&status, "id").as_deref(), Some("reader"), "{status}");
    assert_eq!(field(&status, "token"), Some(tr.to_string()));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_waiter_leaves_on_half_close_and_its_lease_outlives_the_connection() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let th = holder.lock("d holder ttl=1m").await;

    let mut quitter = server.raw().await;
    quitter.send("LOCK d quitter detach").await;
    wait_waiters(&mut admin, "d", 1).await;
    quitter.shutdown_write().await;
    wait_waiters(&mut admin, "d", 0).await;

    let mut stayer = server.raw().await;
    stayer.send("LOCK d stayer ttl=1m detach").await;
    wait_waiters(&mut admin, "d", 1).await;
    assert_eq!(holder.req(&format!("UNLOCK d {th}")).await, "OK");
    let ts = token(&stayer.line().await);
    drop(stayer);
    // A plain lease: the connection's end changes nothing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = admin.req("STATUS d").await;
    assert_eq!(field(&status, "token"), Some(ts.to_string()), "{status}");
    assert_eq!(field(&status, "session").as_deref(), Some("0"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lease_with_grace_survives_a_dropped_connection_when_renewed() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH g").await, "OK watching g");

    let mut first = server.raw().await;
    let t = first.lock("g runner ttl=1m session=300ms").await;
    first.reset();
    wait_in_grace(&mut admin, "g", 300).await;
    // The holder comes back on a new connection within the grace and renews.
    let mut second = server.raw().await;
    let renewed = second.req(&format!("RENEW g {t}")).await;
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    tokio::time::sleep(Duration::from_millis(900)).await;
    let status = admin.req("STATUS g").await;
    assert_eq!(field(&status, "token"), Some(t.to_string()), "{status}");
    assert_eq!(field(&status, "session").as_deref(), Some("1"));

    // The renewing connection now carries the lease: when it goes and nobody renews, the
    // lease ends one grace later, as `dropped`.
    drop(second);
    wait_status(&mut admin, "g", |l| l == "OK g free").await;
    assert_event(&watcher.line().await, "acquired", "g", "runner", t);
    assert_event(&watcher.line().await, "dropped", "g", "runner", t);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lease_with_grace_ends_after_it_and_hands_over() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let t = holder.lock("e holder ttl=1m session=1s").await;
    let mut next = server.raw().await;
    next.send("LOCK e next").await;
    wait_waiters(&mut admin, "e", 1).await;

    drop(holder);
    // Within the grace the lease stands, bound to no connection.
    wait_in_grace(&mut admin, "e", 1000).await;
    let tn = token(&next.line().await);
    assert!(tn > t);
    let mut back = server.raw().await;
    assert_eq!(
        back.req(&format!("RENEW e {t}")).await,
        "ERR NOTHELD e: token is not the current holder's live lease"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_takes_up_its_lease_in_grace_with_a_lock_by_its_id() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let t = holder.lock("u holder ttl=1m session=5s").await;
    drop(holder);
    // No open connection holds it, so a LOCK by its id is its holder coming back (no
    // CONFLICT), and gets the same token.
    wait_in_grace(&mut admin, "u", 5000).await;
    let mut back = server.raw().await;
    assert_eq!(back.lock("u holder ttl=1m session=5s").await, t);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_session_and_detach_options_are_refused() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    for (line, code) in [
        ("LOCK x me session detach", "ERR SYNTAX"),
        ("LOCK x me detach=1", "ERR SYNTAX"),
        ("LOCK x me session=never", "ERR BADARG"),
        ("LOCK x me session=25h", "ERR BADARG"),
    ] {
        let reply = c.req(line).await;
        assert!(reply.starts_with(code), "{line}: {reply}");
    }
    assert_eq!(c.req("STATUS x").await, "OK x free");
    server.shutdown().await;
}

/// A waiter that closes in the same instant its grant is made (the close not yet read when
/// the grant wakes its session) still never keeps the lock: tied waits are taken back, and a
/// plain waiter's grant is watched for the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_closing_as_it_is_granted_never_keeps_the_lock() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    for round in 0..60 {
        let tie = ["detach", "", "session=5s"][round % 3];
        let t = holder.lock(&format!("r holder-{round} ttl=1m")).await;
        let mut w = server.raw().await;
        w.send(&format!("LOCK r w-{round} ttl=30m {tie}")).await;
        wait_waiters(&mut admin, "r", 1).await;
        drop(w);
        assert_eq!(holder.req(&format!("UNLOCK r {t}")).await, "OK");
        wait_status(&mut admin, "r", |l| l == "OK r free").await;
    }
    server.shutdown().await;
}
