//! With `--auth-file` and `--data-dir`, a lease is still its user's after a restart: the
//! journal records the user's name. A user removed from the file meanwhile leaves leases
//! that nobody may renew or release (they end with their ttl).

use crate::common;

use std::path::{Path, PathBuf};

use common::{config, token, Lockd, Raw, TestServer};
use lockd::auth::{user_line, Gate, Users};
use lockd::server::Config;

const ALICE: &str = "alice-secret-0123456789abcdef";
const MALLORY: &str = "mallory-secret-0123456789abcdef";

fn users(with_alice: bool) -> Users {
    let mut lines = vec![user_line("mallory lock=* read=*", MALLORY, [7; 16]).unwrap()];
    if with_alice {
        lines.push(user_line("alice lock=* read=*", ALICE, [8; 16]).unwrap());
    }
    Users::parse(&lines.join("\n"), None).unwrap()
}

async fn durable(dir: &Path, with_alice: bool) -> TestServer {
    Lockd::new()
        .config(Config {
            data_dir: Some(dir.to_path_buf()),
            auth: Some(Gate::new(users(with_alice))),
            ..config()
        })
        .serve()
        .await
}

async fn login(server: &TestServer, user: &str, secret: &str) -> Raw {
    let mut c = server.raw().await;
    assert_eq!(
        c.req(&format!("AUTH {user} {secret}")).await,
        format!("OK {user}")
    );
    c
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockd-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_stays_its_users_across_a_restart() {
    let dir = scratch("auth-restart");
    let server = durable(&dir, true).await;
    let mut alice = login(&server, "alice", ALICE).await;
    let t = token(&alice.req("LOCK deploy ci-1 ttl=1m").await);
    server.shutdown().await;

    let server = durable(&dir, true).await;
    let mut mallory = login(&server, "mallory", MALLORY).await;
    let denied = mallory.req(&format!("UNLOCK deploy {t}")).await;
    assert!(denied.starts_with("ERR DENIED"), "{denied}");
    let denied = mallory.req(&format!("RENEW deploy {t}")).await;
    assert!(denied.starts_with("ERR DENIED"), "{denied}");
    let mut alice = login(&server, "alice", ALICE).await;
    assert!(alice
        .req(&format!("RENEW deploy {t}"))
        .await
        .starts_with("OK ttl_ms="));
    assert_eq!(alice.req(&format!("UNLOCK deploy {t}")).await, "OK");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_users_lease_is_nobodys_to_release() {
    let dir = scratch("auth-removed");
    let server = durable(&dir, true).await;
    let mut alice = login(&server, "alice", ALICE).await;
    let t = token(&alice.req("LOCK deploy ci-1 ttl=1m").await);
    server.shutdown().await;

    let server = durable(&dir, false).await;
    let mut mallory = login(&server, "mallory", MALLORY).await;
    let denied = mallory.req(&format!("UNLOCK deploy {t}")).await;
    assert!(denied.starts_with("ERR DENIED"), "{denied}");
    let status = mallory.req("STATUS deploy").await;
    assert!(status.contains(&format!("token={t}")), "{status}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
