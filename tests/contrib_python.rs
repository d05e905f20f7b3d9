//! contrib/clients/python: its unittest suite, run by the machine's python3 against a real
//! lockd on loopback (LOCKD_ADDR tells the suite where), and the client in real processes
//! that are killed or lose their connection.

#[path = "support/blocking.rs"]
mod blocking;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use blocking::{eventually, signal, Lockd, Proxy};

/// Only a guard against a hang; the suite takes a few seconds.
const GUARD: Duration = Duration::from_secs(120);

fn client_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/python")
}

/// Runs python3 in the client's directory with `args`, LOCKD_ADDR set to `addr`.
fn python(addr: &str, args: &[&str]) -> Child {
    Command::new("python3")
        .args(args)
        .current_dir(client_dir())
        .env("LOCKD_ADDR", addr)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (CI installs it)")
}

/// Runs `script` (after `import lockd_client`, with ADDR set from LOCKD_ADDR).
fn script(addr: &str, script: &str) -> Child {
    let full =
        format!("import os, sys, time, lockd_client\nADDR = os.environ['LOCKD_ADDR']\n{script}");
    python(addr, &["-c", &full])
}

#[test]
fn python_client_unittest_suite_passes_against_a_real_lockd() {
    let lockd = Lockd::start();
    let child = python(
        &lockd.addr.to_string(),
        &["-m", "unittest", "-v", "test_lockd_client"],
    );
    // unittest reports on stderr.
    let blocking::Output {
        status,
        stdout: out,
        stderr: err,
    } = blocking::finish(child, "", GUARD);
    assert!(status.success(), "unittest failed:\n{out}\n{err}");
    // A suite that skipped itself (no LOCKD_ADDR) would pass without testing anything.
    assert!(!err.contains("skipped"), "tests were skipped:\n{err}");
    assert!(err.contains("\nOK"), "no OK summary:\n{err}");
    // The suite leaves the server as it found it.
    eventually(GUARD, "every lock the suite took is released", || {
        lockd.request("STATUS") == "OK 0"
    });
}

/// A process killed while it waits in the queue leaves it: when the holder releases, the lock
/// goes to the next waiter, never to the dead one (which would keep it for its whole ttl).
#[test]
fn a_client_killed_while_waiting_never_gets_the_lock() {
    let cases = [
        // Client.lock: a plain lease, so the wait is sent with `detach`.
        (
            "print(lockd_client.Client(ADDR).lock('queue', ttl=600), flush=True)",
            libc::SIGTERM,
        ),
        // with lock(...): a session lease with grace.
        (
            "with lockd_client.lock('queue', server=ADDR, ttl=600):\n    print('inside', flush=True)",
            libc::SIGKILL,
        ),
    ];
    for (code, sig) in cases {
        let lockd = Lockd::start();
        let held = lockd.request("LOCK queue holder ttl=10m");
        let mut waiter = script(&lockd.addr.to_string(), code);
        eventually(GUARD, "the client waits", || lockd.waiters("queue") == 1);
        let next = lockd.request_in_background("LOCK queue next ttl=10m");
        eventually(GUARD, "the next one waits behind it", || {
            lockd.waiters("queue") == 2
        });
        signal(&waiter, sig);
        let _ = waiter.wait();
        eventually(GUARD, "the killed client leaves the queue", || {
            lockd.waiters("queue") == 1
        });
        let token = held.strip_prefix("OK ").expect("holder's token");
        assert_eq!(lockd.request(&format!("UNLOCK queue {token}")), "OK");
        let granted = next.join().expect("next waiter");
        assert!(granted.starts_with("OK "), "{granted}");
        assert_eq!(lockd.holder_id("queue").as_deref(), Some("next"), "{code}");
    }
}

/// `with lock(...)` through a proxy that cuts its connection: the renewal thread reconnects
/// and renews within the grace, and the body holds the lock past the grace and to its end.
#[test]
fn a_lease_rides_out_a_dropped_connection_within_its_grace() {
    let lockd = Lockd::start();
    let proxy = Proxy::start(lockd.addr);
    let grace = Duration::from_secs(3);
    let child = script(
        &proxy.addr.to_string(),
        "lease = lockd_client.lock('rides', server=ADDR, ttl=60, session=3)\n\
         with lease as token:\n    sys.stdin.readline()\n    lease.check()\n\
         print('released', flush=True)",
    );
    let mut token = None;
    eventually(GUARD, "the lease is taken", || {
        token = lockd.holder_token("rides");
        token.is_some()
    });
    let token = token.expect("token");
    assert!(lockd.request("STATUS rides").contains(" session=1 "));
    proxy.cut();
    eventually(GUARD, "the client reconnects", || proxy.accepted() >= 2);
    // Past the grace of the dropped connection, the lease is still the client's.
    thread::sleep(grace + Duration::from_secs(1));
    let checked = lockd.request(&format!("CHECK rides {token}"));
    assert!(checked.starts_with("OK ttl_ms="), "{checked}");
    let out = blocking::finish(child, "\n", GUARD);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("released"), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS rides"), "OK rides free");
}

/// When the connection stays down past the grace, the server ends the lease and the client
/// says so: LeaseLost, whose exit code is lockctl's 4.
#[test]
fn a_lease_is_lost_when_its_connection_stays_down_past_the_grace() {
    let lockd = Lockd::start();
    let proxy = Proxy::start(lockd.addr);
    let child = script(
        &proxy.addr.to_string(),
        "lease = lockd_client.lock('cut', server=ADDR, ttl=600, session=2)\n\
         try:\n    with lease:\n        deadline = time.monotonic() + 60\n        \
         while not lease.lost and time.monotonic() < deadline:\n            time.sleep(0.05)\n\
         except lockd_client.LockdError as e:\n    print(e, file=sys.stderr)\n    sys.exit(e.exit_code)",
    );
    eventually(GUARD, "the lease is taken", || {
        lockd.holder_token("cut").is_some()
    });
    proxy.refuse(true);
    proxy.cut();
    // The grace (2 s), not the ttl (10 min), ends it.
    eventually(GUARD, "the server ends the lease", || {
        lockd.request("STATUS cut") == "OK cut free"
    });
    let out = blocking::finish(child, "", GUARD);
    assert_eq!(out.code(), Some(4), "{}", out.stderr);
    assert!(out.stderr.contains("lost"), "{}", out.stderr);
}

/// A process killed while it holds a `with lock(...)` loses the lock within the grace, not
/// at the end of its ttl.
#[test]
fn a_killed_holder_frees_the_lock_within_the_grace() {
    let lockd = Lockd::start();
    let mut child = script(
        &lockd.addr.to_string(),
        "with lockd_client.lock('killed', server=ADDR, ttl=600, session=2):\n    time.sleep(600)",
    );
    eventually(GUARD, "the lease is taken", || {
        lockd.holder_token("killed").is_some()
    });
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
    eventually(GUARD, "the lock is free after the grace", || {
        lockd.request("STATUS killed") == "OK killed free"
    });
}
