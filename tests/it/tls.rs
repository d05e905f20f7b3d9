//! The line protocol over TLS (rustls): handshake, mutual TLS, wrong CAs, a plain client on
//! the TLS port and a TLS client on a plain port. Certificates are made at run time.

use crate::common;

use std::time::Duration;

use common::lockctl;
use common::pki::Pki;
use common::{config, Lockd, Raw, TestServer, GUARD};
use lockd::client::Client;
use lockd::proto::ErrorCode;
use lockd::server::Config;
use lockd::tls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A server speaking TLS with a certificate from `pki`, requiring client certificates from
/// `client_ca` if given.
async fn tls_server(pki: &Pki, client_ca: Option<&Pki>) -> TestServer {
    let (cert, key) = pki.server();
    let client_ca = client_ca.map(Pki::ca);
    let tls = tls::server(&cert, &key, client_ca.as_deref()).expect("server TLS");
    Lockd::new()
        .config(Config {
            tls: Some(tls),
            tls_handshake_timeout: Duration::from_millis(500),
            ..config()
        })
        .serve()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_works_over_tls() {
    let pki = Pki::new("tls-basic");
    let server = tls_server(&pki, None).await;
    let connector = tls::client(Some(&pki.ca()), None).expect("client TLS");
    let mut c = Client::connect_tls(&server.addr.to_string(), &connector)
        .await
        .expect("TLS connect");
    c.ping().await.expect("PING over TLS");
    let token = c
        .lock(
            "t",
            "me",
            Some(Duration::from_secs(30)),
            None,
            Default::default(),
        )
        .await
        .expect("LOCK over TLS");
    c.unlock("t", token).await.expect("UNLOCK over TLS");
    // localhost is on the certificate too.
    let by_name = format!("localhost:{}", server.addr.port());
    Client::connect_tls(&by_name, &connector)
        .await
        .expect("TLS connect by name")
        .ping()
        .await
        .expect("PING");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let pki = Pki::new("tls-server");
    let other = Pki::new("tls-other");
    let server = tls_server(&pki, None).await;
    let connector = tls::client(Some(&other.ca()), None).expect("client TLS");
    let Err(err) = Client::connect_tls(&server.addr.to_string(), &connector).await else {
        panic!("an unknown CA must fail the handshake");
    };
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_wants_a_client_certificate_from_its_ca() {
    let pki = Pki::new("tls-mutual");
    let other = Pki::new("tls-stranger");
    let server = tls_server(&pki, Some(&pki)).await;
    let addr = server.addr.to_string();

    let (cert, key) = pki.client("alice");
    let good = tls::client(Some(&pki.ca()), Some((&cert, &key))).expect("client TLS");
    let mut c = Client::connect_tls(&addr, &good).await.expect("mutual TLS");
    c.ping().await.expect("PING with a client certificate");

    // No certificate, or one from another CA: the handshake (TLS 1.3: the first read) fails.
    let none = tls::client(Some(&pki.ca()), None).expect("client TLS");
    let (cert, key) = other.client("mallory");
    let stranger = tls::client(Some(&pki.ca()), Some((&cert, &key))).expect("client TLS");
    for connector in [none, stranger] {
        let refused = match Client::connect_tls(&addr, &connector).await {
            Err(_) => true,
            Ok(mut c) => c.ping().await.is_err(),
        };
        assert!(refused, "a client without a valid certificate was served");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_on_the_tls_port_is_told_and_closed_promptly() {
    let pki = Pki::new("tls-plain");
    let server = tls_server(&pki, None).await;
    // Speaks the line protocol: one plain line says why, then the server closes.
    let mut talker = Raw::connect(server.addr).await;
    talker.send("PING").await;
    talker
        .expect("ERR TLS this port speaks TLS: connect with TLS (lockctl --tls or --tls-ca)")
        .await;
    talker.expect_eof().await;
    // The library's plain client reads it as a refusal with that code.
    let mut plain = Client::connect(&server.addr.to_string())
        .await
        .expect("TCP connect");
    let refused = plain.ping().await.expect_err("plain text on a TLS port");
    assert_eq!(refused.code(), Some(ErrorCode::Tls), "{refused}");
    // A TLS client still gets a handshake: the first byte is only peeked at.
    let connector = tls::client(Some(&pki.ca()), None).expect("client TLS");
    Client::connect_tls(&server.addr.to_string(), &connector)
        .await
        .expect("TLS connect")
        .ping()
        .await
        .expect("PING over TLS");
    // lockctl without --tls shows the server's line.
    let out = lockctl::output(lockctl::lockctl_at(&server.addr.to_string(), &["status"])).await;
    let stderr = lockctl::stderr(&out);
    assert!(
        stderr.contains("this port speaks TLS: connect with TLS (lockctl --tls or --tls-ca)"),
        "{stderr}"
    );
    assert_ne!(lockctl::code(&out), 0, "{stderr}");
    // Says nothing: closed after the handshake timeout.
    let mut silent = Raw::connect(server.addr).await;
    tokio::time::timeout(GUARD, silent.expect_closed())
        .await
        .expect("a silent client is closed");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_on_a_plain_port_gets_an_error() {
    let pki = Pki::new("tls-mismatch");
    let server = Lockd::new().serve().await;
    let connector = tls::client(Some(&pki.ca()), None).expect("client TLS");
    let result = tokio::time::timeout(
        GUARD,
        Client::connect_tls(&server.addr.to_string(), &connector),
    )
    .await
    .expect("the handshake ends");
    assert!(
        result.is_err(),
        "a TLS handshake with a plain server succeeded"
    );
    server.shutdown().await;
}

/// A plain client whose server answers in TLS records (a TLS proxy in front of lockd, or
/// any TLS server: an alert for the plain text it could not read) says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_reading_tls_records_says_so() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Every connection: read what the client says, answer a fatal TLS 1.2 alert record
    // (decode_error), close.
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32])
                    .await;
                let _ = s.shutdown().await;
                let _ = s.read(&mut buf).await;
            });
        }
    });
    // lockctl shows it (each of its connections gets the alert).
    let out = lockctl::output(lockctl::lockctl_at(&addr.to_string(), &["status"])).await;
    let stderr = lockctl::stderr(&out);
    assert!(
        stderr.contains("this lockd speaks TLS: add --tls or --tls-ca"),
        "{stderr}"
    );
    let mut c = Client::connect(&addr.to_string()).await.expect("connect");
    let err = tokio::time::timeout(GUARD, c.ping())
        .await
        .expect("an answer")
        .expect_err("a TLS record is no reply");
    assert!(
        err.to_string()
            .contains("this lockd speaks TLS: add --tls or --tls-ca"),
        "{err}"
    );
    server.abort();
}

