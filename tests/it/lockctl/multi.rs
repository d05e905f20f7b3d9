//! `lockctl run a b -- cmd` and `lockctl acquire a b`: a set of names, taken all at once as
//! one lease, against a real server.

use std::time::Duration;

use lockd::proto::Tie;
use tokio::process::Child;
use tokio::time::{sleep, Instant};

use super::common::lockctl::*;

/// The command sees every name and each name's token, and both names are held while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_two_names_holds_both_and_the_job_sees_every_token() {
    let d = lockd().await;
    let script = r#"echo "$LOCKD_NAMES|$LOCKD_NAME|$LOCKD_TOKEN|$LOCKD_TOKEN_DB_MIGRATE|$LOCKD_TOKEN_CACHE_FLUSH"
        "$LOCKCTL" status db-migrate --json
        "$LOCKCTL" status cache.flush --json"#;
    let out = output(d.lockctl(&["run", "db-migrate", "cache.flush", "-c", script])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    let env: Vec<&str> = lines.next().unwrap().split('|').collect();
    assert_eq!(env[0], "db-migrate cache.flush", "{text}");
    assert_eq!(env[1], "db-migrate", "{text}");
    let first: u64 = env[2].parse().unwrap();
    assert_eq!(env[3], env[2], "LOCKD_TOKEN is the first name's: {text}");
    let second: u64 = env[4].parse().unwrap();
    for (status, token) in [(lines.next(), first), (lines.next(), second)] {
        let status = status.unwrap_or_else(|| panic!("no status line: {text}"));
        assert!(status.contains(r#""held":true"#), "{status}");
        assert!(status.contains(&format!(r#""token":{token},"#)), "{status}");
        assert!(status.contains(r#""session":true"#), "{status}");
    }
    // Released together when the command is done.
    assert_eq!(d.holder("db-migrate").await, None);
    assert_eq!(d.holder("cache.flush").await, None);
}

/// -n finds one name of the set held: exit 1 (the conflict code), nothing runs, and the
/// other name was not taken either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlapping_set_with_nonblock_exits_as_held() {
    let d = lockd().await;
    let dir = scratch("multi-nonblock");
    let (go, ran) = (dir.join("go"), dir.join("ran"));
    let hold = format!("while [ ! -e {} ]; do sleep 0.02; done", go.display());
    let holding = spawn(d.lockctl(&["run", "ov-a", "ov-b", "-c", &hold]));
    d.wait_held("ov-a").await;
    d.wait_held("ov-b").await;
    let touch = format!("touch {}", ran.display());
    let out = output(d.lockctl(&["run", "-n", "ov-c", "ov-b", "-c", &touch])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let out = output(d.lockctl(&["run", "-n", "-E", "75", "ov-b", "ov-c", "-c", &touch])).await;
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    let out = output(d.lockctl(&["acquire", "-n", "ov-c", "ov-a"])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(!ran.exists());
    assert_eq!(d.holder("ov-c").await, None, "a refused set takes nothing");
    std::fs::write(&go, "").unwrap();
    let out = finish(holding).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Free again: the same set is granted at once.
    let out = output(d.lockctl(&["run", "-n", "ov-c", "ov-b", "-c", &touch])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(ran.exists());
}

/// Runs of `p q` and of `q p` at the same time, round after round: never two jobs at once
/// (each appends its start and end to one file), and none is stuck (no deadlock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_with_opposite_orders_never_overlap_and_all_finish() {
    let d = lockd().await;
    let dir = scratch("multi-orders");
    let log = dir.join("log");
    let script = format!(
        "echo start $$ >> {0}; sleep 0.03; echo end $$ >> {0}",
        log.display()
    );
    let rounds = 4;
    for _ in 0..rounds {
        let children: Vec<Child> = [["ord-p", "ord-q"], ["ord-q", "ord-p"], ["ord-p", "ord-q"]]
            .iter()
            .map(|[a, b]| spawn(d.lockctl(&["run", a, b, "-c", &script])))
            .collect();
        for child in children {
            let out = finish(child).await;
            assert_eq!(code(&out), 0, "{}", stderr(&out));
        }
    }
    let text = std::fs::read_to_string(&log).unwrap();
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
    assert_eq!(d.holder("ord-p").await, None);
    assert_eq!(d.holder("ord-q").await, None);
}

/// A set waits for the name that is taken (its queue shows the set) and the job starts only
/// once the set holds both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_waits_for_its_held_name_and_then_holds_both() {
    let d = lockd().await;
    let dir = scratch("multi-wait");
    let ran = dir.join("ran");
    let mut other = d.client().await;
    let token = other
        .lock("wt-b", "other", None, None, Tie::Plain)
        .await
        .unwrap();
    let touch = format!("touch {}", ran.display());
    let waiting = spawn(d.lockctl(&["run", "wt-a", "wt-b", "-c", &touch]));
    d.wait_waiters("wt-b", 1).await;
    assert!(!ran.exists());
    other.unlock("wt-b", token).await.unwrap();
    let out = finish(waiting).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(ran.exists());
    assert_eq!(d.holder("wt-a").await, None);
    assert_eq!(d.holder("wt-b").await, None);
}

/// The command killed: lockctl passes on its signal's exit code and releases both names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_killed_releases_both_names() {
    let d = lockd().await;
    let out = output(d.lockctl(&["run", "kc-a", "kc-b", "-c", "kill -KILL $$"])).await;
    assert_eq!(code(&out), 128 + libc::SIGKILL, "{}", stderr(&out));
    assert_eq!(d.holder("kc-a").await, None);
    assert_eq!(d.holder("kc-b").await, None);
}

/// lockctl killed: the job goes with it, and the server frees both names at the end of the
/// session grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_killed_frees_both_names() {
    let d = lockd().await;
    let dir = scratch("multi-sigkill");
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut child = spawn(d.lockctl(&[
        "run",
        "lk-a",
        "lk-b",
        "--session-grace",
        "500ms",
        "-c",
        &script,
    ]));
    let pid: i32 = wait_for_file(&pidfile).await.trim().parse().unwrap();
    d.wait_held("lk-a").await;
    d.wait_held("lk-b").await;
    signal(&child, libc::SIGKILL);
    let _ = child.wait().await;
    let give_up = Instant::now() + GUARD;
    while alive(pid) {
        assert!(Instant::now() < give_up, "the command outlived lockctl");
        sleep(Duration::from_millis(20)).await;
    }
    d.wait_free("lk-a").await;
    d.wait_free("lk-b").await;
}

/// A lease taken away (BREAK of the second name ends the set) stops the job, exit 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_set_stops_the_job() {
    let d = lockd().await;
    let dir = scratch("multi-broken");
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let child = spawn(d.lockctl(&["run", "br-a", "br-b", "--ttl", "3s", "-c", &script]));
    wait_for_file(&pidfile).await;
    d.wait_held("br-a").await;
    let out = output(d.lockctl(&["break", "br-b", "-y"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = finish(child).await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(d.holder("br-a").await, None);
}

/// `acquire a b`: one token per line, in the order given; releasing the first name with its
/// token releases the whole set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_of_two_names_prints_a_token_each_and_one_release_frees_both() {
    let d = lockd().await;
    let out = output(d.lockctl(&["acquire", "aq-a", "aq-b", "--ttl", "1m", "--id", "ci-7"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let tokens: Vec<u64> = text.lines().map(|t| t.parse().unwrap()).collect();
    assert_eq!(tokens.len(), 2, "{text}");
    assert_eq!(d.holder("aq-a").await, Some(tokens[0]));
    assert_eq!(d.holder("aq-b").await, Some(tokens[1]));
    let out = output(d.lockctl(&["renew", "aq-b", &tokens[1].to_string()])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = output(d.lockctl(&["release", "aq-a", &tokens[0].to_string()])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.holder("aq-a").await, None);
    assert_eq!(d.holder("aq-b").await, None);
}

/// Refused before anything is sent (exit 2 with a server that is not there, not 3): names
/// that give the same variable, a name given twice, --supersede with a set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_lockctl_cannot_run_are_refused_before_sending() {
    let dead = "127.0.0.1:1";
    for (args, says) in [
        (
            &["run", "db-migrate", "db.migrate", "--", "true"][..],
            "LOCKD_TOKEN_DB_MIGRATE",
        ),
        (&["run", "a", "b", "a", "--", "true"][..], "given twice"),
        (&["acquire", "a", "b", "a"][..], "given twice"),
        (
            &["run", "--supersede", "a", "b", "--", "true"][..],
            "--supersede",
        ),
        (&["acquire", "--supersede", "a", "b"][..], "--supersede"),
        (&["run", "a", "bad name", "--", "true"][..], "whitespace"),
    ] {
        let out = output(lockctl_at(dead, args)).await;
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    // Names that only collide as variables are fine for acquire, which runs nothing.
    let d = lockd().await;
    // More than the server's --max-names (16): its refusal, exit 2, and nothing taken.
    let many: Vec<String> = (0..17).map(|i| format!("many-{i}")).collect();
    let mut args = vec!["acquire", "-n"];
    args.extend(many.iter().map(String::as_str));
    let out = output(d.lockctl(&args)).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("LIMIT"), "{}", stderr(&out));
    assert_eq!(d.holder("many-0").await, None);
    let out = output(d.lockctl(&["acquire", "-n", "db-migrate", "db.migrate"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// --help and the man page show the several-names form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_and_man_show_several_names() {
    let dead = "127.0.0.1:1";
    for (args, needles) in [
        (
            &["run", "--help"][..],
            &[
                "<NAME>...",
                "LOCKD_NAMES",
                "LOCKD_TOKEN_<NAME>",
                "db-migrate cache-flush",
            ][..],
        ),
        (
            &["acquire", "--help"][..],
            &["<NAME>...", "one token per line"][..],
        ),
        (
            &["--man", "run"][..],
            &["LOCKD_NAMES", "db\\-migrate cache\\-flush"][..],
        ),
    ] {
        let out = output(lockctl_at(dead, args)).await;
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        let text = stdout(&out);
        for needle in needles {
            assert!(
                text.contains(needle),
                "{needle} missing from {args:?}:\n{text}"
            );
        }
    }
}

/// `--note` goes with every name of the set; `--at-least` keeps both held after the job (one
/// lease, detached through the first name) until lockd ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn note_and_at_least_apply_to_the_whole_set() {
    let d = lockd().await;
    let out = output(d.lockctl(&[
        "run",
        "al-a",
        "al-b",
        "--note",
        "nightly window",
        "--at-least",
        "1s",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for name in ["al-a", "al-b"] {
        let line = d.status_line(name).await;
        assert!(line.contains(" held "), "kept after the job: {line}");
        assert!(line.contains("note=nightly%20window"), "{line}");
    }
    // Another run of an overlapping set skips while the window lasts.
    let out = output(d.lockctl(&["run", "-n", "al-b", "al-c", "--", "true"])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    d.wait_free("al-a").await;
    d.wait_free("al-b").await;
}

/// -w runs out on a set that waits for one of its names: the conflict code, and the set has
/// left the queue of every name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_leaves_every_queue() {
    let d = lockd().await;
    let mut other = d.client().await;
    let token = other
        .lock("ww-b", "other", None, None, Tie::Plain)
        .await
        .unwrap();
    let out = output(d.lockctl(&["run", "-w", "300ms", "ww-a", "ww-b", "--", "true"])).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    d.wait_waiters("ww-b", 0).await;
    assert_eq!(d.holder("ww-a").await, None);
    // A single-name LOCK of the free name is granted at once: nothing waits there any more
    // (a set still queued on it would be first in line, and -n would be refused).
    let out = output(d.lockctl(&["acquire", "-n", "ww-a"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    other.unlock("ww-b", token).await.unwrap();
}

/// A set held by `lockctl run` on a lockd with --data-dir rides through a crash of the
/// server: both names come back with their tokens, the job runs on, and both are released
/// at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_rides_through_a_restart_of_a_durable_lockd() {
    use super::common::durable::{DurableLockd, TempDir, PATIENCE};

    let dir = TempDir::new("lockctl-multi-restart");
    let port = super::common::free_port();
    let server = DurableLockd::start(&dir, port).await;
    let (started, done) = (dir.0.join("started"), dir.0.join("done"));
    let script = format!(
        "touch {}; sleep 4; touch {}",
        started.display(),
        done.display()
    );
    let child = spawn(lockctl_at(
        &server.addr,
        &["run", "dr-a", "dr-b", "--ttl", "2s", "-c", &script],
    ));
    let begun = Instant::now();
    while !started.exists() {
        assert!(begun.elapsed() < PATIENCE, "the command never started");
        sleep(Duration::from_millis(20)).await;
    }
    let tokens = |lines: Vec<String>| lockd::proto::field(&lines[0], "token").map(str::to_owned);
    let mut c = server.client().await;
    let before = (
        tokens(c.status(Some("dr-a")).await.unwrap()),
        tokens(c.status(Some("dr-b")).await.unwrap()),
    );
    assert!(before.0.is_some() && before.1.is_some(), "{before:?}");
    server.crash();
    sleep(Duration::from_millis(300)).await;
    let server = DurableLockd::start(&dir, port).await;
    let mut c = server.client().await;
    let after = (
        tokens(c.status(Some("dr-a")).await.unwrap()),
        tokens(c.status(Some("dr-b")).await.unwrap()),
    );
    assert_eq!(before, after, "the restored set keeps its tokens");
    let out = finish(child).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(done.exists(), "the command was stopped: {}", stderr(&out));
    for name in ["dr-a", "dr-b"] {
        assert_eq!(
            c.status(Some(name)).await.unwrap(),
            vec![format!("{name} free")],
            "released at the end"
        );
    }
    server.stop();
}

/// With several addresses, the first one dead: the set's LOCK goes through the next one, and
/// the job sees both tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_goes_through_the_next_address_when_the_first_is_down() {
    let d = lockd().await;
    let servers = format!("{},{}", super::common::dead_addr(), d.addr);
    let out = output(lockctl_at(
        &servers,
        &[
            "run",
            "fo-a",
            "fo-b",
            "-c",
            r#"echo "$LOCKD_TOKEN_FO_A $LOCKD_TOKEN_FO_B $LOCKD_ADDR""#,
        ],
    ))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words.len(), 3, "{text}");
    assert!(
        words[0].parse::<u64>().is_ok() && words[1].parse::<u64>().is_ok(),
        "{text}"
    );
    assert_eq!(words[2], servers);
    assert_eq!(d.holder("fo-a").await, None);
    assert_eq!(d.holder("fo-b").await, None);
}

/// -v names every name of the set: each with its token when acquired, all of them when
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_names_every_name_of_the_set() {
    let d = lockd().await;
    let out = output(d.lockctl(&["-v", "run", "vb-a", "vb-b", "--", "true"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    let acquired = err
        .lines()
        .find(|l| l.contains("acquired vb-a token "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(acquired.contains(", vb-b token "), "{acquired}");
    assert!(err.contains("released vb-a (with vb-b) token "), "{err}");
}
