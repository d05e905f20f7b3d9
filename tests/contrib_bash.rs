//! contrib/clients/lockd.sh, run by real bash against a real lockd on loopback.
//!
//! Each test starts its own server (in-process, 127.0.0.1:0) and runs bash scripts that source
//! the library as a user would. Time limits here only guard against hangs.

#[path = "support/blocking.rs"]
mod blocking;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use blocking::{Lockd, Output};

const GUARD: Duration = Duration::from_secs(60);

/// Runs `script` with bash (the library sourced first, `set -euo pipefail` on), LOCKD_ADDR
/// pointing at `lockd`, and `stdin` fed in.
fn bash(lockd: &Lockd, script: &str) -> Child {
    let library = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/lockd.sh");
    let full = format!("set -euo pipefail\n. '{}'\n{script}\n", library.display());
    Command::new("bash")
        .arg("-c")
        .arg(full)
        .env("LOCKD_ADDR", lockd.addr.to_string())
        .env_remove("LOCKD_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash must be installed")
}

fn finish(child: Child, stdin: &str) -> Output {
    blocking::finish(child, stdin, GUARD)
}

fn run(lockd: &Lockd, script: &str) -> Output {
    finish(bash(lockd, script), "")
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "bash failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

#[test]
fn lock_unlock_renew_check_with_documented_codes() {
    let lockd = Lockd::start();
    let out = run(
        &lockd,
        r#"
        t=$(lockd_lock deploy ttl=5s)
        [[ $t =~ ^[0-9]+$ ]]
        echo "renewed=$(lockd_renew deploy "$t" ttl=1m)"
        left=$(lockd_check deploy "$t")
        (( left > 5000 ))
        rc=0; LOCKD_ID=someone-else lockd_try deploy || rc=$?
        echo "try=$rc"
        lockd_unlock deploy "$t"
        rc=0; lockd_unlock deploy "$t" || rc=$?
        echo "unlock-again=$rc"
        rc=0; lockd_renew deploy "$t" >/dev/null || rc=$?
        echo "renew-lost=$rc"
        rc=0; lockd_check deploy "$t" >/dev/null || rc=$?
        echo "check-lost=$rc"
        t2=$(LOCKD_ID=someone-else lockd_try deploy)
        (( t2 > t ))
        lockd_unlock deploy "$t2"
        rc=0; lockd_lock 'two words' || rc=$?
        echo "bad-name=$rc"
        rc=0; lockd_lock deploy ttl=0 || rc=$?
        echo "bad-ttl=$rc"
        rc=0; lockd_lock deploy colour=red || rc=$?
        echo "bad-option=$rc"
        rc=0; LOCKD_ADDR=127.0.0.1:1 lockd_lock deploy || rc=$?
        echo "no-server=$rc"
        lockd_request "PING"
        echo "reply=$LOCKD_REPLY"
        "#,
    );
    assert_ok(&out);
    for want in [
        "renewed=60000",
        "try=1",
        "unlock-again=1",
        "renew-lost=1",
        "check-lost=1",
        "bad-name=2",
        "bad-ttl=2",
        "bad-option=2",
        "no-server=3",
        "reply=OK PONG",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == want),
            "missing {want:?} in:\n{}",
            out.stdout
        );
    }
    assert!(out.stderr.contains("ERR TIMEOUT"), "{}", out.stderr);
    assert!(out.stderr.contains("cannot connect"), "{}", out.stderr);
    assert_eq!(lockd.request("STATUS deploy"), "OK deploy free");
}

#[test]
fn a_wait_that_runs_out_returns_1() {
    let lockd = Lockd::start();
    assert!(lockd.request("LOCK busy holder ttl=1m").starts_with("OK "));
    let out = run(
        &lockd,
        r#"
        rc=0; lockd_lock busy wait=200ms || rc=$?
        echo "wait=$rc"
        rc=0; lockd_run busy try -- echo must-not-run || rc=$?
        echo "run-try=$rc"
        "#,
    );
    assert_ok(&out);
    assert!(out.stdout.contains("wait=1"), "{}", out.stdout);
    assert!(out.stdout.contains("run-try=1"), "{}", out.stdout);
    assert!(!out.stdout.contains("must-not-run"), "{}", out.stdout);
}

