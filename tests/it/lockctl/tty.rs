//! `lockctl run` typed at a terminal: the command gets the terminal, so it can read from it
//! and Ctrl-C reaches it. Driven through a real pseudo-terminal by `script(1)`.

use crate::common;
use crate::common::needs::{have, Need};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::blocking::Server;

const GUARD: Duration = Duration::from_secs(30);

/// Starts `lockctl <args>` in a pseudo-terminal as its foreground job; what is written to the
/// child's stdin is typed at that terminal.
fn at_terminal(lockd: &Server, args: &str) -> std::process::Child {
    let lockctl = env!("CARGO_BIN_EXE_lockctl");
    // `exec`: lockctl itself is the terminal's foreground job, whatever shell script(1)
    // runs (a shell that forked and waited would be killed by the Ctrl-C and say 130).
    let line = format!("exec {lockctl} --server {} {args}", lockd.addr);
    Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) must be installed (util-linux; CI installs bsdutils)")
}

#[test]
fn the_command_reads_from_the_terminal() {
    if !have(Need::Script) {
        return;
    }
    let lockd = Server::start();
    let child = at_terminal(
        &lockd,
        "run prompt -- sh -c 'printf \"proceed? \"; read answer; echo \"got=$answer\"'",
    );
    let out = common::blocking::finish(child, "yes\n", GUARD);
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
    if !have(Need::Script) {
        return;
    }
    let lockd = Server::start();
    let ready = std::env::temp_dir().join(format!("lockd-tty-ready-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    // The command says it is ready, then waits for a line; Ctrl-C comes instead.
    let child = at_terminal(
        &lockd,
        &format!(
            "run interrupted -- sh -c 'touch {}; read line; echo not-reached'",
            ready.display()
        ),
    );
    let start = Instant::now();
    while !ready.exists() {
        assert!(start.elapsed() < GUARD, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&ready);
    let out = common::blocking::finish(child, "\u{3}", GUARD);
    assert!(!out.stdout.contains("not-reached"), "{}", out.stdout);
    // 128 + SIGINT: the command was interrupted, and lockctl says so.
    assert_eq!(out.code(), Some(130), "{}{}", out.stdout, out.stderr);
    assert_eq!(lockd.request("STATUS interrupted"), "OK interrupted free");
}

#[test]
fn top_at_the_terminal_redraws_and_ctrl_c_ends_it_with_0() {
    if !have(Need::Script) {
        return;
    }
    use std::io::{Read as _, Write as _};

    let lockd = Server::start();
    lockd.request("LOCK shown someone");
    let mut child = at_terminal(&lockd, "top --interval 100ms");
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    // Ctrl-C only once two screens are drawn: lockctl is then surely listening for it.
    let mut seen = Vec::new();
    let clear = b"\x1b[H\x1b[2J";
    while seen.windows(clear.len()).filter(|w| w == clear).count() < 2 {
        let chunk = rx.recv_timeout(GUARD).expect("top drew nothing");
        seen.extend(chunk);
    }
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.contains("shown"), "{text}");
    child.stdin.take().unwrap().write_all(b"\x03").unwrap();
    let out = common::blocking::finish(child, "", GUARD);
    assert_eq!(out.code(), Some(0), "{text}{}", out.stderr);
}
