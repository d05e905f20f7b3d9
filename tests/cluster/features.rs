//! Cluster mode carries the rest of lockd along: AUTH and lease ownership across
//! front-ends, the two-port compat mode, and /metrics and /readyz (which says when etcd has
//! no quorum).
#![cfg(feature = "etcd")]

use super::basics::wait_held;
use crate::common;
use crate::common::needs::{have, Need};

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::blocking::eventually;
use common::etcd::{http_get, EtcdCluster, LockdFrontEnd};
use common::free_port;
use common::line::Line;
use common::{field, token};
use lockd::auth::user_line;

const PATIENCE: Duration = Duration::from_secs(30);
const ALICE: &str = "alice-secret-0123456789abcdef";
const MALLORY: &str = "mallory-secret-0123456789abcdef";

#[test]
fn a_lease_belongs_to_its_user_on_every_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let dir = std::env::temp_dir().join(format!("lockd-cluster-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let users = dir.join("users");
    let line = |spec: &str, secret: &str| user_line(spec, secret, [5; 16]).expect("user line");
    std::fs::write(
        &users,
        [
            line("alice lock=* read=*", ALICE),
            line("mallory lock=* read=*", MALLORY),
        ]
        .join("\n"),
    )
    .expect("users file");
    let users = users.to_string_lossy().into_owned();
    let a = LockdFrontEnd::start(&etcd, &prefix, &["--auth-file", &users]);
    let b = LockdFrontEnd::start(&etcd, &prefix, &["--auth-file", &users]);
    let mut alice = Line::connect(a.addr());
    assert_eq!(alice.req(&format!("AUTH alice {ALICE}")), "OK alice");
    let t = alice.lock("deploy job");
    let mut mallory = Line::connect(b.addr());
    assert_eq!(
        mallory.req(&format!("AUTH mallory {MALLORY}")),
        "OK mallory"
    );
    let refused = mallory.req(&format!("UNLOCK deploy {t}"));
    assert!(refused.starts_with("ERR DENIED"), "{refused}");
    let refused = mallory.req(&format!("RENEW deploy {t}"));
    assert!(refused.starts_with("ERR DENIED"), "{refused}");
    // The same id from another user is another client: it waits.
    let other = mallory.req("LOCK deploy job wait=0");
    assert!(other.starts_with("ERR TIMEOUT"), "{other}");
    let mut alice_b = Line::connect(b.addr());
    assert_eq!(alice_b.req(&format!("AUTH alice {ALICE}")), "OK alice");
    assert_eq!(alice_b.req(&format!("UNLOCK deploy {t}")), "OK");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_two_port_protocol_works_on_a_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let (lock_port, unlock_port) = (free_port(), free_port());
    let compat = LockdFrontEnd::start(
        &etcd,
        &prefix,
        &[
            "--compat",
            "--compat-addr",
            "127.0.0.1",
            "--lock-port",
            &lock_port.to_string(),
            "--unlock-port",
            &unlock_port.to_string(),
        ],
    );
    let other = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let ask = |port: u16, msg: &str| -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("{msg}\n").as_bytes()).ok()?;
        let mut reply = String::new();
        BufReader::new(s).read_line(&mut reply).ok()?;
        Some(reply.trim_end().to_owned())
    };
    eventually(PATIENCE, "oklocked", || {
        ask(lock_port, "lock:oldjob:1700000000").as_deref() == Some("oklocked")
    });
    let _ = compat;
    eventually(
        PATIENCE,
        "the other front-end sees the old client's lease",
        || field(&other.request("STATUS compat"), "id").as_deref() == Some("oldjob"),
    );
    eventually(PATIENCE, "okunlocked", || {
        ask(unlock_port, "unlock:oldjob:1700000001").as_deref() == Some("okunlocked")
    });
    eventually(PATIENCE, "free everywhere", || {
        other.request("STATUS compat") == "OK compat free"
    });
}

