//! The `lockd` binary as a user runs it: flags and signals (its docs: man.rs).

mod env_docs;
mod man;

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::line::Line;
use crate::common::Lockd;

const LOCKD: &str = env!("CARGO_BIN_EXE_lockd");
const GUARD: Duration = Duration::from_secs(10);

fn ask(addr: SocketAddr, line: &str) -> String {
    // A connection reset at connect (seen once on a loaded CI machine, just after the start
    // probe's connection) is tried again: the test is about the flags, not the listen queue.
    let start = Instant::now();
    let mut c = loop {
        match Line::open(addr, None, Some(GUARD)) {
            Ok(c) => break c,
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionReset && start.elapsed() < GUARD =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    c.req(line)
}

#[test]
fn bad_flags_exit_with_a_message() {
    let out = Command::new(LOCKD)
        .args(["--default-ttl", "2h", "--max-ttl", "1h"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--default-ttl"));

    let out = Command::new(LOCKD)
        .args(["--max-ttl", "soon"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));

    let out = Command::new(LOCKD)
        .args(["--tls-handshake-timeout", "0"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));

    // The old protocol's lease obeys the same minimum ttl as LOCK's.
    let out = Command::new(LOCKD)
        .args(["--compat", "--unlock-timeout", "100us"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--unlock-timeout"));
}

#[test]
fn busy_port_is_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = Command::new(LOCKD)
        .args(["--listen", &addr])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot listen on") && err.contains(&addr),
        "{err}"
    );
}

#[test]
fn max_name_flag_limits_names_and_ids() {
    let lockd = Lockd::new().args(["--max-name", "8"]).spawn();
    let addr = lockd.addr;
    assert!(ask(addr, "LOCK eightchr me").starts_with("OK "));
    assert!(ask(addr, "LOCK ninechars me").starts_with("ERR BADARG "));
    assert!(ask(addr, "LOCK x ninechars").starts_with("ERR BADARG "));
    assert_eq!(
        ask(addr, "STATUS ninechars"),
        "ERR BADARG name is 9 bytes; this server allows at most 8"
    );
    lockd.kill();
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let mut lockd = Lockd::new().spawn();
    let addr = lockd.addr;
    assert_eq!(ask(addr, "PING"), "OK PONG");
    // A waiting LOCK is told the server is going away.
    assert!(ask(addr, "LOCK job a").starts_with("OK "));
    let mut waiter = Line::open(addr, None, Some(GUARD)).expect("connect");
    waiter.send("LOCK job b");
    // Make sure the LOCK is queued before the signal.
    let start = Instant::now();
    while !ask(addr, "STATUS job").ends_with("waiters=1") {
        assert!(start.elapsed() < GUARD, "waiter never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = libc::pid_t::try_from(lockd.pid()).expect("a pid");
    // SAFETY: plain kill of the test's own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill");
    let line = waiter.line();
    assert!(line.starts_with("ERR SHUTDOWN "), "{line:?}");
    let exit = lockd.wait_exit();
    assert!(exit.success(), "{exit:?}");
}
