//! Notes (`LOCK ... note=<text>`) and blocked-by answers: a note travels as the rest of a LOCK
//! line and comes back percent-encoded, last, on every line that shows its holder; a LOCK
//! refused because the name is held says who holds it, to a user who may read the name.

use crate::common;

mod lockctl;

use std::time::Duration;

use common::durable::TempDir;
use common::{field, Lockd, Raw, TestServer};
use lockd::auth::{user_line, Gate, Users};
use lockd::proto::note::decode_note;

/// A note with every kind of character the encoding escapes: spaces, `%`, UTF-8.
const NOTE: &str = "release 1.4.2 by ci job 8812: 100% ☃";
const NOTE_ENCODED: &str = "release%201.4.2%20by%20ci%20job%208812:%20100%25%20%E2%98%83";

async fn server() -> TestServer {
    Lockd::new().serve().await
}

/// The note of a reply line, decoded.
fn note_of(line: &str) -> Option<String> {
    decode_note(&field(line, "note")?)
}

#[tokio::test]
async fn a_note_round_trips_through_status_detail_info_and_watch() {
    let s = server().await;
    let mut watcher = s.raw().await;
    assert_eq!(watcher.req("WATCH deploy").await, "OK watching deploy");
    let mut c = s.raw().await;
    let token = c.lock(&format!("deploy ci-42 ttl=5m note={NOTE}")).await;

    let status = c.req("STATUS deploy").await;
    assert!(
        status.starts_with(&format!("OK deploy held id=ci-42 token={token} ")),
        "{status}"
    );
    assert!(
        status.ends_with(&format!(" note={NOTE_ENCODED}")),
        "{status}"
    );
    assert_eq!(note_of(&status).as_deref(), Some(NOTE));

    c.send("STATUS").await;
    let info = c.line().await;
    assert!(info.starts_with("INFO deploy held id=ci-42 "), "{info}");
    assert!(info.ends_with(&format!(" note={NOTE_ENCODED}")), "{info}");
    assert_eq!(c.line().await, "OK 1");

    c.send("STATUS deploy detail").await;
    let holder = c.line().await;
    assert!(holder.starts_with("HOLDER deploy id=ci-42 "), "{holder}");
    assert!(
        holder.ends_with(&format!(" note={NOTE_ENCODED}")),
        "{holder}"
    );
    let last = c.line().await;
    assert_eq!(note_of(&last).as_deref(), Some(NOTE), "{last}");

    let event = watcher.line().await;
    let prefix = format!("EVENT acquired deploy ci-42 {token} ");
    assert!(event.starts_with(&prefix), "{event}");
    assert!(event.ends_with(&format!(" note={NOTE_ENCODED}")), "{event}");
    assert_eq!(event.split(' ').count(), 7, "{event}");

    // Events other than acquired, and locks without a note, have no note field.
    assert_eq!(c.req(&format!("UNLOCK deploy {token}")).await, "OK");
    let released = watcher.line().await;
    assert!(!released.contains("note="), "{released}");
    let plain = c.lock("deploy ci-43").await;
    let status = c.req("STATUS deploy").await;
    assert!(!status.contains("note="), "{status}");
    let acquired = watcher.line().await;
    assert_eq!(acquired.split(' ').count(), 6, "{acquired}");
    assert!(acquired.starts_with(&format!("EVENT acquired deploy ci-43 {plain} ")));
}

#[tokio::test]
async fn note_is_last_and_takes_the_rest_of_the_line() {
    let s = server().await;
    let mut c = s.raw().await;
    // wait=0 after note= is part of the note; trailing blanks are dropped.
    let token = c.lock("n a note=x  wait=0 \t ").await;
    let status = c.req("STATUS n").await;
    assert_eq!(note_of(&status).as_deref(), Some("x  wait=0"), "{status}");
    assert!(status.ends_with(" note=x%20%20wait=0"), "{status}");
    // An empty note is none.
    assert_eq!(c.req(&format!("UNLOCK n {token}")).await, "OK");
    c.lock("n a note=   ").await;
    let status = c.req("STATUS n").await;
    assert!(!status.contains("note="), "{status}");
}

