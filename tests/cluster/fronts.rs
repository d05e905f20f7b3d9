//! `lockctl run --server A,B` when front-end A is cut off from etcd (alive, but every link to
//! etcd stalls): it answers `ERR UNAVAILABLE` after its `--etcd-request-timeout`, and its
//! waiters only once etcd is back (it can't learn before that its etcd lease is gone).
//! lockctl moves to B: a running job's renewals move its lease there before A's etcd lease
//! (which its session lease hangs on) runs out, so its command is never stopped; a waiting
//! job finds A cut off (the CHECK it asks A every few seconds while it waits there is
//! answered `ERR UNAVAILABLE`), sends the same LOCK through B and is granted there once the
//! first job is done. Never two holders at once.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::blocking::eventually;
use common::etcd::{EtcdCluster, LinkedFrontEnd, LockdFrontEnd};
use common::field;
use common::lockctl::token_after;

const PATIENCE: Duration = Duration::from_secs(40);

/// The timing, and why it lets the running job move in time.
///
/// - lockctl `--ttl 6s --session-grace 6s`: a 6s window, renewed every 2s; each RENEW may
///   take 1s (half an interval) before lockctl tries the next address; the command must be
///   stopped 6s - 0.6s margin - 1s kill grace = 4.4s after the last good RENEW.
/// - A's `--etcd-request-timeout 1s`: cut off, it answers `ERR UNAVAILABLE` within 1s, as
///   lockctl's own bound would give up anyway.
/// - A's `--etcd-lease-ttl 8s`: the session lease granted through A hangs on A's etcd lease,
///   which after the cut lasts at least what is left of it since its last keep-alive (at
///   least two thirds of 8s, 5.3s).
///
/// So in the worst case (the cut right after a good RENEW), the next RENEW is sent to A at
/// 2s, given up at 3s, and sent through B at about 3.1s: before lockctl's own 4.4s, and
/// before A's etcd lease can end (5.3s), after which the lease would be gone (`ERR
/// NOTHELD`). The waiting job asks A a CHECK every 5s, which A answers `ERR UNAVAILABLE`
/// within its 1s request timeout: it moves to B within about 6s of the cut, well within its
/// `-w 30s`.
const LOCKCTL_TIMING: [&str; 6] = ["--ttl", "6s", "--session-grace", "6s", "--kill-grace", "1s"];
const FRONT_END_TIMING: [&str; 4] = ["--etcd-lease-ttl", "8s", "--etcd-request-timeout", "1s"];

/// lockctl's stderr, line by line, from a thread of its own.
struct Lines(mpsc::Receiver<String>);

