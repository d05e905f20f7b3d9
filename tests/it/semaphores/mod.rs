//! Semaphores (`limit=<n>`) and shared locks (`shared`) over real TCP: each rule of proto.md's
//! "Shared locks and semaphores", one test or more per rule. The rules of semaphores alone are
//! conversations: tests/scripts/semaphore*.lockd and limit_locks_every_holder.lockd, run on
//! both backends.
//!
//! Nothing here waits for time to pass except where a lease or a wait is meant to end; a
//! request that must *wait* is shown waiting by the lock's queue (`waiters=`, `WAITER` lines),
//! never by a sleep.

use crate::common;

mod stress;

use std::time::Duration;

use common::detail::{detail, shape};
use common::{
    assert_event, config, field, token, wait_status, wait_waiters, Lockd, Raw, TestServer,
};

/// A server with default settings, and a connection to ask it STATUS.
async fn start() -> (TestServer, Raw) {
    let server = Lockd::new().serve().await;
    let admin = server.raw().await;
    (server, admin)
}

/// `STATUS <name>`, shaped.
async fn status(c: &mut Raw, name: &str) -> String {
    shape(&c.req(&format!("STATUS {name}")).await)
}

/// Sends `LOCK <args>` on a new connection and returns once the lock `name` has `queued`
/// waiters: the request waits, in that place of the queue.
async fn queue(server: &TestServer, admin: &mut Raw, name: &str, args: &str, queued: usize) -> Raw {
    let mut c = server.raw().await;
    c.send(&format!("LOCK {args}")).await;
    wait_waiters(admin, name, queued).await;
    c
}

/// A watcher of `name`.
async fn watch(server: &TestServer, name: &str) -> Raw {
    let mut watcher = server.raw().await;
    assert_eq!(
        watcher.req(&format!("WATCH {name}")).await,
        format!("OK watching {name}")
    );
    watcher
}

/// Reads one `EVENT` line per `(kind, id, token)`, in that order, all of lock `name`.
async fn expect_events(watcher: &mut Raw, name: &str, events: &[(&str, &str, u64)]) {
    for &(kind, id, token) in events {
        assert_event(&watcher.line().await, kind, name, id, token);
    }
}

