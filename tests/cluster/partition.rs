//! Cluster mode when a link is cut while every process keeps running: a front-end cut off
//! from etcd (every link to every member stalls, as when a firewall drops its packets), then
//! healed. Each test has an etcd cluster of its own; the cut front-end reaches etcd through
//! links the test cuts ([`LinkedFrontEnd`]), the other front-ends directly.
//!
//! The first three tests are the three bugs a partition run found: each failed before its fix.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::etcd::{http_get, EtcdCluster, LinkedFrontEnd, LockdFrontEnd};
use common::free_port;
use common::line::Line;
use common::link::Link;
use common::{field, token};

const PATIENCE: Duration = Duration::from_secs(30);

/// The bound proto.md documents for a dead front-end's waiters: `--etcd-lease-ttl` (3s in
/// that test) plus etcd's half-second expiry check, with room for a slow machine. The dead
/// waiter asks for a ttl far above it, so a grant to it shows.
const DEAD_WAITER_BOUND: Duration = Duration::from_secs(10);

/// The bound proto.md gives for a cut-off front-end's session leases and waiters: its
/// `--etcd-lease-ttl` (1s in that test) plus half a second, plus its request timeout (1s)
/// spent on the LOCK it is sent during the cut, with room for a slow machine.
const CUT_OFF_BOUND: Duration = Duration::from_secs(8);

/// How long a test watches for a grant that must not come.
const QUIET: Duration = Duration::from_secs(3);

/// `name`'s waiters in queue order (`<id> session=<0|1>`), from `STATUS <name> detail`.
fn queue(fe: &LockdFrontEnd, name: &str) -> Vec<String> {
    let mut c = Line::connect(fe.addr());
    let mut line = c.req(&format!("STATUS {name} detail"));
    let mut ids = Vec::new();
    while line.starts_with("HOLDER ") || line.starts_with("WAITER ") {
        let waiter = line.starts_with("WAITER ");
        if let (true, Some(id), Some(session)) =
            (waiter, field(&line, "id"), field(&line, "session"))
        {
            ids.push(format!("{id} session={session}"));
        }
        line = c.line();
    }
    ids
}

fn waiters(fe: &LockdFrontEnd, name: &str) -> usize {
    field(&fe.request(&format!("STATUS {name}")), "waiters")
        .and_then(|w| w.parse().ok())
        .unwrap_or(0)
}

/// Holder `h` on FE2; A waits on the cut-off front-end with `wait=4s`, B behind it on FE2.
/// The cut comes next; FE2's release then hands the lock to A in the same etcd write, which
/// the cut-off front-end does not see; A's wait runs out there (`ERR UNAVAILABLE`). Returns
/// A's and B's connections.
fn a_waits_cut_off_b_behind(
    cut: &LinkedFrontEnd,
    fe2: &LockdFrontEnd,
    name: &str,
) -> (Line, Line, u64) {
    let h = token(&fe2.request(&format!("LOCK {name} h ttl=60s")));
    let mut a = Line::connect(cut.addr());
    a.send(&format!("LOCK {name} a ttl=30s wait=4s"));
    eventually(PATIENCE, "A waits", || waiters(fe2, name) == 1);
    let mut b = Line::connect(fe2.addr());
    b.send(&format!("LOCK {name} b ttl=30s"));
    eventually(PATIENCE, "B waits behind A", || waiters(fe2, name) == 2);
    cut.cut();
    assert_eq!(fe2.request(&format!("UNLOCK {name} {h}")), "OK");
    // A's wait runs out on its front-end, which cannot reach etcd to take A's place out, so
    // it can't know whether a grant came first: `ERR UNAVAILABLE`, send the same LOCK again.
    let unknown = a.line();
    assert!(unknown.starts_with("ERR UNAVAILABLE"), "{unknown}");
    (a, b, h)
}

