//! lockctl against a real lockd with an auth file (in this process): --user with a secret
//! from LOCKD_SECRET or --secret-file for run, acquire, release, status, top and watch, a
//! nested lockctl in run's command, the -v side query, and reconnects after a server restart
//! all logged in; and each refusal (a wrong secret, no user, a name outside the user's
//! rights, half-given credentials) exit code 2 at once, with one line that never shows the
//! secret. Over TLS, the login comes after the handshake; with mutual TLS, a certificate that
//! names the same user is no conflict, one that names another is refused.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::lockctl::{
    code, finish, line_with, lockctl_at, output, scratch, spawn, stderr, stderr_lines, stdout,
    wait_for_file, GUARD,
};
use common::TestServer;
use lockd::auth::{user_line, Gate, Users};
use lockd::server::Config;
use tokio::io::AsyncBufReadExt as _;
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::time::{timeout, Instant};

const SECRET: &str = "ci-secret-0123456789abcdef-lockctl";
const WRONG: &str = "not-the-secret-0123456789abcdef";
/// Far less than the --connect-timeout the refusal tests give: a refusal that was retried
/// would take that long.
const FAST: Duration = Duration::from_secs(20);
const PATIENT: &str = "60s";

/// ci may take and read the names that start with `ci-`, and no other.
fn users() -> Users {
    let line = user_line("ci lock=ci-* read=ci-*", SECRET, [9; 16]).unwrap();
    Users::parse(&line, None).unwrap()
}

/// A lockd with the users above on a loopback port, optionally keeping its state in
/// `data_dir`; stopped when dropped.
struct AuthLockd {
    addr: String,
    server: TestServer,
}

async fn auth_lockd(bind: &str, data_dir: Option<&Path>) -> AuthLockd {
    auth_lockd_with(bind, data_dir, None).await
}

async fn auth_lockd_with(
    bind: &str,
    data_dir: Option<&Path>,
    tls: Option<lockd::tls::ServerTls>,
) -> AuthLockd {
    let listener = TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = Config {
        auth: Some(Gate::new(users())),
        data_dir: data_dir.map(Path::to_path_buf),
        shutdown_grace: Duration::from_secs(1),
        tls,
        ..Config::default()
    };
    let server = common::Lockd::new().config(config).serve_on(listener);
    AuthLockd { addr, server }
}

impl AuthLockd {
    /// lockctl aimed at this server with no login of the test's environment.
    fn lockctl(&self, args: &[&str]) -> Command {
        let mut cmd = lockctl_at(&self.addr, args);
        for var in ["LOCKD_USER", "LOCKD_SECRET", "LOCKD_SECRET_FILE"] {
            cmd.env_remove(var);
        }
        cmd
    }

    /// lockctl logged in as ci with the secret in LOCKD_SECRET.
    fn as_ci(&self, args: &[&str]) -> Command {
        let mut cmd = self.lockctl(args);
        cmd.env("LOCKD_USER", "ci").env("LOCKD_SECRET", SECRET);
        cmd
    }

    /// Stops the server and waits until its port is free.
    async fn shut_down(self) {
        self.server.shutdown().await;
    }
}

/// Asserts that lockctl exited 2 at once with one line on stderr containing `cause`, and no
/// secret anywhere in its output.
fn assert_refused(out: &std::process::Output, started: Instant, cause: &str) -> String {
    let text = stderr(out);
    assert_eq!(code(out), 2, "{text}");
    assert!(started.elapsed() < FAST, "retried: {:?}", started.elapsed());
    assert!(text.contains(cause), "no {cause:?} in: {text}");
    assert_eq!(text.trim_end().lines().count(), 1, "one line: {text}");
    assert_no_secret(out);
    text
}

