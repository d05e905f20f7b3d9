//! contrib/clients/python: its unittest suite, run by the machine's python3 against a real
//! lockd on loopback (LOCKD_ADDR tells the suite where), and the client in real processes
//! that are killed or lose their connection.

use crate::common;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::blocking::{
    assert_killed_waiter_never_gets_the_lock, assert_renews_elsewhere_after_a_cut,
    assert_rides_out_a_cut, cut_for_good, eventually, signal, Mark, Proxy, Server,
};
use common::dead_addr;
use common::pki::Pki;

/// Only a guard against a hang; the suite takes a few seconds.
const GUARD: Duration = Duration::from_secs(120);

fn client_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/python")
}

/// Runs python3 in the client's directory with `args`, LOCKD_ADDR set to `addr`.
fn python(addr: &str, args: &[&str]) -> Child {
    python_with(addr, args, &[])
}

/// [`python`] with more variables.
fn python_with(addr: &str, args: &[&str], env: &[(&str, &OsStr)]) -> Child {
    Command::new("python3")
        .args(args)
        .current_dir(client_dir())
        .env("LOCKD_ADDR", addr)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (CI installs it)")
}

/// Asserts that a unittest run passed, and tested something.
fn assert_suite_passed(out: &common::blocking::Output) {
    // unittest reports on stderr.
    let (status, out, err) = (&out.status, &out.stdout, &out.stderr);
    assert!(status.success(), "unittest failed:\n{out}\n{err}");
    // A suite that skipped itself (no LOCKD_ADDR) would pass without testing anything.
    assert!(!err.contains("skipped"), "tests were skipped:\n{err}");
    assert!(err.contains("\nOK"), "no OK summary:\n{err}");
}

/// Runs `script` (after `import lockd_client`, with ADDR set from LOCKD_ADDR).
fn script(addr: &str, script: &str) -> Child {
    let full =
        format!("import os, sys, time, lockd_client\nADDR = os.environ['LOCKD_ADDR']\n{script}");
    python(addr, &["-c", &full])
}

#[test]
fn python_client_unittest_suite_passes_against_a_real_lockd() {
    let lockd = Server::start();
    let child = python(
        &lockd.addr.to_string(),
        &["-m", "unittest", "-v", "test_lockd_client"],
    );
    assert_suite_passed(&common::blocking::finish(child, "", GUARD));
    // The suite leaves the server as it found it.
    eventually(GUARD, "every lock the suite took is released", || {
        lockd.request("STATUS") == "OK 0"
    });
}

/// The whole suite again, over mutual TLS (the client takes lockctl's variables), and the TLS
/// tests: a real `lockd --tls-cert --tls-key --tls-client-ca`, certificates made here.
#[test]
fn python_client_suite_passes_over_mutual_tls() {
    let pki = Pki::new("python");
    let stranger = Pki::new("python-stranger");
    let (cert, key) = pki.server();
    let ca = pki.ca();
    let lockd = common::Lockd::new()
        .args([
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            ca.to_str().unwrap(),
        ])
        .spawn();
    let plain = Server::start();
    let plain_addr = plain.addr.to_string();
    let (me, my_key) = pki.client("python-suite");
    let (them, their_key) = stranger.client("mallory");
    let other_ca = stranger.ca();
    let env: [(&str, &OsStr); 7] = [
        ("LOCKD_TLS_CA", ca.as_os_str()),
        ("LOCKD_CLIENT_CERT", me.as_os_str()),
        ("LOCKD_CLIENT_KEY", my_key.as_os_str()),
        ("LOCKD_TEST_OTHER_CA", other_ca.as_os_str()),
        ("LOCKD_TEST_STRANGER_CERT", them.as_os_str()),
        ("LOCKD_TEST_STRANGER_KEY", their_key.as_os_str()),
        ("LOCKD_TEST_PLAIN_ADDR", OsStr::new(&plain_addr)),
    ];
    let child = python_with(
        &lockd.addr.to_string(),
        &[
            "-m",
            "unittest",
            "-v",
            "test_lockd_client",
            "test_lockd_client_tls",
        ],
        &env,
    );
    assert_suite_passed(&common::blocking::finish(child, "", GUARD));
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
        eprintln!("{code}");
        assert_killed_waiter_never_gets_the_lock(&Server::start(), sig, GUARD, |lockd| {
            script(&lockd.addr.to_string(), code)
        });
    }
}