/// Bug 1, deterministic: A's wait ran out on a cut-off front-end while etcd had already
/// granted it the lock; A fails over to another front-end and, by the same-id rule, is told
/// it holds the lock. When the first front-end's watch catches up, it sees a grant to a
/// waiter that had left and takes it back: that must not end the lease A was told about.
#[test]
fn a_grant_confirmed_through_another_front_end_is_never_taken_back() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let cut = LinkedFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "20s"]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let (_a, mut b, h) = a_waits_cut_off_b_behind(&cut, &fe2, "n");
    // A fails over to FE2 with the same LOCK: the grant etcd holds for it.
    let ta = token(&fe2.request("LOCK n a ttl=30s wait=4s"));
    assert!(ta > h);
    cut.heal();
    // Past the release means it shows A's grant (made in the release's write): a view that
    // never saw `h` shows `n` free, which says nothing.
    eventually(
        PATIENCE,
        "the healed front-end's watch is past the release",
        || field(&cut.request("STATUS n"), "token") == Some(ta.to_string()),
    );
    assert_eq!(b.line_within(QUIET), None, "B was granted while A holds n");
    assert!(fe2
        .request(&format!("CHECK n {ta}"))
        .starts_with("OK ttl_ms="));
    assert!(cut
        .request(&format!("CHECK n {ta}"))
        .starts_with("OK ttl_ms="));
    assert_eq!(field(&cut.request("STATUS n"), "id").as_deref(), Some("a"));
    assert_eq!(fe2.request(&format!("UNLOCK n {ta}")), "OK");
    assert!(token(&b.line()) > ta);
}

/// Bug 1 as the partition run found it: A sends the same LOCK again through the same
/// front-end the moment the link is back, racing that front-end's watch (which brings the
/// grant to a waiter that left). Whatever wins, never two holders: if A is told it holds
/// the lock, B is not granted until A releases. A race, so several rounds.
#[test]
fn the_same_lock_right_after_the_heal_never_makes_two_holders() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let cut = LinkedFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "20s"]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    for round in 0..3 {
        let name = format!("n{round}");
        let (mut a, mut b, _) = a_waits_cut_off_b_behind(&cut, &fe2, &name);
        cut.heal();
        let again = a.req(&format!("LOCK {name} a ttl=30s wait=4s"));
        if again.starts_with("OK ") {
            let ta = token(&again);
            assert_eq!(
                b.line_within(QUIET),
                None,
                "round {round}: A was told it holds {name}, and B was granted"
            );
            assert!(fe2
                .request(&format!("CHECK {name} {ta}"))
                .starts_with("OK ttl_ms="));
            assert_eq!(fe2.request(&format!("UNLOCK {name} {ta}")), "OK");
            assert!(token(&b.line()) > ta);
        } else {
            // A lost the race and queued behind B (its wait then ran out): B holds it.
            assert!(again.starts_with("ERR TIMEOUT"), "round {round}: {again}");
            let tb = token(&b.line());
            assert!(fe2
                .request(&format!("CHECK {name} {tb}"))
                .starts_with("OK ttl_ms="));
        }
    }
}

