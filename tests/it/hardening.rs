//! What an operator expects of a lock server on a network (issue 19, "Hardening"): no start
//! open to the network without authentication unless `--insecure-open` says so, an auth file
//! others may change refused (one others may read warned about), at the start and on SIGHUP,
//! no secret in the log whichever field it was pasted into or sent as, a client certificate
//! with two common names logging in as nobody, and who holds a lock told only to readers.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::{Lockd, LockdProcess, Raw, GUARD};
use lockd::auth::{user_line, Gate, Users};
use lockd::client::Client;
use lockd::proto::ErrorCode;
use lockd::server::Config;
use lockd::tls;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const ALICE: &str = "alice-secret-0123456789abcdef-hardening";
const PASTED: &str = "pasted-secret-0123456789abcdef-must-not-be-logged";

/// A fresh scratch directory of this test binary.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockd-hardening-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `text` written to `<dir>/users` with permission bits `mode`.
fn users_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let file = dir.join("users");
    std::fs::write(&file, text).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    file
}

fn alice_line() -> String {
    user_line("alice lock=* read=*", ALICE, [9; 16]).unwrap()
}

/// Runs lockd with `lockd`'s command line to its exit (it must not start).
fn refused(lockd: Lockd) -> Output {
    let out = lockd.command().output().expect("run lockd");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    out
}

/// The one line a refused start printed.
fn one_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr.trim_end().to_owned()
}

/// 127.0.0.1 with the port of a lockd that listens on every address.
fn local(addr: SocketAddr) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], addr.port()))
}

