//! `--data-dir` with sets of names (`LOCK ... and=`): a set granted (at once, or to a waiter)
//! survives `kill -9` and a restart as one set: the same token on every name, linked again,
//! so one UNLOCK after the restart releases every name and a waiter of them is granted.
//! A set broken before the crash is still told as broken through any of its names, and
//! compaction of the journal keeps a live set whole.

use crate::common;

use std::time::Duration;

use common::durable::{DurableLockd, TempDir, PATIENCE};
use common::free_port;
use common::{token, Raw};

async fn connect(lockd: &DurableLockd) -> Raw {
    Raw::connect(lockd.addr.parse().expect("lockd address")).await
}

/// Polls until `STATUS <name>` says `want` (a prefix after `OK `).
async fn wait_status(c: &mut Raw, name: &str, want: &str) -> String {
    let started = std::time::Instant::now();
    loop {
        let line = c.req(&format!("STATUS {name}")).await;
        if line.starts_with(want) {
            return line;
        }
        assert!(started.elapsed() < PATIENCE, "never {want:?}: {line}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `OK t t ...`: the tokens of a set's grant, asserted one and the same.
fn set_token(reply: &str, names: usize) -> u64 {
    let tokens: Vec<u64> = reply
        .strip_prefix("OK ")
        .unwrap_or_else(|| panic!("not a grant: {reply}"))
        .split(' ')
        .map(|t| t.parse().expect("a token"))
        .collect();
    assert_eq!(tokens.len(), names, "{reply}");
    assert!(tokens.iter().all(|&t| t == tokens[0]), "{reply}");
    tokens[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_survives_kill_9_as_one_set() {
    let run = async {
        let dir = TempDir::new("sets");
        let port = free_port();
        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = connect(&lockd).await;
        // One set granted at once, one granted to a waiter, one broken.
        let t1 = set_token(&c.req("LOCK a one ttl=1m and=b and=c").await, 3);
        let th = c.lock("y h ttl=1m").await;
        let mut w = connect(&lockd).await;
        w.send("LOCK x two ttl=1m and=y").await;
        wait_status(&mut c, "y", &format!("OK y held id=h token={th} ")).await;
        let mut admin = connect(&lockd).await;
        loop {
            let line = admin.req("STATUS y").await;
            if line.contains("waiters=1") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(c.req(&format!("UNLOCK y {th}")).await, "OK");
        let t2 = set_token(&w.line().await, 2);
        assert!(t2 > th);
        let t3 = set_token(&c.req("LOCK p three ttl=1m and=q").await, 2);
        assert_eq!(admin.req("BREAK q force").await, "OK broken=1");
        lockd.crash();
        drop((c, w, admin));

        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = connect(&lockd).await;
        for name in ["a", "b", "c"] {
            wait_status(&mut c, name, &format!("OK {name} held id=one token={t1} ")).await;
        }
        for name in ["x", "y"] {
            wait_status(&mut c, name, &format!("OK {name} held id=two token={t2} ")).await;
        }
        // A waiter of the third name is granted once the set is released through another.
        let mut w = connect(&lockd).await;
        w.send("LOCK c later").await;
        loop {
            if c.req("STATUS c").await.contains("waiters=1") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let renewed = c.req(&format!("RENEW b {t1}")).await;
        assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
        assert_eq!(c.req(&format!("UNLOCK a {t1}")).await, "OK");
        let later = token(&w.line().await);
        assert!(later > t1 && later > t2 && later > t3);
        assert_eq!(c.req("STATUS b").await, "OK b free");
        // The set granted to a waiter is one set too.
        assert_eq!(c.req(&format!("UNLOCK y {t2}")).await, "OK");
        assert_eq!(c.req("STATUS x").await, "OK x free");
        // The broken set: free, and its holder hears of the break through either name.
        assert_eq!(c.req("STATUS p").await, "OK p free");
        for name in ["p", "q"] {
            let renew = c.req(&format!("RENEW {name} {t3}")).await;
            assert!(
                renew.starts_with(&format!("ERR NOTHELD {name}: lease {t3} was broken by")),
                "{renew}"
            );
        }
        drop(lockd);
    };
    tokio::time::timeout(PATIENCE * 4, run)
        .await
        .expect("test did not finish in time");
}