/// Bug 2: a front-end cut off for longer than `--etcd-lease-ttl` lost its etcd lease (and
/// with it its session leases and waiters). Once the link is back it takes a new lease and
/// serves session LOCKs and queued LOCKs again; `/readyz` says ready only then.
#[test]
fn a_front_end_cut_off_longer_than_its_lease_recovers() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let cut = LinkedFrontEnd::start(
        &etcd,
        &prefix,
        &[
            "--etcd-lease-ttl",
            "1s",
            "--etcd-request-timeout",
            "1s",
            "--metrics-listen",
            &metrics.to_string(),
        ],
    );
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let h = token(&fe2.request("LOCK q h ttl=60s"));
    let mut waiter = Line::connect(cut.addr());
    waiter.send("LOCK q w ttl=30s");
    eventually(PATIENCE, "the waiter is queued", || waiters(&fe2, "q") == 1);
    let mut session = Line::connect(cut.addr());
    let ts = session.lock("s sess session");
    let tp = token(&cut.request("LOCK p plain ttl=60s"));

    cut.cut();
    let cut_at = Instant::now();
    // Cut off, it grants nothing and says so within its request timeout; its plain lease is
    // renewed through the other front-end.
    let refused = cut.request("LOCK z me wait=0");
    assert!(refused.starts_with("ERR UNAVAILABLE "), "{refused}");
    let renewed = fe2.request(&format!("RENEW p {tp}"));
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    // Its etcd lease runs out: the session lease and the waiter go with it.
    eventually(PATIENCE, "the cut-off session lease ended", || {
        fe2.request("STATUS s") == "OK s free"
    });
    eventually(PATIENCE, "the cut-off waiter left", || {
        waiters(&fe2, "q") == 0
    });
    assert!(
        cut_at.elapsed() < CUT_OFF_BOUND,
        "its session lease and waiter ended {:?} after the cut",
        cut_at.elapsed()
    );
    eventually(PATIENCE, "not ready while cut off", || {
        http_get(metrics, "/readyz").0 == 503
    });
    // Its waiter is told while the link is still down (once the front-end has heard from no
    // quorum for longer than its etcd lease), so that it can go to another front-end.
    let lost = waiter
        .line_within(PATIENCE)
        .expect("the cut-off waiter is told before the heal");
    assert!(lost.starts_with("ERR UNAVAILABLE "), "{lost}");
    assert!(lost.contains("--etcd-lease-ttl"), "{lost}");
    cut.heal();

    // Those who had session leases are told, as proto.md says.
    let renew = session.req(&format!("RENEW s {ts}"));
    assert!(renew.starts_with("ERR NOTHELD"), "{renew}");

    // Ready again means serving again: session leases and queued LOCKs work.
    eventually(PATIENCE, "ready after the heal", || {
        http_get(metrics, "/readyz").0 == 200
    });
    let again = cut.request("LOCK s2 x session");
    assert!(
        again.starts_with("OK "),
        "ready, but a session LOCK got {again}"
    );
    let mut next = Line::connect(cut.addr());
    next.send("LOCK q w2 ttl=30s");
    eventually(PATIENCE, "a new waiter queues", || waiters(&fe2, "q") == 1);
    assert_eq!(fe2.request(&format!("UNLOCK q {h}")), "OK");
    assert!(token(&next.line()) > h);
    assert_eq!(cut.request(&format!("UNLOCK p {tp}")), "OK");
}

/// Bug 3: a front-end killed while its waiters head three queues (a plain, a `detach` and a
/// session waiter). The releases that follow at once, before its etcd lease has run out,
/// must not leave the lock with a dead waiter for that waiter's whole ttl: the next waiters
/// are granted within the dead front-end bound.
#[test]
fn a_dead_front_ends_waiters_do_not_keep_the_lock() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut fe1 = LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "3s"]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let kinds = [("p", ""), ("d", " detach"), ("s", " session")];
    let mut holders = Vec::new();
    let mut dead = Vec::new();
    let mut next = Vec::new();
    for (name, tie) in kinds {
        holders.push(token(&fe2.request(&format!("LOCK {name} holder ttl=60s"))));
        let mut w = Line::connect(fe1.addr());
        w.send(&format!("LOCK {name} dead ttl=60s{tie}"));
        eventually(PATIENCE, "the waiter is queued", || {
            waiters(&fe2, name) == 1
        });
        dead.push(w);
        let mut n = Line::connect(fe2.addr());
        n.send(&format!("LOCK {name} next ttl=30s"));
        eventually(PATIENCE, "the next waiter is queued", || {
            waiters(&fe2, name) == 2
        });
        next.push(n);
    }
    let killed = Instant::now();
    fe1.kill();
    for ((name, _), h) in kinds.iter().zip(&holders) {
        assert_eq!(fe2.request(&format!("UNLOCK {name} {h}")), "OK");
    }
    for (((name, tie), h), n) in kinds.iter().zip(&holders).zip(&mut next) {
        let granted = n.line_within(DEAD_WAITER_BOUND + QUIET);
        let got = granted.unwrap_or_else(|| {
            panic!("{name} ({tie}): the next waiter was not granted; the dead one kept it")
        });
        assert!(token(&got) > *h);
        assert!(
            killed.elapsed() < DEAD_WAITER_BOUND,
            "{name} ({tie}): granted {:?} after the kill",
            killed.elapsed()
        );
    }
    drop(dead);
}

