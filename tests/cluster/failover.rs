//! Cluster mode when processes die: a front-end killed with SIGKILL, etcd's leader killed,
//! a majority of etcd down, and `lockctl run` riding the death of its front-end. Each test
//! has an etcd cluster of its own (it kills members).
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::etcd::{EtcdCluster, LockdFrontEnd};
use common::line::Line;
use common::{field, token};

const PATIENCE: Duration = Duration::from_secs(30);

/// The bound proto.md documents for a dead front-end's session leases and waiters:
/// `--etcd-lease-ttl` (1s here) plus etcd's expiry check, with room for a slow machine.
const LEASE_TTL: &str = "1s";
const DEAD_FRONT_END_BOUND: Duration = Duration::from_secs(8);

fn front_end(etcd: &EtcdCluster, prefix: &str) -> LockdFrontEnd {
    LockdFrontEnd::start(etcd, prefix, &["--etcd-lease-ttl", LEASE_TTL])
}

#[test]
fn a_killed_front_end_loses_its_sessions_and_waiters_in_bounded_time_not_its_plain_leases() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut a = front_end(&etcd, &prefix);
    let b = front_end(&etcd, &prefix);

    // Through A: a session holder of `s`, a plain holder of `p`, and a waiter on `q`.
    let mut session = Line::connect(a.addr());
    let ts = session.lock("s sess session");
    let tp = token(&a.request("LOCK p plain ttl=60s"));
    let tq = token(&b.request("LOCK q holder"));
    let mut waiter_a = Line::connect(a.addr());
    waiter_a.send("LOCK q waiter-on-a");
    eventually(PATIENCE, "A's waiter queued", || {
        field(&b.request("STATUS q"), "waiters").as_deref() == Some("1")
    });
    // Through B: waiters behind both.
    let mut next_s = Line::connect(b.addr());
    next_s.send("LOCK s next");
    let mut next_q = Line::connect(b.addr());
    next_q.send("LOCK q next");
    eventually(PATIENCE, "B's waiters queued", || {
        field(&b.request("STATUS q"), "waiters").as_deref() == Some("2")
    });

    let killed = Instant::now();
    a.kill();
    // The session lease ends with A's etcd lease: the next waiter gets `s`.
    let ts2 = token(&next_s.line());
    assert!(ts2 > ts);
    assert!(
        killed.elapsed() < DEAD_FRONT_END_BOUND,
        "granted {:?} after the kill",
        killed.elapsed()
    );
    // A's waiter on `q` is gone too: B's waiter is next when the holder releases.
    assert_eq!(b.request(&format!("UNLOCK q {tq}")), "OK");
    eventually(PATIENCE, "A's waiter left the queue", || {
        field(&b.request("STATUS q"), "id") == Some("next".into())
    });
    assert!(token(&next_q.line()) > tq);
    // The plain lease lives on: renewed, checked and released through B.
    let renewed = b.request(&format!("RENEW p {tp}"));
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    assert!(b
        .request(&format!("CHECK p {tp}"))
        .starts_with("OK ttl_ms="));
    assert_eq!(b.request(&format!("UNLOCK p {tp}")), "OK");
}