/// `with lock(...)` through a proxy that cuts its connection: the renewal thread reconnects
/// and renews within the grace, and the body holds the lock past the grace and to its end.
#[test]
fn a_lease_rides_out_a_dropped_connection_within_its_grace() {
    let lockd = Server::start();
    let proxy = Proxy::start(lockd.addr);
    let mark = Mark::new("python-rides");
    let child = script(
        &proxy.addr.to_string(),
        &format!(
            "lease = lockd_client.lock('rides', server=ADDR, ttl=60, session=3)\n\
             with lease as token:\n    open({:?}, 'w').write('in\\n')\n    \
             sys.stdin.readline()\n    lease.check()\n\
             print('released', flush=True)",
            mark.path.display().to_string()
        ),
    );
    // Once the body runs: the lease is taken and renewed.
    mark.wait(GUARD);
    assert_rides_out_a_cut(&lockd, &proxy, "rides", Duration::from_secs(3), GUARD);
    let out = common::blocking::finish(child, "\n", GUARD);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("released"), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS rides"), "OK rides free");
}

/// LOCKD_ADDR lists a dead address first: the client connects to the second, for `Client`
/// and for `with lock(...)`, which take the list from LOCKD_ADDR as lockctl does.
#[test]
fn a_dead_first_address_is_passed_over_for_the_next() {
    let lockd = Server::start();
    let dead = dead_addr();
    let list = format!("{dead},{}", lockd.addr);
    let out = common::blocking::finish(
        script(
            &list,
            "c = lockd_client.Client()\n\
             t = c.lock('fo', ttl=60)\n\
             print(c.server, c.address, flush=True)\n\
             c.unlock('fo', t)\n\
             with lockd_client.lock('fo', ttl=60) as token:\n    \
             print('inside', token, flush=True)",
        ),
        "",
        GUARD,
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains(&format!("{list} {}\n", lockd.addr)),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("inside "), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS fo"), "OK fo free");
}

/// `with lock(...)` with two addresses, the first through a proxy: when the proxy cuts the
/// connection, the renewal thread reconnects to the second address (not back through the
/// proxy, which may lead to the front-end that is down) and renews within the grace.
#[test]
fn a_lease_reconnects_to_the_next_address_after_a_cut() {
    let lockd = Server::start();
    let proxy = Proxy::start(lockd.addr);
    let mark = Mark::new("python-next");
    let list = format!("{},{}", proxy.addr, lockd.addr);
    let child = script(
        &list,
        &format!(
            "lease = lockd_client.lock('next', ttl=60, session=3)\n\
             with lease as token:\n    open({:?}, 'w').write('in\\n')\n    \
             sys.stdin.readline()\n    lease.check()\n\
             print('released', flush=True)",
            mark.path.display().to_string()
        ),
    );
    mark.wait(GUARD);
    assert_renews_elsewhere_after_a_cut(&lockd, &proxy, "next", Duration::from_secs(3), GUARD);
    let out = common::blocking::finish(child, "\n", GUARD);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("released"), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS next"), "OK next free");
}

/// When the connection stays down past the grace, the server ends the lease and the client
/// says so: LeaseLost, whose exit code is lockctl's 4.
#[test]
fn a_lease_is_lost_when_its_connection_stays_down_past_the_grace() {
    let lockd = Server::start();
    let proxy = Proxy::start(lockd.addr);
    let mark = Mark::new("python-cut");
    let child = script(
        &proxy.addr.to_string(),
        &format!(
            "lease = lockd_client.lock('cut', server=ADDR, ttl=600, session=2)\n\
             try:\n    with lease:\n        open({:?}, 'w').write('in\\n')\n        \
             deadline = time.monotonic() + 60\n        \
             while not lease.lost and time.monotonic() < deadline:\n            \
             time.sleep(0.05)\n\
             except lockd_client.LockdError as e:\n    print(e, file=sys.stderr)\n    \
             sys.exit(e.exit_code)",
            mark.path.display().to_string()
        ),
    );
    mark.wait(GUARD);
    cut_for_good(&lockd, &proxy, "cut", GUARD);
    let out = common::blocking::finish(child, "", GUARD);
    assert_eq!(out.code(), Some(4), "{}", out.stderr);
    assert!(out.stderr.contains("lost"), "{}", out.stderr);
}

/// A process killed while it holds a `with lock(...)` loses the lock within the grace, not
/// at the end of its ttl.
#[test]
fn a_killed_holder_frees_the_lock_within_the_grace() {
    let lockd = Server::start();
    let mut child = script(
        &lockd.addr.to_string(),
        "with lockd_client.lock('killed', server=ADDR, ttl=600, session=2):\n    time.sleep(600)",
    );
    lockd.wait_held("killed", GUARD);
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
    eventually(GUARD, "the lock is free after the grace", || {
        lockd.request("STATUS killed") == "OK killed free"
    });
}

/// Python processes share a semaphore of two: two `with lock(..., limit=2)` bodies run at
/// once and a third waits for a slot; a LOCK that does not fit the semaphore exits with
/// lockctl's code 2 (Conflict's `exit_code`).
#[test]
fn processes_share_a_semaphore_and_a_lock_that_does_not_fit_exits_2() {
    let lockd = Server::start();
    let addr = lockd.addr.to_string();
    let marks = [1, 2, 3].map(|i| Mark::new(&format!("python-sem-{i}")));
    // Holds a slot from when it writes its mark until a line comes on its stdin.
    let slot = |mark: &Mark| {
        script(
            &addr,
            &format!(
                "with lockd_client.lock('sem', server=ADDR, ttl=60, limit=2):\n    \
                 open({:?}, 'w').write('in\\n')\n    sys.stdin.readline()",
                mark.path.display().to_string()
            ),
        )
    };
    let first = slot(&marks[0]);
    let second = slot(&marks[1]);
    marks[0].wait(GUARD);
    marks[1].wait(GUARD);
    assert_eq!(lockd.holders("sem"), 2);
    let third = slot(&marks[2]);
    eventually(GUARD, "the third one waits", || lockd.waiters("sem") == 1);
    assert!(!marks[2].path.exists(), "the third one ran beside two");

    let out = common::blocking::finish(
        script(
            &addr,
            "try:\n    lockd_client.Client(ADDR).lock('sem', shared=True)\n\
             except lockd_client.LockdError as e:\n    print(e, file=sys.stderr)\n    \
             sys.exit(e.exit_code)",
        ),
        "",
        GUARD,
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("ERR CONFLICT"), "{}", out.stderr);

    // One leaves: the third takes its slot.
    let done = common::blocking::finish(first, "\n", GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    marks[2].wait(GUARD);
    for child in [third, second] {
        let done = common::blocking::finish(child, "\n", GUARD);
        assert!(done.status.success(), "{}", done.stderr);
    }
    assert_eq!(lockd.request("STATUS"), "OK 0");
}

/// The login suite against the real binary started with an auth file: the client logs in
/// with arguments, a secret file or lockctl's variables, again on every new connection, and
/// is refused (exit code 2, the secret never shown) when wrong.
#[test]
fn python_client_logs_in_and_is_refused_when_wrong() {
    const SECRET: &str = "python-ci-secret-0123456789abcdef";
    let dir = std::env::temp_dir().join(format!("contrib-python-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let users = dir.join("users");
    let line = lockd::auth::user_line("ci lock=ci-* read=*", SECRET, [5; 16]).unwrap();
    std::fs::write(&users, line + "\n").unwrap();
    let lockd = common::Lockd::new()
        .args(["--auth-file", users.to_str().unwrap()])
        .spawn();
    let child = python_with(
        &lockd.addr.to_string(),
        &["-m", "unittest", "-v", "test_lockd_client_auth"],
        &[("LOCKD_TEST_SECRET", OsStr::new(SECRET))],
    );
    assert_suite_passed(&common::blocking::finish(child, "", GUARD));
    let log = lockd.stop().join("\n");
    assert!(!log.contains(SECRET), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
