//! The web view (`--web`): its page, its JSON board and its live event stream over HTTP, its
//! limits, and (browser.rs) the page in a real browser. Rights with `--auth-file` are in
//! `auth::web`.

mod browser;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::common::{self, Lockd, LockdProcess, GUARD};

/// A lockd with the web view on a port of its own; the port.
pub(crate) fn with_web(extra: &[&str]) -> (LockdProcess, SocketAddr) {
    let http = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let lockd = Lockd::new()
        .args(["--metrics-listen", &http.to_string(), "--web"])
        .args(extra)
        .spawn();
    (lockd, http)
}

/// The log of a lockd that must refuse to start with `args`, checked for `why`.
pub(crate) fn refused_at_start(args: &[&str], why: &str) {
    let refused = Lockd::new()
        .args(args)
        .try_spawn()
        .err()
        .expect("lockd refuses to start");
    assert!(refused.iter().any(|l| l.contains(why)), "{refused:?}");
}

/// An HTTP answer: status, head (lower-cased header lines), body.
pub(crate) struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// `GET path`, with Basic credentials when `login` is given.
pub(crate) async fn get(addr: SocketAddr, path: &str, login: Option<(&str, &str)>) -> Answer {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request(path, login).as_bytes()).await.unwrap();
    let mut raw = String::new();
    tokio::time::timeout(GUARD, s.read_to_string(&mut raw))
        .await
        .expect("an answer")
        .expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    Answer {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

/// The request line and head of `GET path`.
pub(crate) fn request(path: &str, login: Option<(&str, &str)>) -> String {
    let auth = login.map_or(String::new(), |(user, secret)| {
        format!(
            "Authorization: Basic {}\r\n",
            base64(&format!("{user}:{secret}"))
        )
    });
    format!("GET {path} HTTP/1.1\r\nHost: lockd\r\nConnection: close\r\n{auth}\r\n")
}

fn base64(text: &str) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The board of `/locks`.
pub(crate) async fn board(addr: SocketAddr, path: &str, login: Option<(&str, &str)>) -> Value {
    let answer = get(addr, path, login).await;
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    serde_json::from_str(&answer.body).expect("JSON")
}

/// The names a board shows.
pub(crate) fn names(board: &Value) -> Vec<String> {
    board["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .map(|l| l["name"].as_str().expect("name").to_string())
        .collect()
}

/// A page's event stream (`/events`), read message by message.
pub(crate) struct Events {
    reader: BufReader<TcpStream>,
}

impl Events {
    /// Opens it; panics unless the answer is a 200 event stream.
    pub async fn open(addr: SocketAddr, path: &str, login: Option<(&str, &str)>) -> Events {
        let (status, head, events) = Events::try_open(addr, path, login).await;
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        events
    }

    /// Opens it: the status, the head, the stream.
    pub async fn try_open(
        addr: SocketAddr,
        path: &str,
        login: Option<(&str, &str)>,
    ) -> (u16, String, Events) {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(request(path, login).as_bytes()).await.unwrap();
        let mut reader = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(GUARD, reader.read_line(&mut line))
                .await
                .expect("a head")
                .expect("read");
            if n == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line.to_ascii_lowercase());
        }
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, head, Events { reader })
    }

    /// The next message with an `event:` (its kind and data), skipping comments and the
    /// chunked encoding's size lines; `None` when the stream ends.
    pub async fn next(&mut self) -> Option<(String, Value)> {
        let mut kind = None;
        let mut data = String::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(GUARD, self.reader.read_line(&mut line))
                .await
                .expect("an event within the guard")
                .ok()?;
            if n == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if let Some(k) = line.strip_prefix("event: ") {
                kind = Some(k.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push_str(d);
            } else if line.is_empty() && kind.is_some() {
                let value = serde_json::from_str(&data).expect("JSON data");
                return kind.map(|k| (k, value));
            }
        }
    }

    /// Messages until one of `kind` that `done` accepts; fails after the guard.
    pub async fn until(&mut self, kind: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + GUARD;
        while Instant::now() < deadline {
            let Some((k, v)) = self.next().await else {
                panic!("the stream ended before a {kind}");
            };
            if k == kind && done(&v) {
                return v;
            }
        }
        panic!("no {kind} as wanted within {GUARD:?}");
    }
}