impl Lines {
    fn of(child: &mut Child) -> Lines {
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// Waits for a line that contains `needle`; every line seen goes to `seen`.
    fn wait_for(&self, needle: &str, seen: &mut String) -> String {
        loop {
            match self.0.recv_timeout(PATIENCE) {
                Ok(line) => {
                    seen.push_str(&line);
                    seen.push('\n');
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!("no line with {needle:?} ({e}); saw:\n{seen}"),
            }
        }
    }

    /// The rest, to its end.
    fn rest(&self, seen: &mut String) {
        while let Ok(line) = self.0.recv_timeout(PATIENCE) {
            seen.push_str(&line);
            seen.push('\n');
        }
    }
}

fn lockctl(servers: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["-v", "--server", servers])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lockctl")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Job 1 holds `fronts` through A and runs until told; job 2 waits for it through A too.
/// A is cut off from etcd. Job 1's renewals move to B and its command runs on, also once A's
/// etcd lease is surely gone; job 2 finds A cut off and sends its LOCK through B. Job 1 is
/// told to finish only after that: job 2 is granted through B, and its command starts after
/// job 1's ended (each command says so in a shared log, and job 2's checks that job 1's is not
/// running). Both exit 0.
#[test]
fn lockctl_moves_to_the_next_front_end_when_its_own_is_cut_off() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let a = LinkedFrontEnd::start(&etcd, &prefix, &FRONT_END_TIMING);
    let b = LockdFrontEnd::start(&etcd, &prefix, &FRONT_END_TIMING);
    let servers = format!("{},{}", a.addr(), b.addr());
    let dir = std::env::temp_dir().join(format!("lockd-fronts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (log, busy, go) = (dir.join("log"), dir.join("busy"), dir.join("go"));

    let first = format!(
        "touch {busy}; echo start1 >> {log}; while [ ! -e {go} ]; do sleep 0.05; done; \
         echo end1 >> {log}; rm {busy}",
        busy = busy.display(),
        log = log.display(),
        go = go.display()
    );
    let mut args = vec!["--id", "job1", "run", "fronts"];
    args.extend(LOCKCTL_TIMING);
    args.extend(["-c", &first]);
    let mut job1 = lockctl(&servers, &args);
    let lines1 = Lines::of(&mut job1);
    let mut seen1 = String::new();
    lines1.wait_for(&format!("connected to lockd at {}", a.addr()), &mut seen1);
    let acquired = lines1.wait_for("acquired fronts token ", &mut seen1);
    let token = token_after(&acquired).to_string();
    eventually(PATIENCE, "job 1's command runs", || busy.exists());

    let second = format!(
        "if [ -e {busy} ]; then echo OVERLAP >> {log}; fi; echo start2 >> {log}",
        busy = busy.display(),
        log = log.display()
    );
    let mut args = vec!["--id", "job2", "run", "-w", "30s", "fronts"];
    args.extend(LOCKCTL_TIMING);
    args.extend(["-c", &second]);
    let mut job2 = lockctl(&servers, &args);
    let lines2 = Lines::of(&mut job2);
    let mut seen2 = String::new();
    lines2.wait_for(&format!("connected to lockd at {}", a.addr()), &mut seen2);
    eventually(PATIENCE, "job 2 waits", || {
        field(&b.request("STATUS fronts"), "waiters").as_deref() == Some("1")
    });

    a.cut();
    let cut_at = std::time::Instant::now();
    // Job 1 renews through B from now on.
    lines1.wait_for(
        &format!("renewing fronts failed: lockd at {}", a.addr()),
        &mut seen1,
    );
    lines1.wait_for(&format!("renewed fronts token {token} again"), &mut seen1);
    // Job 2 learns that A can't serve it, and asks B.
    let moved = lines2.wait_for(
        &format!(
            "lock fronts: lockd at {} answered ERR UNAVAILABLE",
            a.addr()
        ),
        &mut seen2,
    );
    assert!(
        moved.contains(&format!("trying {} in ", b.addr())),
        "{moved}"
    );
    // Once A's etcd lease is surely gone (its ttl, etcd's half-second expiry check, room for
    // a slow machine), a session lease still hanging on it would be too: job 1's is not.
    std::thread::sleep(Duration::from_secs(11).saturating_sub(cut_at.elapsed()));
    let status = b.request("STATUS fronts");
    assert_eq!(
        field(&status, "token").as_deref(),
        Some(token.as_str()),
        "{status}"
    );
    assert_eq!(field(&status, "id").as_deref(), Some("job1"), "{status}");
    assert_eq!(
        read(&log),
        "start1\n",
        "job 2 ran while job 1 held the lock"
    );

    std::fs::write(&go, "").expect("go");
    let status1 = job1.wait().expect("job 1 exits");
    lines1.rest(&mut seen1);
    assert_eq!(status1.code(), Some(0), "job 1:\n{seen1}");
    assert!(!seen1.contains("lost"), "job 1:\n{seen1}");
    let status2 = job2.wait().expect("job 2 exits");
    lines2.rest(&mut seen2);
    assert_eq!(status2.code(), Some(0), "job 2:\n{seen2}");
    assert_eq!(read(&log), "start1\nend1\nstart2\n", "{seen1}\n{seen2}");
    eprintln!("job 1:\n{seen1}job 2:\n{seen2}");
    eventually(PATIENCE, "free at the end", || {
        b.request("STATUS fronts") == "OK fronts free"
    });
    let _ = std::fs::remove_dir_all(&dir);
}
