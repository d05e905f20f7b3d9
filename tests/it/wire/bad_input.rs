//! Bad input gets the exact error code of proto.md, changes nothing, and never stops the
//! server from serving everyone else.

use crate::common;

use std::time::Duration;

use common::{config, field, status_shape, token, Lockd, Raw, TestServer, GUARD};
use lockd::server::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A server with one lock `keep` held (by the returned connection, lease long enough for
/// any test), and the exact `STATUS` (all) it answers then.
async fn server_with_a_lock(config: Config) -> (TestServer, Raw, Vec<String>) {
    let server = Lockd::new().config(config).serve().await;
    let mut c = server.raw().await;
    c.lock("keep keeper ttl=1m").await;
    let table = status_all(&mut c).await;
    (server, c, table)
}

/// The token of the single held lock in a `STATUS` (all) answer.
fn only_token(table: &[String]) -> u64 {
    match table {
        [info, ok] if ok == "OK 1" => field(info, "token")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no token in {info:?}")),
        _ => panic!("expected one held lock: {table:?}"),
    }
}

/// `STATUS` without a name, `ttl_ms` blanked.
async fn status_all(c: &mut Raw) -> Vec<String> {
    c.send("STATUS").await;
    let mut lines = Vec::new();
    loop {
        let line = status_shape(&c.line().await);
        let done = line.starts_with("OK");
        lines.push(line);
        if done {
            return lines;
        }
    }
}

/// Sends each request on one connection and checks each reply starts `ERR <code> `; then the
/// connection still serves, the table is as before, and a new connection is served too.
async fn refused(server: &TestServer, table: &[String], code: &str, requests: &[&[u8]]) {
    let mut c = server.raw().await;
    for req in requests {
        c.send_raw(req).await;
        c.send_raw(b"\n").await;
        let reply = c.line().await;
        let want = format!("ERR {code} ");
        assert!(
            reply.starts_with(&want),
            "{:?}: want {want:?}..., got {reply:?}",
            String::from_utf8_lossy(req)
        );
    }
    assert_eq!(c.req("PING").await, "OK PONG", "connection stays open");
    assert_eq!(status_all(&mut c).await, table, "the table must not change");
    let mut other = server.raw().await;
    assert_eq!(other.req("PING").await, "OK PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syntax_errors() {
    let (server, _keeper, table) = server_with_a_lock(config()).await;
    refused(
        &server,
        &table,
        "SYNTAX",
        &[
            b"",
            b"   ",
            b"\t",
            b"\r",
            b"LOCK",
            b"LOCK n",
            b"UNLOCK",
            b"UNLOCK n",
            b"UNLOCK n 1 2",
            b"RENEW n",
            b"CHECK n",
            b"CHECK n 1 2",
            b"STATUS a b",
            b"WATCH a b",
            b"PING x",
            b"HELP me",
            b"QUIT now",
            // Unknown, repeated and malformed options.
            b"LOCK n a foo=1",
            b"LOCK n a bogus",
            b"LOCK n a ttl=1s ttl=2s",
            b"LOCK n a TTL=1s ttl=2s",
            b"LOCK n a wait=1s wait=1s",
            b"LOCK n a session session",
            b"LOCK n a detach=1",
            b"LOCK n a session detach",
            b"LOCK n a ttl",
            b"LOCK n a wait",
            b"RENEW keep 1 wait=1s",
            b"RENEW keep 1 session",
            b"RENEW keep 1 ttl=1s ttl=1s",
            b"UNLOCK keep 1 ttl=1s",
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_commands() {
    let (server, _keeper, table) = server_with_a_lock(config()).await;
    refused(
        &server,
        &table,
        "UNKNOWN",
        &[
            b"FOO",
            b"LOCKS n a",
            b"GET keep",
            b"unlock-all",
            b"\xc3\xa9",
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_durations_and_ttls() {
    let mut cfg = config();
    cfg.limits.max_ttl = Duration::from_secs(60);
    let (server, mut keeper, table) = server_with_a_lock(cfg).await;
    let t = only_token(&table);

    let renew_zero = format!("RENEW keep {t} ttl=0");
    let renew_long = format!("RENEW keep {t} ttl=61s");
    let renew_bad = format!("RENEW keep {t} ttl=soon");
    refused(
        &server,
        &table,
        "BADARG",
        &[
            b"LOCK n a ttl=abc",
            b"LOCK n a ttl=-1",
            b"LOCK n a ttl=1x",
            b"LOCK n a ttl=",
            b"LOCK n a ttl=1..5",
            b"LOCK n a wait=zz",
            b"LOCK n a wait=-5s",
            b"LOCK n a ttl=99999999999999999999999",
            // ttl 0 and over max_ttl.
            b"LOCK n a ttl=0",
            b"LOCK n a ttl=0s",
            b"LOCK n a ttl=0ms",
            b"LOCK n a ttl=61s",
            b"LOCK n a ttl=2m",
            b"LOCK n a ttl=1h",
            renew_zero.as_bytes(),
            renew_long.as_bytes(),
            renew_bad.as_bytes(),
        ],
    )
    .await;
    // The refused RENEWs left the lease alone, and a good one still works.
    let checked = keeper.req(&format!("CHECK keep {t}")).await;
    assert!(checked.starts_with("OK ttl_ms="), "{checked}");
    let renewed = keeper.req(&format!("RENEW keep {t} ttl=60s")).await;
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    // At the limit is fine; plain and fractional seconds are durations.
    let mut c = server.raw().await;
    for ok in [
        "n1 a ttl=60s",
        "n2 a ttl=1.5",
        "n3 a ttl=30 wait=0.5",
        "n4 a ttl=1m",
    ] {
        let tn = c.lock(ok).await;
        assert_eq!(c.req(&format!("UNLOCK {} {tn}", &ok[..2])).await, "OK");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens() {
    let (server, _keeper, table) = server_with_a_lock(config()).await;
    refused(
        &server,
        &table,
        "BADARG",
        &[
            b"UNLOCK keep abc",
            b"UNLOCK keep 0",
            b"UNLOCK keep 00",
            b"UNLOCK keep -5",
            b"UNLOCK keep +5",
            b"UNLOCK keep 1.0",
            b"UNLOCK keep 0x10",
            b"UNLOCK keep 99999999999999999999999",
            b"UNLOCK keep 18446744073709551616",
            b"CHECK keep 0",
            b"CHECK keep x",
            b"RENEW keep x",
            b"RENEW keep 0 ttl=1s",
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_ids() {
    let (server, _keeper, table) = server_with_a_lock(config()).await;
    let long = "n".repeat(256);
    let long_name = format!("LOCK {long} a");
    let long_id = format!("LOCK n {long}");
    let long_status = format!("STATUS {long}");
    let long_watch = format!("WATCH {long}");
    let long_unlock = format!("UNLOCK {long} 1");
    // 128 two-byte characters: 256 bytes though only 128 characters.
    let wide = "é".repeat(128);
    let wide_name = format!("LOCK {wide} a");
    refused(
        &server,
        &table,
        "BADARG",
        &[
            b"LOCK a\x01b c",
            b"LOCK ab c\x7fd",
            b"LOCK a\x1bb c",
            b"LOCK a\x00b c",
            b"LOCK n a\x0bb",
            b"LOCK n\xc2\x85x a",
            b"STATUS a\x02",
            b"UNLOCK a\x03 5",
            long_name.as_bytes(),
            long_id.as_bytes(),
            long_status.as_bytes(),
            long_watch.as_bytes(),
            long_unlock.as_bytes(),
            wide_name.as_bytes(),
        ],
    )
    .await;

    // 255 bytes is fine, for names and ids, in any UTF-8.
    let mut c = server.raw().await;
    let max = "m".repeat(255);
    let t = c.lock(&format!("{max} {max}")).await;
    let status = c.req(&format!("STATUS {max}")).await;
    assert_eq!(
        status_shape(&status),
        format!("OK {max} held id={max} token={t} ttl_ms=* session=0 waiters=0")
    );
    let wide = format!("{}x", "é".repeat(127));
    assert_eq!(wide.len(), 255);
    let t = c.lock(&format!("{wide} a")).await;
    assert_eq!(c.req(&format!("UNLOCK {wide} {t}")).await, "OK");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_is_refused_and_the_connection_stays() {
    let (server, _keeper, table) = server_with_a_lock(config()).await;
    refused(
        &server,
        &table,
        "ENCODING",
        &[
            b"PING \xff\xfe",
            b"\xff",
            b"LOCK n\xc3 a",
            b"LOCK \xed\xa0\x80 a",
            b"\xc0\xaf",
        ],
    )
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_line_is_refused_and_closed() {
    let mut cfg = config();
    cfg.max_line = 64;
    let (server, mut keeper, table) = server_with_a_lock(cfg).await;

    // Exactly max_line bytes (line ending excluded) is fine, with either ending.
    let mut c = server.raw().await;
    let exact = format!("STATUS {}", "s".repeat(57));
    assert_eq!(exact.len(), 64);
    c.send(&exact).await;
    c.expect_prefix("OK sss").await;
    c.send_raw(format!("{exact}\r\n").as_bytes()).await;
    c.expect_prefix("OK sss").await;

    // One more byte is not.
    let over = format!("STATUS {}", "s".repeat(58));
    c.send(&over).await;
    c.expect_prefix("ERR TOOLONG ").await;
    c.expect_eof().await;

    // A long line that is also a LOCK changes nothing.
    let mut c = server.raw().await;
    c.send(&format!("LOCK {} a", "n".repeat(60))).await;
    c.expect_prefix("ERR TOOLONG ").await;
    c.expect_eof().await;

    assert_eq!(status_all(&mut keeper).await, table);
    assert_eq!(server.raw().await.req("PING").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_line_is_cut_off_without_reading_it_all() {
    let (server, mut keeper, table) = server_with_a_lock(config()).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let (mut rx, mut tx) = stream.into_split();
    const TOTAL: usize = 10 * 1024 * 1024;
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        while sent < TOTAL {
            tx.write_all(&chunk).await?;
            sent += chunk.len();
        }
        Ok::<usize, std::io::Error>(sent)
    });
    // The server answers ERR TOOLONG (if the reset does not overtake it) and closes.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(GUARD, rx.read(&mut buf)).await {
            Err(_) => panic!("connection still open"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    let got = String::from_utf8_lossy(&got);
    assert!(
        got.is_empty() || got.starts_with("ERR TOOLONG "),
        "only ERR TOOLONG may come back: {got:?}"
    );
    // The server stopped reading long before 10 MB: the writer can't have sent it all.
    let written = tokio::time::timeout(GUARD, writer)
        .await
        .expect("writer stuck: the server neither reads nor closes")
        .unwrap();
    assert!(
        written.is_err(),
        "all 10 MB were taken: the server kept reading a line over --max-line"
    );
    assert_eq!(server.raw().await.req("PING").await, "OK PONG");
    assert_eq!(status_all(&mut keeper).await, table);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_refused() {
    let mut cfg = config();
    cfg.max_connections = 2;
    let server = Lockd::new().config(cfg).serve().await;
    let mut c1 = server.raw().await;
    let mut c2 = server.raw().await;
    assert_eq!(c1.req("PING").await, "OK PONG");
    assert_eq!(c2.req("PING").await, "OK PONG");

    let mut c3 = server.raw().await;
    c3.expect_prefix("ERR LIMIT ").await;
    c3.expect_eof().await;

    // The ones inside are unaffected.
    assert_eq!(c1.req("PING").await, "OK PONG");
    let t = c2.lock("l a").await;
    assert_eq!(
        status_all(&mut c1).await,
        [
            format!("INFO l held id=a token={t} ttl_ms=* session=0 waiters=0"),
            "OK 1".to_owned()
        ]
    );

    // Once one leaves, a new connection is served (the server notices the close on its own).
    drop(c1);
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let mut c = server.raw().await;
        c.send("PING").await;
        match c.try_line().await.ok().flatten() {
            Some(line) if line == "OK PONG" => break,
            Some(line) if line.starts_with("ERR LIMIT ") => {}
            None => {}
            Some(line) => panic!("unexpected {line:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no connection accepted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c2.req(&format!("UNLOCK l {t}")).await, "OK");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_locks_than_the_limit_are_refused() {
    let mut cfg = config();
    cfg.limits.max_locks = 2;
    let server = Lockd::new().config(cfg).serve().await;
    let mut c = server.raw().await;
    let ta = c.lock("a x").await;
    let tb = c.lock("b x").await;
    let table = status_all(&mut c).await;
    c.send("LOCK c x").await;
    c.expect_prefix("ERR LIMIT ").await;
    c.send("LOCK c x wait=0").await;
    c.expect_prefix("ERR LIMIT ").await;
    assert_eq!(status_all(&mut c).await, table);
    assert_eq!(c.req("STATUS c").await, "OK c free");
    // Existing names are not new locks: a retry and a try on a held one are as usual.
    assert_eq!(c.req("LOCK a x").await, format!("OK {ta}"));
    c.send("LOCK b other wait=0").await;
    c.expect_prefix("ERR TIMEOUT ").await;
    // Room again after an UNLOCK.
    assert_eq!(c.req(&format!("UNLOCK b {tb}")).await, "OK");
    let tc = c.lock("c x").await;
    assert!(tc > tb);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_does_not_hold_up_others() {
    let server = Lockd::new().serve().await;
    let mut silent = server.raw().await;
    let mut c = server.raw().await;
    for _ in 0..20 {
        let t = c.lock("s a").await;
        assert_eq!(c.req(&format!("UNLOCK s {t}")).await, "OK");
    }
    assert_eq!(c.req("STATUS").await, "OK 0");
    // It was simply idle, not dropped.
    assert_eq!(silent.req("PING").await, "OK PONG");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_sent_one_byte_at_a_time() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    for b in b"LOCK slow a ttl=5s session\r\n" {
        c.send_raw(&[*b]).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let t = token(&c.line().await);
    let status = server.raw().await.req("STATUS slow").await;
    assert_eq!(
        status_shape(&status),
        format!("OK slow held id=a token={t} ttl_ms=* session=1 waiters=0")
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_that_never_reads_is_disconnected_not_waited_for() {
    let mut cfg = config();
    cfg.watch_buffer = 4;
    let server = Lockd::new().config(cfg).serve().await;

    // A small receive window, so the watcher's socket fills with few events.
    let mut watcher = Raw::connect_small(server.addr, 4096).await;
    assert_eq!(watcher.req("WATCH").await, "OK watching *");

    // Long names and ids make big events; pipelined batches make many of them fast. Far more
    // than any socket buffer holds, so the watcher's session is stuck writing.
    let id = "i".repeat(200);
    let mut c = server.raw().await;
    let work = async {
        for round in 0..8 {
            let names: Vec<String> = (0..500)
                .map(|i| format!("{}{round:02}{i:04}", "n".repeat(240)))
                .collect();
            let mut batch = String::new();
            for name in &names {
                batch.push_str(&format!("LOCK {name} {id}\n"));
            }
            c.send_raw(batch.as_bytes()).await;
            let mut tokens = Vec::new();
            for _ in &names {
                tokens.push(token(&c.line().await));
            }
            let mut batch = String::new();
            for (name, t) in names.iter().zip(&tokens) {
                batch.push_str(&format!("UNLOCK {name} {t}\n"));
            }
            c.send_raw(batch.as_bytes()).await;
            for _ in &names {
                c.expect("OK").await;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .expect("lock/unlock stalled behind a watcher that does not read");
    assert_eq!(c.req("STATUS").await, "OK 0");

    // Now it reads: events, then ERR LAGGED, then the end.
    let mut events = 0;
    loop {
        let line = watcher.line().await;
        if line.starts_with("EVENT ") {
            events += 1;
            continue;
        }
        assert!(line.starts_with("ERR LAGGED "), "{line:?}");
        break;
    }
    assert!(
        events < 8000,
        "the watcher was not cut off: {events} events"
    );
    watcher.expect_eof().await;
    server.shutdown().await;
}
