//! Several names at once (proto.md, "Several names at once: `and=`"), on the embedded table
//! over real sockets: a set is granted whole (`OK t t`, one lease), waits whole and in FIFO
//! order on every name, never deadlocks against a set in the opposite order, is refused
//! whole (nothing changes), leaves every queue when its wait runs out, and is one lease for
//! UNLOCK, RENEW, CHECK, expiry, a session's end and BREAK; the same id again is a retry,
//! and with an auth file it needs the lock right on every name.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{
    field, status_shape, tokens, wait_status, wait_waiters, Lockd, Raw, TestServer, GUARD,
};
use lockd::auth::{user_line, Gate, Users};

/// A LOCK of a set, granted at once: its one token (asserted the same on every name).
async fn lock_set(c: &mut Raw, args: &str, names: usize) -> u64 {
    let reply = c.req(&format!("LOCK {args}")).await;
    let got = tokens(&reply);
    assert_eq!(got.len(), names, "{reply}");
    assert!(got.iter().all(|&t| t == got[0]), "{reply}");
    got[0]
}

/// Whether STATUS says `name` is free.
async fn is_free(c: &mut Raw, name: &str) -> bool {
    c.req(&format!("STATUS {name}")).await == format!("OK {name} free")
}

async fn wait_free(c: &mut Raw, name: &str) {
    let want = format!("OK {name} free");
    wait_status(c, name, |s| s == want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_granted_whole_with_one_token_and_one_unlock_releases_all() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = lock_set(&mut c, "db-migrate ci and=cache-flush ttl=30s", 2).await;
    for name in ["db-migrate", "cache-flush"] {
        assert_eq!(
            status_shape(&c.req(&format!("STATUS {name}")).await),
            format!("OK {name} held id=ci token={t} ttl_ms=* session=0 waiters=0")
        );
    }
    // RENEW and CHECK through the second name apply to the set.
    let renewed = c.req(&format!("RENEW cache-flush {t} ttl=1m")).await;
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    let left: u64 = field(&c.req("STATUS db-migrate").await, "ttl_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(left > 30_000, "the first name was renewed too: {left}");
    let checked = c.req(&format!("CHECK db-migrate {t}")).await;
    assert!(checked.starts_with("OK ttl_ms="), "{checked}");
    // One UNLOCK, through either name, releases every name.
    assert_eq!(c.req(&format!("UNLOCK cache-flush {t}")).await, "OK");
    assert!(is_free(&mut c, "db-migrate").await);
    assert!(is_free(&mut c, "cache-flush").await);
    assert!(c
        .req(&format!("UNLOCK db-migrate {t}"))
        .await
        .starts_with("ERR NOTHELD"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_waits_whole_and_keeps_fifo_on_every_name() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut h = server.raw().await;
    let th = h.lock("b h").await;
    // Ahead of the set on b: goes first.
    let mut ahead = server.raw().await;
    ahead.send("LOCK b ahead").await;
    wait_waiters(&mut admin, "b", 1).await;
    let mut set = server.raw().await;
    set.send("LOCK a s and=b").await;
    wait_waiters(&mut admin, "b", 2).await;
    // a is free, but the set waits on it: a later LOCK of a waits behind the set.
    assert!(is_free(&mut admin, "a").await);
    assert!(admin
        .req("LOCK a peek wait=0")
        .await
        .starts_with("ERR TIMEOUT"));
    let mut behind = server.raw().await;
    // Its place can't be seen while a is free (STATUS shows a free name alone), so it is
    // counted once the set holds a.
    behind.send("LOCK a behind").await;

    assert_eq!(h.req(&format!("UNLOCK b {th}")).await, "OK");
    let ta = common::token(&ahead.line().await);
    assert!(ta > th);
    // The set still waits for b; the one behind it on a still waits for the set.
    assert!(is_free(&mut admin, "a").await);
    assert_eq!(ahead.req(&format!("UNLOCK b {ta}")).await, "OK");
    let got = tokens(&set.line().await);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], got[1]);
    assert!(got[0] > ta);
    let ts = got[0];
    wait_waiters(&mut admin, "a", 1).await;
    for name in ["a", "b"] {
        assert_eq!(
            status_shape(&admin.req(&format!("STATUS {name}")).await),
            format!(
                "OK {name} held id=s token={ts} ttl_ms=* session=0 waiters={}",
                usize::from(name == "a")
            )
        );
    }
    assert_eq!(set.req(&format!("UNLOCK a {ts}")).await, "OK");
    let tb = common::token(&behind.line().await);
    assert!(tb > ts);
    assert!(is_free(&mut admin, "b").await);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_in_opposite_orders_never_deadlock_nor_share_a_name() {
    let server = Lockd::new().serve().await;
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 25;
    // Who holds each of a, b, c right now (as a client sees it between its OK and UNLOCK).
    let holding: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let addr = server.addr;
        let holding = Arc::clone(&holding);
        tasks.push(tokio::spawn(async move {
            let mut c = Raw::connect(addr).await;
            for round in 0..ROUNDS {
                // Opposite orders, and a set of three now and then.
                let (names, args): (&[usize], String) = match (i + round) % 3 {
                    0 => (&[0, 1], format!("LOCK a c{i} and=b")),
                    1 => (&[1, 0], format!("LOCK b c{i} and=a")),
                    _ => (&[2, 1, 0], format!("LOCK c c{i} and=b and=a")),
                };
                let reply = c.req(&args).await;
                let got = tokens(&reply);
                assert_eq!(got.len(), names.len(), "{reply}");
                for &n in names {
                    let was = holding[n].swap(i + 1, Ordering::SeqCst);
                    assert_eq!(was, 0, "name {n} had two holders");
                }
                tokio::task::yield_now().await;
                for &n in names {
                    holding[n].store(0, Ordering::SeqCst);
                }
                let first = ["a", "b", "c"][names[0]];
                assert_eq!(c.req(&format!("UNLOCK {first} {}", got[0])).await, "OK");
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.expect("a client failed");
        }
    };
    tokio::time::timeout(GUARD * 4, all)
        .await
        .expect("every request is eventually granted");
    let mut c = server.raw().await;
    for name in ["a", "b", "c"] {
        assert!(is_free(&mut c, name).await);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_set_changes_nothing_and_a_wait_running_out_leaves_every_queue() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut h = server.raw().await;
    let th = h.lock("b h note=busy").await;
    let mut s = server.raw().await;
    // wait=0: refused whole, about the name that blocks it.
    let refused = s.req("LOCK a s and=b wait=0").await;
    assert!(refused.starts_with("ERR TIMEOUT b: held by h"), "{refused}");
    assert!(is_free(&mut admin, "a").await);
    assert_eq!(
        status_shape(&admin.req("STATUS b").await),
        format!("OK b held id=h token={th} ttl_ms=* session=0 waiters=0 note=busy")
    );
    // A name in another mode: refused whole too.
    let sem = admin.lock("c other limit=3").await;
    let conflict = s.req("LOCK a s and=c").await;
    assert!(conflict.starts_with("ERR CONFLICT "), "{conflict}");
    assert!(is_free(&mut admin, "a").await);
    assert_eq!(admin.req(&format!("UNLOCK c {sem}")).await, "OK");

    // wait= running out: out of every queue, the free name's too.
    let out = s.req("LOCK a s and=b wait=300ms").await;
    assert!(
        out.starts_with("ERR TIMEOUT b still held after waiting"),
        "{out}"
    );
    let ta = admin.lock("a x wait=0").await;
    assert_eq!(admin.req(&format!("UNLOCK a {ta}")).await, "OK");
    assert_eq!(
        status_shape(&admin.req("STATUS b").await),
        format!("OK b held id=h token={th} ttl_ms=* session=0 waiters=0 note=busy")
    );
    // A waiting set tied to its connection (session) leaves every queue when it closes.
    let mut gone = server.raw().await;
    gone.send("LOCK a gone session and=b").await;
    wait_waiters(&mut admin, "b", 1).await;
    drop(gone);
    wait_waiters(&mut admin, "b", 0).await;
    let ta = admin.lock("a y wait=0").await;
    assert_eq!(admin.req(&format!("UNLOCK a {ta}")).await, "OK");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_and_a_session_s_end_end_every_name() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut c = server.raw().await;
    lock_set(&mut c, "x c ttl=500ms and=y", 2).await;
    wait_free(&mut admin, "x").await;
    assert!(is_free(&mut admin, "y").await);

    let mut s = server.raw().await;
    lock_set(&mut s, "x s session and=y and=z", 3).await;
    drop(s);
    wait_free(&mut admin, "x").await;
    assert!(is_free(&mut admin, "y").await);
    assert!(is_free(&mut admin, "z").await);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_of_one_name_ends_the_set_and_its_holder_hears_it() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut c = server.raw().await;
    let t = lock_set(&mut c, "p c and=q", 2).await;
    // A waiter of the other name is granted once the set is broken.
    let mut w = server.raw().await;
    w.send("LOCK p w").await;
    wait_waiters(&mut admin, "p", 1).await;
    assert_eq!(admin.req("BREAK q force").await, "OK broken=1");
    let tw = common::token(&w.line().await);
    assert!(tw > t);
    assert!(is_free(&mut admin, "q").await);
    for name in ["p", "q"] {
        let renew = c.req(&format!("RENEW {name} {t}")).await;
        assert!(
            renew.starts_with(&format!("ERR NOTHELD {name}: lease {t} was broken by")),
            "{renew}"
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_set_again_is_a_retry_and_part_of_it_a_conflict() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    let t = lock_set(&mut c, "m c and=n", 2).await;
    let again = lock_set(&mut c, "m c and=n", 2).await;
    assert_eq!(again, t);
    // In another order it is the same set.
    assert_eq!(lock_set(&mut c, "n c and=m", 2).await, t);
    // One of its names alone, or a set of other names around it: CONFLICT.
    assert!(c.req("LOCK m c").await.starts_with("ERR CONFLICT"));
    assert!(c
        .req("LOCK m c and=n and=o")
        .await
        .starts_with("ERR CONFLICT"));
    assert_eq!(c.req(&format!("UNLOCK m {t}")).await, "OK");
    // Holding one name alone, a set around it is a CONFLICT too.
    let single = c.lock("m c").await;
    assert!(c.req("LOCK m c and=n").await.starts_with("ERR CONFLICT"));
    assert!(is_free(&mut c, "n").await);
    assert_eq!(c.req(&format!("UNLOCK m {single}")).await, "OK");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_tells_watchers_one_event_per_name() {
    let server = Lockd::new().serve().await;
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");
    let mut c = server.raw().await;
    let t = lock_set(&mut c, "e1 c and=e2", 2).await;
    assert_eq!(c.req(&format!("UNLOCK e2 {t}")).await, "OK");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let line = watcher.line().await;
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            words.get(4).copied(),
            Some(t.to_string().as_str()),
            "{line}"
        );
        seen.push(format!("{} {}", words[1], words[2]));
    }
    seen.sort();
    assert_eq!(
        seen,
        ["acquired e1", "acquired e2", "released e1", "released e2"]
    );
    server.shutdown().await;
}

const ALICE: &str = "alice-secret-0123456789abcdef-multi";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_auth_file_a_set_needs_the_lock_right_on_every_name() {
    let users = format!(
        "{}\n",
        user_line("alice lock=build* read=*", ALICE, [5; 16]).unwrap()
    );
    let server: TestServer = Lockd::new()
        .config(lockd::server::Config {
            auth: Some(Gate::new(Users::parse(&users, None).unwrap())),
            ..common::config()
        })
        .serve()
        .await;
    let mut a = Raw::connect(server.addr).await;
    assert_eq!(a.req(&format!("AUTH alice {ALICE}")).await, "OK alice");
    assert_eq!(
        a.req("LOCK build-1 a and=deploy").await,
        "ERR DENIED deploy: user alice has no lock right on it"
    );
    assert!(is_free(&mut a, "build-1").await);
    let t = lock_set(&mut a, "build-1 a and=build-2", 2).await;
    assert_eq!(a.req(&format!("UNLOCK build-2 {t}")).await, "OK");
    assert!(is_free(&mut a, "build-1").await);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_replaced_or_superseded_leaves_every_queue() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut h = server.raw().await;
    let th = h.lock("r2 h").await;
    // The same id again, for one name: the set is REPLACED and leaves r1's queue too.
    let mut old = server.raw().await;
    old.send("LOCK r1 s and=r2").await;
    wait_waiters(&mut admin, "r2", 1).await;
    let mut new = server.raw().await;
    new.send("LOCK r2 s").await;
    assert_eq!(
        old.line().await,
        "ERR REPLACED a newer LOCK r1 with the same id took this one's place"
    );
    let t1 = admin.lock("r1 x wait=0").await;
    assert_eq!(admin.req(&format!("UNLOCK r1 {t1}")).await, "OK");
    // supersede on one name ends a set that waits there, on every name.
    let mut set = server.raw().await;
    set.send("LOCK r1 t and=r2").await;
    wait_waiters(&mut admin, "r2", 2).await;
    let mut newest = server.raw().await;
    newest.send("LOCK r2 n supersede").await;
    let told = set.line().await;
    assert!(told.starts_with("ERR SUPERSEDED "), "{told}");
    assert_eq!(
        new.line().await,
        "ERR SUPERSEDED r2: a newer LOCK by n took the queue"
    );
    let t1 = admin.lock("r1 y wait=0").await;
    assert_eq!(admin.req(&format!("UNLOCK r1 {t1}")).await, "OK");
    assert_eq!(h.req(&format!("UNLOCK r2 {th}")).await, "OK");
    let tn = common::token(&newest.line().await);
    assert!(tn > th);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_set_shares_and_keeps_fifo_behind_a_writer() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut r = server.raw().await;
    let tr = r.lock("sb r shared").await;
    // Beside a shared holder: granted at once, on both names.
    let mut s = server.raw().await;
    let ts = lock_set(&mut s, "sa s shared and=sb", 2).await;
    // A writer waits on sb; a shared set after it waits behind it, though it would fit.
    let mut w = server.raw().await;
    w.send("LOCK sb w").await;
    wait_waiters(&mut admin, "sb", 1).await;
    let mut late = server.raw().await;
    late.send("LOCK sc late shared and=sb").await;
    wait_waiters(&mut admin, "sb", 2).await;
    assert!(is_free(&mut admin, "sc").await);
    assert_eq!(r.req(&format!("UNLOCK sb {tr}")).await, "OK");
    assert_eq!(s.req(&format!("UNLOCK sa {ts}")).await, "OK");
    let tw = common::token(&w.line().await);
    assert_eq!(w.req(&format!("UNLOCK sb {tw}")).await, "OK");
    let got = tokens(&late.line().await);
    assert!(got.iter().all(|&t| t > tw), "{got:?}");
    server.shutdown().await;
}
