//! lockctl over TLS against a real lockd in this process (certificates made at run time):
//! run, acquire, release, renew, status, watch and a reconnect over TLS; mutual TLS; and the
//! failures a user meets (an untrusted, expired or misnamed certificate, a plain port, a port
//! that never answers, a refused client certificate), each exit code 3 at once, with a line
//! naming the cause.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::lockctl::{
    code, finish, line_with, lockctl_at, output, proxy, scratch, spawn, stderr, stderr_lines,
    stdout, wait_for_file, Server, GUARD,
};
use common::pki::Pki;
use common::TestServer;
use lockd::client::Client;
use lockd::server::Config;
use lockd::tls;
use tokio::io::AsyncBufReadExt as _;
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::time::{timeout, Instant};

/// Far longer than any failure here may take: a failure that ends before it was not retried
/// until --connect-timeout.
const PATIENT: &str = "60s";
const FAST: Duration = Duration::from_secs(30);

/// A lockd serving TLS on a free loopback port with a certificate of `pki`, requiring client
/// certificates of `client_ca` if given; stopped when dropped.
struct TlsLockd {
    addr: String,
    ca: PathBuf,
    /// Kept to stop the server on drop.
    _server: TestServer,
}

async fn tls_lockd(pki: &Pki, client_ca: Option<&Pki>) -> TlsLockd {
    let (cert, key) = pki.server();
    tls_lockd_with(&cert, &key, pki.ca(), client_ca.map(Pki::ca).as_deref()).await
}

async fn tls_lockd_with(
    cert: &Path,
    key: &Path,
    ca: PathBuf,
    client_ca: Option<&Path>,
) -> TlsLockd {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = Config {
        tls: Some(tls::server(cert, key, client_ca).expect("server TLS")),
        ..Config::default()
    };
    let server = common::Lockd::new().config(config).serve_on(listener);
    TlsLockd {
        addr,
        ca,
        _server: server,
    }
}

impl TlsLockd {
    /// lockctl aimed at this server, trusting its CA (through LOCKD_TLS_CA, as a user's
    /// environment would).
    fn lockctl(&self, args: &[&str]) -> Command {
        let mut cmd = lockctl_at(&self.addr, args);
        cmd.env("LOCKD_TLS_CA", &self.ca);
        cmd
    }

    async fn client(&self, identity: Option<(&Path, &Path)>) -> Client {
        let connector = tls::client(Some(&self.ca), identity).unwrap();
        Client::connect_tls(&self.addr, &connector).await.unwrap()
    }

    /// What `STATUS <name>` answers, asked over TLS.
    async fn status_line(&self, name: &str, identity: Option<(&Path, &Path)>) -> String {
        let mut lines = self
            .client(identity)
            .await
            .status(Some(name))
            .await
            .unwrap();
        lines.remove(0)
    }
}

fn token_of(line: &str) -> Option<u64> {
    lockd::proto::field(line, "token").map(|t| t.parse().unwrap())
}