/// Shared holders hold together while an exclusive LOCK waits; a shared LOCK behind it waits
/// too (strict FIFO); the writer gets the lock alone once every reader left, and when it
/// leaves, every reader queued behind it is granted in one go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_then_exclusive_then_shared_is_served_in_order() {
    let (server, mut admin) = start().await;
    let mut watcher = watch(&server, "rw").await;

    let mut s = server.raw().await;
    let s1 = s.lock("rw s1 shared").await;
    let s2 = s.lock("rw s2 shared").await;
    assert!(s1 < s2);
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=s1 token={s1} ttl_ms=* session=0 waiters=0 holders=2 mode=shared")
    );
    let mut w = queue(&server, &mut admin, "rw", "rw w", 1).await;
    // A reader that would fit beside the readers holding waits behind the writer.
    let mut r1 = queue(&server, &mut admin, "rw", "rw r1 shared", 2).await;
    let mut x = server.raw().await;
    x.send("LOCK rw x shared wait=0").await;
    x.expect_prefix("ERR TIMEOUT ").await;
    assert_eq!(
        detail(&mut admin, "rw").await,
        [
            format!("HOLDER rw id=s1 token={s1} held_ms=* ttl_ms=* session=0 mode=shared"),
            format!("HOLDER rw id=s2 token={s2} held_ms=* ttl_ms=* session=0 mode=shared"),
            "WAITER rw 1 id=w waited_ms=* session=0 mode=exclusive".to_owned(),
            "WAITER rw 2 id=r1 waited_ms=* session=0 mode=shared".to_owned(),
            format!(
                "OK rw held id=s1 token={s1} ttl_ms=* session=0 waiters=2 holders=2 mode=shared"
            ),
        ]
    );

    // One reader leaving is not enough for the writer.
    assert_eq!(s.req(&format!("UNLOCK rw {s1}")).await, "OK");
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=s2 token={s2} ttl_ms=* session=0 waiters=2 holders=1 mode=shared")
    );
    let mut r2 = queue(&server, &mut admin, "rw", "rw r2 shared", 3).await;
    assert_eq!(s.req(&format!("UNLOCK rw {s2}")).await, "OK");
    let tw = token(&w.line().await);
    assert!(tw > s2);
    // An exclusive holder's line is the plain one.
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=w token={tw} ttl_ms=* session=0 waiters=2")
    );
    assert_eq!(
        detail(&mut admin, "rw").await,
        [
            format!("HOLDER rw id=w token={tw} held_ms=* ttl_ms=* session=0 mode=exclusive"),
            "WAITER rw 1 id=r1 waited_ms=* session=0 mode=shared".to_owned(),
            "WAITER rw 2 id=r2 waited_ms=* session=0 mode=shared".to_owned(),
            format!("OK rw held id=w token={tw} ttl_ms=* session=0 waiters=2"),
        ]
    );

    // The writer leaves: both readers are granted at once, in queue order.
    assert_eq!(w.req(&format!("UNLOCK rw {tw}")).await, "OK");
    let t1 = token(&r1.line().await);
    let t2 = token(&r2.line().await);
    assert!(tw < t1 && t1 < t2, "{tw} {t1} {t2}");
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=r1 token={t1} ttl_ms=* session=0 waiters=0 holders=2 mode=shared")
    );
    expect_events(
        &mut watcher,
        "rw",
        &[
            ("acquired", "s1", s1),
            ("acquired", "s2", s2),
            ("released", "s1", s1),
            ("released", "s2", s2),
            ("acquired", "w", tw),
            ("released", "w", tw),
            ("acquired", "r1", t1),
            ("acquired", "r2", t2),
        ],
    )
    .await;
    server.shutdown().await;
}

/// A writer waiting at the head that leaves (its wait runs out, its session client closes)
/// lets the readers behind it in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_leaving_the_head_lets_the_readers_behind_it_in() {
    let (server, mut admin) = start().await;
    let mut s = server.raw().await;
    let s1 = s.lock("rw s1 shared").await;

    let mut w = queue(&server, &mut admin, "rw", "rw w wait=2s", 1).await;
    let mut r = queue(&server, &mut admin, "rw", "rw r shared", 2).await;
    w.expect_prefix("ERR TIMEOUT ").await;
    let tr = token(&r.line().await);
    assert!(tr > s1);

    let gone = queue(&server, &mut admin, "rw", "rw gone session", 1).await;
    let mut r2 = queue(&server, &mut admin, "rw", "rw r2 shared", 2).await;
    drop(gone);
    let t2 = token(&r2.line().await);
    assert!(t2 > tr);
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=s1 token={s1} ttl_ms=* session=0 waiters=0 holders=3 mode=shared")
    );
    server.shutdown().await;
}

/// A waiting writer whose id LOCKs again as a reader takes its own place in the queue, where
/// a reader fits at once: it is granted, and so are the readers behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_replaced_by_a_reader_is_granted_with_the_readers_behind() {
    let (server, mut admin) = start().await;
    let mut s = server.raw().await;
    let s1 = s.lock("rw s1 shared").await;
    let mut old = queue(&server, &mut admin, "rw", "rw w", 1).await;
    let mut r = queue(&server, &mut admin, "rw", "rw r shared", 2).await;
    let mut new = server.raw().await;
    let tw = new.lock("rw w shared").await;
    old.expect_prefix("ERR REPLACED ").await;
    let tr = token(&r.line().await);
    assert!(s1 < tw && tw < tr, "{s1} {tw} {tr}");
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=s1 token={s1} ttl_ms=* session=0 waiters=0 holders=3 mode=shared")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_session_holder_closing_leaves_the_others_holding() {
    let (server, mut admin) = start().await;
    let mut s1 = server.raw().await;
    let t1 = s1.lock("rw s1 shared session").await;
    let mut s2 = server.raw().await;
    let t2 = s2.lock("rw s2 shared").await;
    let mut w = queue(&server, &mut admin, "rw", "rw w", 1).await;
    drop(s1);
    wait_status(&mut admin, "rw", |l| {
        field(l, "holders").as_deref() == Some("1")
    })
    .await;
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=s2 token={t2} ttl_ms=* session=0 waiters=1 holders=1 mode=shared")
    );
    assert!(t1 < t2);
    assert_eq!(s2.req(&format!("UNLOCK rw {t2}")).await, "OK");
    let tw = token(&w.line().await);
    assert!(tw > t2);
    server.shutdown().await;
}

