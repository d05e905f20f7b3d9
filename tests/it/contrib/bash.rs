//! contrib/clients/lockd.sh, run by real bash against a real lockd on loopback.
//!
//! Each test starts its own server (in-process, 127.0.0.1:0) and runs bash scripts that source
//! the library as a user would. Time limits here only guard against hangs.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::blocking::{
    assert_killed_waiter_never_gets_the_lock, assert_renews_elsewhere_after_a_cut,
    assert_rides_out_a_cut, cut_for_good, eventually, signal, Mark, Output, Proxy, Server,
};
use common::dead_addr;

const GUARD: Duration = Duration::from_secs(60);

/// Runs `script` with bash (the library sourced first, `set -euo pipefail` on), LOCKD_ADDR
/// pointing at `lockd`, and `stdin` fed in.
fn bash(lockd: &Server, script: &str) -> Child {
    bash_at(&lockd.addr.to_string(), script, false)
}

/// `bash`, with LOCKD_ADDR set to `addr`; in a process group of its own if `own_group`.
fn bash_at(addr: &str, script: &str, own_group: bool) -> Child {
    let library = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/lockd.sh");
    let full = format!("set -euo pipefail\n. '{}'\n{script}\n", library.display());
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(full)
        .env("LOCKD_ADDR", addr)
        .env_remove("LOCKD_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if own_group {
        command.process_group(0);
    }
    command.spawn().expect("bash must be installed")
}

fn held(lockd: &Server, name: &str) -> u64 {
    lockd.wait_held(name, GUARD)
}

fn finish(child: Child, stdin: &str) -> Output {
    common::blocking::finish(child, stdin, GUARD)
}

