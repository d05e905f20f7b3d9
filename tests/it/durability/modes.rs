//! `--data-dir` with semaphores and shared locks: every holder of a semaphore or a shared lock
//! survives `kill -9` and a restart, with its token, and the name keeps its shape.

use crate::common;

use std::time::Duration;

use common::detail::{detail, shape};
use common::durable::{DurableLockd, TempDir, PATIENCE};
use common::free_port;
use common::{token, Raw};

/// The `HOLDER` lines of `STATUS <name> detail`, shaped, sorted by token.
async fn holders(c: &mut Raw, name: &str) -> Vec<String> {
    let mut lines: Vec<String> = detail(c, name)
        .await
        .into_iter()
        .filter(|l| l.starts_with("HOLDER "))
        .collect();
    lines.sort_by_key(|l| common::field(l, "token").and_then(|t| t.parse::<u64>().ok()));
    lines
}

async fn connect(lockd: &DurableLockd) -> Raw {
    Raw::connect(lockd.addr.parse().expect("lockd address")).await
}

/// Polls until `name` has `n` waiters.
async fn wait_waiters(c: &mut Raw, name: &str, n: usize) {
    let want = format!(" waiters={n}");
    let started = std::time::Instant::now();
    loop {
        let line = c.req(&format!("STATUS {name}")).await;
        if line.contains(&want) {
            return;
        }
        assert!(started.elapsed() < PATIENCE, "never {want}: {line}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What [`hold_then_crash_and_restart`] held: two slots of the semaphore `sem` of 3 (`a`,
/// then `b` with a session lease) and two shared holders of `rw` (`r1`, then `r2`).
struct Held {
    ta: u64,
    tb: u64,
    r1: u64,
    r2: u64,
    /// `STATUS sem detail` and `STATUS rw detail` before the crash.
    before: [Vec<String>; 2],
}

/// Starts lockd on `dir`, takes the holds of [`Held`], kills lockd with SIGKILL and starts
/// it again on the same data directory and port.
async fn hold_then_crash_and_restart(dir: &TempDir) -> (DurableLockd, Held) {
    let port = free_port();
    let lockd = DurableLockd::start(dir, port).await;
    let mut c = connect(&lockd).await;
    let held = Held {
        ta: c.lock("sem a limit=3 ttl=1m").await,
        tb: c.lock("sem b limit=3 ttl=1m session").await,
        r1: c.lock("rw r1 shared ttl=1m").await,
        r2: c.lock("rw r2 shared ttl=1m").await,
        before: [detail(&mut c, "sem").await, detail(&mut c, "rw").await],
    };
    lockd.crash();
    drop(c);
    (DurableLockd::start(dir, port).await, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_slots_and_shared_holders_survive_kill_9() {
    let run = async {
        let dir = TempDir::new("modes");
        let (lockd, held) = hold_then_crash_and_restart(&dir).await;
        let Held { ta, tb, r1, r2, .. } = held;
        let (before_sem, before_rw) = (&held.before[0], &held.before[1]);
        let mut admin = connect(&lockd).await;
        // The same holders with the same tokens; b's session lease is now a plain one (its
        // connection died with the old process). Their order is checked by
        // `restored_holders_keep_their_grant_order`.
        assert_eq!(
            holders(&mut admin, "sem").await,
            [
                format!("HOLDER sem id=a token={ta} held_ms=* ttl_ms=* session=0 mode=limit:3"),
                format!("HOLDER sem id=b token={tb} held_ms=* ttl_ms=* session=0 mode=limit:3"),
            ],
            "before the crash: {before_sem:?}"
        );
        assert_eq!(
            holders(&mut admin, "rw").await,
            [
                format!("HOLDER rw id=r1 token={r1} held_ms=* ttl_ms=* session=0 mode=shared"),
                format!("HOLDER rw id=r2 token={r2} held_ms=* ttl_ms=* session=0 mode=shared"),
            ],
            "before the crash: {before_rw:?}"
        );
        for (name, mode) in [("sem", "limit:3"), ("rw", "shared")] {
            let line = admin.req(&format!("STATUS {name}")).await;
            assert!(
                line.ends_with(&format!(" waiters=0 holders=2 mode={mode}")),
                "{line}"
            );
        }

        // The shape is kept: another limit, or a plain LOCK, is refused.
        let mut other = connect(&lockd).await;
        for args in ["sem x limit=2", "sem x", "rw x limit=2"] {
            let reply = other.req(&format!("LOCK {args}")).await;
            assert!(reply.starts_with("ERR CONFLICT "), "LOCK {args}: {reply}");
        }

        // A third slot is free; a fourth LOCK waits.
        let tc = other.lock("sem c limit=3").await;
        assert!(tc > tb, "{tc} after {tb}");
        let mut d = connect(&lockd).await;
        d.send("LOCK sem d limit=3").await;
        wait_waiters(&mut admin, "sem", 1).await;

        // Another reader joins the restored readers; a writer waits for all of them.
        let r3 = other.lock("rw r3 shared").await;
        let mut w = connect(&lockd).await;
        w.send("LOCK rw w").await;
        wait_waiters(&mut admin, "rw", 1).await;

        // The restored holders come back with their tokens.
        let mut back = connect(&lockd).await;
        for (name, t) in [("sem", ta), ("sem", tb), ("rw", r1), ("rw", r2)] {
            let renewed = back.req(&format!("RENEW {name} {t}")).await;
            assert!(renewed.starts_with("OK ttl_ms="), "{name} {t}: {renewed}");
        }
        assert_eq!(back.req(&format!("UNLOCK sem {ta}")).await, "OK");
        let td = token(&d.line().await);
        assert!(td > tc);
        assert_eq!(back.req(&format!("UNLOCK sem {tb}")).await, "OK");

        for t in [r1, r2] {
            assert_eq!(back.req(&format!("UNLOCK rw {t}")).await, "OK");
        }
        assert!(
            admin.req("STATUS rw").await.contains(" waiters=1 "),
            "the writer waits for the new reader"
        );
        assert_eq!(other.req(&format!("UNLOCK rw {r3}")).await, "OK");
        let tw = token(&w.line().await);
        assert!(tw > r3);
        assert_eq!(
            shape(&admin.req("STATUS rw").await),
            format!("OK rw held id=w token={tw} ttl_ms=* session=0 waiters=0")
        );
    };
    tokio::time::timeout(PATIENCE * 3, run)
        .await
        .expect("test did not finish in time");
}

/// proto.md: STATUS describes "the holder granted first", and `STATUS <name> detail` lists
/// holders "in the order they were granted" — after a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_holders_keep_their_grant_order() {
    let run = async {
        let dir = TempDir::new("modes-order");
        let (lockd, held) = hold_then_crash_and_restart(&dir).await;
        let mut admin = connect(&lockd).await;
        let after = [
            detail(&mut admin, "sem").await,
            detail(&mut admin, "rw").await,
        ];
        // Who each line names: the HOLDER lines, then the OK line.
        let first = |lines: &[String]| -> Vec<String> {
            let pick = |l: &String, key| common::field(l, key).unwrap_or_default();
            lines
                .iter()
                .map(|l| format!("id={} token={}", pick(l, "id"), pick(l, "token")))
                .collect()
        };
        let (ta, tb, r1, r2) = (held.ta, held.tb, held.r1, held.r2);
        assert_eq!(
            [first(&after[0]), first(&after[1])],
            [
                [
                    format!("id=a token={ta}"),
                    format!("id=b token={tb}"),
                    format!("id=a token={ta}")
                ],
                [
                    format!("id=r1 token={r1}"),
                    format!("id=r2 token={r2}"),
                    format!("id=r1 token={r1}")
                ],
            ],
            "before the crash: {:?}; after: {after:?}",
            held.before
        );
    };
    tokio::time::timeout(PATIENCE * 3, run)
        .await
        .expect("test did not finish in time");
}