#[tokio::test]
async fn bad_notes_are_refused_and_change_nothing() {
    let s = server().await;
    let mut c = s.raw().await;
    let long = "x".repeat(lockd::DEFAULT_MAX_NOTE + 1);
    let reply = c.req(&format!("LOCK n a note={long}")).await;
    assert!(reply.starts_with("ERR BADARG note is 257 bytes"), "{reply}");
    let reply = c.req("LOCK n a note=ring \u{7} bell").await;
    assert!(reply.starts_with("ERR BADARG "), "{reply}");
    let reply = c.req("LOCK n a note=tab\tinside").await;
    assert!(reply.starts_with("ERR BADARG "), "{reply}");
    assert_eq!(c.req("STATUS n").await, "OK n free");
    // Exactly at the limit is fine.
    let ok = "y".repeat(lockd::DEFAULT_MAX_NOTE);
    c.lock(&format!("n a note={ok}")).await;
    assert_eq!(
        note_of(&c.req("STATUS n").await).as_deref(),
        Some(ok.as_str())
    );
}

#[tokio::test]
async fn max_note_is_a_flag() {
    let lockd = Lockd::new().args(["--max-note", "8"]).spawn();
    let mut c = lockd.raw().await;
    let reply = c.req("LOCK n a note=123456789").await;
    assert!(
        reply.starts_with("ERR BADARG note is 9 bytes; this server allows at most 8"),
        "{reply}"
    );
    assert_eq!(c.req("STATUS n").await, "OK n free");
    c.lock("n a note=12345678").await;
    let status = c.req("STATUS n").await;
    assert!(status.ends_with(" note=12345678"), "{status}");
}

#[tokio::test]
async fn a_retry_keeps_its_note_unless_it_brings_one() {
    let s = server().await;
    let mut c = s.raw().await;
    let token = c.lock("n a note=first").await;
    assert_eq!(c.lock("n a ttl=1m").await, token);
    assert_eq!(note_of(&c.req("STATUS n").await).as_deref(), Some("first"));
    assert_eq!(c.lock("n a note=second try").await, token);
    assert_eq!(
        note_of(&c.req("STATUS n").await).as_deref(),
        Some("second try")
    );
}

#[tokio::test]
async fn a_waiter_s_note_is_the_holder_s_once_granted() {
    let s = server().await;
    let mut holder = s.raw().await;
    let token = holder.lock("n a note=first").await;
    let mut waiter = s.raw().await;
    waiter.send("LOCK n b note=next in line").await;
    common::wait_waiters(&mut holder, "n", 1).await;
    assert_eq!(holder.req(&format!("UNLOCK n {token}")).await, "OK");
    let granted = common::token(&waiter.line().await);
    let status = holder.req("STATUS n").await;
    assert!(
        status.contains(&format!(" id=b token={granted} ")),
        "{status}"
    );
    assert_eq!(note_of(&status).as_deref(), Some("next in line"));
}

