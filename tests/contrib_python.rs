//! contrib/clients/python: its unittest suite, run by the machine's python3 against a real
//! lockd on loopback (LOCKD_ADDR tells the suite where).

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Only a guard against a hang; the suite takes a few seconds.
const GUARD: Duration = Duration::from_secs(120);

/// A lockd serving on 127.0.0.1:0 from its own runtime, stopped on drop.
struct Lockd {
    addr: SocketAddr,
    shutdown: CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Lockd {
    fn start() -> Lockd {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let shutdown = CancellationToken::new();
        let config = lockd::server::Config::default();
        runtime.spawn(lockd::server::run(config, listener, shutdown.clone()));
        Lockd {
            addr,
            shutdown,
            runtime: Some(runtime),
        }
    }
}

impl Drop for Lockd {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

#[test]
fn python_client_unittest_suite_passes_against_a_real_lockd() {
    let lockd = Lockd::start();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/python");
    let mut child = Command::new("python3")
        .args(["-m", "unittest", "-v", "test_lockd_client"])
        .current_dir(&dir)
        .env("LOCKD_ADDR", lockd.addr.to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (CI installs it)");
    // unittest reports on stderr; read both pipes so neither fills up.
    let mut stdout = child.stdout.take().expect("stdout");
    let out = thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let mut stderr = child.stderr.take().expect("stderr");
    let err = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + GUARD;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("python unittest still running after {GUARD:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().expect("stdout"), err.join().expect("stderr"));
    assert!(status.success(), "unittest failed:\n{out}\n{err}");
    // A suite that skipped itself (no LOCKD_ADDR) would pass without testing anything.
    assert!(!err.contains("skipped"), "tests were skipped:\n{err}");
    assert!(err.contains("\nOK"), "no OK summary:\n{err}");
}
