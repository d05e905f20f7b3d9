//! `lockctl run` typed at a terminal: the command gets the terminal, so it can read from it
//! and Ctrl-C reaches it. Driven through a real pseudo-terminal by `script(1)`.

#[path = "support/blocking.rs"]
mod blocking;

use std::process::{Command, Stdio};
use std::time::Duration;

use blocking::Lockd;

const GUARD: Duration = Duration::from_secs(30);

/// Runs `lockctl <args>` in a pseudo-terminal as its foreground job, typing `input`.
fn at_terminal(lockd: &Lockd, args: &str, input: &str) -> blocking::Output {
    let lockctl = env!("CARGO_BIN_EXE_lockctl");
    let line = format!("{lockctl} -s {} {args}", lockd.addr);
    let child = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) must be installed (util-linux; CI installs bsdutils)");
    blocking::finish(child, input, GUARD)
}

#[test]
fn the_command_reads_from_the_terminal() {
    let lockd = Lockd::start();
    let out = at_terminal(
        &lockd,
        "run prompt -- sh -c 'printf \"proceed? \"; read answer; echo \"got=$answer\"'",
        "yes\n",
    );
    assert!(
        out.status.success(),
        "{:?}: {}{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert!(out.stdout.contains("got=yes"), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS prompt"), "OK prompt free");
}

#[test]
fn ctrl_c_at_the_terminal_stops_the_command_and_releases() {
    let lockd = Lockd::start();
    // The command says it is ready, then waits for a line; Ctrl-C comes instead.
    let out = at_terminal(
        &lockd,
        "run interrupted -- sh -c 'echo ready; read line; echo not-reached'",
        "\u{3}",
    );
    assert!(!out.stdout.contains("not-reached"), "{}", out.stdout);
    assert_eq!(lockd.request("STATUS interrupted"), "OK interrupted free");
}