/// proto.md, `delay=`: a session lease that went with its dead front-end's etcd lease
/// keeps its place for its lock-delay (its holder may still be running), shown held by
/// every front-end, and ends as `dropped` when the delay is over: the next waiter is granted
/// no sooner than the delay after the kill.
#[test]
fn a_session_lease_of_a_killed_front_end_runs_its_lock_delay_before_the_next_grant() {
    if !have(Need::Etcd) {
        return;
    }
    const DELAY: Duration = Duration::from_secs(6);
    let etcd = EtcdCluster::start(1);
    let prefix = etcd.prefix();
    let mut a = front_end(&etcd, &prefix);
    let b = front_end(&etcd, &prefix);
    let mut session = Line::connect(a.addr());
    let t = session.lock("d job session delay=6s");
    let mut next = Line::connect(b.addr());
    next.send("LOCK d next");
    eventually(PATIENCE, "the next waiter queued", || {
        field(&b.request("STATUS d"), "waiters").as_deref() == Some("1")
    });
    let mut watch = Line::connect(b.addr());
    assert_eq!(watch.req("WATCH d"), "OK watching d");

    let killed = Instant::now();
    a.kill();
    // The key goes with A's etcd lease; B still shows the lease held (in its delay), but
    // it is over for its holder. (CHECK, not RENEW: a RENEW through B would take the
    // session over, to B.)
    eventually(PATIENCE, "the lease's key gone", || {
        b.request(&format!("CHECK d {t}"))
            .starts_with("ERR NOTHELD")
    });
    let status = b.request("STATUS d");
    assert_eq!(field(&status, "id").as_deref(), Some("job"), "{status}");
    let granted = token(&next.line());
    let after = killed.elapsed();
    assert!(granted > t);
    assert!(after >= DELAY, "granted {after:?} after the kill");
    // Its end is told when the delay is over, then the grant.
    let dropped = watch.line();
    assert!(dropped.starts_with("EVENT dropped d job"), "{dropped}");
    assert!(watch.line().starts_with("EVENT acquired d next"));
}

#[test]
fn a_plain_lease_granted_by_a_dead_front_end_still_expires() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut a = front_end(&etcd, &prefix);
    let b = front_end(&etcd, &prefix);
    let t = token(&a.request("LOCK e short ttl=1500ms"));
    let mut next = Line::connect(b.addr());
    next.send("LOCK e next");
    a.kill();
    // B takes over A's timers once etcd says A is gone.
    assert!(token(&next.line()) > t);
}

#[test]
fn killing_the_etcd_leader_loses_nothing_and_grants_nothing_twice() {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let a = front_end(&etcd, &prefix);
    let b = front_end(&etcd, &prefix);
    leader_killed_loses_nothing(&mut etcd, &a, &b);
}

/// Holder on `a`, a waiter on `b`; the etcd leader is killed: service resumes, the holder
/// renews, the hand-over happens once, to the waiter, and nobody else holds the lock
/// meanwhile. Also over TLS (tests/cluster/secure.rs).
pub(crate) fn leader_killed_loses_nothing(
    etcd: &mut EtcdCluster,
    a: &LockdFrontEnd,
    b: &LockdFrontEnd,
) {
    let held = token(&a.request("LOCK kept me ttl=120s"));
    let mut waiter = Line::connect(b.addr());
    waiter.send("LOCK kept you");
    eventually(PATIENCE, "queued", || {
        field(&a.request("STATUS kept"), "waiters").as_deref() == Some("1")
    });

    let leader = etcd.wait_leader();
    etcd.kill(leader);
    etcd.wait_leader();
    // Service resumes: the holder and the waiter are still there, and the hand-over happens
    // once, to the waiter.
    eventually(PATIENCE, "the holder renews after the election", || {
        a.request(&format!("RENEW kept {held}")).starts_with("OK ")
    });
    eventually(PATIENCE, "the release goes through", || {
        let reply = b.request(&format!("UNLOCK kept {held}"));
        reply == "OK" || reply.starts_with("ERR NOTHELD")
    });
    let granted = token(&waiter.line());
    assert!(granted > held);
    eventually(PATIENCE, "STATUS shows the waiter holding", || {
        field(&a.request("STATUS kept"), "id").as_deref() == Some("you")
    });
    let again = a.request("LOCK kept third wait=0");
    assert!(again.starts_with("ERR TIMEOUT"), "{again}");
    etcd.restart(leader);
    etcd.wait_healthy();
    let mut last = String::new();
    eventually(PATIENCE, "the release after the restart", || {
        last = b.request(&format!("UNLOCK kept {granted}"));
        // Only a refusal for want of etcd may be tried again.
        assert!(
            last == "OK" || last.starts_with("ERR UNAVAILABLE"),
            "{last}"
        );
        last == "OK"
    });
}

