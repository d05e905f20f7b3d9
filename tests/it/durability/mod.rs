//! `--data-dir`: what a restart of the real binary keeps, and what a crash can't break.
//!
//! Every test runs `lockd` as a child process on a data directory in a temp dir, kills it
//! (SIGKILL unless said otherwise) and starts it again on the same files.

use crate::common;

mod modes;
mod readyz_journal;
mod sets;

use std::collections::HashMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::durable::{DurableLockd, Rng, TempDir, PATIENCE};
use common::free_port;
use lockd::client::{Client, ClientError};
use lockd::proto::{ErrorCode, Tie};

const MINUTE: Option<Duration> = Some(Duration::from_secs(60));

/// Bounds a whole test: a hang is a failure, not a stuck CI job.
async fn bounded<F: std::future::Future>(limit: Duration, f: F) -> F::Output {
    tokio::time::timeout(limit, f)
        .await
        .expect("test did not finish in time")
}

/// The STATUS line of one lock.
async fn status(c: &mut Client, name: &str) -> String {
    c.status(Some(name)).await.expect("STATUS").remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_live_holders_and_their_tokens() {
    bounded(PATIENCE * 3, async {
        let dir = TempDir::new("restart");
        let port = free_port();
        let lockd = DurableLockd::start(&dir, port).await;
        let mut holder = lockd.client().await;
        let token = holder
            .lock("job", "holder", MINUTE, None, Tie::Plain)
            .await
            .unwrap();
        let mut session_holder = lockd.client().await;
        let session_token = session_holder
            .lock(
                "sess",
                "sess-holder",
                MINUTE,
                None,
                Tie::Session(Duration::ZERO),
            )
            .await
            .unwrap();
        lockd.crash();
        drop((holder, session_holder));

        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = lockd.client().await;
        let job = status(&mut c, "job").await;
        assert!(
            job.contains(&format!("held id=holder token={token} ")),
            "{job}"
        );
        // A session lease whose connection died with the old process is now a plain lease.
        let sess = status(&mut c, "sess").await;
        assert!(
            sess.contains(&format!("held id=sess-holder token={session_token} "))
                && sess.contains("session=0"),
            "{sess}"
        );

        // A second client queues behind the restored holder and is not granted.
        let mut other = lockd.client().await;
        let waiting =
            tokio::spawn(async move { other.lock("job", "other", MINUTE, None, Tie::Plain).await });
        let queued_at = Instant::now();
        while !status(&mut c, "job").await.contains("waiters=1") {
            assert!(
                queued_at.elapsed() < PATIENCE,
                "the second LOCK never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "granted while the restored lease is live"
        );

        // The holder comes back with its old token: RENEW and UNLOCK work.
        let mut holder = lockd.client().await;
        let left = holder.renew("job", token, None).await.unwrap();
        assert!(
            left > Duration::from_secs(30),
            "renewed with its own ttl: {left:?}"
        );
        holder.unlock("job", token).await.unwrap();
        let granted = tokio::time::timeout(PATIENCE, waiting)
            .await
            .expect("the waiter was not granted after UNLOCK")
            .expect("waiter task")
            .expect("waiter LOCK");
        assert!(granted > token, "{granted} after {token}");

        let mut session_holder = lockd.client().await;
        session_holder
            .renew("sess", session_token, None)
            .await
            .unwrap();
        session_holder.unlock("sess", session_token).await.unwrap();
        assert_eq!(status(&mut c, "sess").await, "sess free");
    })
    .await;
}

/// One client's hold of a name: from the moment it read `OK <token>` to the moment it sent
/// its UNLOCK (a subset of the server's lease, so overlapping holds are real overlaps).
#[derive(Debug, Clone)]
struct Held {
    name: &'static str,
    token: u64,
    from: Duration,
    to: Duration,
    worker: usize,
}

const NAMES: [&str; 4] = ["n0", "n1", "n2", "n3"];

fn is_connection_error(e: &ClientError) -> bool {
    match e {
        ClientError::Io(_) | ClientError::Closed => true,
        // A graceful stop is not part of this test, but a refusal to grant is never a grant.
        ClientError::Refused(p) => p.code == ErrorCode::Shutdown,
        ClientError::Unexpected(_) => false,
    }
}

/// LOCK/UNLOCK in a loop through crashes and restarts, until `stop` and nothing is held.
async fn worker(
    worker: usize,
    addr: String,
    stop: Arc<AtomicBool>,
    epoch: Instant,
    mut rng: Rng,
) -> Vec<Held> {
    let id = format!("worker-{worker}");
    let mut held = Vec::new();
    let mut conn: Option<Client> = None;
    // A LOCK whose answer was lost with the connection: it may have been granted, so ask for
    // the same name again (a repeat by the holder gets its token at once).
    let mut unsure: Option<&'static str> = None;
    // What this worker holds, and when it first sent its UNLOCK.
    let mut holding: Option<(&'static str, u64, Duration, Option<Duration>)> = None;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping && holding.is_none() && unsure.is_none() {
            return held;
        }
        let Some(c) = conn.as_mut() else {
            match Client::connect(&addr).await {
                Ok(c) => conn = Some(c),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
            continue;
        };
        if let Some((name, token, from, sent)) = holding.as_mut() {
            let to = *sent.get_or_insert_with(|| epoch.elapsed());
            match c.unlock(name, *token).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(ErrorCode::NotHeld) => {}
                Err(e) if is_connection_error(&e) => {
                    conn = None;
                    continue;
                }
                Err(e) => panic!("{id}: UNLOCK {name} {token}: {e}"),
            }
            held.push(Held {
                name,
                token: *token,
                from: *from,
                to,
                worker,
            });
            holding = None;
            continue;
        }
        let name = unsure.unwrap_or(NAMES[rng.below(NAMES.len() as u64) as usize]);
        unsure = Some(name);
        let wait = if stopping {
            Duration::ZERO
        } else {
            Duration::from_secs(2)
        };
        match c
            .lock(
                name,
                &id,
                Some(Duration::from_secs(30)),
                Some(wait),
                Tie::Plain,
            )
            .await
        {
            Ok(token) => {
                holding = Some((name, token, epoch.elapsed(), None));
                unsure = None;
                tokio::time::sleep(Duration::from_micros(rng.below(3000))).await;
            }
            // Not granted: a holder asking again would have been answered at once.
            Err(e) if e.code() == Some(ErrorCode::Timeout) => unsure = None,
            Err(e) if is_connection_error(&e) => conn = None,
            Err(e) => panic!("{id}: LOCK {name}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashes_under_load_never_grant_a_lock_twice() {
    bounded(PATIENCE * 6, async {
        let dir = TempDir::new("crash");
        let port = free_port();
        let mut lockd = DurableLockd::start(&dir, port).await;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        eprintln!("seed {seed}");
        let mut rng = Rng::new(seed);
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let workers: Vec<_> = (0..16)
            .map(|i| {
                let worker_rng = Rng::new(seed.wrapping_add(1 + i as u64).wrapping_mul(31));
                tokio::spawn(worker(
                    i,
                    lockd.addr.clone(),
                    Arc::clone(&stop),
                    epoch,
                    worker_rng,
                ))
            })
            .collect();

        const CRASHES: usize = 8;
        for _ in 0..CRASHES {
            tokio::time::sleep(Duration::from_millis(150 + rng.below(400))).await;
            lockd.crash();
            lockd = DurableLockd::start(&dir, port).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for w in workers {
            all.extend(
                tokio::time::timeout(PATIENCE, w)
                    .await
                    .expect("a worker did not finish")
                    .expect("worker panicked"),
            );
        }

        eprintln!("{} holds over {CRASHES} crashes", all.len());
        assert!(
            all.len() >= 20,
            "too little work to mean anything: {}",
            all.len()
        );
        let mut by_name: HashMap<&str, Vec<Held>> = HashMap::new();
        for h in all.iter().cloned() {
            by_name.entry(h.name).or_default().push(h);
        }
        for (name, mut holds) in by_name {
            holds.sort_by_key(|h| h.from);
            for pair in holds.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                assert!(
                    b.from >= a.to,
                    "{name}: worker {} held {:?}..{:?} (token {}) while worker {} was \
                     granted at {:?} (token {})",
                    a.worker,
                    a.from,
                    a.to,
                    a.token,
                    b.worker,
                    b.from,
                    b.token
                );
                assert!(
                    b.token > a.token,
                    "{name}: token {} granted after {}",
                    b.token,
                    a.token
                );
            }
        }
        let mut c = lockd.client().await;
        assert!(c.status(None).await.unwrap().is_empty(), "all released");
        lockd.stop();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_record_is_dropped_with_a_warning() {
    bounded(PATIENCE * 3, async {
        let dir = TempDir::new("torn");
        let port = free_port();
        let lockd = DurableLockd::start(&dir, port).await;
        let a = lockd
            .client()
            .await
            .lock("a", "me", MINUTE, None, Tie::Plain)
            .await
            .unwrap();
        lockd.crash();

        // Half of a record, as a crash in the middle of a write leaves it.
        let log = dir.log_file();
        let frames = common::durable::frames(&log);
        let bytes = fs::read(&log).unwrap();
        let (start, end) = frames[0];
        common::durable::append(&log, &bytes[start..start + (end - start) / 2]);

        let lockd = DurableLockd::start(&dir, port).await;
        assert!(
            lockd.stderr_text().contains("torn"),
            "{}",
            lockd.stderr_text()
        );
        let mut c = lockd.client().await;
        assert!(status(&mut c, "a").await.contains(&format!("token={a} ")));
        let b = c.lock("b", "me", MINUTE, None, Tie::Plain).await.unwrap();
        assert!(b > a);
        lockd.crash();

        // Garbage after good records: also a torn tail. The record written after the first
        // cut must have landed where the torn bytes were, or it would be lost now.
        common::durable::append(&dir.log_file(), &[0x5a, 0x00, 0x00, 0x00, 0x13, 0x37, 0xff]);
        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = lockd.client().await;
        assert!(status(&mut c, "a").await.contains(&format!("token={a} ")));
        assert!(status(&mut c, "b").await.contains(&format!("token={b} ")));
        lockd.stop();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_before_good_records_stops_the_start_naming_the_file() {
    bounded(PATIENCE * 3, async {
        let dir = TempDir::new("damaged");
        let port = free_port();
        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = lockd.client().await;
        c.lock("a", "me", MINUTE, None, Tie::Plain).await.unwrap();
        c.lock("b", "me", MINUTE, None, Tie::Plain).await.unwrap();
        lockd.crash();

        let log = dir.log_file();
        let frames = common::durable::frames(&log);
        assert!(
            frames.len() >= 2,
            "one flush per answered request: {frames:?}"
        );
        let mut bytes = fs::read(&log).unwrap();
        bytes[frames[0].0 + 12] ^= 0x01;
        fs::write(&log, &bytes).unwrap();

        let (status, stderr) = common::durable::start_expecting_failure(&dir, port);
        assert!(!status.success(), "started on a damaged log: {stderr}");
        let file = log.file_name().unwrap().to_str().unwrap();
        assert!(
            stderr.contains(file) && stderr.contains("damaged"),
            "{stderr}"
        );
        // Nothing was "repaired": the damage is still there for a person to look at.
        assert_eq!(fs::read(&log).unwrap(), bytes);

        // A damaged snapshot is refused the same way.
        let dir = TempDir::new("damaged-snapshot");
        fs::create_dir_all(dir.data()).unwrap();
        fs::write(dir.data().join("leases.snapshot"), b"LOCKDSN1 not really").unwrap();
        let (status, stderr) = common::durable::start_expecting_failure(&dir, port);
        assert!(!status.success(), "started on a damaged snapshot: {stderr}");
        assert!(stderr.contains("leases.snapshot"), "{stderr}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lockd_on_the_same_directory_refuses_to_start() {
    bounded(PATIENCE * 3, async {
        let dir = TempDir::new("second");
        let lockd = DurableLockd::start(&dir, free_port()).await;
        let (status, stderr) = common::durable::start_expecting_failure(&dir, free_port());
        assert!(!status.success());
        assert!(
            stderr.contains("in use") && stderr.contains(&*dir.data().to_string_lossy()),
            "{stderr}"
        );
        lockd.client().await.ping().await.unwrap();
        assert!(lockd.stop().success());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_continue_above_the_old_ones_with_no_live_lease() {
    bounded(PATIENCE * 3, async {
        let dir = TempDir::new("tokens");
        let port = free_port();

        // A token far above the wall-clock seed, whose lease has already ended: only the
        // data directory can know about it.
        let high: u64 = 1 << 52;
        {
            let (mut store, _) =
                lockd::store::Store::open(&dir.data(), Default::default()).unwrap();
            let journal = store.journal();
            let now = Instant::now();
            let seq = journal.append(
                &mut vec![lockd::locks::Change::Grant {
                    name: "old".into(),
                    id: "gone".into(),
                    token: high,
                    ttl: Duration::from_millis(1),
                    deadline: now,
                    mode: Default::default(),
                    user: lockd::locks::NO_USER,
                    // As an older lockd wrote it: who took it and when, not known.
                    origin: Default::default(),
                    granted_unix_ms: 0,
                    note: None,
                }],
                now,
                |_| None,
            );
            journal.durable(seq).await.unwrap();
            store.close().unwrap();
        }

        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = lockd.client().await;
        assert_eq!(status(&mut c, "old").await, "old free");
        let t1 = c.lock("a", "me", MINUTE, None, Tie::Plain).await.unwrap();
        assert!(t1 > high, "{t1} <= {high}");
        c.unlock("a", t1).await.unwrap();
        assert!(lockd.stop().success(), "graceful stop");

        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = lockd.client().await;
        let t2 = c.lock("a", "me", MINUTE, None, Tie::Plain).await.unwrap();
        assert!(t2 > t1, "{t2} <= {t1}");
        c.unlock("a", t2).await.unwrap();
        lockd.crash();

        let lockd = DurableLockd::start(&dir, port).await;
        let t3 = lockd
            .client()
            .await
            .lock("b", "me", MINUTE, None, Tie::Plain)
            .await
            .unwrap();
        assert!(t3 > t2, "{t3} <= {t2}");
    })
    .await;
}

/// A restored lease's hold time counts from its grant, not from the restart: STATUS
/// detail's `held_ms` (and the audit line's, at its end) goes on from before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_lease_is_held_since_its_grant() {
    bounded(PATIENCE * 3, async {
        let dir = TempDir::new("held-since-grant");
        let port = free_port();
        let lockd = DurableLockd::start(&dir, port).await;
        let mut holder = lockd.client().await;
        holder
            .lock("long-job", "holder", MINUTE, None, Tie::Plain)
            .await
            .unwrap();
        let before = Duration::from_millis(1500);
        tokio::time::sleep(before).await;
        lockd.crash();
        drop(holder);

        let lockd = DurableLockd::start(&dir, port).await;
        let mut c = lockd.client().await;
        let detail = c.detail("long-job").await.expect("detail");
        let held = detail.holders[0].held;
        assert!(
            held >= before,
            "held for {held:?} after {before:?} before the restart"
        );
        lockd.stop();
    })
    .await;
}
