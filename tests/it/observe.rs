//! Observability: /metrics, /healthz and /readyz over real HTTP while lockd is driven over
//! real TCP; the exposition checked by a real OpenMetrics parser; `STATUS <name> detail`;
//! and `--log-format json`.

use crate::common;
use crate::common::needs::{have, Need};

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use common::{config, http_get as get, token, wait_status, wait_waiters, Lockd, GUARD};
use lockd::http::Endpoint;
use lockd::server::Config;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Parses an exposition with the Prometheus project's OpenMetrics parser (Python), so a
/// malformed line fails the test; returns every sample as `name{labels}` -> value, labels
/// sorted.
fn parse_exposition(text: &str) -> HashMap<String, f64> {
    let script = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        print(f"{s.name}{{{labels}}} {s.value}")
"#;
    // Debian's python3 carries python3-prometheus-client; .ci/run installs it.
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 with python3-prometheus-client is needed: apt-get install python3-prometheus-client");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// A server with its metrics endpoint on 127.0.0.1:0.
async fn observed(config: Config) -> (common::TestServer, std::net::SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let endpoint = Endpoint::new(vec!["w".into()]);
    tokio::spawn(
        endpoint
            .clone()
            .run(listener, None, CancellationToken::new()),
    );
    let server = Lockd::new()
        .config(Config {
            endpoint: Some(endpoint),
            ..config
        })
        .serve()
        .await;
    // The server hands the endpoint its backend once it serves: scrape only from then on
    // (before, /metrics answers 503 "starting", which the readyz test covers).
    let ready_by = std::time::Instant::now() + Duration::from_secs(10);
    while get(addr, "/readyz").await.0 != 200 {
        assert!(
            std::time::Instant::now() < ready_by,
            "/readyz never became ready"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (server, addr)
}

async fn scrape(addr: std::net::SocketAddr) -> HashMap<String, f64> {
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    parse_exposition(&body)
}

fn sample(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("no sample {key}; have {:?}", m.keys()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_grants_waits_expiries_and_refusals() {
    if !have(Need::PythonPrometheus) {
        return;
    }
    let (server, http) = observed(config()).await;
    let m = scrape(http).await;
    assert_eq!(sample(&m, "lockd_grants_total{wait=\"immediate\"}"), 0.0);
    let build = m
        .keys()
        .find(|k| k.starts_with("lockd_build_info{"))
        .unwrap_or_else(|| panic!("no lockd_build_info in {:?}", m.keys()));
    assert!(build.contains("backend=\"memory\""), "{build}");
    assert!(build.contains("version=\"0.1.0\""), "{build}");
    assert!(build.contains("commit=\""), "{build}");
    assert!(!build.contains("commit=\"\""), "{build}");

    // A grant at once, then its expiry.
    let mut a = server.raw().await;
    a.lock("m a ttl=20ms").await;
    wait_status(&mut a, "m", |l| l == "OK m free").await;
    // A waiter, then a grant after waiting.
    let th = a.lock("w holder ttl=1m").await;
    let mut b = server.raw().await;
    b.send("LOCK w waiter ttl=1m").await;
    wait_waiters(&mut a, "w", 1).await;
    let m = scrape(http).await;
    assert_eq!(sample(&m, "lockd_waiters{}"), 1.0);
    assert_eq!(sample(&m, "lockd_locks_held{}"), 1.0);
    assert_eq!(sample(&m, "lockd_lock_holders{name=\"w\"}"), 1.0);
    assert_eq!(sample(&m, "lockd_lock_waiters{name=\"w\"}"), 1.0);
    assert!(sample(&m, "lockd_connections{protocol=\"line\"}") >= 2.0);
    let mut watcher = server.raw().await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");
    let m = scrape(http).await;
    assert_eq!(sample(&m, "lockd_watchers{}"), 1.0);
    assert_eq!(a.req(&format!("UNLOCK w {th}")).await, "OK");
    token(&b.line().await);
    // A refusal.
    assert!(a.req("UNLOCK w 1").await.starts_with("ERR NOTHELD"));

    let m = scrape(http).await;
    assert_eq!(sample(&m, "lockd_grants_total{wait=\"immediate\"}"), 2.0);
    assert_eq!(sample(&m, "lockd_grants_total{wait=\"queued\"}"), 1.0);
    assert_eq!(sample(&m, "lockd_wait_seconds_count{}"), 1.0);
    assert_eq!(sample(&m, "lockd_releases_total{kind=\"expired\"}"), 1.0);
    assert_eq!(sample(&m, "lockd_releases_total{kind=\"unlock\"}"), 1.0);
    assert_eq!(sample(&m, "lockd_hold_seconds_count{}"), 2.0);
    assert_eq!(sample(&m, "lockd_refusals_total{code=\"NOTHELD\"}"), 1.0);
    assert_eq!(sample(&m, "lockd_waiters{}"), 0.0);
    server.shutdown().await;
}

/// Busy polling rests where it catches nothing, requests further apart than its window (each
/// 50 µs window after a request runs out before the next comes), and its series say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_that_catches_nothing_rests_and_is_counted() {
    if !have(Need::PythonPrometheus) {
        return;
    }
    let (server, http) = observed(config()).await;
    let m = scrape(http).await;
    assert_eq!(sample(&m, "lockd_busy_poll_rests_total{}"), 0.0);
    assert_eq!(sample(&m, "lockd_busy_poll_resting{}"), 0.0);
    let mut c = server.raw().await;
    // The poller judges after 20 ms of spinning: about 400 such requests, a second or two
    // (a busy machine may preempt it more; the guard is generous).
    let guard = std::time::Instant::now() + 6 * GUARD;
    while sample(&scrape(http).await, "lockd_busy_poll_rests_total{}") < 1.0 {
        assert!(
            std::time::Instant::now() < guard,
            "busy polling never rested"
        );
        for _ in 0..100 {
            assert_eq!(c.req("PING").await, "OK PONG");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    // Requests are still answered while it rests.
    assert_eq!(c.req("PING").await, "OK PONG");
    server.shutdown().await;
}

/// Idle and unfinished-line closes are told `ERR LIMIT` but are not refusals: counted apart,
/// so that an alert on refused connections or locks does not page for clients that went
/// quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_line_timeout_closes_are_counted_apart_from_refusals() {
    if !have(Need::PythonPrometheus) {
        return;
    }
    // One server for each timeout, the other off: a busy machine that delays the trickled
    // bytes must not turn the unfinished line into an idle connection.
    let one = |idle, line| {
        let mut cfg = config();
        (cfg.idle_timeout, cfg.line_timeout) = (idle, line);
        cfg
    };
    // The line timer starts at the line's first byte; the idle one at the connection, so
    // it has room for the PING first.
    let (idle_server, idle_http) = observed(one(Duration::from_secs(1), Duration::ZERO)).await;
    let (line_server, line_http) = observed(one(Duration::ZERO, Duration::from_millis(200))).await;
    let mut idle = idle_server.raw().await;
    assert_eq!(idle.req("PING").await, "OK PONG");
    let mut trickle = line_server.raw().await;
    trickle.send_raw(b"PIN").await;
    assert!(idle.line().await.starts_with("ERR LIMIT idle"));
    assert!(trickle
        .line()
        .await
        .starts_with("ERR LIMIT line not finished"));
    for (http, reason) in [(idle_http, "idle"), (line_http, "line")] {
        let m = scrape(http).await;
        assert_eq!(
            sample(
                &m,
                &format!("lockd_timeout_closes_total{{reason=\"{reason}\"}}")
            ),
            1.0
        );
        assert_eq!(sample(&m, "lockd_refusals_total{code=\"LIMIT\"}"), 0.0);
    }
    idle_server.shutdown().await;
    line_server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_starting_until_the_table_is_served() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    let endpoint = Endpoint::new(Vec::new());
    tokio::spawn(
        endpoint
            .clone()
            .run(listener, None, CancellationToken::new()),
    );
    assert_eq!(get(http, "/healthz").await.0, 200);
    assert_eq!(get(http, "/readyz").await.0, 503);
    let server = Lockd::new()
        .config(Config {
            endpoint: Some(endpoint),
            ..config()
        })
        .serve()
        .await;
    let mut c = server.raw().await;
    assert_eq!(c.req("PING").await, "OK PONG");
    let (status, body) = get(http, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    server.shutdown().await;
    assert_eq!(get(http, "/readyz").await.0, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_detail_shows_the_holder_and_the_queue_in_order() {
    let server = Lockd::new().serve().await;
    let mut admin = server.raw().await;
    let mut holder = server.raw().await;
    let t = holder.lock("q holder ttl=1m").await;
    let mut waiters = Vec::new();
    for (i, tie) in ["", " session", " detach"].iter().enumerate() {
        let mut w = server.raw().await;
        w.send(&format!("LOCK q w{i}{tie}")).await;
        wait_waiters(&mut admin, "q", i + 1).await;
        waiters.push(w);
    }
    admin.send("STATUS q detail").await;
    let holder_line = admin.line().await;
    let mut words = holder_line.split(' ');
    assert_eq!(words.next(), Some("HOLDER"));
    assert_eq!(words.next(), Some("q"));
    assert_eq!(words.next(), Some("id=holder"));
    assert_eq!(words.next(), Some(format!("token={t}").as_str()));
    assert!(words.next().unwrap().starts_with("held_ms="));
    assert!(words.next().unwrap().starts_with("ttl_ms="));
    assert_eq!(words.next(), Some("session=0"));
    assert_eq!(words.next(), Some("mode=exclusive"));
    let mut waited = Vec::new();
    for (i, session) in [0, 1, 0].iter().enumerate() {
        let line = admin.line().await;
        let prefix = format!("WAITER q {} id=w{i} waited_ms=", i + 1);
        let rest = line
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{line:?} should start {prefix:?}"));
        let (ms, s) = rest.split_once(' ').unwrap();
        assert_eq!(s, format!("session={session} mode=exclusive"));
        waited.push(ms.parse::<u64>().unwrap());
    }
    // The first in line has waited longest.
    assert!(waited.windows(2).all(|w| w[0] >= w[1]), "{waited:?}");
    let ok = admin.line().await;
    assert!(
        ok.starts_with(&format!("OK q held id=holder token={t} ")),
        "{ok}"
    );
    assert!(ok.ends_with(" waiters=3"), "{ok}");
    assert_eq!(
        admin.req("STATUS free-one detail").await,
        "OK free-one free"
    );
    assert!(admin
        .req("STATUS q details")
        .await
        .starts_with("ERR SYNTAX"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_name_id_token_and_times() {
    let port = common::free_port();
    let mut lockd = tokio::process::Command::from(
        common::Lockd::new()
            .listen(format!("127.0.0.1:{port}"))
            .args(["--log-format", "json"])
            .command(),
    )
    .env("RUST_LOG", "info,lockd::handler=debug")
    .stderr(Stdio::piped())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(lockd.stderr.take().unwrap()).lines();
    async fn next(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    ) -> serde_json::Value {
        let line = tokio::time::timeout(GUARD, lines.next_line())
            .await
            .expect("a log line")
            .unwrap()
            .expect("lockd still logging");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"))
    }
    // Wait for "listening", then drive it.
    while next(&mut lines).await["message"] != "listening" {}
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut c = common::Raw::connect(addr).await;
    let t = c.lock("j me ttl=1m").await;
    assert_eq!(c.req(&format!("UNLOCK j {t}")).await, "OK");
    let granted = next(&mut lines).await;
    assert_eq!(granted["message"], "granted", "{granted}");
    assert_eq!(granted["name"], "j");
    assert_eq!(granted["id"], "me");
    assert_eq!(granted["token"], t);
    assert_eq!(granted["waited_ms"], 0);
    let released = next(&mut lines).await;
    assert_eq!(released["message"], "released", "{released}");
    assert_eq!(released["name"], "j");
    assert_eq!(released["id"], "me");
    assert_eq!(released["token"], t);
    assert!(released["held_ms"].is_u64(), "{released}");
    // A refusal (at debug) names what was refused.
    assert!(c
        .req(&format!("UNLOCK j {t}"))
        .await
        .starts_with("ERR NOTHELD"));
    let refused = loop {
        let line = next(&mut lines).await;
        if line["message"] == "refused" {
            break line;
        }
    };
    assert_eq!(refused["code"], "NOTHELD", "{refused}");
    assert_eq!(refused["name"], "j");
    assert_eq!(refused["token"], t);
    lockd.kill().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), lockd.wait()).await;
}