#[test]
fn without_quorum_requests_are_unavailable_and_nothing_is_granted_then_service_resumes() {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let a = LockdFrontEnd::start(
        &etcd,
        &prefix,
        &["--etcd-lease-ttl", "5s", "--etcd-request-timeout", "1s"],
    );
    let held = token(&a.request("LOCK q1 me ttl=60s"));
    let mut waiter = Line::connect(a.addr());
    waiter.send("LOCK q1 you");
    eventually(PATIENCE, "queued", || {
        field(&a.request("STATUS q1"), "waiters").as_deref() == Some("1")
    });
    etcd.kill(0);
    etcd.kill(1);
    // Prompt refusals, no grants.
    let asked = Instant::now();
    let refused = a.request("LOCK q2 me");
    assert!(refused.starts_with("ERR UNAVAILABLE"), "{refused}");
    assert!(asked.elapsed() < Duration::from_secs(10));
    let refused = a.request(&format!("UNLOCK q1 {held}"));
    assert!(refused.starts_with("ERR UNAVAILABLE"), "{refused}");
    assert_eq!(waiter.line_within(Duration::from_millis(500)), None);
    etcd.restart(0);
    etcd.restart(1);
    etcd.wait_healthy();
    // Quorum is back: the same requests go through, and the waiter is granted.
    eventually(PATIENCE, "the release after quorum", || {
        a.request(&format!("UNLOCK q1 {held}")) == "OK"
    });
    assert!(token(&waiter.line()) > held);
    let t = token(&a.request("LOCK q2 me"));
    assert!(t > held);
}

#[test]
fn lockctl_run_rides_out_the_death_of_its_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut a = LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "3s"]);
    let b = front_end(&etcd, &prefix);
    let dir = std::env::temp_dir().join(format!("lockd-ride-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (started, go) = (dir.join("started"), dir.join("go"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done; echo done",
        started.display(),
        go.display()
    );
    let servers = format!("{},{}", a.addr(), b.addr());
    let run = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args([
            "--server", &servers, "run", "ride", "--ttl", "3s", "--", "sh", "-c", &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lockctl");
    eventually(PATIENCE, "the command started", || started.exists());
    // B shows what its watch has seen: wait until it has seen the grant.
    let mut before = None;
    eventually(PATIENCE, "B sees the lock held", || {
        before = field(&b.request("STATUS ride"), "token");
        before.is_some()
    });
    a.kill();
    // Longer than the lease: only renewals through B can have kept it.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(field(&b.request("STATUS ride"), "token"), before);
    std::fs::write(&go, "").expect("go");
    let out = run.wait_with_output().expect("lockctl exits");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    eventually(PATIENCE, "released", || {
        b.request("STATUS ride") == "OK ride free"
    });
}

#[test]
fn with_one_etcd_member_down_every_request_is_served() {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let a = front_end(&etcd, &prefix);
    etcd.kill(0);
    etcd.wait_leader();
    // The front-end's etcd client still has the dead member among its endpoints: a request
    // it sends there is sent again elsewhere, never answered UNAVAILABLE.
    let mut c = Line::connect(a.addr());
    for i in 0..100 {
        let t = c.lock(&format!("up{} me", i % 7));
        assert_eq!(c.req(&format!("UNLOCK up{} {t}", i % 7)), "OK");
    }
    assert!(c.req("CHECK up0 1").starts_with("ERR NOTHELD"));
}

#[test]
fn a_front_end_that_loses_its_etcd_lease_tells_its_waiters_unavailable() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let a = front_end(&etcd, &prefix);
    let b = front_end(&etcd, &prefix);
    let held = token(&b.request("LOCK frozen holder"));
    let mut waiter = Line::connect(a.addr());
    waiter.send("LOCK frozen waits-on-a");
    eventually(PATIENCE, "queued", || {
        field(&b.request("STATUS frozen"), "waiters").as_deref() == Some("1")
    });
    // A stops answering etcd (SIGSTOP) for longer than its etcd lease: its waiter's key goes.
    let pid = a.process().pid() as i32;
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    eventually(
        PATIENCE,
        "the waiter's key ended with A's etcd lease",
        || field(&b.request("STATUS frozen"), "waiters").as_deref() == Some("0"),
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let told = waiter.line();
    assert!(told.starts_with("ERR UNAVAILABLE"), "{told}");
    // A serves again (a new etcd lease), and the lock is as it was.
    eventually(PATIENCE, "A serves again", || {
        a.request("LOCK other me wait=0").starts_with("OK ")
    });
    assert_eq!(b.request(&format!("UNLOCK frozen {held}")), "OK");
}

#[test]
fn a_stopped_front_end_takes_its_waiters_out_and_leaves_its_session_leases_to_move() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    // A long etcd lease, so that only the stop itself can explain a prompt end.
    let mut a = LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "20s"]);
    let b = front_end(&etcd, &prefix);
    let held = token(&b.request("LOCK stopping holder"));
    let mut waiter = Line::connect(a.addr());
    waiter.send("LOCK stopping waits-on-a");
    let mut session = Line::connect(a.addr());
    let ts = session.lock("moving me session=30s");
    eventually(PATIENCE, "queued", || {
        field(&b.request("STATUS stopping"), "waiters").as_deref() == Some("1")
    });
    let stopped = Instant::now();
    a.stop();
    eventually(PATIENCE, "A's waiter left the queue", || {
        field(&b.request("STATUS stopping"), "waiters").as_deref() == Some("0")
    });
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
    // The session lease waits for its holder to come back through another front-end.
    let mut moved = Line::connect(b.addr());
    let renewed = moved.req(&format!("RENEW moving {ts}"));
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    assert_eq!(b.request(&format!("UNLOCK stopping {held}")), "OK");
    assert_eq!(moved.req(&format!("UNLOCK moving {ts}")), "OK");
}