/// Holder `h` on FE2, A waiting on `a_fe` at the head of the queue, B behind it on FE2.
fn a_heads_the_queue_b_behind(
    a_fe: SocketAddr,
    fe2: &LockdFrontEnd,
    name: &str,
) -> (Line, Line, u64) {
    let h = token(&fe2.request(&format!("LOCK {name} h ttl=60s")));
    let mut a = Line::connect(a_fe);
    a.send(&format!("LOCK {name} a ttl=30s"));
    eventually(PATIENCE, "A waits", || waiters(fe2, name) == 1);
    let mut b = Line::connect(fe2.addr());
    b.send(&format!("LOCK {name} b ttl=30s"));
    eventually(PATIENCE, "B waits behind A", || waiters(fe2, name) == 2);
    (a, b, h)
}

/// The bound proto.md gives for a place to be kept: `--etcd-lease-ttl` (5s in these tests,
/// ample for a re-send) of the front-end that died or was cut off.
const PLACE_KEPT_FOR: &str = "5s";

/// A waiter whose front-end dies sends the same LOCK through another front-end within the
/// dead one's `--etcd-lease-ttl`: it takes its place back, ahead of the waiter that queued
/// behind it, instead of going to the back.
#[test]
fn a_waiter_whose_front_end_died_keeps_its_place_through_another() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut fe1 = LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", PLACE_KEPT_FOR]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let (a, mut b, h) = a_heads_the_queue_b_behind(fe1.addr(), &fe2, "n");
    fe1.kill();
    drop(a);
    let mut a = Line::connect(fe2.addr());
    a.send("LOCK n a ttl=30s");
    assert_eq!(fe2.request(&format!("UNLOCK n {h}")), "OK");
    let ta = token(&a.line());
    assert!(ta > h);
    assert_eq!(b.line_within(QUIET), None, "B was granted ahead of A");
    assert_eq!(a.req(&format!("UNLOCK n {ta}")), "OK");
    assert!(token(&b.line()) > ta);
}

/// The same when the front-end is cut off from etcd (it runs on, and so does A's connection
/// to it): A's LOCK through another front-end takes its place over, and once the link is
/// back the old request is answered `ERR REPLACED`, as on one server.
#[test]
fn a_waiter_whose_front_end_is_cut_off_keeps_its_place_through_another() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let cut = LinkedFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", PLACE_KEPT_FOR]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let (mut old, mut b, h) = a_heads_the_queue_b_behind(cut.addr(), &fe2, "n");
    cut.cut();
    // The same LOCK, but as a session lease: STATUS can then tell the new request from the
    // old one in the queue.
    let mut a = Line::connect(fe2.addr());
    a.send("LOCK n a ttl=30s session");
    eventually(PATIENCE, "A's place taken over", || {
        queue(&fe2, "n") == ["a session=1", "b session=0"]
    });
    assert_eq!(fe2.request(&format!("UNLOCK n {h}")), "OK");
    let got = a.line();
    let ta = token(&got);
    cut.heal();
    let replaced = old.line();
    assert!(replaced.starts_with("ERR REPLACED"), "{replaced}");
    assert_eq!(b.line_within(QUIET), None, "B was granted ahead of A");
    assert_eq!(a.req(&format!("UNLOCK n {ta}")), "OK");
    assert!(token(&b.line()) > ta);
}