/// The first holder's and the queue's ids of `name` on a board.
pub(crate) fn at(board: &Value, name: &str) -> Option<(Vec<String>, Vec<String>)> {
    let lock = board["locks"]
        .as_array()?
        .iter()
        .find(|l| l["name"] == name)?;
    let ids = |list: &Value| {
        list.as_array()
            .map(|a| {
                a.iter()
                    .map(|h| h["id"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    Some((ids(&lock["holders"]), ids(&lock["queue"])))
}

fn pair(holders: &[&str], queue: &[&str]) -> Option<(Vec<String>, Vec<String>)> {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    Some((own(holders), own(queue)))
}

#[tokio::test]
async fn the_event_stream_tells_grants_queues_and_releases_as_they_happen() {
    let (lockd, http) = with_web(&[]);
    let page = get(http, "/", None).await;
    assert_eq!(page.status, 200);
    assert!(
        page.head.contains("content-type: text/html"),
        "{}",
        page.head
    );
    assert!(
        page.head
            .contains("content-security-policy: default-src 'self'"),
        "{}",
        page.head
    );
    assert!(
        page.body.contains("<script src=\"view.js\""),
        "{}",
        page.body
    );
    for asset in ["/view.js", "/view.css"] {
        assert_eq!(get(http, asset, None).await.status, 200, "{asset}");
    }

    let mut events = Events::open(http, "/events", None).await;
    events.until("state", |b| names(b).is_empty()).await;
    let mut a = lockd.raw().await;
    let t = a.lock("deploy/web a ttl=1m note=v42").await;
    let acquired = events.until("lock", |e| e["kind"] == "acquired").await;
    assert_eq!(acquired["name"], "deploy/web");
    assert_eq!(acquired["id"], "a");
    assert_eq!(acquired["token"], t);
    assert_eq!(acquired["note"], "v42");
    let b = events
        .until("state", |b| at(b, "deploy/web").is_some())
        .await;
    let holder = &b["locks"][0]["holders"][0];
    assert_eq!(holder["token"], t);
    assert_eq!(holder["note"], "v42");
    assert_eq!(holder["session"], false);
    assert!(holder["left_ms"].as_u64().unwrap() <= 60_000, "{holder}");

    // A LOCK that waits publishes no event: the board still shows its queue.
    let mut w = lockd.raw().await;
    w.send("LOCK deploy/web b ttl=1m session").await;
    events
        .until("state", |b| at(b, "deploy/web") == pair(&["a"], &["b"]))
        .await;

    assert_eq!(a.req(&format!("UNLOCK deploy/web {t}")).await, "OK");
    let released = events.until("lock", |e| e["kind"] == "released").await;
    assert_eq!(released["token"], t);
    let t2 = common::token(&w.line().await);
    events
        .until("state", |b| at(b, "deploy/web") == pair(&["b"], &[]))
        .await;
    assert_eq!(w.req(&format!("UNLOCK deploy/web {t2}")).await, "OK");
    events.until("state", |b| names(b).is_empty()).await;

    // /locks answers the same board once; a page opened now is first told the recent events.
    let mut c = lockd.raw().await;
    c.lock("build/x c ttl=1m").await;
    let once = board(http, "/locks", None).await;
    assert_eq!(names(&once), ["build/x"]);
    let mut late = Events::open(http, "/events", None).await;
    let mut told = Vec::new();
    while let Some((kind, e)) = late.next().await {
        if kind == "state" {
            assert_eq!(names(&e), ["build/x"]);
            break;
        }
        told.push(format!(
            "{} {} {}",
            e["kind"].as_str().unwrap(),
            e["name"].as_str().unwrap(),
            e["id"].as_str().unwrap()
        ));
    }
    assert_eq!(
        told,
        [
            "acquired deploy/web a",
            "released deploy/web a",
            "acquired deploy/web b",
            "released deploy/web b",
            "acquired build/x c"
        ]
    );
}

#[tokio::test]
async fn a_prefix_shows_only_the_names_under_it() {
    let (lockd, http) = with_web(&[]);
    let mut c = lockd.raw().await;
    for name in ["deploy/a", "deploy/b", "backup/db", "deployment"] {
        c.lock(&format!("{name} c ttl=1m")).await;
    }
    assert_eq!(
        names(&board(http, "/locks?prefix=deploy%2F", None).await),
        ["deploy/a", "deploy/b"]
    );
    assert_eq!(
        names(&board(http, "/locks?prefix=deploy/*", None).await),
        ["deploy/a", "deploy/b"]
    );
    assert_eq!(names(&board(http, "/locks", None).await).len(), 4);
    let mut events = Events::open(http, "/events?prefix=backup/", None).await;
    let b = events.until("state", |_| true).await;
    assert_eq!(names(&b), ["backup/db"]);
    c.lock("deploy/c c ttl=1m").await;
    c.lock("backup/files c ttl=1m").await;
    // Only the name under the prefix is told.
    let e = events.until("lock", |_| true).await;
    assert_eq!(e["name"], "backup/files");
    let bad = get(http, "/locks?prefix=%zz", None).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}

#[tokio::test]
async fn web_locks_and_web_viewers_bound_what_the_view_costs() {
    let (lockd, http) = with_web(&["--web-locks", "2", "--web-viewers", "1"]);
    let mut c = lockd.raw().await;
    for name in ["a", "b", "c"] {
        c.lock(&format!("{name} c ttl=1m")).await;
    }
    let b = board(http, "/locks", None).await;
    assert_eq!(names(&b), ["a", "b"]);
    assert_eq!(b["more"], 1);

    let first = Events::open(http, "/events", None).await;
    let (status, head, _) = Events::try_open(http, "/events", None).await;
    assert_eq!(status, 503, "{head}");
    // The page closes: its place is free again.
    drop(first);
    let deadline = Instant::now() + GUARD;
    loop {
        let (status, _, _) = Events::try_open(http, "/events", None).await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed page's place was not freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn without_web_there_is_no_page() {
    let http = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let _lockd = Lockd::new()
        .args(["--metrics-listen", &http.to_string()])
        .spawn();
    for path in ["/", "/events", "/locks", "/view.js"] {
        assert_eq!(get(http, path, None).await.status, 404, "{path}");
    }
}

#[test]
fn web_on_a_network_address_needs_auth_file_or_insecure_open() {
    let http = format!("0.0.0.0:{}", common::free_port());
    refused_at_start(
        &["--metrics-listen", &http, "--web"],
        "--web on a --metrics-listen address that is not loopback",
    );
    refused_at_start(&["--web"], "--metrics-listen");
    for bad in [["--web-locks", "0"], ["--web-viewers", "0"]] {
        let http = format!("127.0.0.1:{}", common::free_port());
        let args = ["--metrics-listen", &http, "--web", bad[0], bad[1]];
        refused_at_start(&args, bad[0]);
    }
}
