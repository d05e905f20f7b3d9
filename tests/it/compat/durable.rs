//! The two-port mode with `--data-dir`: a lock taken through the lock port survives a crash of
//! lockd, keeps the lock port closed after the restart, and an old client's `unlock:` still
//! releases it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_ports, Lockd};

const GUARD: Duration = Duration::from_secs(10);

struct Ports {
    lock: u16,
    unlock: u16,
    line: u16,
}

fn start(ports: &Ports, data: &std::path::Path) -> Child {
    let child = Lockd::new()
        .listen(format!("127.0.0.1:{}", ports.line))
        .data_dir(data)
        .args(["--compat"])
        .command()
        .env("SERVER_ADDR", "127.0.0.1")
        .env("LOCK_PORT", ports.lock.to_string())
        .env("UNLOCK_PORT", ports.unlock.to_string())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn lockd");
    // The line port accepts (into its backlog) as soon as it is bound, before the state is
    // recovered and the compat ports are open: wait for an answer, not for a connection.
    let start = Instant::now();
    while !message(ports.line, "PING").starts_with("OK PONG") {
        assert!(start.elapsed() < GUARD, "lockd did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Sends one old-protocol message and returns the whole reply.
fn message(port: u16, msg: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    s.set_read_timeout(Some(GUARD)).expect("timeout");
    s.write_all(format!("{msg}\n").as_bytes()).expect("write");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
}

fn open(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[test]
fn compat_lock_survives_a_crash_and_is_still_unlockable() {
    let data = std::env::temp_dir().join(format!("lockd-compat-durable-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let [lock, unlock, line] = free_ports(3)[..] else {
        unreachable!()
    };
    let ports = Ports { lock, unlock, line };
    let mut lockd = start(&ports, &data);
    assert_eq!(
        message(ports.lock, "lock:old-client:1700000000"),
        "oklocked\n"
    );
    let _ = lockd.kill();
    let _ = lockd.wait();

    let mut lockd = start(&ports, &data);
    assert!(
        !open(ports.lock),
        "lock port open while the restored lock is held"
    );
    assert_eq!(
        message(ports.unlock, "unlock:other:1700000001"),
        "okunlocked\n"
    );
    let start = Instant::now();
    while !open(ports.lock) {
        assert!(start.elapsed() < GUARD, "lock port never reopened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = lockd.kill();
    let _ = lockd.wait();
    let _ = std::fs::remove_dir_all(&data);
}