#[test]
fn metrics_and_readyz_follow_the_cluster() {
    if !have(Need::Etcd) {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let prefix = etcd.prefix();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let fe = LockdFrontEnd::start(
        &etcd,
        &prefix,
        &[
            "--metrics-listen",
            &metrics.to_string(),
            "--etcd-request-timeout",
            "1s",
        ],
    );
    let t = token(&fe.request("LOCK m me"));
    eventually(PATIENCE, "ready", || http_get(metrics, "/readyz").0 == 200);
    // The gauge counts what the front-end's watch has shown: a moment after the grant.
    eventually(PATIENCE, "lockd_cluster_locks_held 1", || {
        let (code, body) = http_get(metrics, "/metrics");
        assert_eq!(code, 200);
        let held = body
            .lines()
            .find(|l| l.starts_with("lockd_cluster_locks_held "))
            .unwrap_or_else(|| panic!("no lockd_cluster_locks_held in {body}"));
        held == "lockd_cluster_locks_held 1"
    });
    etcd.kill(0);
    etcd.kill(1);
    eventually(PATIENCE, "not ready without quorum", || {
        let (code, body) = http_get(metrics, "/readyz");
        code == 503 && body.contains("etcd")
    });
    etcd.restart(0);
    etcd.restart(1);
    etcd.wait_healthy();
    eventually(PATIENCE, "ready again", || {
        http_get(metrics, "/readyz").0 == 200
    });
    assert_eq!(fe.request(&format!("UNLOCK m {t}")), "OK");
}

/// A cluster front-end ends STATUS's `OK` line with how old its view is: the Python client
/// still reads a free lock as free and a held one with its holder, with and without detail.
#[test]
fn the_python_client_reads_a_front_end_s_status() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(1);
    let fe = LockdFrontEnd::start(&etcd, &etcd.prefix(), &[]);
    let t = token(&fe.request("LOCK held me ttl=1m"));
    // STATUS shows what the front-end's watch has seen, a moment after its own grant.
    wait_held(&fe, "held", t);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/python");
    let script = "import sys\n\
        from lockd_client import Client\n\
        c = Client(sys.argv[1], id='py')\n\
        print(c.status('free'), c.detail('free'))\n\
        s = c.status('held')\n\
        d = c.detail('held')\n\
        print(s.id, s.token, d.status.id, len(d.holders))\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script, &fe.addr().to_string()])
        .current_dir(&dir)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, format!("None None\nme {t} me 1\n"));
}

/// The web view (`--web`) of a front-end shows what every front-end granted and queued, and
/// streams the events its watch sees.
#[test]
fn the_web_view_shows_locks_taken_through_any_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let etcd = EtcdCluster::start(1);
    let prefix = etcd.prefix();
    let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _viewed = LockdFrontEnd::start(
        &etcd,
        &prefix,
        &["--metrics-listen", &http.to_string(), "--web"],
    );
    let other = LockdFrontEnd::start(&etcd, &prefix, &[]);
    let mut events = TcpStream::connect(http).unwrap();
    events.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(events, "GET /events HTTP/1.1\r\nHost: lockd\r\n\r\n").unwrap();
    let mut events = BufReader::new(events);

    let t = token(&other.request("LOCK deploy/web a ttl=1m note=v42"));
    let mut waiter = Line::connect(other.addr());
    waiter.send("LOCK deploy/web b ttl=1m");
    eventually(PATIENCE, "the holder and the queue on the board", || {
        let (code, body) = http_get(http, "/locks");
        assert_eq!(code, 200, "{body}");
        let board: serde_json::Value = serde_json::from_str(&body).unwrap();
        let lock = &board["locks"][0];
        lock["name"] == "deploy/web"
            && lock["holders"][0]["token"] == t
            && lock["holders"][0]["note"] == "v42"
            && lock["queue"][0]["id"] == "b"
            && board["etcd"]["bound_ms"].is_u64()
    });
    let mut line = String::new();
    loop {
        line.clear();
        assert_ne!(events.read_line(&mut line).unwrap(), 0, "the stream ended");
        if line.starts_with("data: ") && line.contains("\"kind\":\"acquired\"") {
            assert!(line.contains(&format!("\"token\":{t}")), "{line}");
            break;
        }
    }
    assert_eq!(other.request(&format!("UNLOCK deploy/web {t}")), "OK");
    token(&waiter.line());
}
