//! Cluster mode: `lockctl run` of a set of names through several front-ends. Runs of the
//! same two names in opposite orders, through different front-ends, never overlap and all
//! finish; a set held through one front-end is seen held on every name through another, and
//! `-n` of an overlapping set there exits 1.
#![cfg(feature = "etcd")]

use super::basics::etcd;
use crate::common;
use crate::common::needs::{have, Need};

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::blocking::eventually;
use common::etcd::LockdFrontEnd;
use common::field;

const PATIENCE: Duration = Duration::from_secs(20);

/// `n` front-ends sharing a prefix of their own.
fn front_ends(n: usize) -> Vec<LockdFrontEnd> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let prefix = format!(
        "{}lockctl-sets{}/",
        etcd().prefix(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    (0..n)
        .map(|_| LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "5s"]))
        .collect()
}

fn lockctl(servers: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    cmd.args(["--server", servers])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lockd-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn assert_ran(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn lockctl_sets_in_opposite_orders_through_two_front_ends_never_overlap() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let (one, two) = (
        format!("{},{}", fes[0].addr(), fes[1].addr()),
        format!("{},{}", fes[1].addr(), fes[0].addr()),
    );
    let dir = scratch("cluster-lockctl-sets");
    let log = dir.join("log");
    let script = format!(
        "echo start $$ >> {0}; sleep 0.05; echo end $$ >> {0}",
        log.display()
    );
    let rounds = 3;
    for _ in 0..rounds {
        let children: Vec<_> = [
            (&one, ["cp", "cq"]),
            (&two, ["cq", "cp"]),
            (&one, ["cq", "cp"]),
        ]
        .iter()
        .map(|(servers, [a, b])| {
            lockctl(servers, &["run", a, b, "-c", &script])
                .spawn()
                .expect("lockctl")
        })
        .collect();
        for child in children {
            assert_ran(&child.wait_with_output().expect("lockctl ends"));
        }
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), rounds * 3 * 2, "{text}");
    for pair in lines.chunks(2) {
        assert!(pair[0].starts_with("start "), "overlap:\n{text}");
        assert_eq!(
            pair[0].replacen("start", "end", 1),
            pair[1],
            "overlap:\n{text}"
        );
    }
    for name in ["cp", "cq"] {
        eventually(PATIENCE, &format!("{name} free"), || {
            fes[1].request(&format!("STATUS {name}")) == format!("OK {name} free")
        });
    }
}

#[test]
fn a_lockctl_set_is_held_on_every_name_and_refuses_an_overlapping_nonblock() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let dir = scratch("cluster-lockctl-set-held");
    let (go, env) = (dir.join("go"), dir.join("env"));
    let hold = format!(
        r#"echo "$LOCKD_TOKEN_SA $LOCKD_TOKEN_SB" > {}; while [ ! -e {} ]; do sleep 0.02; done"#,
        env.display(),
        go.display()
    );
    let holding = lockctl(
        &fes[0].addr().to_string(),
        &["run", "sa", "sb", "-c", &hold],
    )
    .spawn()
    .expect("lockctl");
    eventually(PATIENCE, "the job started", || {
        std::fs::read_to_string(&env).is_ok_and(|t| t.ends_with('\n'))
    });
    let tokens = std::fs::read_to_string(&env).expect("env");
    let tokens: Vec<&str> = tokens.split_whitespace().collect();
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    // Seen through the other front-end (once its watch has caught up): each name held with
    // its own token.
    for (name, token) in ["sa", "sb"].iter().zip(&tokens) {
        eventually(PATIENCE, &format!("{name} held with {token}"), || {
            let status = fes[1].request(&format!("STATUS {name}"));
            field(&status, "token").as_deref() == Some(*token)
        });
    }
    let out = lockctl(
        &fes[1].addr().to_string(),
        &["run", "-n", "sc", "sb", "--", "true"],
    )
    .output()
    .expect("lockctl");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fes[1].request("STATUS sc"), "OK sc free");
    std::fs::write(&go, "").expect("go");
    assert_ran(&holding.wait_with_output().expect("lockctl ends"));
    for name in ["sa", "sb"] {
        eventually(PATIENCE, &format!("{name} free"), || {
            fes[1].request(&format!("STATUS {name}")) == format!("OK {name} free")
        });
    }
}
