//! lockctl tries again what can be mended by trying again: a front-end that answers
//! `ERR UNAVAILABLE` (as a cluster front-end cut off from etcd does) is left for the next
//! address of `--server`, with backoff, for the rest of the wait; with only such front-ends
//! the wait ends with exit code 5 naming the last one and what it said; `-n` answers at once;
//! a running `run` whose RENEW is answered `ERR UNAVAILABLE` renews through the next address
//! and its command runs on.
//!
//! The front-end that can't serve is [`Flaky`]: a line proxy in front of a real lockd that
//! answers LOCK, RENEW and UNLOCK itself with `ERR UNAVAILABLE` when told to, and passes
//! everything else (and everything while it is healthy) through.

use crate::common;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use common::lockctl::*;

/// What [`Flaky`] answers the server itself says when etcd does not answer.
const UNAVAILABLE: &str = "ERR UNAVAILABLE etcd did not answer within 2s; try again";

/// How [`Flaky`] treats LOCK, RENEW and UNLOCK.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    /// Passes them to lockd.
    Pass = 0,
    /// Answers them `ERR UNAVAILABLE` itself; lockd never sees them.
    Unavailable = 1,
    /// Passes the next LOCK to lockd, which grants it, but answers `ERR UNAVAILABLE` in place
    /// of the grant (the answer lost, not the write); then passes everything.
    LoseGrant = 2,
}

/// A front-end in front of a real lockd, told by the test what to do with LOCK and RENEW.
struct Flaky {
    addr: String,
    mode: Arc<AtomicU8>,
    /// The grants it swallowed (their `OK <token>` lines).
    lost: Arc<Mutex<Vec<String>>>,
}

impl Flaky {
    async fn new(to: String, mode: Mode) -> Flaky {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mode = Arc::new(AtomicU8::new(mode as u8));
        let lost = Arc::new(Mutex::new(Vec::new()));
        let (m, l) = (Arc::clone(&mode), Arc::clone(&lost));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(&to).await else {
                    continue;
                };
                tokio::spawn(serve(client, upstream, Arc::clone(&m), Arc::clone(&l)));
            }
        });
        Flaky { addr, mode, lost }
    }

    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn lost_grants(&self) -> Vec<String> {
        self.lost.lock().unwrap().clone()
    }
}

/// One client connection: lines from the client go to lockd or are answered here; lockd's
/// lines go back, except a swallowed grant. One writer task, so that replies never interleave.
async fn serve(
    client: TcpStream,
    upstream: TcpStream,
    mode: Arc<AtomicU8>,
    lost: Arc<Mutex<Vec<String>>>,
) {
    let (cr, mut cw) = client.into_split();
    let (ur, mut uw) = upstream.into_split();
    let (tx, mut rx) = mpsc::channel::<String>(64);
    let writer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if cw.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let swallow = Arc::new(AtomicU8::new(0));
    let (to_client, swallowing) = (tx.clone(), Arc::clone(&swallow));
    let replies = tokio::spawn(async move {
        let mut lines = BufReader::new(ur).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let reply = if swallowing.swap(0, Ordering::SeqCst) == 1 && line.starts_with("OK ") {
                lost.lock().unwrap().push(line);
                UNAVAILABLE.to_owned()
            } else {
                line
            };
            if to_client.send(reply + "\n").await.is_err() {
                break;
            }
        }
    });
    let mut lines = BufReader::new(cr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let asks = ["LOCK ", "RENEW ", "UNLOCK "]
            .iter()
            .any(|verb| line.starts_with(verb));
        let now = mode.load(Ordering::SeqCst);
        if asks && now == Mode::Unavailable as u8 {
            if tx.send(format!("{UNAVAILABLE}\n")).await.is_err() {
                break;
            }
            continue;
        }
        if asks && now == Mode::LoseGrant as u8 && line.starts_with("LOCK ") {
            mode.store(Mode::Pass as u8, Ordering::SeqCst);
            swallow.store(1, Ordering::SeqCst);
        }
        if uw.write_all(format!("{line}\n").as_bytes()).await.is_err() {
            break;
        }
    }
    // The client went: so does the connection to lockd (a session lease sees the close).
    replies.abort();
    writer.abort();
}