/// Every LOCK that does not fit the name's shape is `ERR CONFLICT` and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_of_another_shape_conflicts_and_changes_nothing() {
    let (server, mut admin) = start().await;
    let mut h = server.raw().await;
    let ta = h.lock("sem a limit=3").await;
    let ts = h.lock("rw s shared").await;
    let te = h.lock("ex e").await;
    // A semaphore with a waiter, to show a waiter's conflicting retry keeps its place.
    let tp = h.lock("full p limit=2").await;
    h.lock("full q limit=2").await;
    let mut d = queue(&server, &mut admin, "full", "full d limit=2", 1).await;

    let refused = [
        // Against a semaphore of 3: another limit, shared, exclusive (limit=1 is exclusive),
        // and the holder's own id in another mode.
        ("sem", "sem x limit=2"),
        ("sem", "sem x limit=4"),
        ("sem", "sem x shared"),
        ("sem", "sem x"),
        ("sem", "sem x limit=1"),
        ("sem", "sem a limit=2"),
        ("sem", "sem a shared"),
        ("sem", "sem a"),
        ("sem", "sem x limit=2 wait=0"),
        // Against a read/write lock held shared: a semaphore; the reader itself as a writer.
        ("rw", "rw x limit=2"),
        ("rw", "rw s"),
        ("rw", "rw s limit=3"),
        // Against an exclusive lock: a semaphore; the writer itself as a reader.
        ("ex", "ex x limit=2"),
        ("ex", "ex e shared"),
        ("ex", "ex e limit=2"),
        // A waiter asking again in another shape.
        ("full", "full d limit=3"),
        ("full", "full d shared"),
    ];
    let mut other = server.raw().await;
    for (name, args) in refused {
        let before = detail(&mut admin, name).await;
        let reply = other.req(&format!("LOCK {args}")).await;
        assert!(reply.starts_with("ERR CONFLICT "), "LOCK {args}: {reply}");
        assert_eq!(detail(&mut admin, name).await, before, "LOCK {args}");
    }

    // Same shape, only held: these wait (or time out), they do not conflict.
    for args in ["ex x shared wait=0", "ex x limit=1 wait=0", "rw x wait=0"] {
        let reply = other.req(&format!("LOCK {args}")).await;
        assert!(reply.starts_with("ERR TIMEOUT "), "LOCK {args}: {reply}");
    }
    // limit=1 is the exclusive holder's own mode: its retry.
    assert_eq!(other.req("LOCK ex e limit=1").await, format!("OK {te}"));

    // The waiter kept its place and is granted the next free slot.
    assert_eq!(h.req(&format!("UNLOCK full {tp}")).await, "OK");
    token(&d.line().await);

    // The shape lasts only while the name is held or waited for.
    assert_eq!(h.req(&format!("UNLOCK sem {ta}")).await, "OK");
    assert_eq!(h.req(&format!("UNLOCK rw {ts}")).await, "OK");
    h.lock("sem z limit=5").await;
    h.lock("rw z limit=2").await;
    assert!(h
        .req("LOCK sem y limit=3")
        .await
        .starts_with("ERR CONFLICT "));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shared_and_limit_options_are_refused() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let refused = [
        ("s a shared limit=2", "SYNTAX"),
        ("s a limit=2 shared", "SYNTAX"),
        ("s a shared shared", "SYNTAX"),
        ("s a limit=2 limit=2", "SYNTAX"),
        ("s a shared=1", "SYNTAX"),
        ("s a limit", "SYNTAX"),
        ("s a limit=0", "BADARG"),
        ("s a limit=abc", "BADARG"),
        ("s a limit=100001", "BADARG"),
        ("s a limit=4294967297", "BADARG"),
        ("s a limit=-1", "BADARG"),
        ("s a limit=1.5", "BADARG"),
        ("s a limit=", "BADARG"),
    ];
    for (args, code) in refused {
        let reply = c.req(&format!("LOCK {args}")).await;
        assert!(
            reply.starts_with(&format!("ERR {code} ")),
            "LOCK {args}: {reply}"
        );
    }
    assert_eq!(c.req("STATUS s").await, "OK s free");
    assert_eq!(c.req("STATUS").await, "OK 0");

    // The bounds themselves, and option keys in any case.
    let t = c.lock("s a limit=100000").await;
    assert_eq!(
        status(&mut c, "s").await,
        format!(
            "OK s held id=a token={t} ttl_ms=* session=0 waiters=0 holders=1 mode=limit:100000"
        )
    );
    let t = c.lock("t a LIMIT=2").await;
    assert_eq!(
        status(&mut c, "t").await,
        format!("OK t held id=a token={t} ttl_ms=* session=0 waiters=0 holders=1 mode=limit:2")
    );
    let t = c.lock("u a SHARED").await;
    assert_eq!(
        status(&mut c, "u").await,
        format!("OK u held id=a token={t} ttl_ms=* session=0 waiters=0 holders=1 mode=shared")
    );
    // limit=1 is an exclusive lock: its line is the plain one.
    let t = c.lock("v a limit=1").await;
    assert_eq!(
        status(&mut c, "v").await,
        format!("OK v held id=a token={t} ttl_ms=* session=0 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lines_show_every_mode() {
    let (server, mut admin) = start().await;
    let mut h = server.raw().await;
    let ta = h.lock("sem a limit=2 session").await;
    let tb = h.lock("sem b limit=2").await;
    let _c = queue(&server, &mut admin, "sem", "sem c limit=2 session", 1).await;
    let _d = queue(&server, &mut admin, "sem", "sem d limit=2 detach", 2).await;
    let ts = h.lock("rw s shared").await;
    let te = h.lock("ex e").await;
    let _f = queue(&server, &mut admin, "ex", "ex f", 1).await;
    let _g = queue(&server, &mut admin, "ex", "ex g shared session=5s", 2).await;

    assert_eq!(
        detail(&mut admin, "sem").await,
        [
            format!("HOLDER sem id=a token={ta} held_ms=* ttl_ms=* session=1 mode=limit:2"),
            format!("HOLDER sem id=b token={tb} held_ms=* ttl_ms=* session=0 mode=limit:2"),
            "WAITER sem 1 id=c waited_ms=* session=1 mode=limit:2".to_owned(),
            "WAITER sem 2 id=d waited_ms=* session=0 mode=limit:2".to_owned(),
            format!(
                "OK sem held id=a token={ta} ttl_ms=* session=1 waiters=2 holders=2 mode=limit:2"
            ),
        ]
    );
    assert_eq!(
        detail(&mut admin, "ex").await,
        [
            format!("HOLDER ex id=e token={te} held_ms=* ttl_ms=* session=0 mode=exclusive"),
            "WAITER ex 1 id=f waited_ms=* session=0 mode=exclusive".to_owned(),
            "WAITER ex 2 id=g waited_ms=* session=1 mode=shared".to_owned(),
            format!("OK ex held id=e token={te} ttl_ms=* session=0 waiters=2"),
        ]
    );
    admin.send("STATUS").await;
    let mut all = Vec::new();
    for _ in 0..4 {
        all.push(shape(&admin.line().await));
    }
    assert_eq!(
        all,
        [
            format!("INFO ex held id=e token={te} ttl_ms=* session=0 waiters=2"),
            format!(
                "INFO rw held id=s token={ts} ttl_ms=* session=0 waiters=0 holders=1 mode=shared"
            ),
            format!(
                "INFO sem held id=a token={ta} ttl_ms=* session=1 waiters=2 holders=2 mode=limit:2"
            ),
            "OK 3".to_owned(),
        ]
    );
    server.shutdown().await;
}

/// In compat mode the compat lock is still a plain mutex: an old client's hold is exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compat_lock_stays_a_plain_mutex() {
    use lockd::compat::CompatConfig;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let [lock_port, unlock_port] = common::free_ports(2)[..] else {
        unreachable!()
    };
    let mut cfg = config();
    cfg.compat = Some(CompatConfig {
        host: "127.0.0.1".into(),
        lock_port,
        unlock_port,
        unlock_timeout: Duration::from_secs(30),
        name: "compat".into(),
        read_timeout: Duration::from_millis(300),
    });
    let server = Lockd::new().config(cfg).serve().await;
    let mut admin = server.raw().await;
    // The compat ports are up before the line protocol answers anything.
    assert_eq!(admin.req("PING").await, "OK PONG");
    let mut old = tokio::net::TcpStream::connect(("127.0.0.1", lock_port))
        .await
        .expect("connect to the compat lock port");
    old.write_all(b"lock:old:1700000000\n").await.expect("send");
    let mut answer = String::new();
    tokio::time::timeout(common::GUARD, old.read_to_string(&mut answer))
        .await
        .expect("answer in time")
        .expect("read");
    assert_eq!(answer, "oklocked\n");

    let line = admin.req("STATUS compat").await;
    assert!(line.starts_with("OK compat held id=old "), "{line}");
    assert_eq!(field(&line, "mode"), None, "{line}");
    assert!(admin
        .req("LOCK compat x shared wait=0")
        .await
        .starts_with("ERR TIMEOUT "));
    assert!(admin
        .req("LOCK compat x limit=2 wait=0")
        .await
        .starts_with("ERR CONFLICT "));
    server.shutdown().await;
}

