//! The web view with `--auth-file`: HTTP Basic with the file's users and secrets, and the
//! same `read=` rights as STATUS and WATCH (every route; the event stream's events and
//! boards; a user removed by a reload loses its stream).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{hangup, login, users_in, ALICE, BOB, CAROL, MALLORY};
use crate::common::{self, Lockd};
use crate::web::{at, board, get, names, refused_at_start, Events};

#[tokio::test]
async fn the_page_asks_for_a_user_and_shows_only_what_its_rights_read() {
    let (dir, file) = users_in("web");
    let http = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let lockd = Lockd::new()
        .args(["--auth-file", file.to_str().unwrap()])
        .args(["--metrics-listen", &http.to_string(), "--web"])
        .spawn();
    let mut alice = login(lockd.addr, "alice", ALICE).await;
    alice.lock("deploy a ttl=1m").await;
    alice.lock("build/1 a ttl=1m").await;

    // Every route asks for a login, and a wrong secret or unknown user gets none.
    for path in ["/", "/view.js", "/view.css", "/locks", "/events"] {
        for bad in [None, Some(("alice", BOB)), Some(("nobody", ALICE))] {
            let refused = get(http, path, bad).await;
            assert_eq!(refused.status, 401, "{path} {bad:?}: {}", refused.body);
            assert!(
                refused
                    .head
                    .contains("www-authenticate: basic realm=\"lockd\""),
                "{}",
                refused.head
            );
            assert!(!refused.body.contains("deploy"), "{}", refused.body);
        }
    }
    assert_eq!(get(http, "/", Some(("bob", BOB))).await.status, 200);

    // What STATUS shows each user, the board shows it (alice reads everything, bob deploy,
    // carol nothing).
    for (user, secret, shown) in [
        ("alice", ALICE, vec!["build/1", "deploy"]),
        ("bob", BOB, vec!["deploy"]),
        ("carol", CAROL, vec![]),
    ] {
        let mut c = login(lockd.addr, user, secret).await;
        c.send("STATUS").await;
        let mut status = Vec::new();
        loop {
            let line = c.line().await;
            match line.strip_prefix("INFO ") {
                Some(info) => status.push(info.split(' ').next().unwrap().to_string()),
                None => break,
            }
        }
        assert_eq!(status, shown, "STATUS for {user}");
        let b = board(http, "/locks", Some((user, secret))).await;
        assert_eq!(names(&b), shown, "/locks for {user}");
        let mut events = Events::open(http, "/events", Some((user, secret))).await;
        let first = events.until("state", |_| true).await;
        assert_eq!(names(&first), shown, "/events for {user}");
    }

    // bob's stream: deploy's events, not build's; the recent ones too.
    let mut bob = Events::open(http, "/events", Some(("bob", BOB))).await;
    let recent = bob.next().await.expect("a message");
    assert_eq!(recent.0, "lock");
    assert_eq!(recent.1["name"], "deploy");
    bob.until("state", |_| true).await;
    alice.lock("build/2 a ttl=1m").await;
    login(lockd.addr, "mallory", MALLORY)
        .await
        .lock("deploy/x m ttl=1m")
        .await;
    let mut queued = login(lockd.addr, "alice", ALICE).await;
    queued.send("LOCK deploy a2 ttl=1m").await;
    loop {
        let (kind, e) = bob.next().await.expect("the stream goes on");
        assert_eq!(kind, "state", "bob is told of nothing he may not read: {e}");
        assert_eq!(names(&e), ["deploy"], "{e}");
        if at(&e, "deploy").is_some_and(|(_, queue)| queue == ["a2"]) {
            break;
        }
    }

    // A reload that removes bob ends his stream.
    std::fs::write(
        &file,
        std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("user bob "))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    hangup(&lockd);
    while let Some((kind, e)) = bob.next().await {
        assert_ne!(kind, "lock", "{e}");
    }
    assert_eq!(get(http, "/locks", Some(("bob", BOB))).await.status, 401);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--metrics-tls`: the page, its logins and /metrics over TLS with `--tls-cert` (no client
/// certificate asked for, even with `--tls-client-ca`); logins in clear across a network are
/// refused at start.
#[tokio::test]
async fn logins_cross_a_network_only_over_tls() {
    let (dir, file) = users_in("web-tls");
    let pki = common::pki::Pki::new("web-tls");
    let (cert, key) = pki.server();
    let http = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let lockd = Lockd::new()
        .args(["--auth-file", file.to_str().unwrap()])
        .args([
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ])
        .args(["--tls-client-ca", pki.ca().to_str().unwrap()])
        .args([
            "--metrics-listen",
            &http.to_string(),
            "--web",
            "--metrics-tls",
        ])
        .spawn();
    let connector = lockd::tls::client(Some(&pki.ca()), None).expect("client TLS");
    let get_tls = |path: &'static str, login: Option<(&'static str, &'static str)>| {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(http).await.unwrap();
            let name = lockd::tls::server_name("127.0.0.1").unwrap();
            let mut tls = connector.connect(name, tcp).await.expect("handshake");
            tls.write_all(crate::web::request(path, login).as_bytes())
                .await
                .unwrap();
            let mut raw = String::new();
            let _ = tls.read_to_string(&mut raw).await;
            raw
        }
    };
    let page = get_tls("/locks", Some(("bob", BOB))).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("\"locks\":[]"), "{page}");
    let refused = get_tls("/locks", None).await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(get_tls("/metrics", None).await.starts_with("HTTP/1.1 200"));
    // Plain HTTP gets no page.
    let mut plain = tokio::net::TcpStream::connect(http).await.unwrap();
    plain
        .write_all(crate::web::request("/locks", Some(("bob", BOB))).as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(common::GUARD, plain.read_to_end(&mut raw)).await;
    assert!(!String::from_utf8_lossy(&raw).contains("HTTP/1.1 200"));
    drop(lockd);

    // Without --metrics-tls, a login on an address others reach is refused at start.
    let open = format!("0.0.0.0:{}", common::free_port());
    let file = file.to_str().unwrap();
    refused_at_start(
        &["--auth-file", file, "--metrics-listen", &open, "--web"],
        "secrets across the network in clear",
    );
    let _ = std::fs::remove_dir_all(dir);
}