#[test]
fn concurrent_bash_processes_exclude_each_other() {
    let lockd = Lockd::start();
    let dir = std::env::temp_dir().join(format!("lockd-contrib-bash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // The critical section claims a directory (mkdir is atomic) and would fail if another
    // process were inside; half the processes use lockd_run, half lockd_lock/lockd_unlock.
    let section = format!(
        "mkdir '{d}/inside' || echo overlap >> '{d}/violations'; sleep 0.02; \
         echo x >> '{d}/count'; rmdir '{d}/inside'",
        d = dir.display()
    );
    let children: Vec<Child> = (0..4)
        .map(|i| {
            let script = if i % 2 == 0 {
                format!(
                    "for _ in 1 2 3 4 5; do lockd_run shared ttl=10s wait=30s -- \
                     bash -c \"{section}\"; done"
                )
            } else {
                format!(
                    "for _ in 1 2 3 4 5; do t=$(lockd_lock shared ttl=10s wait=30s); \
                     {section}; lockd_unlock shared \"$t\"; done"
                )
            };
            bash(&lockd, &script)
        })
        .collect();
    for child in children {
        assert_ok(&finish(child, ""));
    }
    let count = std::fs::read_to_string(dir.join("count")).expect("count file");
    let violations = std::fs::read_to_string(dir.join("violations")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(violations, "", "two processes were inside at once");
    assert_eq!(count.lines().count(), 20);
    assert_eq!(lockd.request("STATUS shared"), "OK shared free");
}

#[test]
fn run_propagates_the_exit_code_stdin_and_token_and_releases() {
    let lockd = Lockd::start();
    let out = finish(
        bash(
            &lockd,
            r#"
            rc=0; lockd_run job ttl=1s -- bash -c 'read -r line; echo "got $line token=$LOCKD_TOKEN"; sleep 1.2; exit 7' || rc=$?
            echo "rc=$rc"
            echo "status=$(lockd_request 'STATUS job'; echo "$LOCKD_REPLY")"
            "#,
        ),
        "hello\n",
    );
    assert_ok(&out);
    // The command outlived its 1 s ttl: renewal kept the lock, and it ended released.
    assert!(out.stdout.contains("got hello token="), "{}", out.stdout);
    assert!(out.stdout.contains("rc=7"), "{}", out.stdout);
    assert!(out.stdout.contains("status=OK job free"), "{}", out.stdout);
}

#[test]
fn run_stops_the_command_when_the_lease_is_lost() {
    let lockd = Lockd::start();
    let mark =
        std::env::temp_dir().join(format!("lockd-contrib-bash-started-{}", std::process::id()));
    let _ = std::fs::remove_file(&mark);
    let child = bash(
        &lockd,
        &format!(
            r#"
        # A well-behaved command passes SIGTERM on to its own children.
        rc=0; lockd_run doomed ttl=1s -- bash -c \
            'trap "kill \$child; exit 143" TERM; echo started; touch {mark}; sleep 30 & child=$!; wait $child; echo finished' \
            || rc=$?
        echo "rc=$rc"
        "#,
            mark = mark.display()
        ),
    );
    // Take the lease away once the command runs (its trap is set), as an expiry or an
    // operator would.
    let deadline = Instant::now() + GUARD;
    let token = loop {
        if let Some(token) = lockd.holder_token("doomed").filter(|_| mark.exists()) {
            break token;
        }
        assert!(
            Instant::now() < deadline,
            "the command never started under the lock"
        );
        thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_file(&mark);
    assert_eq!(lockd.request(&format!("UNLOCK doomed {token}")), "OK");
    let out = finish(child, "");
    assert_ok(&out);
    assert!(out.stdout.contains("started"), "{}", out.stdout);
    assert!(!out.stdout.contains("finished"), "{}", out.stdout);
    assert!(out.stdout.contains("rc=5"), "{}", out.stdout);
    assert!(out.stderr.contains("lost"), "{}", out.stderr);
    assert_eq!(out.code(), Some(0));
}

#[test]
fn under_set_e_a_plain_run_exits_with_the_command_code_or_5() {
    let lockd = Lockd::start();
    // `set -e` is on (see `bash`): a failing lockd_run ends the script with its code.
    let out = run(
        &lockd,
        "lockd_run plain -- bash -c 'exit 3'; echo not-reached",
    );
    assert_eq!(out.code(), Some(3), "{}", out.stderr);
    assert!(!out.stdout.contains("not-reached"));
    assert_eq!(lockd.request("STATUS plain"), "OK plain free");

    let child = bash(
        &lockd,
        "lockd_run plain ttl=1s -- bash -c 'exec sleep 30'; echo not-reached",
    );
    let deadline = Instant::now() + GUARD;
    let token = loop {
        if let Some(token) = lockd.holder_token("plain") {
            break token;
        }
        assert!(Instant::now() < deadline, "the lock was never taken");
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(lockd.request(&format!("UNLOCK plain {token}")), "OK");
    let out = finish(child, "");
    assert_eq!(out.code(), Some(5), "{}", out.stderr);
    assert!(!out.stdout.contains("not-reached"));
}

#[test]
fn sigterm_to_the_script_stops_the_command_and_releases_the_lock() {
    let lockd = Lockd::start();
    let child = bash(
        &lockd,
        "lockd_run term ttl=30s -- bash -c 'exec sleep 30'; echo not-reached",
    );
    let deadline = Instant::now() + GUARD;
    while lockd.holder_token("term").is_none() {
        assert!(Instant::now() < deadline, "the lock was never taken");
        thread::sleep(Duration::from_millis(20));
    }
    // bash's own kill: no procps needed.
    let killed = Command::new("bash")
        .arg("-c")
        .arg(format!("kill -TERM {}", child.id()))
        .status()
        .expect("kill");
    assert!(killed.success());
    let out = finish(child, "");
    // Like a script without the library: ended by the signal, no exit code.
    assert_eq!(out.code(), None, "{:?}: {}", out.status, out.stderr);
    assert!(!out.stdout.contains("not-reached"));
    assert_eq!(lockd.request("STATUS term"), "OK term free");
}
