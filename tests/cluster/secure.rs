//! Cluster mode toward a secured etcd: TLS with client certificates on etcd's client URLs
//! (`--etcd-ca`, `--etcd-cert`, `--etcd-key`), etcd's own users and roles (`--etcd-user`
//! with `LOCKD_ETCD_PASSWORD` or `--etcd-password-file`), the one line a front-end exits 2
//! with when etcd refuses it, and the failover property over TLS. Certificates are made at
//! run time (testpki); users and roles are set up with etcdctl, as an operator would.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::etcd::{EtcdCluster, EtcdTls, LockdFrontEnd};
use common::line::Line;
use common::pki::Pki;
use common::{field, token, Lockd};

const PATIENCE: Duration = Duration::from_secs(30);

/// How long a refused start may take: the refusal itself is at the first answer, and the
/// connect timeout given below is far longer, so a refusal taken for an outage (tried again
/// until the timeout, then exit 1) fails the test by its status, not by this bound.
const REFUSAL_BOUND: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: &str = "20s";

/// A CA, etcd's certificate from it, and a TLS cluster of `n` members requiring client
/// certificates from the same CA.
fn tls_cluster(n: usize, name: &str) -> (Pki, EtcdCluster) {
    let pki = Pki::new(name);
    let (cert, key) = pki.server();
    let tls = EtcdTls {
        cert,
        key,
        client_ca: pki.ca(),
    };
    let etcd = EtcdCluster::start_tls(n, &tls);
    (pki, etcd)
}

/// `--etcd-ca`, and the client certificate `user` from `certs` (if any).
fn tls_args(ca: &Path, client: Option<(PathBuf, PathBuf)>) -> Vec<String> {
    let mut args = vec!["--etcd-ca".into(), ca.display().to_string()];
    if let Some((cert, key)) = client {
        args.extend([
            "--etcd-cert".into(),
            cert.display().to_string(),
            "--etcd-key".into(),
            key.display().to_string(),
        ]);
    }
    args
}