#[test]
fn a_client_certificate_names_its_user() {
    let pki = Pki::new("tls-cn");
    let (cert, _) = pki.client("deploy-bot");
    assert_eq!(
        tls::subject_cn(&Pki::der(&cert)).as_deref(),
        Some("deploy-bot")
    );
    let (server_cert, _) = pki.server();
    assert_eq!(
        tls::subject_cn(&Pki::der(&server_cert)).as_deref(),
        Some("lockd")
    );
}

#[test]
fn bad_files_are_named_in_the_error() {
    let pki = Pki::new("tls-files");
    let (cert, key) = pki.server();
    let missing = pki.dir.join("missing.pem");
    let err = tls::server(&missing, &key, None).expect_err("missing cert");
    assert!(err.contains("missing.pem"), "{err}");
    let err = tls::server(&cert, &cert, None).expect_err("a cert is no key");
    assert!(err.contains("server.pem"), "{err}");
}

/// Mutual TLS with an auth file: a client certificate whose common name is a user logs the
/// connection in as that user, no AUTH needed; any other name must AUTH like anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_naming_a_user_logs_it_in() {
    use lockd::auth::{user_line, Gate, Users};
    let pki = Pki::new("tls-user");
    let (cert, key) = pki.server();
    let tls = tls::server(&cert, &key, Some(&pki.ca())).expect("server TLS");
    let file = [
        user_line(
            "alice lock=build* read=*",
            "alice-secret-0123456789",
            [1; 16],
        )
        .unwrap(),
        user_line("bob lock=* read=*", "bob-secret-0123456789ab", [2; 16]).unwrap(),
    ]
    .join("\n");
    let users = Users::parse(&file, None).expect("users");
    let server = Lockd::new()
        .config(Config {
            tls: Some(tls),
            auth: Some(Gate::new(users)),
            ..config()
        })
        .serve()
        .await;
    let addr = server.addr.to_string();

    let (cert, key) = pki.client("alice");
    let alice = tls::client(Some(&pki.ca()), Some((&cert, &key))).expect("client TLS");
    let mut c = Client::connect_tls(&addr, &alice)
        .await
        .expect("mutual TLS");
    let token = c
        .lock("build-1", "ci", None, None, Default::default())
        .await
        .expect("alice may lock build* without AUTH");
    // Her rights are hers: not deploy.
    let denied = c
        .lock("deploy", "ci", None, None, Default::default())
        .await
        .expect_err("alice has no lock right on deploy");
    assert!(denied.to_string().contains("DENIED"), "{denied}");
    c.unlock("build-1", token).await.expect("UNLOCK");

    // A certificate for a name the file doesn't have: logged in as nobody.
    let (cert, key) = pki.client("carol");
    let carol = tls::client(Some(&pki.ca()), Some((&cert, &key))).expect("client TLS");
    let mut c = Client::connect_tls(&addr, &carol)
        .await
        .expect("mutual TLS");
    let refused = c
        .lock("build-2", "ci", None, None, Default::default())
        .await
        .expect_err("an unknown CN must AUTH first");
    assert!(refused.to_string().contains("NOAUTH"), "{refused}");
    c.auth("bob", "bob-secret-0123456789ab")
        .await
        .expect("AUTH as a user of the file");
    c.lock("build-2", "ci", None, None, Default::default())
        .await
        .expect("then LOCK");
    server.shutdown().await;
}