fn run(lockd: &Server, script: &str) -> Output {
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
    let lockd = Server::start();
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
    // lockctl's exit codes: 1 held by someone else, 2 usage, 3 unreachable, 4 not the lease.
    for want in [
        "renewed=60000",
        "try=1",
        "unlock-again=4",
        "renew-lost=4",
        "check-lost=4",
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

/// `lockd_lock NAME and=NAME2`: a set, one token per name on one line; UNLOCK of the first
/// name releases both, and an overlapping set that does not wait returns 1 and takes nothing.
#[test]
fn a_set_is_locked_whole_and_released_through_its_first_name() {
    let lockd = Server::start();
    let out = run(
        &lockd,
        r#"
        read -r t1 t2 < <(lockd_lock db-migrate ttl=1m and=cache-flush)
        [[ $t1 =~ ^[0-9]+$ && $t2 =~ ^[0-9]+$ ]]
        echo "tokens=$t1 $t2"
        rc=0; LOCKD_ID=someone-else lockd_lock report wait=0 and=cache-flush || rc=$?
        echo "overlap=$rc"
        left=$(lockd_check cache-flush "$t2")
        (( left > 5000 ))
        lockd_unlock db-migrate "$t1"
        rc=0; lockd_check cache-flush "$t2" >/dev/null || rc=$?
        echo "second-after-unlock=$rc"
        "#,
    );
    assert_ok(&out);
    for want in ["overlap=1", "second-after-unlock=4"] {
        assert!(
            out.stdout.lines().any(|l| l == want),
            "missing {want:?} in:\n{}",
            out.stdout
        );
    }
    let tokens = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("tokens="))
        .unwrap_or_else(|| panic!("no tokens in:\n{}", out.stdout));
    assert_eq!(tokens.split(' ').count(), 2, "{tokens}");
    for name in ["db-migrate", "cache-flush", "report"] {
        assert_eq!(
            lockd.request(&format!("STATUS {name}")),
            format!("OK {name} free")
        );
    }
}

#[test]
fn a_wait_that_runs_out_returns_1() {
    let lockd = Server::start();
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
    let lockd = Server::start();
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
    let lockd = Server::start();
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

/// `lockd_run NAME and=NAME2 -- CMD`: the set is held while CMD runs (every name at once),
/// CMD gets the names and a token variable per name, and both names are free after it.
#[test]
fn run_holds_a_set_and_gives_the_command_a_token_per_name() {
    let lockd = Server::start();
    let library = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/lockd.sh");
    let script = r#"
        lockd_run db-migrate ttl=1m and=cache.flush -- bash -c '
            echo "names=$LOCKD_NAMES"
            echo "tokens=$LOCKD_TOKENS"
            echo "each=$LOCKD_TOKEN_DB_MIGRATE $LOCKD_TOKEN_CACHE_FLUSH first=$LOCKD_TOKEN"
            . "@LIBRARY@"
            rc=0; LOCKD_ID=other lockd_try cache.flush || rc=$?
            echo "second-name-held=$rc"
        '
        echo "rc=$?"
        "#;
    let out = run(
        &lockd,
        &script.replace("@LIBRARY@", &library.display().to_string()),
    );
    assert_ok(&out);
    let line = |key: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{}\n{}", out.stdout, out.stderr))
            .to_owned()
    };
    assert_eq!(line("names="), "db-migrate cache.flush");
    let tokens = line("tokens=");
    let t: Vec<&str> = tokens.split(' ').collect();
    assert_eq!(t.len(), 2, "{tokens}");
    assert_eq!(t[0], t[1], "a set is one lease: one token");
    assert_eq!(line("each="), format!("{} {} first={}", t[0], t[1], t[0]));
    assert_eq!(line("second-name-held="), "1");
    assert_eq!(line("rc="), "0");
    for name in ["db-migrate", "cache.flush"] {
        assert_eq!(
            lockd.request(&format!("STATUS {name}")),
            format!("OK {name} free")
        );
    }
}

/// A set whose names give one token variable (`a-b`, `a.b`) is refused before anything is
/// sent, as lockctl refuses it; so is `supersede` with `and=`.
#[test]
fn run_refuses_a_set_it_could_not_tell_apart_and_a_superseding_set() {
    let lockd = Server::start();
    let out = run(
        &lockd,
        r#"
        rc=0; lockd_run a-b and=a.b -- true 2>/dev/null || rc=$?
        echo "same-variable=$rc"
        rc=0; lockd_run a-b and=c supersede -- true 2>/dev/null || rc=$?
        echo "supersede=$rc"
        "#,
    );
    assert_ok(&out);
    assert!(out.stdout.contains("same-variable=2"), "{}", out.stdout);
    assert!(out.stdout.contains("supersede=2"), "{}", out.stdout);
    for name in ["a-b", "a.b", "c"] {
        assert_eq!(
            lockd.request(&format!("STATUS {name}")),
            format!("OK {name} free")
        );
    }
}

/// lockd_run stops its renewer with a TERM when the command ends, wherever in its loop the
/// renewer is (napping, reading the clock, renewing): short commands of many lengths against a
/// short ttl put the TERM at every point of the loop, and every run must end with the
/// command's status and the lock free.
#[test]
fn a_run_ends_well_wherever_its_renewer_is_when_the_command_ends() {
    let lockd = Server::start();
    let out = run(
        &lockd,
        r#"
        bad=0
        for i in $(seq 0 39); do
            rc=0; lockd_run job ttl=300ms session=300ms -- sleep "0.0$((i % 10))$((i / 10))" || rc=$?
            if ((rc != 0)); then echo "run $i: rc=$rc"; bad=1; fi
        done
        echo "bad=$bad"
        echo "status=$(lockd_request 'STATUS job'; echo "$LOCKD_REPLY")"
        "#,
    );
    assert_ok(&out);
    assert!(
        out.stdout.contains("bad=0"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(out.stdout.contains("status=OK job free"), "{}", out.stdout);
}

#[test]
fn run_stops_the_command_when_the_lease_is_lost() {
    let lockd = Server::start();
    let mark = Mark::new("bash-started");
    let child = bash(
        &lockd,
        &format!(
            r#"
        # A well-behaved command passes SIGTERM on to its own children.
        rc=0; lockd_run doomed ttl=1s -- bash -c \
            'trap "kill \$child; exit 143" TERM; echo started; echo started > {mark}; sleep 30 & child=$!; wait $child; echo finished' \
            || rc=$?
        echo "rc=$rc"
        "#,
            mark = mark.path.display()
        ),
    );
    // Take the lease away once the command runs (its trap is set), as an expiry or an
    // operator would.
    let token = held(&lockd, "doomed");
    mark.wait(GUARD);
    assert_eq!(lockd.request(&format!("UNLOCK doomed {token}")), "OK");
    let out = finish(child, "");
    assert_ok(&out);
    assert!(out.stdout.contains("started"), "{}", out.stdout);
    assert!(!out.stdout.contains("finished"), "{}", out.stdout);
    assert!(out.stdout.contains("rc=4"), "{}", out.stdout);
    assert!(out.stderr.contains("lost"), "{}", out.stderr);
    assert_eq!(out.code(), Some(0));
}

#[test]
fn under_set_e_a_plain_run_exits_with_the_command_code_or_4() {
    let lockd = Server::start();
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
    let token = held(&lockd, "plain");
    assert_eq!(lockd.request(&format!("UNLOCK plain {token}")), "OK");
    let out = finish(child, "");
    assert_eq!(out.code(), Some(4), "{}", out.stderr);
    assert!(!out.stdout.contains("not-reached"));

    // A command that is not there: the shell's 127, and the lock released.
    let out = run(&lockd, "lockd_run plain -- no-such-command-here");
    assert_eq!(out.code(), Some(127), "{}", out.stderr);
    assert_eq!(lockd.request("STATUS plain"), "OK plain free");
}

#[test]
fn a_signal_to_the_script_stops_the_command_and_releases_the_lock() {
    let lockd = Server::start();
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let child = bash(
            &lockd,
            "lockd_run term ttl=30s -- bash -c 'exec sleep 30'; echo not-reached",
        );
        held(&lockd, "term");
        // To the script alone: lockd_run passes it on to the command (INT too, which a
        // background job of a script would otherwise ignore).
        signal(&child, sig);
        let out = finish(child, "");
        // Like a script without the library: ended by the signal, no exit code.
        assert_eq!(out.code(), None, "{:?}: {}", out.status, out.stderr);
        assert!(!out.stdout.contains("not-reached"));
        assert_eq!(lockd.request("STATUS term"), "OK term free");
    }
}

/// A script killed while it waits in the queue leaves it: when the holder releases, the lock
/// goes to the next waiter, never to the dead one (which would keep it for its whole ttl).
#[test]
fn a_script_killed_while_waiting_never_gets_the_lock() {
    let cases = [
        // The usual form: the wait runs in a command substitution's subshell, which outlives
        // the script killed on its own, and must notice.
        (
            r#"t=$(lockd_lock queue ttl=10m); echo "got $t""#,
            libc::SIGTERM,
        ),
        ("lockd_lock queue ttl=10m", libc::SIGKILL),
        // lockd_run's wait is a session LOCK; it traps TERM and must stop waiting.
        ("lockd_run queue ttl=10m -- echo ran", libc::SIGTERM),
    ];
    for (script, sig) in cases {
        eprintln!("{script}");
        assert_killed_waiter_never_gets_the_lock(&Server::start(), sig, GUARD, |lockd| {
            bash(lockd, script)
        });
    }
}

/// lockd_run through a proxy that cuts its connection: the renewer reconnects and renews
/// within the grace, and the command keeps the lock past the grace and to its end.
#[test]
fn run_rides_out_a_dropped_connection_within_its_grace() {
    let lockd = Server::start();
    let proxy = Proxy::start(lockd.addr);
    let mark = Mark::new("bash-rides");
    let child = bash_at(
        &proxy.addr.to_string(),
        &format!(
            r#"lockd_run rides ttl=1m session=3s -- bash -c 'echo in > {}; read -r line; echo "got $line"'"#,
            mark.path.display()
        ),
        false,
    );
    // Once the command runs: lockd_run has its lease and its renewer.
    mark.wait(GUARD);
    assert_rides_out_a_cut(&lockd, &proxy, "rides", Duration::from_secs(3), GUARD);
    let out = finish(child, "go\n");
    assert_ok(&out);
    assert!(out.stdout.contains("got go"), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS rides"), "OK rides free");
}

/// LOCKD_ADDR lists a dead address first: every call connects to the second; with every
/// address dead a call returns 3 naming them all; a list that cannot be one returns 2.
#[test]
fn a_dead_first_address_is_passed_over_for_the_next() {
    let lockd = Server::start();
    let (dead, also_dead) = (dead_addr(), dead_addr());
    let list = format!("{dead},{}", lockd.addr);
    let out = finish(
        bash_at(
            &list,
            &format!(
                r#"
        t=$(lockd_lock fo ttl=1m)
        lockd_renew fo "$t" >/dev/null
        lockd_status fo >/dev/null
        echo "addr=$lockd__addr"
        lockd_unlock fo "$t"
        lockd_run fo ttl=1m -- bash -c 'echo "ran $LOCKD_TOKEN"'
        rc=0; LOCKD_ADDR={dead},{also_dead} lockd_status || rc=$?
        echo "all-dead=$rc"
        rc=0; LOCKD_ADDR={dead},,{dead} lockd_status || rc=$?
        echo "empty-entry=$rc"
        "#
            ),
            false,
        ),
        "",
    );
    assert_ok(&out);
    for want in [
        format!("addr={}", lockd.addr),
        "all-dead=3".to_string(),
        "empty-entry=2".to_string(),
    ] {
        assert!(
            out.stdout.lines().any(|l| l == want),
            "missing {want:?} in:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
    assert!(out.stdout.contains("ran "), "{}", out.stdout);
    assert!(
        out.stderr
            .contains(&format!("cannot connect to any of {dead}, {also_dead}")),
        "{}",
        out.stderr
    );
    assert_eq!(lockd.request("STATUS fo"), "OK fo free");
}

/// lockd_run with two addresses, the first through a proxy that cuts its connection: the
/// renewer reconnects to the second address (not back through the proxy, which may lead to
/// the front-end that is down), renews within the grace, and the command runs to its end.
#[test]
fn run_reconnects_to_the_next_address_after_a_cut() {
    let lockd = Server::start();
    let proxy = Proxy::start(lockd.addr);
    let mark = Mark::new("bash-next");
    let child = bash_at(
        &format!("{},{}", proxy.addr, lockd.addr),
        &format!(
            r#"lockd_run next ttl=1m session=3s -- bash -c 'echo in > {}; read -r line; echo "got $line"'"#,
            mark.path.display()
        ),
        false,
    );
    mark.wait(GUARD);
    assert_renews_elsewhere_after_a_cut(&lockd, &proxy, "next", Duration::from_secs(3), GUARD);
    let out = finish(child, "go\n");
    assert_ok(&out);
    assert!(out.stdout.contains("got go"), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS next"), "OK next free");
}

/// When the connection stays down past the grace, the server ends the lease, and lockd_run
/// stops the command and returns 4.
#[test]
fn run_loses_the_lease_when_its_connection_stays_down_past_the_grace() {
    let lockd = Server::start();
    let proxy = Proxy::start(lockd.addr);
    let mark = Mark::new("bash-cut");
    let child = bash_at(
        &proxy.addr.to_string(),
        &format!(
            "lockd_run cut ttl=10m session=2s -- bash -c 'echo in > {}; exec sleep 60'; \
             echo not-reached",
            mark.path.display()
        ),
        false,
    );
    mark.wait(GUARD);
    cut_for_good(&lockd, &proxy, "cut", GUARD);
    let out = finish(child, "");
    assert_eq!(out.code(), Some(4), "{}", out.stderr);
    assert!(out.stderr.contains("lost"), "{}", out.stderr);
    assert!(!out.stdout.contains("not-reached"));
}

/// A killed lockd_run never keeps the lock: killed alone, its renewer stops the command and
/// releases at once; killed with everything it started, the server ends the lease after the
/// grace (2 s), long before the ttl (10 min).
#[test]
fn a_killed_run_frees_the_lock_within_the_grace() {
    let lockd = Server::start();
    let pid_file = Mark::new("bash-command-pid");
    for whole_group in [false, true] {
        pid_file.clear();
        let mut child = bash_at(
            &lockd.addr.to_string(),
            &format!(
                "lockd_run killed ttl=10m session=2s -- bash -c 'echo $$ > {}; exec sleep 60'",
                pid_file.path.display()
            ),
            true,
        );
        let command: i32 = pid_file.wait(GUARD).parse().expect("the command's pid");
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) only sends a signal, to our child or to the group it leads.
        assert_eq!(
            unsafe { libc::kill(if whole_group { -pid } else { pid }, libc::SIGKILL) },
            0
        );
        let _ = child.wait();
        eventually(GUARD, "the lock is free", || {
            lockd.request("STATUS killed") == "OK killed free"
        });
        eventually(GUARD, "the command is stopped", || !running(command));
    }
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Starts `lockd_run NAME OPTIONS` of a command that says it is in (through `mark`) and then
/// holds the lock until a line comes on its stdin.
fn run_until_stdin(lockd: &Server, name_and_options: &str, mark: &Mark) -> Child {
    bash(
        lockd,
        &format!(
            "lockd_run {name_and_options} -- bash -c 'echo in > {}; read -r line'",
            mark.path.display()
        ),
    )
}

/// Starts two `run_until_stdin`s and returns once both commands are inside at once.
fn two_inside(lockd: &Server, name_and_options: &str, tag: &str) -> Vec<Child> {
    let marks = [1, 2].map(|i| Mark::new(&format!("{tag}-{i}")));
    let children = marks
        .iter()
        .map(|mark| run_until_stdin(lockd, name_and_options, mark))
        .collect();
    for mark in &marks {
        mark.wait(GUARD);
    }
    children
}

#[test]
fn a_semaphore_of_two_runs_two_commands_at_once_and_the_third_waits_its_turn() {
    let lockd = Server::start();
    let mut holders = two_inside(&lockd, "sem ttl=1m limit=2", "bash-sem");
    assert_eq!(lockd.holders("sem"), 2);

    let third_mark = Mark::new("bash-sem-3");
    let third = run_until_stdin(&lockd, "sem ttl=1m limit=2", &third_mark);
    eventually(GUARD, "the third one waits", || lockd.waiters("sem") == 1);
    assert!(!third_mark.path.exists(), "the third one ran beside two");

    // One leaves: the third takes its slot while the other still holds.
    assert_ok(&finish(holders.remove(0), "\n"));
    third_mark.wait(GUARD);
    assert_eq!(lockd.holders("sem"), 2);
    assert_ok(&finish(third, "\n"));
    assert_ok(&finish(holders.remove(0), "\n"));
    assert_eq!(lockd.request("STATUS"), "OK 0");
}

#[test]
fn shared_holders_hold_together_while_an_exclusive_one_waits_and_status_shows_them() {
    let lockd = Server::start();
    let mut readers = two_inside(&lockd, "rw ttl=1m shared", "bash-shared");
    let writer = bash(
        &lockd,
        r#"t=$(lockd_lock rw ttl=1m exclusive); echo "got $t"
        lockd_status rw
        echo "mode=$LOCKD_MODE holders=$LOCKD_HOLDERS waiters=$LOCKD_WAITERS"
        lockd_unlock rw "$t""#,
    );
    eventually(GUARD, "the exclusive one waits", || {
        lockd.waiters("rw") == 1
    });

    let out = run(
        &lockd,
        r#"lockd_status rw
        echo "mode=$LOCKD_MODE holders=$LOCKD_HOLDERS waiters=$LOCKD_WAITERS"
        # Strict FIFO: a shared request does not overtake the waiting exclusive one.
        rc=0; lockd_try rw shared || rc=$?
        echo "try-shared=$rc""#,
    );
    assert_ok(&out);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let holder_lines: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with("HOLDER rw "))
        .collect();
    assert_eq!(holder_lines.len(), 2, "{}", out.stdout);
    assert!(
        holder_lines.iter().all(|l| l.contains(" mode=shared")),
        "{}",
        out.stdout
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("WAITER rw 1 ") && l.ends_with(" mode=exclusive")),
        "{}",
        out.stdout
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("OK rw held ") && l.ends_with(" holders=2 mode=shared")),
        "{}",
        out.stdout
    );
    for want in ["mode=shared holders=2 waiters=1", "try-shared=1"] {
        assert!(
            lines.contains(&want),
            "missing {want:?} in:\n{}",
            out.stdout
        );
    }

    // The writer gets the lock only once both readers are gone.
    assert_ok(&finish(readers.remove(0), "\n"));
    assert_eq!(lockd.waiters("rw"), 1);
    assert_ok(&finish(readers.remove(0), "\n"));
    let out = finish(writer, "");
    assert_ok(&out);
    assert!(out.stdout.contains("got "), "{}", out.stdout);
    assert!(
        out.stdout.contains("mode=exclusive holders=1 waiters=0"),
        "{}",
        out.stdout
    );
    assert_eq!(lockd.request("STATUS"), "OK 0");
}

#[test]
fn a_lock_that_does_not_fit_the_name_returns_2_as_lockctl_does() {
    let lockd = Server::start();
    let out = run(
        &lockd,
        r#"
        t=$(lockd_lock sem ttl=1m limit=2)
        rc=0; lockd_lock sem shared wait=1m || rc=$?
        echo "shared-on-semaphore=$rc"
        rc=0; lockd_try sem || rc=$?
        echo "exclusive-on-semaphore=$rc"
        rc=0; lockd_try sem limit=3 || rc=$?
        echo "other-limit=$rc"
        rc=0; lockd_run sem shared -- echo must-not-run || rc=$?
        echo "run-shared=$rc"
        rc=0; lockd_lock sem shared limit=2 || rc=$?
        echo "shared-and-limit=$rc"
        rc=0; lockd_run sem exclusive shared -- echo must-not-run || rc=$?
        echo "exclusive-and-shared=$rc"
        rc=0; lockd_lock sem limit=two || rc=$?
        echo "limit-not-a-number=$rc"
        rc=0; lockd_lock sem limit=0 || rc=$?
        echo "limit-0=$rc"
        # The second slot, by another id (the same id again would get the same lease).
        t2=$(LOCKD_ID=second lockd_try sem limit=2)
        (( t2 > t ))
        lockd_unlock sem "$t"
        lockd_unlock sem "$t2"
        "#,
    );
    assert_ok(&out);
    for want in [
        "shared-on-semaphore=2",
        "exclusive-on-semaphore=2",
        "other-limit=2",
        "run-shared=2",
        "shared-and-limit=2",
        "exclusive-and-shared=2",
        "limit-not-a-number=2",
        "limit-0=2",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == want),
            "missing {want:?} in:\n{}",
            out.stdout
        );
    }
    assert!(!out.stdout.contains("must-not-run"), "{}", out.stdout);
    assert_eq!(
        out.stderr.matches("ERR CONFLICT").count(),
        4,
        "{}",
        out.stderr
    );
    assert_eq!(lockd.request("STATUS"), "OK 0");
}

/// Against the real binary with an auth file, LOCKD_USER and its secret (from LOCKD_SECRET or
/// LOCKD_SECRET_FILE) log every connection in, lockd_run's included; a wrong secret, no user
/// and a name outside the user's rights return 2; the secret is never printed, even under
/// `set -x`.
#[test]
fn lockd_user_and_its_secret_log_every_connection_in() {
    const SECRET: &str = "bash-ci-secret-0123456789abcdef";
    let dir = std::env::temp_dir().join(format!("contrib-bash-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let users = dir.join("users");
    let line = lockd::auth::user_line("ci lock=ci-* read=*", SECRET, [6; 16]).unwrap();
    std::fs::write(&users, line + "\n").unwrap();
    let secret_file = dir.join("ci.secret");
    std::fs::write(&secret_file, format!("{SECRET}\r\n")).unwrap();
    let lockd = common::Lockd::new()
        .args(["--auth-file", users.to_str().unwrap()])
        .spawn();
    let addr = lockd.addr.to_string();
    let script = format!(
        r#"
        set -x
        export LOCKD_USER=ci LOCKD_SECRET={SECRET}
        t=$(lockd_lock ci-a ttl=30s)
        [[ $(lockd_status ci-a) == *"token=$t"* ]]
        lockd_unlock ci-a "$t"
        unset LOCKD_SECRET
        export LOCKD_SECRET_FILE='{file}'
        lockd_run ci-b ttl=3s session=1s -- bash -c 'sleep 2; echo "ran $LOCKD_TOKEN"'
        rc=0; lockd_lock deploy ttl=5s || rc=$?; echo "denied=$rc"
        rc=0; LOCKD_SECRET_FILE= LOCKD_SECRET=wrong-secret-0123456789 lockd_status || rc=$?
        echo "wrong=$rc"
        rc=0; LOCKD_USER= LOCKD_SECRET_FILE= lockd_status ci-a || rc=$?; echo "nouser=$rc"
        rc=0; LOCKD_SECRET=x lockd_status || rc=$?; echo "twice=$rc"
        rc=0; LOCKD_SECRET_FILE= lockd_status || rc=$?; echo "nosecret=$rc"
        "#,
        file = secret_file.display()
    );
    let out = finish(bash_at(&addr, &script, false), "");
    assert_ok(&out);
    for want in [
        "ran ",
        "denied=2",
        "wrong=2",
        "nouser=2",
        "twice=2",
        "nosecret=2",
    ] {
        assert!(
            out.stdout.contains(want),
            "no {want:?} in:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
    for want in [
        "has no lock right",
        "refused to log in user ci",
        "NOAUTH",
        "given twice",
        "needs a secret",
    ] {
        assert!(out.stderr.contains(want), "no {want:?} in:\n{}", out.stderr);
    }
    // `set -x` traced the script's own lines that set them, but no line of the library: not
    // the AUTH line, nor any message.
    for secret in [SECRET, "wrong-secret-0123456789"] {
        for line in out.stderr.lines().filter(|l| l.contains(secret)) {
            let own = line.starts_with("+ export LOCKD_USER=ci LOCKD_SECRET=")
                || line.starts_with("+ LOCKD_SECRET=");
            assert!(own, "{secret} shown: {line}\n{}", out.stderr);
        }
    }
    let log = lockd.stop().join("\n");
    assert!(!log.contains(SECRET), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
