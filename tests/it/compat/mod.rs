//! The two-port compatibility mode over real TCP: an in-process server with the line protocol
//! on 127.0.0.1:0 and the compat ports on free loopback ports.

mod durable;
mod nc;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use lockd::client::Client;
use lockd::compat::CompatConfig;
use lockd::proto::Tie;
use lockd::server::Config;

use crate::common::{free_ports, Lockd, TestServer};

/// Failure guard for anything that should happen at once.
const GUARD: Duration = Duration::from_secs(10);
const NAME: &str = "compat";

struct Server {
    line: String,
    lock: SocketAddr,
    unlock: SocketAddr,
    server: TestServer,
}

fn compat_config(unlock_timeout: Duration, read_timeout: Duration) -> CompatConfig {
    let [lock_port, unlock_port] = free_ports(2)[..] else {
        unreachable!()
    };
    CompatConfig {
        host: "127.0.0.1".into(),
        lock_port,
        unlock_port,
        unlock_timeout,
        name: NAME.into(),
        read_timeout,
    }
}

/// Serves `compat` beside the line protocol. Its ports are free ports found and let go, so
/// another test may take one before the server binds it: then it starts again on new ones.
async fn start_with(mut compat: CompatConfig) -> Server {
    for _ in 0..5 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let line = listener.local_addr().unwrap().to_string();
        let lock = SocketAddr::from(([127, 0, 0, 1], compat.lock_port));
        let unlock = SocketAddr::from(([127, 0, 0, 1], compat.unlock_port));
        let config = Config {
            compat: Some(compat.clone()),
            ..Config::default()
        };
        let server = Lockd::new().config(config).serve_on(listener);
        // The compat ports are set up before the line protocol answers anything.
        let connected = tokio::time::timeout(GUARD, Client::connect(&line))
            .await
            .expect("connect in time");
        if let Ok(mut c) = connected {
            if c.ping().await.is_ok() {
                return Server {
                    line,
                    lock,
                    unlock,
                    server,
                };
            }
        }
        match server.join().await {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                let [lock_port, unlock_port] = free_ports(2)[..] else {
                    unreachable!()
                };
                (compat.lock_port, compat.unlock_port) = (lock_port, unlock_port);
            }
            other => panic!("the server did not answer a PING: it ended with {other:?}"),
        }
    }
    panic!("five times another test took a compat port first")
}

async fn start() -> Server {
    start_with(compat_config(
        Duration::from_secs(30),
        Duration::from_millis(300),
    ))
    .await
}

impl Server {
    async fn stop(self) {
        self.server.shutdown().await;
    }

    async fn status(&self) -> String {
        let mut c = client(&self.line).await;
        c.status(Some(NAME)).await.unwrap().remove(0)
    }
}

async fn client(addr: &str) -> Client {
    tokio::time::timeout(GUARD, Client::connect(addr))
        .await
        .expect("connect in time")
        .unwrap()
}

/// What the old client does: send one line, read everything until the server closes.
/// `Err` if the connection was refused or reset.
async fn exchange(addr: SocketAddr, message: &str) -> io::Result<String> {
    tokio::time::timeout(GUARD, async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(message.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    })
    .await
    .expect("the server answers and closes in time")
}