/// Past the bound the place is gone with the dead front-end's etcd lease: the same LOCK
/// queues at the back.
#[test]
fn a_waiter_that_comes_back_too_late_queues_at_the_back() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut fe1 = LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", "1s"]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let (a, mut b, h) = a_heads_the_queue_b_behind(fe1.addr(), &fe2, "n");
    fe1.kill();
    drop(a);
    eventually(PATIENCE, "the dead front-end's waiter is gone", || {
        waiters(&fe2, "n") == 1
    });
    let mut a = Line::connect(fe2.addr());
    a.send("LOCK n a ttl=30s");
    eventually(PATIENCE, "A queued again", || waiters(&fe2, "n") == 2);
    assert_eq!(fe2.request(&format!("UNLOCK n {h}")), "OK");
    let tb = token(&b.line());
    assert_eq!(a.line_within(QUIET), None, "A was granted ahead of B");
    assert_eq!(b.req(&format!("UNLOCK n {tb}")), "OK");
    assert!(token(&a.line()) > tb);
}

/// Whether process `pid` still runs (not yet reaped counts as gone: a zombie runs no code).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

/// A client cut off from its front-end mid-lease (the link stalls; both keep running): the
/// front-end hears no more renewals, so the session lease ends with its ttl and the next
/// waiter is granted. `lockctl run` must have stopped its command before that grant, every
/// time: measured as the moment the command's process was gone against the moment the next
/// holder's grant arrived, over several runs.
#[test]
fn lockctl_run_stops_its_command_before_a_cut_off_lease_passes_on() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let fe1 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let dir = std::env::temp_dir().join(format!("lockd-cut-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for round in 0..4 {
        let link = Link::start(fe1.addr());
        let name = format!("job{round}");
        let pidfile = dir.join(format!("pid{round}"));
        // The command ignores SIGTERM: only lockctl's SIGKILL ends it.
        let script = format!(
            "trap '' TERM; echo $$ > {}.tmp; mv {0}.tmp {0}; while :; do sleep 0.05; done",
            pidfile.display()
        );
        let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(["--server", &link.addr.to_string(), "run", &name])
            .args([
                "--ttl",
                "4s",
                "--session-grace",
                "2s",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("lockctl");
        eventually(PATIENCE, "the command started", || pidfile.exists());
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .expect("pid")
            .trim()
            .parse()
            .expect("a pid");
        let mut next = Line::connect(fe2.addr());
        next.send(&format!("LOCK {name} next ttl=30s"));
        eventually(PATIENCE, "the next holder waits", || {
            waiters(&fe2, &name) == 1
        });
        let granted = std::thread::spawn(move || {
            let reply = next.line();
            (reply, Instant::now())
        });
        link.cut();
        let mut gone = None;
        let deadline = Instant::now() + PATIENCE;
        while gone.is_none() && Instant::now() < deadline {
            if !alive(pid) {
                gone = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let gone = gone.expect("lockctl never stopped its command");
        let (reply, granted_at) = granted.join().expect("next holder");
        assert!(reply.starts_with("OK "), "{reply}");
        assert!(
            gone <= granted_at,
            "round {round}: the command ran {:?} after the next holder was granted",
            gone.duration_since(granted_at)
        );
        eprintln!(
            "round {round}: command gone {:?} before the next grant",
            granted_at.duration_since(gone)
        );
        let status = run.wait().expect("lockctl exits");
        assert_eq!(status.code(), Some(4), "lockctl's exit for a lost lease");
        assert_eq!(
            fe2.request(&format!("UNLOCK {name} {}", token(&reply))),
            "OK"
        );
        drop(link);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// lockctl does it on failover: `lockctl run` waiting through a front-end that dies
/// reconnects to the next one in `--server` and sends the same LOCK (its id), so it keeps
/// its place ahead of the waiter that queued behind it.
#[test]
fn lockctl_run_keeps_its_place_when_its_front_end_dies() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut fe1 = LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", PLACE_KEPT_FOR]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let dir = std::env::temp_dir().join(format!("lockd-place-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ran = dir.join("ran");
    let h = token(&fe2.request("LOCK place h ttl=60s"));
    let servers = format!("{},{}", fe1.addr(), fe2.addr());
    let script = format!("touch {}; sleep 1", ran.display());
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args([
            "--server", &servers, "run", "place", "--", "sh", "-c", &script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("lockctl");
    eventually(PATIENCE, "lockctl waits", || waiters(&fe2, "place") == 1);
    let mut b = Line::connect(fe2.addr());
    b.send("LOCK place b ttl=30s");
    eventually(PATIENCE, "B waits behind it", || {
        waiters(&fe2, "place") == 2
    });
    fe1.kill();
    // lockctl comes back through FE2 with the same LOCK: it takes over its place, or, if
    // the release below comes first, the grant made to its dead waiter (same id).
    assert_eq!(fe2.request(&format!("UNLOCK place {h}")), "OK");
    eventually(PATIENCE, "lockctl's command ran", || ran.exists());
    let status = run.wait().expect("lockctl exits");
    assert!(status.success(), "{status:?}");
    // Only now, after lockctl released: B.
    assert!(token(&b.line()) > h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client program waiting for `name` through the first of two front-ends, which dies: it
/// must come back through the second with the same LOCK and keep its place, ahead of the
/// waiter that queued behind it. `client(servers)` starts it: it prints its token once
/// granted, then unlocks and exits when its standard input ends.
fn a_client_keeps_its_place(name: &str, client: impl FnOnce(&str) -> std::process::Child) {
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let mut fe1 = LockdFrontEnd::start(&etcd, &prefix, &["--etcd-lease-ttl", PLACE_KEPT_FOR]);
    let fe2 = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let h = token(&fe2.request(&format!("LOCK {name} h ttl=60s")));
    let mut child = client(&format!("{},{}", fe1.addr(), fe2.addr()));
    eventually(PATIENCE, "the client waits", || waiters(&fe2, name) == 1);
    let mut b = Line::connect(fe2.addr());
    b.send(&format!("LOCK {name} b ttl=30s"));
    eventually(PATIENCE, "B waits behind it", || waiters(&fe2, name) == 2);
    fe1.kill();
    assert_eq!(fe2.request(&format!("UNLOCK {name} {h}")), "OK");
    // Read on a thread of its own, so that a client that never answers fails the test
    // instead of hanging it.
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
        let _ = tx.send(line);
    });
    let Ok(line) = rx.recv_timeout(PATIENCE) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the client printed no token within {PATIENCE:?}");
    };
    let t: u64 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a token: {line:?}"));
    assert!(t > h);
    assert_eq!(
        b.line_within(QUIET),
        None,
        "B was granted ahead of the client"
    );
    drop(child.stdin.take());
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the client's status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the client did not exit within {PATIENCE:?} of the end of its input");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    assert!(token(&b.line()) > t);
}

fn piped(cmd: &mut std::process::Command) -> std::process::Child {
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the client's interpreter must be installed (CI installs it)")
}

/// The Python client does it on failover too: `Client.lock`.
#[test]
fn the_python_client_keeps_its_place_when_its_front_end_dies() {
    if !have(Need::Etcd) {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/python");
    let script = "import sys\n\
        from lockd_client import Client\n\
        c = Client(sys.argv[1], id='py')\n\
        t = c.lock('pyplace', ttl=30)\n\
        print(t, flush=True)\n\
        sys.stdin.readline()\n\
        c.unlock('pyplace', t)\n";
    a_client_keeps_its_place("pyplace", |servers| {
        piped(
            std::process::Command::new("python3")
                .args(["-c", script, servers])
                .current_dir(&dir),
        )
    });
}

/// And the bash client: `lockd_lock`, with LOCKD_ADDR listing both front-ends.
#[test]
fn the_bash_client_keeps_its_place_when_its_front_end_dies() {
    if !have(Need::Etcd) {
        return;
    }
    let client = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/lockd.sh");
    let script = format!(
        "source {}; t=$(lockd_lock shplace ttl=30s) || exit $?; echo \"$t\"; read -r _; \
         lockd_unlock shplace \"$t\"",
        client.display()
    );
    a_client_keeps_its_place("shplace", |servers| {
        piped(
            std::process::Command::new("bash")
                .args(["-c", &script])
                .env("LOCKD_ADDR", servers)
                .env("LOCKD_ID", "sh"),
        )
    });
}
