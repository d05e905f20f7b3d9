//! contrib/clients/python: its unittest suite, run by the machine's python3 against a real
//! lockd on loopback (LOCKD_ADDR tells the suite where).

#[path = "support/blocking.rs"]
mod blocking;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use blocking::Lockd;

/// Only a guard against a hang; the suite takes a few seconds.
const GUARD: Duration = Duration::from_secs(120);

#[test]
fn python_client_unittest_suite_passes_against_a_real_lockd() {
    let lockd = Lockd::start();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/python");
    let child = Command::new("python3")
        .args(["-m", "unittest", "-v", "test_lockd_client"])
        .current_dir(&dir)
        .env("LOCKD_ADDR", lockd.addr.to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (CI installs it)");
    // unittest reports on stderr.
    let blocking::Output {
        status,
        stdout: out,
        stderr: err,
    } = blocking::finish(child, "", GUARD);
    assert!(status.success(), "unittest failed:\n{out}\n{err}");
    // A suite that skipped itself (no LOCKD_ADDR) would pass without testing anything.
    assert!(!err.contains("skipped"), "tests were skipped:\n{err}");
    assert!(err.contains("\nOK"), "no OK summary:\n{err}");
}