async fn accepts(addr: SocketAddr) -> bool {
    tokio::time::timeout(GUARD, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .is_ok()
}

async fn refused(addr: SocketAddr) -> bool {
    match tokio::time::timeout(GUARD, TcpStream::connect(addr))
        .await
        .expect("connect in time")
    {
        Ok(_) => false,
        Err(e) => {
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
            true
        }
    }
}

/// Waits for something the server does after an event (a line-protocol grant or release).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + GUARD;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn lock_then_unlock_and_the_ports_follow() {
    let s = start().await;
    assert!(refused(s.unlock).await, "unlock port closed while free");
    assert!(accepts(s.lock).await, "lock port open while free");

    assert_eq!(
        exchange(s.lock, "lock:old-1:1700000000\n").await.unwrap(),
        "oklocked\n"
    );
    // Closed before the answer was sent, so at once for the client.
    assert!(refused(s.lock).await, "lock port closed while held");
    assert!(accepts(s.unlock).await, "unlock port open while held");
    let status = s.status().await;
    assert!(status.starts_with("compat held id=old-1 "), "{status}");

    // Accepted from any client, as the old server did.
    assert_eq!(
        exchange(s.unlock, "unlock:old-2:1700000001\n")
            .await
            .unwrap(),
        "okunlocked\n"
    );
    assert!(refused(s.unlock).await, "unlock port closed again");
    assert!(accepts(s.lock).await, "lock port open again");
    assert_eq!(s.status().await, "compat free");

    // And again: the ports reopen as often as it takes.
    for round in 0..3 {
        let lock = format!("lock:old-3:{round}\n");
        assert_eq!(exchange(s.lock, &lock).await.unwrap(), "oklocked\n");
        let unlock = format!("unlock:old-3:{round}\r\n");
        assert_eq!(exchange(s.unlock, &unlock).await.unwrap(), "okunlocked\n");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_message_without_newline_counts_when_the_client_half_closes() {
    let s = start().await;
    let mut c = TcpStream::connect(s.lock).await.unwrap();
    c.write_all(b"lock:half:1").await.unwrap();
    c.shutdown().await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(GUARD, c.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, "oklocked\n");
    s.stop().await;
}

/// Reads what the server sends on a connection that sends `bytes`, until it closes. A reset
/// counts as nothing sent.
async fn answer_to(addr: SocketAddr, bytes: &[u8], half_close: bool) -> String {
    tokio::time::timeout(GUARD, async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(bytes).await;
        if half_close {
            let _ = s.shutdown().await;
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .expect("the server closes a connection that is not a message")
}

#[tokio::test]
async fn garbage_changes_nothing() {
    let s = start().await;
    let long = vec![b'x'; 10_000];
    let junk: [(&[u8], bool); 8] = [
        (b"hello\n", false),
        (b"unlock:a:1\n", false),
        (b"lock:a b:1\n", false),
        (b"lock:a:now\n", false),
        (b"\xff\xfe\n", false),
        (b"", true),        // a port scan, an empty connection
        (b"lock:a", false), // never finished: closed after the read timeout
        (&long, false),     // over-long
    ];
    for (bytes, half_close) in junk {
        assert_eq!(answer_to(s.lock, bytes, half_close).await, "", "{bytes:?}");
        assert_eq!(s.status().await, "compat free", "{bytes:?}");
        assert!(refused(s.unlock).await);
    }
    // A silent connection does not hold up a real client.
    let _silent = TcpStream::connect(s.lock).await.unwrap();
    assert_eq!(
        exchange(s.lock, "lock:real:1\n").await.unwrap(),
        "oklocked\n"
    );

    // While held, garbage on the unlock port changes nothing either.
    for bytes in [&b"lock:real:2\n"[..], b"unlock:\n", b"unlock:a:b:\n"] {
        assert_eq!(answer_to(s.unlock, bytes, false).await, "", "{bytes:?}");
        let status = s.status().await;
        assert!(status.starts_with("compat held id=real "), "{status}");
    }
    assert_eq!(
        exchange(s.unlock, "unlock:real:3\n").await.unwrap(),
        "okunlocked\n"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_unlock_timeout_releases() {
    let s = start_with(compat_config(
        Duration::from_millis(300),
        Duration::from_millis(300),
    ))
    .await;
    let mut watch = client(&s.line).await;
    watch.watch(Some(NAME)).await.unwrap();

    assert_eq!(
        exchange(s.lock, "lock:slow:1\n").await.unwrap(),
        "oklocked\n"
    );
    let acquired = tokio::time::timeout(GUARD, watch.read_line())
        .await
        .unwrap()
        .unwrap();
    assert!(
        acquired.starts_with("EVENT acquired compat slow "),
        "{acquired}"
    );
    let expired = tokio::time::timeout(GUARD, watch.read_line())
        .await
        .unwrap()
        .unwrap();
    assert!(
        expired.starts_with("EVENT expired compat slow "),
        "{expired}"
    );

    eventually("the lock port reopens", || accepts(s.lock)).await;
    eventually("the unlock port closes", || refused(s.unlock)).await;
    assert_eq!(s.status().await, "compat free");
    assert_eq!(
        exchange(s.lock, "lock:next:2\n").await.unwrap(),
        "oklocked\n"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_line_protocol_holder_keeps_the_lock_port_closed_until_it_unlocks() {
    let s = start().await;
    let mut c = client(&s.line).await;
    let token = c
        .lock(
            NAME,
            "new-1",
            Some(Duration::from_secs(30)),
            None,
            Tie::Plain,
        )
        .await
        .unwrap();
    eventually("the lock port closes", || refused(s.lock)).await;
    assert!(
        accepts(s.unlock).await,
        "the unlock port tells the lock is held"
    );

    // An unlock message carries no token: it can't release a line-protocol lease.
    assert_eq!(answer_to(s.unlock, b"unlock:old-1:1\n", false).await, "");
    let status = s.status().await;
    assert!(status.starts_with("compat held id=new-1 "), "{status}");
    assert!(refused(s.lock).await, "still closed");

    c.unlock(NAME, token).await.unwrap();
    eventually("the lock port reopens", || accepts(s.lock)).await;
    eventually("the unlock port closes", || refused(s.unlock)).await;
    assert_eq!(
        exchange(s.lock, "lock:old-1:2\n").await.unwrap(),
        "oklocked\n"
    );

    // And the other way round: a line-protocol LOCK waits for the old client's turn.
    let mut probe = client(&s.line).await;
    let err = probe
        .lock(NAME, "new-2", None, Some(Duration::ZERO), Tie::Plain)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("TIMEOUT"), "{err}");
    s.stop().await;
}

#[tokio::test]
async fn a_fifo_waiter_wins_the_next_turn() {
    let s = start().await;
    assert_eq!(
        exchange(s.lock, "lock:old-1:1\n").await.unwrap(),
        "oklocked\n"
    );

    let line = s.line.clone();
    let waiter = tokio::spawn(async move {
        let mut c = client(&line).await;
        let token = c.lock(NAME, "new-1", None, None, Tie::Plain).await.unwrap();
        (c, token)
    });
    eventually("the line client waits", || async {
        s.status().await.ends_with("waiters=1")
    })
    .await;

    assert_eq!(
        exchange(s.unlock, "unlock:old-1:2\n").await.unwrap(),
        "okunlocked\n"
    );
    // Granted to the waiter in the same step: the lock port never opened.
    assert!(
        refused(s.lock).await,
        "the polling client finds the lock port closed"
    );
    let (mut c, token) = tokio::time::timeout(GUARD, waiter).await.unwrap().unwrap();
    let status = s.status().await;
    assert!(status.starts_with("compat held id=new-1 "), "{status}");

    c.unlock(NAME, token).await.unwrap();
    eventually("the lock port reopens", || accepts(s.lock)).await;
    assert_eq!(
        exchange(s.lock, "lock:old-1:3\n").await.unwrap(),
        "oklocked\n"
    );
    s.stop().await;
}

/// The harness's own retry: a compat port another test took first is replaced by a new one.
#[tokio::test]
async fn the_harness_starts_again_on_new_ports_when_one_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let mut compat = compat_config(Duration::from_secs(30), Duration::from_millis(300));
    compat.lock_port = taken_port;
    let s = start_with(compat).await;
    assert_ne!(s.lock.port(), taken_port);
    assert_eq!(
        exchange(s.lock, "lock:old-1:1\n").await.unwrap(),
        "oklocked\n"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_port_in_use_fails_at_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // The lock port is a free port found and let go: another test may take it meanwhile,
    // and then the start fails on it instead. Only a failure on the taken unlock port counts.
    for _ in 0..5 {
        let mut compat = compat_config(Duration::from_secs(30), Duration::from_secs(1));
        compat.unlock_port = taken.local_addr().unwrap().port();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = Config {
            compat: Some(compat),
            ..Config::default()
        };
        let result = Lockd::new().config(config).serve_on(listener).join().await;
        let err = result.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        if err.to_string().contains("compat lock port") {
            continue;
        }
        assert!(err.to_string().contains("unlock port"), "{err}");
        return;
    }
    panic!("the lock port was taken by others five times");
}
