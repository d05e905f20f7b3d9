//! lockctl and notes: `--note`, run's default note (its program's name; the command line
//! only with `--note-command`), notes in `status`,
//! `status --json` and `top`, and `-v`'s blocked-by line; the bash client's `LOCKD_NOTE`.

use crate::common;

use common::lockctl::*;

/// The note of `name` as STATUS shows it, decoded.
async fn note(d: &Server, name: &str) -> Option<String> {
    super::note_of(&d.status_line(name).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sends_its_program_s_name_as_the_note_unless_told() {
    let d = lockd().await;
    let mut child = spawn(d.lockctl(&["run", "job", "--", "sleep", "30"]));
    d.wait_held("job").await;
    assert_eq!(note(&d, "job").await.as_deref(), Some("sleep"));
    signal(&child, libc::SIGTERM);
    let _ = child.wait().await;
    d.wait_free("job").await;

    let mut child = spawn(d.lockctl(&[
        "run",
        "job",
        "--note",
        "release 1.4.2 by ci job 8812",
        "--",
        "sleep",
        "30",
    ]));
    d.wait_held("job").await;
    assert_eq!(
        note(&d, "job").await.as_deref(),
        Some("release 1.4.2 by ci job 8812")
    );
    let out = output(d.lockctl(&["status", "job", "--json"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout(&out);
    assert!(
        json.contains(r#""note":"release 1.4.2 by ci job 8812","holders":["#),
        "{json}"
    );
    let out = output(d.lockctl(&["status"])).await;
    let text = stdout(&out);
    assert!(text.lines().next().unwrap().ends_with("NOTE"), "{text}");
    assert!(text.contains("release 1.4.2 by ci job 8812"), "{text}");
    let out = output(d.lockctl(&["status", "job"])).await;
    assert!(stdout(&out).contains("release 1.4.2 by ci job 8812"));

    // -v on a refused -n says who holds it, for how long, and its note, in words.
    let out = output(d.lockctl(&["-v", "run", "-n", "job", "--", "true"])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("lockctl: job: held by "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(" for "), "{line}");
    assert!(line.ends_with(": release 1.4.2 by ci job 8812"), "{line}");
    // Without -v, nothing.
    let out = output(d.lockctl(&["acquire", "-w", "100ms", "job"])).await;
    assert_eq!(code(&out), 1);
    assert!(!stderr(&out).contains("ERR TIMEOUT"), "{}", stderr(&out));
    let out = output(d.lockctl(&["-v", "acquire", "-w", "100ms", "job"])).await;
    assert!(
        stderr(&out).contains("lockctl: job still held after waiting "),
        "{}",
        stderr(&out)
    );
    signal(&child, libc::SIGTERM);
    let _ = child.wait().await;
}

/// A secret on a command line is never published by default: anyone with `read` on the lock
/// sees its note (STATUS, top, watch, a refused LOCK's blocked-by answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_note_never_shows_the_arguments() {
    let d = lockd().await;
    let secret = "--db-password=hunter2";
    let mut child = spawn(d.lockctl(&[
        "run", "ci-sec", "--", "/bin/sh", "-c", "sleep 30", "x", secret,
    ]));
    d.wait_held("ci-sec").await;
    assert_eq!(note(&d, "ci-sec").await.as_deref(), Some("sh"));
    let out = output(d.lockctl(&["status", "ci-sec", "--json"])).await;
    assert!(!stdout(&out).contains("hunter2"), "{}", stdout(&out));
    let refused = output(d.lockctl(&["-v", "run", "-n", "ci-sec", "--", "true"])).await;
    assert!(
        !stderr(&refused).contains("hunter2"),
        "{}",
        stderr(&refused)
    );
    signal(&child, libc::SIGTERM);
    let _ = child.wait().await;
    d.wait_free("ci-sec").await;
    // A -c script: its first word's file name; a variable first is no name to show.
    for (script, want) in [
        ("/opt/jobs/backup.sh --key s3cr3t", "backup.sh"),
        ("PGPASSWORD=s3cr3t psql -c 'select 1'; sleep 30", "sh"),
    ] {
        let script = format!("{script}; sleep 30");
        let mut child = spawn(d.lockctl(&["run", "ci-sec", "-c", &script]));
        d.wait_held("ci-sec").await;
        assert_eq!(note(&d, "ci-sec").await.as_deref(), Some(want));
        signal(&child, libc::SIGTERM);
        let _ = child.wait().await;
        d.wait_free("ci-sec").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_command_line_is_cut_and_an_empty_note_sends_none() {
    let d = lockd().await;
    let long = "é".repeat(200);
    let mut child = spawn(d.lockctl(&[
        "run",
        "job",
        "--note-command",
        "--",
        "sh",
        "-c",
        "sleep 30",
        &long,
    ]));
    d.wait_held("job").await;
    let got = note(&d, "job").await.expect("a note");
    assert!(got.len() <= 256 && got.len() > 250, "{}", got.len());
    assert!(got.starts_with("sh -c sleep 30 éé"), "{got}");
    signal(&child, libc::SIGTERM);
    let _ = child.wait().await;
    d.wait_free("job").await;

    let mut child = spawn(d.lockctl(&["run", "job", "--note", "", "--", "sleep", "30"]));
    d.wait_held("job").await;
    assert_eq!(note(&d, "job").await, None);
    signal(&child, libc::SIGTERM);
    let _ = child.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_sends_no_note_unless_told() {
    let d = lockd().await;
    let out = output(d.lockctl(&["acquire", "a", "--ttl", "1m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(note(&d, "a").await, None);
    let out = output(d.lockctl(&["acquire", "b", "--ttl", "1m", "--note", "by hand"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(note(&d, "b").await.as_deref(), Some("by hand"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_with_a_newline_is_refused_before_it_is_sent() {
    let d = lockd().await;
    // The newline would end the LOCK early and make the rest a request of its own.
    let out = output(d.lockctl(&["acquire", "a", "--note", "one\nUNLOCK a 1"])).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("control character"),
        "{}",
        stderr(&out)
    );
    assert!(d.status_line("a").await.contains(" free"));
}

#[test]
fn the_bash_client_sends_lockd_note_and_reads_it_back() {
    let lockd = common::blocking::Server::start();
    let library =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/lockd.sh");
    let script = format!(
        r#"set -euo pipefail
. '{}'
t=$(LOCKD_NOTE='deploy 1.4 100% \n é' lockd_lock n ttl=1m)
lockd_status n >/dev/null
echo "note=[$LOCKD_HOLDER_NOTE]"
err=$(mktemp)
rc=0; LOCKD_ID=other lockd_try n 2>"$err" || rc=$?
echo "try=$rc"
cat "$err" >&2
rm -f "$err"
rc=0; LOCKD_NOTE=$'a\tb' lockd_lock m 2>/dev/null || rc=$?
echo "bad=$rc"
lockd_unlock n "$t"
"#,
        library.display()
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("LOCKD_ADDR", lockd.addr.to_string())
        .env_remove("LOCKD_ID")
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(r"note=[deploy 1.4 100% \n é]"), "{stdout}");
    assert!(stdout.contains("try=1"), "{stdout}");
    assert!(stdout.contains("bad=2"), "{stdout}");
    assert!(
        stderr.contains("ERR TIMEOUT n: held by ") && stderr.contains(" note=deploy%201.4"),
        "{stderr}"
    );
}
