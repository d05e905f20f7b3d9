//! Honest health in cluster mode: `/readyz` follows the age of the front-end's last answer
//! from an etcd quorum (not whether some connection is up), STATUS says how old its view is,
//! `lockctl status` warns when that view may be stale, and `ERR UNAVAILABLE` says why in
//! plain words. Two ways to lose the quorum: every link of one front-end cut (both ends
//! running), and etcd's members killed down to the one the front-end talks to.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::etcd::{http_get, EtcdCluster, LinkedFrontEnd, LockdFrontEnd};
use common::field;
use common::free_port;
use common::line::Line;
use common::Lockd;

const PATIENCE: Duration = Duration::from_secs(30);

/// The readiness bound of these front-ends: `--etcd-lease-ttl 3s` / 3 (proto.md: `max(1s,
/// ttl / 3)`).
const BOUND_MS: u64 = 1000;

/// How soon after a cut `/readyz` must say 503: the bound, a probe period (a quarter of it),
/// and room for a slow, busy machine. Polled, so a fast machine passes as soon as it is true.
const NOT_READY_WITHIN: Duration = Duration::from_secs(8);

fn args(metrics: SocketAddr) -> Vec<String> {
    [
        "--etcd-lease-ttl",
        "3s",
        "--etcd-request-timeout",
        "1s",
        "--metrics-listen",
        &metrics.to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `etcd_age_ms` and `etcd_bound_ms` of a STATUS of every lock, from its closing `OK` line
/// (after an `INFO` line per held lock: a LOCK answered `ERR UNAVAILABLE` during a cut may
/// still be applied when the link is back, as proto.md says).
fn status_age(addr: SocketAddr) -> (u64, u64) {
    let mut c = Line::connect(addr);
    c.send("STATUS");
    let line = loop {
        let line = c.line();
        if !line.starts_with("INFO ") {
            break line;
        }
    };
    assert!(line.starts_with("OK "), "{line}");
    let ms = |key| {
        field(&line, key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
    };
    (ms("etcd_age_ms"), ms("etcd_bound_ms"))
}

/// A refusal a user can read: the code, one plain sentence, none of the etcd client's debug
/// text.
fn assert_plain_unavailable(reply: &str) {
    assert!(reply.starts_with("ERR UNAVAILABLE "), "{reply}");
    for debug in ["tonic", "Transport", "code:", "Status {", "grpc"] {
        assert!(!reply.contains(debug), "debug text {debug:?} in {reply:?}");
    }
    assert!(reply.contains("etcd"), "no cause named: {reply}");
}

/// `lockctl status` against `addr`: its exit code and stderr.
fn lockctl_status(addr: SocketAddr) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("status")
        .env("LOCKD_ADDR", addr.to_string())
        .output()
        .expect("run lockctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) fn series(metrics: SocketAddr, name: &str) -> Option<String> {
    let (code, body) = http_get(metrics, "/metrics");
    assert_eq!(code, 200, "{body}");
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .map(|l| l[name.len() + 1..].to_owned())
}

#[test]
fn a_cut_off_front_end_is_not_ready_says_why_and_comes_back() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let cut = LinkedFrontEnd::start(
        &etcd,
        &prefix,
        &args(metrics).iter().map(String::as_str).collect::<Vec<_>>(),
    );
    eventually(PATIENCE, "ready", || http_get(metrics, "/readyz").0 == 200);
    assert_eq!(status_age(cut.addr()).1, BOUND_MS);
    // Polled, not read once: a busy machine may stall the front-end for a moment between the
    // ready answer and the next read, and a view a moment past the bound is then right.
    eventually(
        PATIENCE,
        "a healthy front-end's view within the bound",
        || {
            let (age, bound) = status_age(cut.addr());
            age <= bound
        },
    );
    eventually(PATIENCE, "lockctl status without a warning", || {
        let (code, stderr) = lockctl_status(cut.addr());
        assert_eq!(code, Some(0), "{stderr}");
        !stderr.contains("warning")
    });
    // The etcd series exist, and say it is up.
    assert_eq!(series(metrics, "lockd_etcd_up").as_deref(), Some("1"));
    // Idle, the watch has delivered every revision etcd reported (its progress is asked for).
    eventually(PATIENCE, "the watch is caught up", || {
        series(metrics, "lockd_etcd_watch_lag_revisions").as_deref() == Some("0")
    });
    for name in [
        "lockd_etcd_confirmed_age_seconds",
        "lockd_etcd_watch_lag_revisions",
        "lockd_etcd_request_duration_seconds_count",
        "lockd_etcd_errors_total{kind=\"timeout\"}",
    ] {
        assert!(series(metrics, name).is_some(), "no {name}");
    }

    cut.cut();
    let cut_at = Instant::now();
    eventually(PATIENCE, "not ready while cut off", || {
        let (code, body) = http_get(metrics, "/readyz");
        code == 503 && body.starts_with("not ready: etcd: no quorum answer for ")
    });
    assert!(
        cut_at.elapsed() < NOT_READY_WITHIN,
        "ready for {:?} after the cut",
        cut_at.elapsed()
    );
    let (_, body) = http_get(metrics, "/readyz");
    for debug in ["tonic", "Transport", "code:"] {
        assert!(!body.contains(debug), "{body}");
    }
    assert_eq!(series(metrics, "lockd_etcd_up").as_deref(), Some("0"));

    // STATUS still answers, from the mirror, and says how old it is: the age grows.
    let (first, _) = status_age(cut.addr());
    assert!(
        first > BOUND_MS,
        "cut off, yet the view is only {first}ms old"
    );
    eventually(PATIENCE, "the age grows", || {
        status_age(cut.addr()).0 > first
    });
    let (code, stderr) = lockctl_status(cut.addr());
    assert_eq!(code, Some(5), "{stderr}");
    assert!(
        stderr.contains("lockctl: warning: this front-end last heard from etcd")
            && stderr.contains("the holders shown may be stale"),
        "{stderr}"
    );

    // So do STATUS of one lock, its detail, and lockctl status of one lock.
    for ask in ["STATUS one", "STATUS one detail"] {
        let line = Line::connect(cut.addr()).req(ask);
        assert!(
            line.starts_with("OK one free etcd_age_ms="),
            "{ask}: {line}"
        );
        let age: u64 = field(&line, "etcd_age_ms")
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(age > BOUND_MS, "{ask}: {line}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["status", "one"])
        .env("LOCKD_ADDR", cut.addr().to_string())
        .output()
        .expect("run lockctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains("the holders shown may be stale"),
        "{stderr}"
    );

    // A LOCK is refused in plain words.
    assert_plain_unavailable(&cut.request("LOCK h me wait=0"));

    cut.heal();
    eventually(PATIENCE, "ready after the heal", || {
        http_get(metrics, "/readyz").0 == 200
    });
    eventually(PATIENCE, "a fresh view again", || {
        status_age(cut.addr()).0 <= BOUND_MS
    });
    assert_eq!(series(metrics, "lockd_etcd_up").as_deref(), Some("1"));
    eventually(PATIENCE, "lockctl status is quiet again", || {
        lockctl_status(cut.addr()).0 == Some(0)
    });
}

#[test]
fn without_quorum_the_last_member_standing_is_not_enough() {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    // Attached to member 0 alone: the one left standing.
    let fe = LockdFrontEnd::of(
        Lockd::new()
            .etcd(&etcd.client_url(0), &prefix)
            .args(args(metrics)),
    );
    eventually(PATIENCE, "ready", || http_get(metrics, "/readyz").0 == 200);
    etcd.kill(1);
    etcd.kill(2);
    eventually(PATIENCE, "not ready without quorum", || {
        let (code, body) = http_get(metrics, "/readyz");
        code == 503 && body.starts_with("not ready: etcd: no quorum answer for ")
    });
    // Once the member knows it has no leader, the reason says so.
    eventually(PATIENCE, "the cause is named", || {
        http_get(metrics, "/readyz")
            .1
            .contains("etcd has no leader")
    });
    let refused = fe.request("LOCK q me wait=0");
    assert_plain_unavailable(&refused);
    assert!(
        series(metrics, "lockd_etcd_errors_total{kind=\"no_leader\"}").is_some_and(|n| n != "0"),
        "no no_leader error counted"
    );
    etcd.restart(1);
    etcd.restart(2);
    etcd.wait_healthy();
    eventually(PATIENCE, "ready again", || {
        http_get(metrics, "/readyz").0 == 200
    });
}