/// The fields of a blocked-by answer after its fixed start.
fn blocked_fields(reply: &str, start: &str) -> Vec<(String, String)> {
    let rest = reply
        .strip_prefix(start)
        .unwrap_or_else(|| panic!("{reply:?} should start with {start:?}"));
    rest.split(' ')
        .map(|w| {
            let (k, v) = w
                .split_once('=')
                .unwrap_or_else(|| panic!("{w:?} in {reply:?}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn keys(fields: &[(String, String)]) -> Vec<&str> {
    fields.iter().map(|(k, _)| k.as_str()).collect()
}

fn value<'a>(fields: &'a [(String, String)], key: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map_or("", |(_, v)| v.as_str())
}

#[tokio::test]
async fn wait_0_and_a_wait_that_ran_out_say_who_blocks() {
    let s = server().await;
    let mut holder = s.raw().await;
    holder
        .lock(&format!("deploy ci-42 ttl=5m note={NOTE}"))
        .await;
    let mut queued = s.raw().await;
    queued.send("LOCK deploy q").await;
    common::wait_waiters(&mut holder, "deploy", 1).await;

    let mut c = s.raw().await;
    let reply = c.req("LOCK deploy other wait=0").await;
    let f = blocked_fields(&reply, "ERR TIMEOUT deploy: held by ci-42 ");
    assert_eq!(keys(&f), ["held_ms", "waiters", "note"], "{reply}");
    assert_eq!(value(&f, "waiters"), "1");
    assert!(value(&f, "held_ms").parse::<u64>().is_ok(), "{reply}");
    assert_eq!(value(&f, "note"), NOTE_ENCODED);

    let reply = c.req("LOCK deploy other wait=100ms").await;
    let f = blocked_fields(
        &reply,
        "ERR TIMEOUT deploy still held after waiting 100ms; held by ci-42 ",
    );
    assert_eq!(keys(&f), ["held_ms", "waiters", "note"], "{reply}");
    assert_eq!(value(&f, "waiters"), "1", "{reply}");

    // Without a note: no note field.
    let mut p = s.raw().await;
    p.lock("plain p").await;
    let reply = c.req("LOCK plain other wait=0").await;
    let f = blocked_fields(&reply, "ERR TIMEOUT plain: held by p ");
    assert_eq!(keys(&f), ["held_ms", "waiters"], "{reply}");
}

const ALICE: &str = "alice-secret-0123456789abcdef";
const CAROL: &str = "carol-secret-0123456789abcdef";

/// alice may lock and read deploy; carol may only lock it.
async fn auth_server() -> TestServer {
    let line = |spec: &str, secret: &str| user_line(spec, secret, [3; 16]).unwrap();
    let users = [
        line("alice lock=deploy read=deploy", ALICE),
        line("carol lock=deploy", CAROL),
    ]
    .join("\n");
    let users = Users::parse(&users, None).unwrap();
    Lockd::new()
        .config(lockd::server::Config {
            auth: Some(Gate::new(users)),
            ..common::config()
        })
        .serve()
        .await
}

async fn login(s: &TestServer, user: &str, secret: &str) -> Raw {
    let mut c = s.raw().await;
    assert_eq!(
        c.req(&format!("AUTH {user} {secret}")).await,
        format!("OK {user}")
    );
    c
}

#[tokio::test]
async fn blocked_by_details_are_for_readers_only() {
    let s = auth_server().await;
    let mut alice = login(&s, "alice", ALICE).await;
    alice.lock("deploy a-1 note=hands off").await;

    let mut reader = login(&s, "alice", ALICE).await;
    let reply = reader.req("LOCK deploy a-2 wait=0").await;
    let f = blocked_fields(&reply, "ERR TIMEOUT deploy: held by a-1 ");
    assert_eq!(keys(&f), ["user", "held_ms", "waiters", "note"], "{reply}");
    assert_eq!(value(&f, "user"), "alice");
    assert_eq!(value(&f, "note"), "hands%20off");

    let mut carol = login(&s, "carol", CAROL).await;
    assert_eq!(
        carol.req("LOCK deploy c-1 wait=0").await,
        "ERR TIMEOUT deploy: held"
    );
    assert_eq!(
        carol.req("LOCK deploy c-1 wait=50ms").await,
        "ERR TIMEOUT deploy still held after waiting 50ms"
    );
}

#[tokio::test]
async fn notes_survive_a_data_dir_restart() {
    let dir = TempDir::new("notes");
    let s = Lockd::new().data_dir(dir.data()).serve().await;
    let mut c = s.raw().await;
    let token = c.lock(&format!("deploy ci-42 ttl=5m note={NOTE}")).await;
    let plain = c.lock("other ci-43 ttl=5m").await;
    // A retry without a note keeps it, through the journal too.
    assert_eq!(c.lock("deploy ci-42 ttl=5m").await, token);
    drop(c);
    s.shutdown().await;

    let s = Lockd::new().data_dir(dir.data()).serve().await;
    let mut c = s.raw().await;
    let status = c.req("STATUS deploy").await;
    assert!(
        status.starts_with(&format!("OK deploy held id=ci-42 token={token} ")),
        "{status}"
    );
    assert_eq!(note_of(&status).as_deref(), Some(NOTE), "{status}");
    let status = c.req("STATUS other").await;
    assert!(status.contains(&format!(" token={plain} ")), "{status}");
    assert!(!status.contains("note="), "{status}");
    let _ = Duration::ZERO;
}