/// A plain waiter whose client is gone (it closed while waiting: FIN, as a killed process
/// sends) is granted with the others in one go; the reset its grant meets takes it back
/// (event `dropped`), and the others keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_reader_granted_with_others_is_taken_back_alone() {
    let (server, mut admin) = start().await;
    let mut watcher = watch(&server, "rw").await;
    let mut w = server.raw().await;
    let tw = w.lock("rw w").await;
    let ghost = queue(&server, &mut admin, "rw", "rw ghost shared", 1).await;
    let mut r = queue(&server, &mut admin, "rw", "rw r shared", 2).await;
    let mut x = queue(&server, &mut admin, "rw", "rw x", 3).await;
    drop(ghost);

    assert_eq!(w.req(&format!("UNLOCK rw {tw}")).await, "OK");
    let tr = token(&r.line().await);
    wait_status(&mut admin, "rw", |l| {
        field(l, "holders").as_deref() == Some("1")
    })
    .await;
    assert_eq!(
        status(&mut admin, "rw").await,
        format!("OK rw held id=r token={tr} ttl_ms=* session=0 waiters=1 holders=1 mode=shared")
    );
    expect_events(
        &mut watcher,
        "rw",
        &[("acquired", "w", tw), ("released", "w", tw)],
    )
    .await;
    let line = watcher.line().await;
    let tg: u64 = field_n(&line, 4);
    assert!(tg < tr);
    assert_event(&line, "acquired", "rw", "ghost", tg);
    expect_events(
        &mut watcher,
        "rw",
        &[("acquired", "r", tr), ("dropped", "ghost", tg)],
    )
    .await;
    assert_eq!(r.req(&format!("UNLOCK rw {tr}")).await, "OK");
    token(&x.line().await);
    server.shutdown().await;
}

/// Word `n` (from 0) of `line`, parsed.
fn field_n<T: std::str::FromStr>(line: &str, n: usize) -> T {
    line.split(' ')
        .nth(n)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("word {n} of {line:?}"))
}