/// `run -w 20s` and `acquire -w 20s` with a front-end that answers `ERR UNAVAILABLE` first in
/// `--server`: both are granted through the second, and -v says which front-end answered what
/// and where the next try goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_front_end_is_passed_over_for_the_next() {
    let d = lockd().await;
    let bad = Flaky::new(d.addr.clone(), Mode::Unavailable).await;
    let list = format!("{},{}", bad.addr, d.addr);

    let out = output(lockctl_at(
        &list,
        &["-v", "run", "-w", "20s", "ua-run", "--", "true"],
    ))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "lock ua-run: lockd at {} answered ERR UNAVAILABLE",
            bad.addr
        )) && err.contains(&format!("; trying {} in ", d.addr)),
        "says who answered what and where it goes next: {err}"
    );
    assert!(err.contains("acquired ua-run token "), "{err}");

    let out = output(lockctl_at(
        &list,
        &["acquire", "-w", "20s", "ua-acq", "--ttl", "1m"],
    ))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token: u64 = stdout(&out).trim().parse().unwrap();
    assert_eq!(d.holder("ua-acq").await, Some(token));
}

/// With only a front-end that answers `ERR UNAVAILABLE`, `run -w` and `acquire -w` give up
/// when the wait is over, with exit code 5 (neither the conflict code nor a usage error) and
/// one line naming the front-end and what it said; the command never runs. -n answers at
/// once (within its short connect timeout, not the patient one), with the same code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_unavailable_front_ends_is_exit_5_after_the_wait() {
    let d = lockd().await;
    let bad = Flaky::new(d.addr.clone(), Mode::Unavailable).await;
    let dir = scratch("retry-unavailable");
    let ran = dir.join("ran");
    let touch = format!("touch {}", ran.display());
    let wait = Duration::from_secs(2);

    for args in [
        vec!["run", "-w", "2s", "ua-none", "-c", &touch],
        vec!["acquire", "-w", "2s", "ua-none"],
    ] {
        let started = Instant::now();
        let out = output(lockctl_at(&bad.addr, &args)).await;
        assert_eq!(code(&out), 5, "{args:?}: {}", stderr(&out));
        assert!(
            started.elapsed() >= wait,
            "{args:?} gave up before its wait"
        );
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("unavailable for the whole wait (2s)"), "{err}");
        assert!(
            err.contains(&format!(
                "lockd at {} answered ERR UNAVAILABLE etcd did not answer",
                bad.addr
            )),
            "{err}"
        );
    }
    assert!(!ran.exists(), "the command ran");
    assert_eq!(d.holder("ua-none").await, None);

    // -n: one try, well within the patient connect timeout (10s) it would get otherwise.
    for args in [
        vec!["run", "-n", "ua-none", "-c", &touch],
        vec!["acquire", "-n", "ua-none"],
    ] {
        let started = Instant::now();
        let out = output(lockctl_at(&bad.addr, &args)).await;
        assert_eq!(code(&out), 5, "{args:?}: {}", stderr(&out));
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{args:?} took {:?}",
            started.elapsed()
        );
        assert!(stderr(&out).contains("ERR UNAVAILABLE"), "{}", stderr(&out));
    }
    assert!(!ran.exists(), "the command ran");

    // -n tries each address once: the healthy second one grants it.
    let list = format!("{},{}", bad.addr, d.addr);
    let out = output(lockctl_at(&list, &["acquire", "-n", "ua-n", "--ttl", "1m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// `run -n` and `acquire -n` against a server that is down answer within the one-shot
/// connect timeout (2s), exit 3, not after the patient one (10s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonblocking_against_a_down_server_answers_soon() {
    let dead = common::dead_addr();
    for args in [
        vec!["run", "-n", "down", "--", "true"],
        vec!["acquire", "-n", "down"],
    ] {
        let started = Instant::now();
        let out = output(lockctl_at(&dead, &args)).await;
        assert_eq!(code(&out), 3, "{args:?}: {}", stderr(&out));
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

/// A LOCK that lockd granted but whose answer was lost (`ERR UNAVAILABLE` in its place) is
/// sent again with the same id, through the next address: it gets that same grant back, and
/// no second token is ever handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_is_taken_up_by_the_same_lock_again() {
    let d = lockd().await;
    let lossy = Flaky::new(d.addr.clone(), Mode::LoseGrant).await;
    let list = format!("{},{}", lossy.addr, d.addr);
    let out = output(lockctl_at(
        &list,
        &["--id", "same", "acquire", "-w", "20s", "lg", "--ttl", "1m"],
    ))
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    assert_eq!(lossy.lost_grants(), vec![format!("OK {token}")]);
    assert_eq!(d.holder("lg").await, Some(token.parse().unwrap()));
}

/// A running `run` whose front-end starts answering RENEW with `ERR UNAVAILABLE`: lockctl
/// renews through the next address instead, the lease (the same token) lives on there, and
/// the command runs to its end with exit code 0. A short ttl, so that several renewals fall
/// in the test: every one after the switch would fail without the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_move_to_the_next_address_on_unavailable() {
    let d = lockd().await;
    let flaky = Flaky::new(d.addr.clone(), Mode::Pass).await;
    let list = format!("{},{}", flaky.addr, d.addr);
    let dir = scratch("retry-renew");
    let go = dir.join("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", go.display());
    let mut child = spawn(lockctl_at(
        &list,
        &["-v", "run", "rn", "--ttl", "3s", "-c", &script],
    ));
    let mut err = stderr_lines(&mut child);
    let acquired = line_with(&mut err, "acquired rn token ").await;
    let token = token_after(&acquired);
    line_with(&mut err, &format!("renewed rn token {token}")).await;

    flaky.set(Mode::Unavailable);
    let failed = line_with(&mut err, "renewing rn failed").await;
    assert!(
        failed.contains(&format!("lockd at {} answered ERR UNAVAILABLE", flaky.addr))
            && failed.contains(&format!("trying {} in ", d.addr)),
        "{failed}"
    );
    line_with(&mut err, &format!("renewed rn token {token} again")).await;
    // Renewals go on through the healthy address, several lease lengths long.
    let until = Instant::now() + Duration::from_secs(7);
    while Instant::now() < until {
        let line = timeout(GUARD, err.next_line())
            .await
            .expect("lockctl went quiet")
            .unwrap()
            .expect("stderr ended");
        assert!(!line.contains("lost"), "{line}");
    }
    assert_eq!(d.holder("rn").await, Some(token));

    std::fs::write(&go, "").unwrap();
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(d.holder("rn").await, None);
}

/// The one-shot `renew` and `release` send their request again through the next address
/// when a front-end answers `ERR UNAVAILABLE`; with only such a front-end they give up after
/// their short connect timeout with exit code 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_and_release_try_the_next_address() {
    let d = lockd().await;
    let bad = Flaky::new(d.addr.clone(), Mode::Unavailable).await;
    let list = format!("{},{}", bad.addr, d.addr);
    let mut c = d.client().await;
    let token = c
        .lock(
            "os",
            "me",
            Some(Duration::from_secs(60)),
            None,
            lockd::proto::Tie::Plain,
        )
        .await
        .unwrap()
        .to_string();

    for args in [
        vec!["renew", "os", token.as_str(), "--ttl", "2m"],
        vec!["release", "os", token.as_str()],
    ] {
        let started = Instant::now();
        let out = output(lockctl_at(&bad.addr, &args)).await;
        assert_eq!(code(&out), 5, "{args:?}: {}", stderr(&out));
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{args:?} took {:?}",
            started.elapsed()
        );
        let err = stderr(&out);
        assert!(err.contains("answered ERR UNAVAILABLE"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert_eq!(d.holder("os").await, Some(token.parse().unwrap()));

    let out = output(lockctl_at(&list, &["renew", "os", &token, "--ttl", "2m"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = output(lockctl_at(&list, &["release", "os", &token])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.holder("os").await, None);
}

/// `watch` whose front-end goes away carries on through the next address: it goes on
/// printing events instead of exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_carries_on_through_the_next_address() {
    use tokio::io::AsyncReadExt as _;

    let d = lockd().await;
    let p = proxy(d.addr.clone()).await;
    let list = format!("{},{}", p.addr, d.addr);
    let mut child = spawn(lockctl_at(&list, &["watch", "wn"]));
    let mut events = child.stdout.take().unwrap();
    let mut c = d.client().await;
    // Events until one shows with id `id`.
    async fn seen(
        c: &mut lockd::client::Client,
        events: &mut tokio::process::ChildStdout,
        id: &str,
    ) {
        let mut text = String::new();
        let give_up = Instant::now() + GUARD;
        while !text.contains(&format!(" acquired wn id={id} ")) {
            assert!(Instant::now() < give_up, "no events: {text:?}");
            let t = c
                .lock("wn", id, None, None, lockd::proto::Tie::Plain)
                .await
                .unwrap();
            c.unlock("wn", t).await.unwrap();
            let mut buf = [0u8; 1024];
            if let Ok(Ok(n)) = timeout(Duration::from_millis(200), events.read(&mut buf)).await {
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    }
    seen(&mut c, &mut events, "before").await;
    p.refuse(true);
    p.cut();
    seen(&mut c, &mut events, "after").await;
    assert!(child.try_wait().unwrap().is_none(), "watch ended");
    signal(&child, libc::SIGINT);
    let status = timeout(GUARD, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}