/// A front-end started while etcd has no leader (no quorum yet, as while a cluster boots)
/// waits for one within `--etcd-connect-timeout`, instead of exiting at the first "no leader".
#[test]
fn a_front_end_started_before_etcd_has_a_leader_waits_for_one() {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let endpoints = etcd.endpoints();
    etcd.kill(0);
    etcd.kill(1);
    let starting = std::thread::spawn(move || {
        LockdFrontEnd::spawn(
            [
                "--etcd",
                endpoints.as_str(),
                "--etcd-prefix",
                prefix.as_str(),
                "--etcd-connect-timeout",
                "60s",
                "--etcd-request-timeout",
                "1s",
            ]
            .map(String::from)
            .to_vec(),
        )
    });
    // Long enough for its first steps to be answered "no leader" (or not at all).
    std::thread::sleep(Duration::from_secs(2));
    etcd.restart(0);
    etcd.restart(1);
    let a = starting
        .join()
        .expect("the front-end started once etcd had a leader");
    // etcd has just regained its quorum: on a loaded machine its first writes may outlast the
    // 1s request timeout, which the front-end answers `ERR UNAVAILABLE` (try again). The same
    // LOCK sent again gets its grant; an UNLOCK sent again after a lost answer may find it done.
    let mut t = String::new();
    eventually(PATIENCE, "a LOCK through the started front-end", || {
        let reply = a.request("LOCK boot me");
        assert!(
            reply.starts_with("OK") || reply.starts_with("ERR UNAVAILABLE"),
            "{reply}"
        );
        if reply.starts_with("OK") {
            t = token(&reply).to_string();
        }
        !t.is_empty()
    });
    let mut answers = Vec::new();
    eventually(PATIENCE, "an UNLOCK through the started front-end", || {
        let reply = a.request(&format!("UNLOCK boot {t}"));
        let again = !answers.is_empty() && reply.starts_with("ERR NOTHELD");
        answers.push(reply);
        answers.last().is_some_and(|r| r == "OK") || again
    });
    assert!(
        answers[..answers.len() - 1]
            .iter()
            .all(|r| r.starts_with("ERR UNAVAILABLE")),
        "{answers:?}"
    );
    eventually(PATIENCE, "boot is free", || {
        a.request("STATUS boot").starts_with("OK boot free")
    });
}
