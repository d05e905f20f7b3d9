//! Semaphores (`limit=<n>`) and shared locks (`shared`) over real TCP, where a conversation
//! of the line protocol alone cannot say it. Every rule of proto.md's "Shared locks and
//! semaphores" that a conversation can show is a script, run on both backends:
//! tests/scripts/semaphore*.lockd, shared*.lockd, shape_*.lockd, status_modes.lockd and
//! limit_locks_every_holder.lockd. What stays here is not a conversation on one line port:
//! the compat lock is taken through the old protocol's two ports, on free ports chosen at run
//! time, and the script runner connects only to the line port (a `# flags:` line cannot name
//! a free port); `stress` runs many clients at random and checks the intervals they held.

use crate::common;

mod stress;

use std::time::Duration;

use common::{config, field, Lockd};

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