/// `lockctl` with `args` must exit 3 well before its --connect-timeout, saying `cause`.
async fn assert_fails_fast(cmd: Command, cause: &str) -> String {
    let started = Instant::now();
    let out = output(cmd).await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(
        started.elapsed() < FAST,
        "retried for {:?}: {}",
        started.elapsed(),
        stderr(&out)
    );
    let text = stderr(&out);
    assert!(text.contains(cause), "no {cause:?} in: {text}");
    assert_eq!(text.trim_end().lines().count(), 1, "one line: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_over_tls_holds_the_lock_while_the_command_runs_and_releases_it() {
    let pki = Pki::new("lockctl-run");
    let d = tls_lockd(&pki, None).await;
    let dir = scratch("tls-run");
    let (ready, nested, go) = (dir.join("ready"), dir.join("nested"), dir.join("go"));
    // The command runs lockctl itself: run hands it the TLS settings with the address.
    let script = format!(
        "\"$LOCKCTL\" status job --json > {}; echo $LOCKD_TOKEN > {}; \
         while [ ! -e {} ]; do sleep 0.02; done",
        nested.display(),
        ready.display(),
        go.display()
    );
    let child = spawn(d.lockctl(&["run", "job", "-c", &script]));
    let token: u64 = wait_for_file(&ready).await.trim().parse().unwrap();
    let line = d.status_line("job", None).await;
    assert_eq!(token_of(&line), Some(token), "{line}");
    let nested = std::fs::read_to_string(&nested).unwrap();
    assert!(nested.contains(&format!(r#""token":{token},"#)), "{nested}");
    std::fs::write(&go, "").unwrap();
    let out = finish(child).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.status_line("job", None).await, "job free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_status_and_release_over_tls() {
    let pki = Pki::new("lockctl-ops");
    let d = tls_lockd(&pki, None).await;
    let out = output(d.lockctl(&["acquire", "ops", "--ttl", "1m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    assert_eq!(
        token_of(&d.status_line("ops", None).await),
        Some(token.parse().unwrap())
    );

    let out = output(d.lockctl(&["renew", "ops", &token, "--ttl", "2m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = output(d.lockctl(&["status", "ops", "--json"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(r#""token":{token},"#)),
        "{}",
        stdout(&out)
    );
    let out = output(d.lockctl(&["status"])).await;
    assert!(stdout(&out).contains("ops"), "{}", stdout(&out));

    let out = output(d.lockctl(&["release", "ops", &token])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.status_line("ops", None).await, "ops free");
    // A token that is no longer the lease: 4, as without TLS.
    let out = output(d.lockctl(&["release", "ops", &token])).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_over_tls_prints_events() {
    let pki = Pki::new("lockctl-watch");
    let d = tls_lockd(&pki, None).await;
    let mut watcher = spawn(d.lockctl(&["watch", "seen"]));
    let mut lines = tokio::io::BufReader::new(watcher.stdout.take().unwrap()).lines();
    // The watch is on once lockctl is connected: lock again until an event shows.
    let give_up = Instant::now() + GUARD;
    let line = loop {
        let mut c = d.client(None).await;
        let token = c
            .lock("seen", "me", None, None, Default::default())
            .await
            .unwrap();
        c.unlock("seen", token).await.unwrap();
        if let Ok(Ok(Some(line))) = timeout(Duration::from_millis(200), lines.next_line()).await {
            break line;
        }
        assert!(Instant::now() < give_up, "watch printed nothing");
    };
    assert!(line.contains("seen"), "{line}");
    drop(watcher);
}

/// A connection reset under a running command: lockctl reconnects over TLS and renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reconnects_over_tls() {
    let pki = Pki::new("lockctl-reconnect");
    let d = tls_lockd(&pki, None).await;
    let p = proxy(d.addr.clone()).await;
    let dir = scratch("tls-reconnect");
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let script = format!(
        "echo $LOCKD_TOKEN > {}; while [ ! -e {} ]; do sleep 0.05; done",
        ready.display(),
        go.display()
    );
    let args = ["-v", "run", "ride", "--session-grace", "5s", "-c", &script];
    let mut cmd = lockctl_at(&p.addr, &args);
    cmd.env("LOCKD_TLS_CA", &d.ca);
    let mut child = spawn(cmd);
    let mut err = stderr_lines(&mut child);
    let token: u64 = wait_for_file(&ready).await.trim().parse().unwrap();
    p.cut();
    line_with(&mut err, "reconnected").await;
    line_with(&mut err, &format!("renewed ride token {token}")).await;
    std::fs::write(&go, "").unwrap();
    line_with(&mut err, &format!("released ride token {token}")).await;
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_takes_a_client_certificate_and_says_when_one_is_missing_or_refused() {
    let pki = Pki::new("lockctl-mutual");
    let stranger = Pki::new("lockctl-stranger");
    let d = tls_lockd(&pki, Some(&pki)).await;
    let (cert, key) = pki.client("deploy-bot");
    let identity = Some((cert.as_path(), key.as_path()));

    let mut cmd = d.lockctl(&["acquire", "m", "--ttl", "1m"]);
    cmd.env("LOCKD_CLIENT_CERT", &cert)
        .env("LOCKD_CLIENT_KEY", &key);
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    assert_eq!(
        token_of(&d.status_line("m", identity).await),
        Some(token.parse().unwrap())
    );
    // Without an auth file, the certificate's name says who took it (it grants nothing).
    let detail = d.client(identity).await.detail("m").await.unwrap();
    assert_eq!(detail.holders[0].user.as_deref(), Some("deploy-bot"));
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let out = output(d.lockctl(&[
        "release",
        "m",
        &token,
        "--client-cert",
        c,
        "--client-key",
        k,
    ]))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let mut without = d.lockctl(&["run", "m", "--connect-timeout", PATIENT, "--", "true"]);
    without
        .env_remove("LOCKD_CLIENT_CERT")
        .env_remove("LOCKD_CLIENT_KEY");
    assert_fails_fast(without, "requires a client certificate").await;

    let (cert, key) = stranger.client("mallory");
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let args = [
        "run",
        "m",
        "--connect-timeout",
        PATIENT,
        "--client-cert",
        c,
        "--client-key",
        k,
        "--",
        "true",
    ];
    let text = assert_fails_fast(d.lockctl(&args), "refused the client certificate").await;
    assert!(text.contains("not signed by a CA lockd trusts"), "{text}");
    assert_eq!(d.status_line("m", identity).await, "m free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_not_trusted() {
    let pki = Pki::new("lockctl-server");
    let other = Pki::new("lockctl-other");
    let d = tls_lockd(&pki, None).await;
    let dir = scratch("tls-untrusted");
    let ran = dir.join("ran");
    let touch = format!("touch {}", ran.display());
    let mut cmd = d.lockctl(&["run", "x", "--connect-timeout", PATIENT, "-c", &touch]);
    cmd.env("LOCKD_TLS_CA", other.ca());
    let text = assert_fails_fast(cmd, "is not trusted").await;
    assert!(text.contains(&d.addr), "{text}");
    assert!(text.contains("--tls-ca"), "says what to do: {text}");
    assert!(!ran.exists(), "the command ran");
    let mut cmd = d.lockctl(&["status"]);
    cmd.env("LOCKD_TLS_CA", other.ca());
    assert_fails_fast(cmd, "is not trusted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_or_misnamed_server_certificate_is_not_trusted() {
    let odd = OddCa::new();
    let dir = scratch("tls-odd");
    for (cert, cause) in [
        (odd.server(&dir, "expired", &["localhost"], true), "expired"),
        (
            odd.server(&dir, "misnamed", &["elsewhere.example"], false),
            "not valid for",
        ),
    ] {
        let d = tls_lockd_with(&cert.0, &cert.1, odd.ca.clone(), None).await;
        let cmd = d.lockctl(&["run", "x", "--connect-timeout", PATIENT, "--", "true"]);
        assert_fails_fast(cmd, cause).await;
    }
}

/// With several addresses, each connection's certificate is checked against the host of the
/// address it was made to: lockd's certificate here names `localhost` only, so the same
/// server is trusted as the second address `localhost:<port>` after a dead `127.0.0.1:<port>`,
/// and not as the second address `127.0.0.1:<port>` after a dead `localhost:<port>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_several_addresses_the_certificate_is_checked_against_the_one_connected_to() {
    let pki = Pki::new("lockctl-names");
    let (cert, key) = pki.server_named("localhost-only", &["localhost"]);
    let d = tls_lockd_with(&cert, &key, pki.ca(), None).await;
    let port = d.addr.rsplit_once(':').unwrap().1;
    let dead = common::dead_addr();
    let dead_port = dead.rsplit_once(':').unwrap().1;

    let list = format!("{dead},localhost:{port}");
    let mut cmd = lockctl_at(&list, &["-v", "status"]);
    cmd.env("LOCKD_TLS_CA", &d.ca);
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("connected to lockd at localhost:{port}")),
        "{}",
        stderr(&out)
    );

    let list = format!("localhost:{dead_port},127.0.0.1:{port}");
    let mut cmd = lockctl_at(&list, &["status", "--connect-timeout", PATIENT]);
    cmd.env("LOCKD_TLS_CA", &d.ca);
    let text = assert_fails_fast(cmd, "not valid for").await;
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_on_a_plain_port_is_told_so_at_once() {
    let pki = Pki::new("lockctl-plain");
    let d: Server = common::lockctl::lockd().await;
    let mut cmd = d.lockctl(&["run", "x", "--connect-timeout", PATIENT, "--", "true"]);
    cmd.env("LOCKD_TLS_CA", pki.ca());
    let text = assert_fails_fast(cmd, "plain TCP").await;
    assert!(text.contains("did not answer in TLS"), "{text}");
    let mut cmd = d.lockctl(&["--tls", "status"]);
    cmd.env("LOCKD_TLS_CA", pki.ca());
    assert_fails_fast(cmd, "plain TCP").await;
}

/// A plain lockctl at a TLS port is a failed handshake too: exit 3 at once, saying to speak
/// TLS (not exit 2, a refused request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_on_a_tls_port_is_told_so_at_once() {
    let pki = Pki::new("lockctl-plain-at-tls");
    let d = tls_lockd(&pki, None).await;
    for args in [&["status"][..], &["run", "x", "--", "true"]] {
        let cmd = lockctl_at(&d.addr, args);
        assert_fails_fast(cmd, "this port speaks TLS").await;
    }
}

/// A port that accepts and never answers the handshake: the handshake has a limit of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_never_answers_the_handshake_is_not_waited_for_long() {
    let pki = Pki::new("lockctl-silent");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let mut cmd = lockctl_at(
        &addr,
        &["run", "x", "--connect-timeout", PATIENT, "--", "true"],
    );
    cmd.env("LOCKD_TLS_CA", pki.ca());
    assert_fails_fast(cmd, "sent no TLS handshake").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tls_files_are_a_usage_error_naming_the_file() {
    let pki = Pki::new("lockctl-files");
    let d = tls_lockd(&pki, None).await;
    let missing = pki.dir.join("missing-ca.pem");
    let mut cmd = d.lockctl(&["status"]);
    cmd.env("LOCKD_TLS_CA", &missing);
    let out = output(cmd).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("missing-ca.pem"), "{}", stderr(&out));

    let (cert, _) = pki.client("half");
    let out = output(d.lockctl(&["status", "--client-cert", cert.to_str().unwrap()])).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--client-key"), "{}", stderr(&out));

    // The issue's spelling, --tls-cert/--tls-key, names the same files, and is told apart from
    // the CA: no hint about the system's CA bundle for a missing client certificate.
    let gone = pki.dir.join("gone-client.pem");
    let key = pki.dir.join("gone-client.key");
    let out = output(d.lockctl(&[
        "status",
        "--tls-cert",
        gone.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("gone-client.pem"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("CA bundle"), "{}", stderr(&out));

    let mut cmd = d.lockctl(&["status"]);
    cmd.env("LOCKD_TLS", "maybe");
    let out = output(cmd).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

/// `--help` speaks of every TLS flag and its variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_documents_the_tls_flags() {
    let out = output(lockctl_at("127.0.0.1:1", &["run", "--help"])).await;
    let help = stdout(&out);
    for word in [
        "--tls",
        "LOCKD_TLS",
        "--tls-ca",
        "LOCKD_TLS_CA",
        "--client-cert",
        "LOCKD_CLIENT_CERT",
        "--client-key",
        "LOCKD_CLIENT_KEY",
    ] {
        assert!(help.contains(word), "no {word} in:\n{help}");
    }
}

/// A CA of this test's own, for server certificates that `Pki` does not make: an expired
/// one, and one for another host.
struct OddCa {
    ca: PathBuf,
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl OddCa {
    fn new() -> OddCa {
        let dir = scratch("tls-odd-ca");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.pem()).unwrap();
        OddCa { ca, cert, key }
    }

    /// A server certificate for `names` (and 127.0.0.1 unless `names` is another host's),
    /// expired long ago if `expired`: `(cert, key)` in `dir`.
    fn server(&self, dir: &Path, file: &str, names: &[&str], expired: bool) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names.clone()).unwrap();
        if names.iter().any(|n| n == "localhost") {
            params
                .subject_alt_names
                .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        }
        if expired {
            params.not_before = rcgen::date_time_ymd(2001, 1, 1);
            params.not_after = rcgen::date_time_ymd(2002, 1, 1);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (c, k) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// SIGHUP reloads the certificate and key (a rotation keeps every in-memory lease): new
/// connections get the new certificate, a lease taken before is still there, and files that
/// make no identity leave the one in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_and_key() {
    let (old, new) = (Pki::new("rotate-old"), Pki::new("rotate-new"));
    let dir = scratch("tls-rotate");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    let (old_cert, old_key) = old.server();
    std::fs::copy(&old_cert, &cert).unwrap();
    std::fs::copy(&old_key, &key).unwrap();
    let lockd = common::Lockd::new()
        .args(["--tls-cert", cert.to_str().unwrap()])
        .args(["--tls-key", key.to_str().unwrap()])
        .spawn();
    let addr = lockd.addr.to_string();
    let trusting = |ca: PathBuf| {
        let mut cmd = lockctl_at(&addr, &["status"]);
        cmd.env("LOCKD_TLS_CA", ca);
        cmd
    };
    let held = lockctl_at(&addr, &["acquire", "kept", "--ttl", "1m"]);
    let mut held = held;
    held.env("LOCKD_TLS_CA", old.ca());
    assert_eq!(code(&output(held).await), 0);
    assert_eq!(code(&output(trusting(old.ca())).await), 0);
    let hangup = || {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(lockd.pid() as libc::pid_t, libc::SIGHUP);
        }
    };
    // A broken key: refused, the old certificate stays.
    std::fs::write(&key, "not a key").unwrap();
    hangup();
    let give_up = Instant::now() + GUARD;
    while !lockd
        .log()
        .iter()
        .any(|l| l.contains("TLS certificate and key not reloaded"))
    {
        assert!(
            Instant::now() < give_up,
            "no refusal logged: {:#?}",
            lockd.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(code(&output(trusting(old.ca())).await), 0);
    // The new pair: new connections get it, and the lease is still held.
    let (new_cert, new_key) = new.server();
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    hangup();
    let give_up = Instant::now() + GUARD;
    loop {
        let out = output(trusting(new.ca())).await;
        if code(&out) == 0 {
            assert!(stdout(&out).contains("kept"), "{}", stdout(&out));
            break;
        }
        assert!(Instant::now() < give_up, "never reloaded: {}", stderr(&out));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(code(&output(trusting(old.ca())).await), 3);
}
