//! The library client's sets of names (`LockOptions::and`): `Connector::lock` and `hold()`
//! take every name at once as one lease, with a token per name.

use std::time::Duration;

use lockd::client::{hold, Addrs, Client, Connector, LockOptions};
use lockd::proto::ErrorCode;

use crate::common::{Lockd, GUARD};

fn connector(addr: std::net::SocketAddr) -> Connector {
    Connector::new(Addrs::one(addr.to_string()), GUARD)
}

async fn holder(client: &mut Client, name: &str) -> Option<u64> {
    client
        .lock_status(name)
        .await
        .expect("status")
        .held()
        .map(|h| h.token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connector_lock_of_a_set_gives_a_token_per_name_and_one_unlock_frees_all() {
    let server = Lockd::new().serve().await;
    let lockd = connector(server.addr);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .and("cs-b")
        .and("cs-c");
    let mut locked = lockd.lock("cs-a", "one", &opts).await.expect("granted");
    assert_eq!(locked.tokens.len(), 3);
    assert_eq!(locked.token, locked.tokens[0]);
    let mut look = Client::connect(&server.addr.to_string()).await.unwrap();
    for (name, token) in ["cs-a", "cs-b", "cs-c"].iter().zip(&locked.tokens) {
        assert_eq!(holder(&mut look, name).await, Some(*token), "{name}");
    }
    // An overlapping set that does not wait is refused whole, and takes nothing.
    let now = LockOptions::new().wait(Duration::ZERO).and("cs-c");
    let refused = lockd.lock("cs-d", "two", &now).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Timeout));
    assert_eq!(holder(&mut look, "cs-d").await, None);
    // supersede with a set is refused before anything is sent.
    let both = LockOptions::new().supersede().and("cs-e");
    let refused = lockd.lock("cs-f", "three", &both).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Syntax));
    locked
        .client
        .unlock("cs-a", locked.token)
        .await
        .expect("unlock");
    for name in ["cs-a", "cs-b", "cs-c"] {
        assert_eq!(holder(&mut look, name).await, None, "{name}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_of_a_set_holds_every_name_and_releases_them_together() {
    let server = Lockd::new().serve().await;
    let lockd = connector(server.addr);
    let addr = server.addr.to_string();
    let opts = LockOptions::new().ttl(Duration::from_secs(60)).and("hs-b");
    let seen = hold(&lockd, "hs-a", "one", &opts, |lease| async move {
        let mut look = Client::connect(&addr).await.unwrap();
        let a = holder(&mut look, "hs-a").await;
        let b = holder(&mut look, "hs-b").await;
        (lease.tokens().to_vec(), a, b)
    })
    .await
    .expect("held");
    let (tokens, a, b) = seen;
    assert_eq!(tokens.len(), 2);
    assert_eq!(a, Some(tokens[0]));
    assert_eq!(b, Some(tokens[1]));
    let mut look = Client::connect(&server.addr.to_string()).await.unwrap();
    // Released when the block ends.
    let until = tokio::time::Instant::now() + GUARD;
    while holder(&mut look, "hs-b").await.is_some() {
        assert!(tokio::time::Instant::now() < until, "hs-b still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(holder(&mut look, "hs-a").await, None);
    server.shutdown().await;
}