fn assert_no_secret(out: &std::process::Output) {
    for text in [stderr(out), stdout(out)] {
        assert!(!text.contains(SECRET) && !text.contains(WRONG), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_status_release_and_run_with_the_secret_from_the_environment() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    let out = output(d.as_ci(&["-v", "acquire", "ci-a"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_no_secret(&out);
    let token = stdout(&out).trim().to_owned();
    let out = output(d.as_ci(&["status", "ci-a", "--json"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("\"token\":{token}")),
        "{}",
        stdout(&out)
    );
    let out = output(d.as_ci(&["-v", "release", "ci-a", &token])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_no_secret(&out);

    // The command's lockctl inherits LOCKD_SECRET; lockctl adds LOCKD_USER, and no file.
    let out = output(d.as_ci(&[
        "-v",
        "run",
        "ci-b",
        "--",
        "sh",
        "-c",
        "echo \"user=$LOCKD_USER file=${LOCKD_SECRET_FILE-none}\"; \"$LOCKCTL\" status ci-b",
    ]))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("user=ci file=none"), "{text}");
    assert!(
        text.contains("ci-b") && text.contains("exclusive"),
        "{text}"
    );
    assert_no_secret(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_file_is_passed_on_to_the_command_as_an_absolute_path() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    let dir = scratch("auth-file");
    std::fs::write(dir.join("ci.secret"), format!("{SECRET}\r\nignored\n")).unwrap();
    // A relative --secret-file; the command changes directory before its lockctl runs.
    let mut cmd = d.lockctl(&[
        "--user",
        "ci",
        "--secret-file",
        "ci.secret",
        "run",
        "ci-c",
        "--",
        "sh",
        "-c",
        "cd / && echo \"file=$LOCKD_SECRET_FILE secret=${LOCKD_SECRET-none}\" && \
         \"$LOCKCTL\" status ci-c && \"$LOCKCTL\" acquire -n ci-c",
    ]);
    cmd.current_dir(&dir);
    let out = output(cmd).await;
    // The nested acquire -n finds the lock held (by the outer run): exit 1, passed through.
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let text = stdout(&out);
    let absolute = dir.join("ci.secret");
    assert!(
        text.contains(&format!("file={} secret=none", absolute.display())),
        "{text}"
    );
    assert!(text.contains("ci-c"), "{text}");
    assert_no_secret(&out);
    // And on its own, for status; a file others may read is said, one only its owner reads
    // is not.
    use std::os::unix::fs::PermissionsExt as _;
    let status = || {
        d.lockctl(&[
            "--user",
            "ci",
            "--secret-file",
            absolute.to_str().unwrap(),
            "status",
        ])
    };
    std::fs::set_permissions(&absolute, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = output(status()).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("may be read by every user (mode 0644): chmod 600 it"),
        "{}",
        stderr(&out)
    );
    std::fs::set_permissions(&absolute, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = output(status()).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_exit_2_at_once_for_every_command_and_never_shown() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    for args in [
        &["status"][..],
        &["acquire", "ci-a"],
        &["release", "ci-a", "1"],
        &["renew", "ci-a", "1"],
        &["run", "ci-a", "--", "true"],
        &["top"],
        &["watch"],
    ] {
        let mut all = vec!["-v", "--connect-timeout", PATIENT];
        all.extend_from_slice(args);
        let mut cmd = d.lockctl(&all);
        cmd.env("LOCKD_USER", "ci").env("LOCKD_SECRET", WRONG);
        let started = Instant::now();
        let out = output(cmd).await;
        let text = assert_refused(&out, started, "refused to log in user ci");
        assert!(text.contains("DENIED"), "{args:?}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_user_on_a_server_that_needs_one_says_to_give_one() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    for args in [
        &["status"][..],
        &["acquire", "ci-a"],
        &["run", "ci-a", "--", "true"],
        &["top", "--interval", "100ms"],
        &["watch"],
    ] {
        let started = Instant::now();
        let out = output(d.lockctl(args)).await;
        let text = assert_refused(&out, started, "NOAUTH");
        assert!(text.contains("give --user"), "{args:?}: {text}");
        assert!(text.contains("LOCKD_SECRET"), "{args:?}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_outside_the_users_rights_is_exit_2_with_the_servers_text() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    for args in [
        &["acquire", "deploy"][..],
        &["run", "deploy", "--", "true"],
        &["status", "deploy"],
        &["top", "deploy"],
    ] {
        let started = Instant::now();
        let out = output(d.as_ci(args)).await;
        assert_refused(&out, started, "DENIED deploy: user ci has no");
    }
}

/// lockctl's arguments, its environment, and what its message must say.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_given_or_doubly_given_credentials_are_usage_errors() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    let dir = scratch("auth-usage");
    let file = dir.join("secret");
    std::fs::write(&file, SECRET).unwrap();
    let file = file.to_str().unwrap();
    let cases: [Case; 6] = [
        (&["--user", "ci", "status"], &[], "needs a secret"),
        (&["status"], &[("LOCKD_SECRET", SECRET)], "without a user"),
        (
            &["--user", "ci", "--secret-file", file, "status"],
            &[("LOCKD_SECRET", SECRET)],
            "given twice",
        ),
        (
            &[
                "--user",
                "ci",
                "--secret-file",
                "/nonexistent/secret",
                "status",
            ],
            &[],
            "cannot read the secret file",
        ),
        (
            &["--user", "ci", "status"],
            &[("LOCKD_SECRET", "two words")],
            "whitespace",
        ),
        // No flag takes the secret itself.
        (&["--secret", SECRET, "status"], &[], "--secret"),
    ];
    for (args, env, cause) in cases {
        let mut cmd = d.lockctl(args);
        cmd.envs(env.iter().copied());
        let out = output(cmd).await;
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        let text = stderr(&out);
        assert!(text.contains(cause), "{args:?}: no {cause:?} in {text}");
        if !args.contains(&"--secret") {
            assert!(!text.contains(SECRET), "{text}");
        }
    }
}

/// With -v, a LOCK that has to wait asks on a second connection who holds the lock: that
/// connection logs in too, or it could not say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verbose_side_query_logs_in_too() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    let out = output(d.as_ci(&["--id", "holder-1", "acquire", "ci-w", "--ttl", "1m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = output(d.as_ci(&["-v", "run", "-w", "2s", "ci-w", "--", "true"])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("held by holder-1"), "{text}");
    assert!(
        text.contains("connected to lockd at") && text.contains(" as ci"),
        "{text}"
    );
    assert_no_secret(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_logs_in_and_prints_events() {
    let d = auth_lockd("127.0.0.1:0", None).await;
    let mut watch = spawn(d.as_ci(&["watch", "ci-e"]));
    let mut lines = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    // The watch is set up once an event shows; keep taking and releasing until one does.
    let seen = timeout(GUARD, async {
        loop {
            let out = output(d.as_ci(&["acquire", "ci-e", "--ttl", "1m"])).await;
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            let token = stdout(&out).trim().to_owned();
            let out = output(d.as_ci(&["release", "ci-e", &token])).await;
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            if let Ok(Ok(Some(line))) = timeout(Duration::from_millis(500), lines.next_line()).await
            {
                return line;
            }
        }
    })
    .await
    .expect("no event");
    assert!(seen.contains("ci-e"), "{seen}");
    watch.kill().await.unwrap();
}

/// `lockctl run` rides through a restart of a lockd that keeps its state: it reconnects,
/// logs in again and renews the restored lease (which is still ci's), and the command runs
/// to its end. Without the login on the reconnect the RENEW would be refused (NOAUTH) and the
/// command stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_in_again_on_reconnect_after_a_server_restart() {
    let dir = scratch("auth-restart");
    let data = dir.join("data");
    let d = auth_lockd("127.0.0.1:0", Some(&data)).await;
    let addr = d.addr.clone();
    let (started, done) = (dir.join("started"), dir.join("done"));
    let mut run = spawn(d.as_ci(&[
        "-v",
        "run",
        "ci-r",
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        &format!(
            "echo go > {}; sleep 5; touch {}",
            started.display(),
            done.display()
        ),
    ]));
    let mut err = stderr_lines(&mut run);
    wait_for_file(&started).await;
    d.shut_down().await;
    let d = auth_lockd(&addr, Some(&data)).await;
    line_with(&mut err, "reconnected to lockd").await;
    line_with(&mut err, "renewed ci-r").await;
    let mut rest = String::new();
    while let Ok(Some(line)) = err.next_line().await {
        rest.push_str(&line);
        rest.push('\n');
    }
    let out = finish(run).await;
    assert_eq!(code(&out), 0, "{rest}");
    assert!(done.exists(), "the command was stopped: {rest}");
    assert!(!rest.contains("lost") && !rest.contains(SECRET), "{rest}");
    // Released at the end, on the new server.
    let out = output(d.as_ci(&["status", "ci-r"])).await;
    assert!(stdout(&out).contains("free"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_and_mutual_tls_the_login_follows_the_handshake() {
    use common::pki::Pki;
    let pki = Pki::new("lockctl-auth");
    let (cert, key) = pki.server();
    let ca = pki.ca();
    let tls = lockd::tls::server(&cert, &key, Some(&ca)).expect("server TLS");
    let d = auth_lockd_with("127.0.0.1:0", None, Some(tls)).await;
    let (ci_cert, ci_key) = pki.client("ci");
    let (other_cert, other_key) = pki.client("nobody");
    let with_cert = |cmd: &mut Command, cert: &Path, key: &Path| {
        cmd.env("LOCKD_TLS_CA", &ca)
            .env("LOCKD_CLIENT_CERT", cert)
            .env("LOCKD_CLIENT_KEY", key);
    };
    // A certificate naming nobody of the file: --user logs in after the handshake.
    let mut cmd = d.as_ci(&["run", "ci-t", "--", "sh", "-c", "\"$LOCKCTL\" status ci-t"]);
    with_cert(&mut cmd, &other_cert, &other_key);
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("ci-t"), "{}", stdout(&out));
    // The certificate logs ci in by itself; --user ci as well is no conflict.
    let mut cmd = d.as_ci(&["status", "ci-t"]);
    with_cert(&mut cmd, &ci_cert, &ci_key);
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // ... but a --user other than the certificate's is refused, not silently ignored.
    let mut cmd = d.lockctl(&["--user", "someone", "status"]);
    cmd.env("LOCKD_SECRET", SECRET);
    with_cert(&mut cmd, &ci_cert, &ci_key);
    let started = Instant::now();
    let out = output(cmd).await;
    assert_refused(&out, started, "by its client certificate");
}
