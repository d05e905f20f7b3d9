//! lockctl status and top against a real lockd: who holds a lock, who waits for it and in
//! what order, as a table, as JSON, and as a live view.

use crate::common;

use std::time::Duration;

use lockd::client::Client;
use lockd::proto::Tie;
use serde_json::Value;
use tokio::io::AsyncReadExt as _;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use common::lockctl::*;

/// Sends a LOCK of `name` as `id` that waits; the task ends when it is granted.
fn queue_up(client: Client, name: &'static str, id: &'static str, tie: Tie) -> JoinHandle<()> {
    let mut client = client;
    tokio::spawn(async move {
        let _ = client.lock(name, id, None, None, tie).await;
        // Keep the connection (a session waiter leaves the queue with it).
        std::future::pending::<()>().await;
    })
}

/// A lock held by `holder` with `first` then `second` (a session waiter) in its queue.
async fn held_with_two_waiters(d: &Server, name: &'static str) -> (u64, [JoinHandle<()>; 2]) {
    let token = d
        .client()
        .await
        .lock(
            name,
            "holder",
            Some(Duration::from_secs(60)),
            None,
            Tie::Plain,
        )
        .await
        .unwrap();
    let first = queue_up(d.client().await, name, "first", Tie::Plain);
    d.wait_waiters(name, 1).await;
    let second = queue_up(
        d.client().await,
        name,
        "second",
        Tie::Session(Duration::ZERO),
    );
    d.wait_waiters(name, 2).await;
    (token, [first, second])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_name_shows_the_holder_and_the_queue_in_order() {
    let d = lockd().await;
    let (token, waiters) = held_with_two_waiters(&d, "db").await;

    let out = output(d.lockctl(&["status", "db"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0], "db: held exclusive, 1 holder, 2 waiting",
        "{text}"
    );
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        words(lines[2]),
        [
            "HOLDER", "TOKEN", "USER", "PEER", "GRANTED", "HELD", "FOR", "TTL", "LEFT", "SESSION",
            "MODE"
        ],
        "{text}"
    );
    let holder = words(lines[3]);
    assert_eq!(
        holder[..2],
        ["holder".to_owned(), token.to_string()],
        "{text}"
    );
    // No auth file: no user; the holder's address, and the grant's time as RFC 3339 UTC.
    assert_eq!(holder[2], "-", "{text}");
    assert!(holder[3].starts_with("127.0.0.1:"), "{text}");
    assert!(is_rfc3339_utc(&holder[4]), "{text}");
    assert_eq!(holder[7..], ["no", "exclusive"], "{text}");
    assert_eq!(
        words(lines[5]),
        ["#", "WAITER", "WAITED", "FOR", "SESSION", "MODE"],
        "{text}"
    );
    let (first, second) = (words(lines[6]), words(lines[7]));
    assert_eq!(
        (first[0].as_str(), first[1].as_str()),
        ("1", "first"),
        "{text}"
    );
    assert_eq!(first[3..], ["no", "exclusive"], "{text}");
    assert_eq!(
        (second[0].as_str(), second[1].as_str()),
        ("2", "second"),
        "{text}"
    );
    assert_eq!(second[3], "yes", "{text}");
    assert_eq!(lines.len(), 8, "{text}");

    let out = output(d.lockctl(&["status", "db", "--json"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["name"], "db");
    assert_eq!(v["held"], true);
    assert_eq!(v["id"], "holder");
    assert_eq!(v["token"], token);
    assert_eq!(v["waiters"], 2);
    assert_eq!(v["mode"], "exclusive");
    let holders = v["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{v}");
    assert_eq!(holders[0]["id"], "holder");
    assert_eq!(holders[0]["token"], token);
    assert!(holders[0]["ttl_ms"].as_u64().unwrap() <= 60_000, "{v}");
    assert!(holders[0]["held_ms"].is_u64(), "{v}");
    assert_eq!(holders[0]["session"], false);
    assert_eq!(holders[0]["user"], Value::Null, "{v}");
    assert!(
        is_rfc3339_utc(holders[0]["granted_at"].as_str().unwrap()),
        "{v}"
    );
    assert!(
        holders[0]["granted_unix_ms"].as_u64().unwrap() > 1_700_000_000_000,
        "{v}"
    );
    assert!(
        holders[0]["peer"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{v}"
    );
    let queue = v["queue"].as_array().unwrap();
    let order: Vec<(u64, &str, bool)> = queue
        .iter()
        .map(|w| {
            assert!(w["waited_ms"].is_u64(), "{w}");
            (
                w["position"].as_u64().unwrap(),
                w["id"].as_str().unwrap(),
                w["session"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(order, [(1, "first", false), (2, "second", true)]);
    // The one waiting longer has waited at least as long.
    assert!(queue[0]["waited_ms"].as_u64() >= queue[1]["waited_ms"].as_u64());
    for w in waiters {
        w.abort();
    }
}

/// `2026-12-01T03:12:00Z`: RFC 3339, UTC, to the second.
fn is_rfc3339_utc(text: &str) -> bool {
    text.len() == 20 && text.ends_with('Z') && humantime::parse_rfc3339(text).is_ok()
}

/// With an auth file, each holder's user shows in the table and the JSON, with when it was
/// granted (RFC 3339 and Unix ms, which agree, and lie between the test's clock readings
/// around the LOCK) and from which address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_name_says_which_user_took_it_and_when() {
    use lockd::auth::{user_line, Gate, Users};
    const SECRET: &str = "ops-secret-0123456789abcdef-status";
    let users = Users::parse(
        &user_line("ops lock=* read=*", SECRET, [3; 16]).unwrap(),
        None,
    );
    let config = lockd::server::Config {
        auth: Some(Gate::new(users.unwrap())),
        ..lockd::server::Config::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _server = common::Lockd::new().config(config).serve_on(listener);
    let as_ops = |args: &[&str]| {
        let mut cmd = lockctl_at(&addr, args);
        cmd.env_remove("LOCKD_SECRET_FILE");
        cmd.env("LOCKD_USER", "ops").env("LOCKD_SECRET", SECRET);
        cmd
    };
    let unix_ms = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.unwrap().as_millis() as u64
    };
    let before = unix_ms();
    let out = output(as_ops(&[
        "acquire",
        "deploy-prod",
        "--id",
        "ci-7",
        "--ttl",
        "1m",
    ]))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let after = unix_ms();

    let out = output(as_ops(&["status", "deploy-prod"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let holder: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(holder[0], "ci-7", "{text}");
    assert_eq!(holder[2], "ops", "{text}");
    assert!(holder[3].starts_with("127.0.0.1:"), "{text}");
    assert!(is_rfc3339_utc(holder[4]), "{text}");

    let out = output(as_ops(&["status", "deploy-prod", "--json"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let h = &v["holders"][0];
    assert_eq!(h["id"], "ci-7", "{v}");
    assert_eq!(h["user"], "ops", "{v}");
    let granted = h["granted_unix_ms"].as_u64().unwrap();
    assert!(
        (before..=after).contains(&granted),
        "{before} {granted} {after}"
    );
    let at = humantime::parse_rfc3339(h["granted_at"].as_str().unwrap()).unwrap();
    let at_s = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(at_s, granted / 1000, "{v}");
    assert_eq!(holder[4], h["granted_at"], "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_free_name_and_of_nothing_held() {
    let d = lockd().await;
    let out = output(d.lockctl(&["status", "free-one"])).await;
    assert_eq!((code(&out), stdout(&out).trim()), (0, "free-one: free"));
    let out = output(d.lockctl(&["status", "free-one", "--json"])).await;
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"name": "free-one", "held": false, "holders": [], "queue": []})
    );
    let out = output(d.lockctl(&["status"])).await;
    assert_eq!(stdout(&out).trim(), "no locks held");
    let out = output(d.lockctl(&["status", "--json"])).await;
    assert_eq!(stdout(&out).trim(), "[]");
}

/// Reads `child`'s stdout until it holds `n` snapshots (a blank line ends each but the last).
async fn snapshots(stdout: &mut tokio::process::ChildStdout, n: usize) -> Vec<String> {
    let mut seen = String::new();
    let give_up = Instant::now() + GUARD;
    // One more separator than asked for: the n-th snapshot is then complete.
    while seen.matches("\n\n").count() < n {
        assert!(Instant::now() < give_up, "only saw:\n{seen}");
        let mut buf = [0u8; 4096];
        if let Ok(Ok(k)) = timeout(Duration::from_millis(200), stdout.read(&mut buf)).await {
            assert!(k > 0, "top ended early; saw:\n{seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..k]));
        }
    }
    seen.split("\n\n").take(n).map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_prints_a_snapshot_per_interval_when_not_at_a_terminal() {
    let d = lockd().await;
    let (_, waiters) = held_with_two_waiters(&d, "busy").await;
    d.client()
        .await
        .lock("quiet", "other", None, None, Tie::Plain)
        .await
        .unwrap();
    let mut child = spawn(d.lockctl(&["top", "--interval", "200ms"]));
    let mut out = child.stdout.take().unwrap();
    let shots = snapshots(&mut out, 2).await;
    for shot in &shots {
        assert!(
            !shot.contains('\x1b'),
            "no terminal codes in a pipe: {shot:?}"
        );
        let lines: Vec<&str> = shot.lines().collect();
        assert!(
            lines[0].starts_with(&format!("lockd at {}, ", d.addr)),
            "{shot}"
        );
        assert!(lines[0].contains(": 2 held, 2 waiting"), "{shot}");
        let header: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            header,
            ["NAME", "MODE", "HOLDER", "AGE", "TTL", "LEFT", "QUEUE"],
            "{shot}"
        );
        // Longest queue first.
        let busy: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(busy[..3], ["busy", "exclusive", "holder"], "{shot}");
        assert_eq!(busy.last(), Some(&"2"), "{shot}");
        assert_ne!(busy[3], "-", "the age comes from the detail: {shot}");
        let quiet: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(quiet[..3], ["quiet", "exclusive", "other"], "{shot}");
        assert_eq!(quiet.last(), Some(&"0"), "{shot}");
        assert_eq!(lines.len(), 4, "{shot}");
    }
    signal(&child, libc::SIGTERM);
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    for w in waiters {
        w.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_of_names_shows_them_free_or_held_and_rides_out_a_dead_server() {
    let d = lockd().await;
    d.client()
        .await
        .lock("held", "h", None, None, Tie::Plain)
        .await
        .unwrap();
    let mut child = spawn(d.lockctl(&["top", "held", "gone", "--interval", "100ms"]));
    let mut out = child.stdout.take().unwrap();
    let shot = snapshots(&mut out, 1).await.remove(0);
    let lines: Vec<&str> = shot.lines().collect();
    assert!(lines[0].contains(": 1 held, 0 waiting"), "{shot}");
    assert!(
        lines[2].starts_with("gone ") && lines[2].ends_with(" free"),
        "{shot}"
    );
    assert!(lines[3].starts_with("held "), "{shot}");
    // The server goes away: top says so and keeps going.
    drop(d);
    let mut seen = String::new();
    let give_up = Instant::now() + GUARD;
    while !seen.contains("trying again every 100ms") {
        assert!(Instant::now() < give_up, "never said: {seen}");
        let mut buf = [0u8; 4096];
        if let Ok(Ok(k)) = timeout(Duration::from_millis(200), out.read(&mut buf)).await {
            seen.push_str(&String::from_utf8_lossy(&buf[..k]));
        }
    }
    signal(&child, libc::SIGINT);
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));

    let out = output(lockctl_at("127.0.0.1:1", &["top", "--interval", "10ms"])).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--interval"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_top_and_watch_of_a_prefix_show_only_the_names_under_it() {
    let d = lockd().await;
    let mut c = d.client().await;
    for name in ["deploy/web", "deploy/db", "deployment", "build"] {
        c.lock(name, "holder", None, None, Tie::Plain)
            .await
            .unwrap();
    }
    let out = output(d.lockctl(&["status", "deploy/*", "--json"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["deploy/db", "deploy/web"]);

    let mut top = spawn(d.lockctl(&["top", "deploy/*", "--interval", "200ms"]));
    let mut out = top.stdout.take().unwrap();
    let shot = snapshots(&mut out, 1).await.remove(0);
    let names: Vec<&str> = shot
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ["deploy/db", "deploy/web"], "{shot}");
    signal(&top, libc::SIGTERM);
    let _ = timeout(GUARD, top.wait()).await;

    let mut watch = spawn(d.lockctl(&["watch", "deploy/*"]));
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    // The watch is on once a lock under the prefix shows up in it.
    let give_up = Instant::now() + GUARD;
    let mut n = 0;
    loop {
        assert!(Instant::now() < give_up, "watch saw nothing");
        let (other, new) = (format!("build/other{n}"), format!("deploy/new{n}"));
        c.lock(&other, "b", None, None, Tie::Plain).await.unwrap();
        c.lock(&new, "d", None, None, Tie::Plain).await.unwrap();
        n += 1;
        match timeout(Duration::from_millis(300), lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                assert!(line.contains(" acquired deploy/new"), "{line}");
                break;
            }
            _ => continue,
        }
    }
    signal(&watch, libc::SIGTERM);
    let _ = timeout(GUARD, watch.wait()).await;
}