/// Polls `lockd`'s log until a line contains `text`; fails after the guard.
async fn wait_log(lockd: &LockdProcess, text: &str) {
    let deadline = Instant::now() + GUARD;
    while !lockd.log().iter().any(|l| l.contains(text)) {
        assert!(
            Instant::now() < deadline,
            "no {text:?} in {:#?}",
            lockd.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hangup(lockd: &LockdProcess) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe {
        libc::kill(lockd.pid() as libc::pid_t, libc::SIGHUP);
    }
}

/// One HTTP/1.0 GET: the status code and the body.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    tokio::time::timeout(GUARD, s.read_to_string(&mut text))
        .await
        .expect("an answer")
        .expect("read");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// Polls `http_get` until it answers 200.
async fn http_ok(addr: SocketAddr, path: &str) -> String {
    let deadline = Instant::now() + GUARD;
    loop {
        if let Ok((200, body)) =
            tokio::time::timeout(Duration::from_secs(2), http_get(addr, path)).await
        {
            return body;
        }
        assert!(Instant::now() < deadline, "{path} never answered 200");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- 1. Open to the network without authentication ----

#[test]
fn a_non_loopback_listen_without_auth_exits_2_with_one_line() {
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let out = refused(Lockd::new().listen(addr));
        let line = one_line(&out);
        assert!(
            line.contains(&format!("--listen {addr} is reachable")),
            "{line}"
        );
        assert!(
            line.contains("--auth-file") && line.contains("--insecure-open"),
            "{line}"
        );
    }
    // The old protocol's ports too: --auth-file does not cover them.
    let out = refused(Lockd::new().args(["--compat", "--compat-addr", "0.0.0.0"]));
    let line = one_line(&out);
    assert!(
        line.contains("--compat-addr 0.0.0.0 is reachable"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_open_starts_warns_and_shows_it_on_the_metrics_endpoint() {
    let metrics = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let lockd = Lockd::new()
        .listen("0.0.0.0:0")
        .args(["--insecure-open", "--metrics-listen", &metrics.to_string()])
        .spawn();
    let mut c = Raw::connect(local(lockd.addr)).await;
    c.lock("open-1 me").await;
    let log = lockd.log();
    let warned: Vec<_> = log
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("--insecure-open"))
        .collect();
    assert_eq!(warned.len(), 1, "{log:#?}");
    assert!(warned[0].contains("without authentication"), "{log:#?}");
    let health = http_ok(metrics, "/healthz").await;
    assert_eq!(
        health,
        "ok; open without authentication (--insecure-open)\n"
    );
    let exposition = http_ok(metrics, "/metrics").await;
    assert!(
        exposition.lines().any(|l| l == "lockd_open_without_auth 1"),
        "{exposition}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_file_opens_the_network_without_a_warning_and_loopback_needs_nothing() {
    let dir = scratch("open-auth");
    let file = users_file(&dir, &alice_line(), 0o600);
    let metrics = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let lockd = Lockd::new()
        .listen("0.0.0.0:0")
        .args(["--auth-file", file.to_str().unwrap()])
        .args(["--metrics-listen", &metrics.to_string()])
        .spawn();
    let mut c = Raw::connect(local(lockd.addr)).await;
    assert_eq!(c.req(&format!("AUTH alice {ALICE}")).await, "OK alice");
    assert_eq!(http_ok(metrics, "/healthz").await, "ok\n");
    let exposition = http_ok(metrics, "/metrics").await;
    assert!(
        exposition.lines().any(|l| l == "lockd_open_without_auth 0"),
        "{exposition}"
    );
    let log = lockd.stop();
    assert!(!log.iter().any(|l| l.contains("WARN")), "{log:#?}");

    // Loopback, by address and by name: nothing to say.
    for addr in ["127.0.0.1:0", "localhost:0"] {
        let lockd = Lockd::new().listen(addr).spawn();
        let mut c = lockd.raw().await;
        c.lock("loop-1 me").await;
        let log = lockd.stop();
        assert!(!log.iter().any(|l| l.contains("WARN")), "{addr}: {log:#?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

// ---- 2. Auth file permissions ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_file_others_may_read_is_warned_about_one_they_may_write_refused() {
    let dir = scratch("perms");
    for mode in [0o620, 0o602, 0o666] {
        let file = users_file(&dir, &alice_line(), mode);
        let out = refused(Lockd::new().args(["--auth-file", file.to_str().unwrap()]));
        let line = one_line(&out);
        assert!(line.contains("--auth-file"), "{mode:o}: {line}");
        assert!(
            line.contains("group or others may write it"),
            "{mode:o}: {line}"
        );
    }
    for (mode, warned) in [(0o644, true), (0o640, false), (0o600, false)] {
        let file = users_file(&dir, &alice_line(), mode);
        let lockd = Lockd::new()
            .args(["--auth-file", file.to_str().unwrap()])
            .spawn();
        let mut c = lockd.raw().await;
        assert_eq!(c.req(&format!("AUTH alice {ALICE}")).await, "OK alice");
        let log = lockd.stop();
        let said = log.iter().any(|l| l.contains("readable by other users"));
        assert_eq!(said, warned, "{mode:o}: {log:#?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_checks_the_permissions_again() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch("perms-reload");
    let file = users_file(&dir, &alice_line(), 0o600);
    let lockd = Lockd::new()
        .args(["--auth-file", file.to_str().unwrap()])
        .spawn();
    let dave = "dave-secret-0123456789abcdef-hardening";
    let both = format!(
        "{}\n{}",
        alice_line(),
        user_line("dave lock=*", dave, [8; 16]).unwrap()
    );
    users_file(&dir, &both, 0o666);
    hangup(&lockd);
    wait_log(&lockd, "auth file not reloaded").await;
    let mut c = lockd.raw().await;
    c.send(&format!("AUTH dave {dave}")).await;
    c.expect_prefix("ERR DENIED bad user or secret").await;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    hangup(&lockd);
    wait_log(&lockd, "auth file reloaded").await;
    let mut c = lockd.raw().await;
    assert_eq!(c.req(&format!("AUTH dave {dave}")).await, "OK dave");
    let log = lockd.stop();
    let error = log
        .iter()
        .find(|l| l.contains("auth file not reloaded"))
        .unwrap();
    assert!(error.contains("group or others may write it"), "{error}");
    assert!(
        log.iter().any(|l| l.contains("readable by other users")),
        "{log:#?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

// ---- 3. Never log what could be a secret ----

#[test]
fn a_secret_in_the_wrong_field_of_the_auth_file_is_never_printed() {
    let dir = scratch("fields");
    let hash = user_line("x", ALICE, [1; 16]).unwrap();
    let hash = hash.split_whitespace().nth(2).unwrap().to_owned();
    let cases = [
        (
            format!("{}\nuser {PASTED} lock=*", alice_line()),
            "line 2: field 3 is not a valid salted hash",
        ),
        (
            format!("user bob {PASTED}"),
            "line 1: field 3 is not a valid salted hash",
        ),
        (
            format!("user bob {hash} {PASTED}"),
            "line 1: field 4 is neither",
        ),
        (
            format!("# users\nuser bob {hash} read=* {PASTED}"),
            "line 2: field 5 is neither",
        ),
    ];
    for (text, expected) in cases {
        let file = users_file(&dir, &text, 0o600);
        let out = refused(Lockd::new().args(["--auth-file", file.to_str().unwrap()]));
        let line = one_line(&out);
        assert!(line.contains(expected), "{text:?}: {line}");
        assert!(!line.contains(PASTED), "{line}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_auth_logs_only_a_known_user_name() {
    let dir = scratch("swapped");
    let file = users_file(&dir, &alice_line(), 0o600);
    let lockd = Lockd::new()
        .args(["--auth-file", file.to_str().unwrap()])
        .spawn();
    let mut c = lockd.raw().await;
    // The words swapped: the secret where the user goes.
    c.send(&format!("AUTH {ALICE} alice")).await;
    c.expect_prefix("ERR DENIED bad user or secret").await;
    c.send(&format!("AUTH alice {PASTED}")).await;
    c.expect_prefix("ERR DENIED bad user or secret").await;
    assert_eq!(c.req(&format!("AUTH alice {ALICE}")).await, "OK alice");
    let log = lockd.stop();
    let failed: Vec<_> = log
        .iter()
        .filter(|l| l.contains("authentication failed"))
        .collect();
    assert_eq!(failed.len(), 2, "{log:#?}");
    // Still the shape the fail2ban filter matches: the address first.
    for line in &failed {
        assert!(
            line.contains("authentication failed ip=127.0.0.1 peer="),
            "{line}"
        );
    }
    assert!(failed[0].contains(" user=? "), "{}", failed[0]);
    assert!(failed[1].contains(" user=\"alice\" "), "{}", failed[1]);
    for secret in [ALICE, PASTED] {
        assert!(
            !log.iter().any(|l| l.contains(secret)),
            "{secret}: {log:#?}"
        );
    }

    // The same in JSON.
    let lockd = Lockd::new()
        .args([
            "--auth-file",
            file.to_str().unwrap(),
            "--log-format",
            "json",
        ])
        .spawn();
    let mut c = lockd.raw().await;
    c.send(&format!("AUTH {ALICE} alice")).await;
    c.expect_prefix("ERR DENIED bad user or secret").await;
    let log = lockd.stop();
    let failed: Vec<serde_json::Value> = log
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "authentication failed")
        .collect();
    assert_eq!(failed.len(), 1, "{log:#?}");
    assert_eq!(failed[0]["user"], "?", "{log:#?}");
    assert!(!log.iter().any(|l| l.contains(ALICE)), "{log:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

// ---- 4. A client certificate with several common names ----

/// A CA, a server certificate for 127.0.0.1 and a client certificate whose subject has the
/// common names `cns` (rcgen keeps one value per attribute type, so the second and later go
/// in as a custom type with commonName's OID), in `dir`: (ca, server cert, server key, client
/// cert, client key).
fn pki_with_client(dir: &Path, cns: &[&str]) -> [PathBuf; 5] {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        SanType,
    };
    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "hardening test CA");
    let ca = params.self_signed(&ca_key).unwrap();

    let server_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.distinguished_name.push(DnType::CommonName, "lockd");
    let server = params.signed_by(&server_key, &ca, &ca_key).unwrap();

    let client_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    for (i, cn) in cns.iter().enumerate() {
        let ty = match i {
            0 => DnType::CommonName,
            _ => DnType::CustomDnType(vec![2, 5, 4, 3]),
        };
        params.distinguished_name.push(ty, *cn);
    }
    let client = params.signed_by(&client_key, &ca, &ca_key).unwrap();
    [
        write("ca.pem", ca.pem()),
        write("server.pem", server.pem()),
        write("server.key", server_key.serialize_pem()),
        write("client.pem", client.pem()),
        write("client.key", client_key.serialize_pem()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_with_two_common_names_logs_in_as_nobody() {
    let dir = scratch("two-cn");
    let [ca, cert, key, client_cert, client_key] = pki_with_client(&dir, &["alice", "root"]);
    let der = common::pki::Pki::der(&client_cert);
    assert_eq!(
        tls::subject_cns(&der),
        Some(vec!["alice".to_string(), "root".to_string()])
    );
    assert_eq!(tls::subject_cn(&der), None, "two names are no name");

    let users = format!(
        "{}\n{}",
        user_line("alice lock=a* read=*", ALICE, [2; 16]).unwrap(),
        user_line(
            "root lock=* read=*",
            "root-secret-0123456789abcdef",
            [3; 16]
        )
        .unwrap()
    );
    let server = Lockd::new()
        .config(Config {
            tls: Some(tls::server(&cert, &key, Some(&ca)).expect("server TLS")),
            auth: Some(Gate::new(Users::parse(&users, None).unwrap())),
            ..common::config()
        })
        .serve()
        .await;
    let addr = server.addr.to_string();
    let connector = tls::client(Some(&ca), Some((&client_cert, &client_key))).expect("TLS");
    let mut c = Client::connect_tls(&addr, &connector)
        .await
        .expect("the handshake itself succeeds");
    let e = c.ping().await.expect_err("refused");
    assert_eq!(e.code(), Some(ErrorCode::Denied), "{e}");
    assert!(
        e.to_string()
            .contains("the client certificate has 2 common names (CN)"),
        "{e}"
    );
    c.ping().await.expect_err("and closed");

    // The same CA's certificate with one name still logs in as that user.
    let one = scratch("one-cn");
    let [ca1, cert1, key1, client1, client1_key] = pki_with_client(&one, &["alice"]);
    let server1 = Lockd::new()
        .config(Config {
            tls: Some(tls::server(&cert1, &key1, Some(&ca1)).expect("server TLS")),
            auth: Some(Gate::new(Users::parse(&users, None).unwrap())),
            ..common::config()
        })
        .serve()
        .await;
    let connector = tls::client(Some(&ca1), Some((&client1, &client1_key))).expect("TLS");
    let mut c = Client::connect_tls(&server1.addr.to_string(), &connector)
        .await
        .expect("mutual TLS");
    c.lock("a-1", "me", None, None, Default::default())
        .await
        .expect("alice by her certificate");
    server.shutdown().await;
    server1.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(one);
}

// ---- 5. Blocked-by details only with `read` ----

#[tokio::test]
async fn who_holds_a_lock_is_told_only_to_users_who_may_read_it() {
    let line = |spec: &str, secret: &str| user_line(spec, secret, [4; 16]).unwrap();
    let users = [
        line("owner lock=app-* read=app-*", ALICE),
        line("locker lock=app-*", "locker-secret-0123456789abcdef"),
        line(
            "reader lock=app-* read=app-*",
            "reader-secret-0123456789abcdef",
        ),
    ]
    .join("\n");
    let server = Lockd::new()
        .config(Config {
            auth: Some(Gate::new(Users::parse(&users, None).unwrap())),
            ..common::config()
        })
        .serve()
        .await;
    let addr = server.addr;
    let login = |user: &'static str, secret: &'static str| async move {
        let mut c = Raw::connect(addr).await;
        assert_eq!(
            c.req(&format!("AUTH {user} {secret}")).await,
            format!("OK {user}")
        );
        c
    };
    let mut owner = login("owner", ALICE).await;
    let mut locker = login("locker", "locker-secret-0123456789abcdef").await;
    let mut reader = login("reader", "reader-secret-0123456789abcdef").await;
    owner.lock("app-10 alice-10 ttl=1m").await;

    assert_eq!(
        locker.req("LOCK app-10 l-1 wait=0").await,
        "ERR TIMEOUT app-10: held"
    );
    // The reader is told who blocks (proto.md, Blocked-by answers).
    let reply = reader.req("LOCK app-10 r-1 wait=0").await;
    assert!(
        reply.starts_with("ERR TIMEOUT app-10: held by alice-10 user=owner held_ms="),
        "{reply}"
    );
    // A wait that runs out names nobody to the locker; the reader is told who blocks.
    assert_eq!(
        locker.req("LOCK app-10 w-1 wait=50ms").await,
        "ERR TIMEOUT app-10 still held after waiting 50ms"
    );
    let reply = reader.req("LOCK app-10 w-1 wait=50ms").await;
    assert!(
        reply.starts_with(
            "ERR TIMEOUT app-10 still held after waiting 50ms; held by alice-10 user=owner "
        ),
        "{reply}"
    );
    // STATUS says nothing to the locker either.
    locker.send("STATUS app-10").await;
    locker
        .expect_prefix("ERR DENIED app-10: user locker has no read right")
        .await;

    // Without an auth file, everyone may read: the holder is named.
    let open = Lockd::new().serve().await;
    let mut a = open.raw().await;
    a.lock("app-10 alice-10 ttl=1m").await;
    let mut b = open.raw().await;
    let reply = b.req("LOCK app-10 b-1 wait=0").await;
    assert!(
        reply.starts_with("ERR TIMEOUT app-10: held by alice-10 held_ms="),
        "{reply}"
    );
    server.shutdown().await;
    open.shutdown().await;
}