/// Runs `lockd` expecting it to refuse to start: its exit status must be 2, and its last
/// line of standard error the reason, which is returned.
fn refused_start(lockd: Lockd) -> String {
    let mut child = lockd
        .args(["--etcd-connect-timeout", CONNECT_TIMEOUT])
        .command()
        .spawn()
        .expect("spawn lockd");
    let deadline = Instant::now() + REFUSAL_BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lockd still running after {REFUSAL_BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert_eq!(status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or("").to_owned();
    assert!(last.starts_with("lockd: etcd at "), "{stderr}");
    for debug in ["tonic", "Status {", "code:", "Transport"] {
        assert!(!last.contains(debug), "{last}");
    }
    last
}

#[test]
fn front_ends_over_tls_with_client_certificates_serve_locks_in_fifo_order() {
    if !have(Need::Etcd) {
        return;
    }
    let (pki, etcd) = tls_cluster(3, "etcd-tls-fifo");
    let prefix = etcd.prefix();
    let args = tls_args(&pki.ca(), Some(pki.client("lockd")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = LockdFrontEnd::start(&etcd, &prefix, &args);
    let b = LockdFrontEnd::start(&etcd, &prefix, &args);
    assert!(etcd.endpoints().starts_with("https://"));

    let t = token(&a.request("LOCK tls one ttl=60s"));
    assert_eq!(b.request(&format!("UNLOCK tls {t}")), "OK");

    // FIFO across the two front-ends: a holder through A, the first waiter through B, the
    // second through A.
    let held = token(&a.request("LOCK fifo holder ttl=60s"));
    let mut first = Line::connect(b.addr());
    first.send("LOCK fifo first");
    eventually(PATIENCE, "the first waiter queued", || {
        field(&a.request("STATUS fifo"), "waiters").as_deref() == Some("1")
    });
    let mut second = Line::connect(a.addr());
    second.send("LOCK fifo second");
    eventually(PATIENCE, "the second waiter queued", || {
        field(&b.request("STATUS fifo"), "waiters").as_deref() == Some("2")
    });
    assert_eq!(b.request(&format!("UNLOCK fifo {held}")), "OK");
    let t1 = token(&first.line());
    assert!(t1 > held);
    assert_eq!(second.line_within(Duration::from_millis(300)), None);
    assert_eq!(first.req(&format!("UNLOCK fifo {t1}")), "OK");
    let t2 = token(&second.line());
    assert!(t2 > t1);
    assert_eq!(second.req(&format!("UNLOCK fifo {t2}")), "OK");
}

#[test]
fn a_front_end_that_etcd_refuses_over_tls_exits_2_saying_why() {
    if !have(Need::Etcd) {
        return;
    }
    let (pki, etcd) = tls_cluster(1, "etcd-tls-refusals");
    let prefix = etcd.prefix();
    let other = Pki::new("etcd-tls-other");
    let on_etcd = |args: Vec<String>| Lockd::new().etcd(&etcd.endpoints(), &prefix).args(args);

    let why = refused_start(on_etcd(tls_args(&pki.ca(), None)));
    assert!(
        why.ends_with("etcd requires a client certificate: give --etcd-cert and --etcd-key"),
        "{why}"
    );

    let (cert, key) = other.client("lockd");
    let why = refused_start(on_etcd(tls_args(&pki.ca(), Some((cert.clone(), key)))));
    assert!(
        why.contains(&format!(
            "etcd refused the client certificate --etcd-cert {}",
            cert.display()
        )),
        "{why}"
    );

    let why = refused_start(on_etcd(tls_args(&other.ca(), Some(pki.client("lockd")))));
    assert!(
        why.ends_with(&format!(
            "etcd's certificate is not signed by --etcd-ca {}",
            other.ca().display()
        )),
        "{why}"
    );

    // A file that is no CA is refused before any connection.
    let not_pem = other.dir.join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").expect("write");
    let out = on_etcd(tls_args(&not_pem, Some(pki.client("lockd"))))
        .command()
        .output()
        .expect("lockd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("lockd: --etcd-ca ") && l.contains("no certificate")),
        "{stderr}"
    );

    // The one that is let in is served.
    let args = tls_args(&pki.ca(), Some(pki.client("lockd")));
    let fe = LockdFrontEnd::of(Lockd::new().etcd(&etcd.endpoints(), &prefix).args(args));
    let t = token(&fe.request("LOCK in me"));
    assert_eq!(fe.request(&format!("UNLOCK in {t}")), "OK");
}

/// `etcdctl` as the test's operator: set-up steps must succeed.
fn ctl(etcd: &EtcdCluster, args: &[&str]) {
    if let Err(e) = etcd.etcdctl(args, None) {
        panic!("etcdctl {args:?}: {e}");
    }
}

/// `name` held through `holder`, a waiter queued through `waiter`, and the lock handed to
/// it with a greater token when the holder lets go.
fn hand_over(name: &str, holder: &LockdFrontEnd, waiter: &LockdFrontEnd) {
    let held = token(&holder.request(&format!("LOCK {name} holder ttl=60s")));
    let mut next = Line::connect(waiter.addr());
    next.send(&format!("LOCK {name} next"));
    eventually(PATIENCE, &format!("{name}: the waiter queued"), || {
        field(&holder.request(&format!("STATUS {name}")), "waiters").as_deref() == Some("1")
    });
    assert_eq!(holder.request(&format!("UNLOCK {name} {held}")), "OK");
    let t = token(&next.line());
    assert!(t > held, "{name}: token {t} after {held}");
    assert_eq!(next.req(&format!("UNLOCK {name} {t}")), "OK");
}

#[test]
fn a_user_whose_role_covers_the_prefix_is_served_and_any_other_is_refused_with_why() {
    if !(have(Need::Etcd) && have(Need::Etcdctl)) {
        return;
    }
    // Tokens that expire within the test (the default is five minutes): a front-end must
    // log in again by itself and carry on.
    let etcd = EtcdCluster::start_with(1, &["--auth-token-ttl", "1"]);
    let prefix = etcd.prefix();
    let elsewhere = format!("{}elsewhere/", prefix.trim_end_matches('/'));
    ctl(&etcd, &["user", "add", "root:root-secret"]);
    ctl(&etcd, &["role", "add", "lockd"]);
    ctl(
        &etcd,
        &[
            "role",
            "grant-permission",
            "lockd",
            "--prefix=true",
            "readwrite",
            &prefix,
        ],
    );
    ctl(&etcd, &["user", "add", "lockd:lockd-secret"]);
    ctl(&etcd, &["user", "grant-role", "lockd", "lockd"]);
    ctl(&etcd, &["role", "add", "other"]);
    ctl(
        &etcd,
        &[
            "role",
            "grant-permission",
            "other",
            "--prefix=true",
            "readwrite",
            &elsewhere,
        ],
    );
    ctl(&etcd, &["user", "add", "stranger:stranger-secret"]);
    ctl(&etcd, &["user", "grant-role", "stranger", "other"]);
    ctl(&etcd, &["auth", "enable"]);

    let dir = std::env::temp_dir().join(format!("lockd-etcd-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let password_file = dir.join("password");
    std::fs::write(&password_file, "lockd-secret\n").expect("write");
    let lockd = || Lockd::new().etcd(&etcd.endpoints(), &prefix);
    let env = |password: &str| vec![("LOCKD_ETCD_PASSWORD".to_owned(), password.to_owned())];

    // Through the environment and through the file: both front-ends serve the same locks.
    let a = LockdFrontEnd::of(
        lockd()
            .args(["--etcd-user", "lockd"])
            .envs(&env("lockd-secret")),
    );
    let b = LockdFrontEnd::of(lockd().args([
        "--etcd-user",
        "lockd",
        "--etcd-password-file",
        &password_file.display().to_string(),
    ]));
    hand_over("authed", &a, &b);

    // Past the tokens' life: both front-ends still serve, a hand-over included.
    std::thread::sleep(Duration::from_secs(3));
    hand_over("later", &b, &a);

    let why = refused_start(
        lockd()
            .args(["--etcd-user", "lockd"])
            .envs(&env("not-the-password")),
    );
    assert!(
        why.ends_with("etcd refused user lockd: wrong user or password"),
        "{why}"
    );
    assert!(!why.contains("not-the-password"), "{why}");

    let why = refused_start(
        lockd()
            .args(["--etcd-user", "stranger"])
            .envs(&env("stranger-secret")),
    );
    assert!(
        why.contains(&format!(
            "etcd user stranger may not read and write --etcd-prefix {prefix} (permission denied)"
        )),
        "{why}"
    );

    let why = refused_start(lockd());
    assert!(
        why.contains("etcd requires a user: give --etcd-user"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `killing_the_etcd_leader_loses_nothing_and_grants_nothing_twice` (failover.rs), on a
/// cluster that speaks TLS to its clients: the client's reconnection to another member goes
/// through a new handshake, and the hand-over still happens once.
#[test]
fn killing_the_etcd_leader_over_tls_loses_nothing_and_grants_nothing_twice() {
    if !have(Need::Etcd) {
        return;
    }
    let (pki, mut etcd) = tls_cluster(3, "etcd-tls-failover");
    let prefix = etcd.prefix();
    let mut args = tls_args(&pki.ca(), Some(pki.client("lockd")));
    args.extend(["--etcd-lease-ttl".into(), "1s".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = LockdFrontEnd::start(&etcd, &prefix, &args);
    let b = LockdFrontEnd::start(&etcd, &prefix, &args);
    crate::failover::leader_killed_loses_nothing(&mut etcd, &a, &b);
}

/// The README's setup: TLS with client certificates and etcd's authentication on, where
/// etcd takes a certificate's common name as its user, so lockd needs no `--etcd-user`.
/// The role of `lockd` covers the prefix; `stranger`'s covers another.
#[test]
fn with_etcd_auth_over_tls_the_certificate_s_common_name_is_the_user() {
    if !(have(Need::Etcd) && have(Need::Etcdctl)) {
        return;
    }
    let (pki, etcd) = tls_cluster(1, "etcd-tls-cn");
    let prefix = etcd.prefix();
    let elsewhere = format!("{}elsewhere/", prefix.trim_end_matches('/'));
    let root = pki.client("root");
    let ctl = |args: &[&str]| {
        if let Err(e) = etcd.etcdctl(args, Some((&root.0, &root.1))) {
            panic!("etcdctl {args:?}: {e}");
        }
    };
    ctl(&["user", "add", "root:root-secret"]);
    ctl(&["role", "add", "lockd"]);
    ctl(&[
        "role",
        "grant-permission",
        "lockd",
        "--prefix=true",
        "readwrite",
        &prefix,
    ]);
    // A password nobody uses: the certificate is the login.
    ctl(&["user", "add", "lockd:unused-9f2c41"]);
    ctl(&["user", "grant-role", "lockd", "lockd"]);
    ctl(&["role", "add", "other"]);
    ctl(&[
        "role",
        "grant-permission",
        "other",
        "--prefix=true",
        "readwrite",
        &elsewhere,
    ]);
    ctl(&["user", "add", "stranger:unused-77b0e3"]);
    ctl(&["user", "grant-role", "stranger", "other"]);
    ctl(&["auth", "enable"]);

    let on_etcd = |args: Vec<String>| Lockd::new().etcd(&etcd.endpoints(), &prefix).args(args);
    let fe = LockdFrontEnd::of(on_etcd(tls_args(&pki.ca(), Some(pki.client("lockd")))));
    let t = token(&fe.request("LOCK cn me ttl=60s"));
    assert_eq!(fe.request(&format!("UNLOCK cn {t}")), "OK");

    let why = refused_start(on_etcd(tls_args(&pki.ca(), Some(pki.client("stranger")))));
    assert!(
        why.contains(&format!(
            "etcd denied this front-end --etcd-prefix {prefix} (permission denied)"
        )),
        "{why}"
    );
}
