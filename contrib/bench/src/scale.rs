//! Many connections and many locks: waiters on one lock, a million held locks, and a burst of
//! expiries. Memory is the server's resident set from /proc, so run each of these on a
//! freshly started server (run.sh does): an allocator keeps what it once grew to.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::stats::{self, rss_bytes, Held, XorShift};
use crate::wire::{encode, Line, Redis, Resp};
use crate::{Out, Target};

/// Connections opened at once while setting up (below every listen backlog).
const CONNECTING_AT_ONCE: usize = 200;
/// Connections used to fill the table, and requests per pipelined batch on each.
const FILLERS: usize = 8;
const BATCH: usize = 1000;
/// How long the server is left to settle before its memory is read.
const SETTLE: Duration = Duration::from_millis(500);

fn ns(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

async fn bounded<T>(
    limit: Duration,
    what: &str,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: overran {limit:?}"),
        )),
    }
}

/// What finished within `cap`; the rest are cancelled.
async fn drain<T: 'static>(set: &mut JoinSet<io::Result<T>>, cap: Duration) -> io::Result<Vec<T>> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + cap;
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(r)) => out.push(r.map_err(io::Error::other)??),
            Ok(None) => return Ok(out),
            Err(_) => {
                set.abort_all();
                while set.join_next().await.is_some() {}
                return Ok(out);
            }
        }
    }
}

async fn collect<T: 'static>(set: &mut JoinSet<io::Result<T>>) -> io::Result<Vec<T>> {
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.map_err(io::Error::other)??);
    }
    Ok(out)
}

/// `n` connections wait on one held lock; then it is released and they drain through it.
///
/// Draining stops at `cap`; a drain not done by then is reported as extrapolated from its rate
/// (Redis pollers can take minutes, and every run must stay bounded).
pub async fn waiters(
    t: Target,
    n: usize,
    pid: u32,
    retry: Duration,
    cap: Duration,
    out: &Out,
) -> io::Result<()> {
    const NAME: &str = "bench-waiters";
    let limit = Duration::from_secs(180);
    let before = rss_bytes(pid)?;
    let base = Instant::now();
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let asked = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    let drained = match t {
        Target::Dflockd(_) => return Err(t.lacks("scale")),
        Target::Lockd(addr) => {
            let mut holder = Line::connect(addr).await?;
            holder.send(&format!("LOCK {NAME} holder ttl=1h")).await?;
            let token = holder.recv_token().await?;
            for i in 0..n {
                let (connecting, asked) = (Arc::clone(&connecting), Arc::clone(&asked));
                set.spawn(async move {
                    let permit = connecting.acquire_owned().await.map_err(io::Error::other)?;
                    let mut conn = Line::connect(addr).await?;
                    drop(permit);
                    conn.send(&format!("LOCK {NAME} w{i} ttl=1h")).await?;
                    asked.fetch_add(1, Ordering::Relaxed);
                    let token = conn.recv_token().await?;
                    let start = ns(base);
                    let end = ns(base);
                    conn.call_ok(&format!("UNLOCK {NAME} {token}")).await?;
                    Ok((Held { start, end }, ns(base)))
                });
            }
            bounded(limit, "queueing waiters", async {
                loop {
                    let reply = holder.call(&format!("STATUS {NAME}")).await?;
                    let queued = reply
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("waiters="))
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if queued >= n {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await?;
            tokio::time::sleep(SETTLE).await;
            let after = rss_bytes(pid)?;
            out.row(
                "wait.rss_per_waiter_b",
                after.saturating_sub(before) as f64 / n as f64,
            );
            let t0 = ns(base);
            holder.call_ok(&format!("UNLOCK {NAME} {token}")).await?;
            let done = drain(&mut set, cap).await?;
            (t0, done)
        }
        Target::Redis(addr) => {
            let mut holder = Redis::connect(addr).await?;
            if !holder.try_lock(NAME, "holder", 3_600_000).await? {
                return Err(io::Error::other("waiters: lock already held"));
            }
            for i in 0..n {
                let (connecting, asked) = (Arc::clone(&connecting), Arc::clone(&asked));
                set.spawn(async move {
                    let permit = connecting.acquire_owned().await.map_err(io::Error::other)?;
                    let mut conn = Redis::connect(addr).await?;
                    drop(permit);
                    let value = format!("w{i}");
                    let mut rng = XorShift::new(i as u64 + 7);
                    let mut first = true;
                    loop {
                        let won = conn.try_lock(NAME, &value, 30_000).await?;
                        if first {
                            asked.fetch_add(1, Ordering::Relaxed);
                            first = false;
                            // Spread the pollers over the retry period.
                            tokio::time::sleep(Duration::from_micros(
                                rng.below(retry.as_micros() as u64),
                            ))
                            .await;
                        }
                        if won {
                            break;
                        }
                        tokio::time::sleep(retry).await;
                    }
                    let start = ns(base);
                    let end = ns(base);
                    conn.unlock(NAME, &value).await?;
                    Ok((Held { start, end }, ns(base)))
                });
            }
            bounded(limit, "connecting pollers", async {
                while asked.load(Ordering::Relaxed) < n {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(())
            })
            .await?;
            tokio::time::sleep(SETTLE).await;
            let after = rss_bytes(pid)?;
            out.row(
                "wait.rss_per_waiter_b",
                after.saturating_sub(before) as f64 / n as f64,
            );
            let t0 = ns(base);
            holder.unlock(NAME, "holder").await?;
            let done = drain(&mut set, cap).await?;
            (t0, done)
        }
    };
    let (t0, done) = drained;
    let complete = done.len() == n;
    let last = if complete {
        done.iter().map(|&(_, at)| at).max().unwrap_or(t0)
    } else {
        t0 + cap.as_nanos() as u64
    };
    let secs = (last - t0) as f64 / 1e9;
    let rate = done.len() as f64 / secs.max(1e-9);
    let held: Vec<Held> = done.iter().map(|&(h, _)| h).collect();
    let violations = stats::slots(&held, 1).violations;
    out.row(
        "wait.drain_s",
        if complete {
            secs
        } else {
            n as f64 / rate.max(1e-9)
        },
    );
    out.row("wait.drain_estimated", if complete { 0.0 } else { 1.0 });
    out.row("wait.drain_rate", rate);
    out.row("wait.violations", violations as f64);
    Ok(())
}

/// Takes `n` locks with 16-byte names and reads the server's memory per lock.
pub async fn held(t: Target, n: usize, pid: u32, out: &Out) -> io::Result<()> {
    tokio::time::sleep(SETTLE).await;
    let before = rss_bytes(pid)?;
    let started = Instant::now();
    let mut set = JoinSet::new();
    for k in 0..FILLERS {
        set.spawn(async move {
            let names = (k..n).step_by(FILLERS).collect::<Vec<_>>();
            let mut buf = Vec::with_capacity(BATCH * 48);
            match t {
                Target::Dflockd(_) => return Err(t.lacks("scale")),
                Target::Lockd(addr) => {
                    let mut conn = Line::connect(addr).await?;
                    for chunk in names.chunks(BATCH) {
                        buf.clear();
                        for i in chunk {
                            buf.extend_from_slice(
                                format!("LOCK held-{i:011} h ttl=1h\n").as_bytes(),
                            );
                        }
                        conn.send_raw(&buf).await?;
                        for _ in chunk {
                            conn.recv_token().await?;
                        }
                    }
                }
                Target::Redis(addr) => {
                    let mut conn = Redis::connect(addr).await?;
                    for chunk in names.chunks(BATCH) {
                        buf.clear();
                        for i in chunk {
                            let name = format!("held-{i:011}");
                            encode(
                                &mut buf,
                                &[b"SET", name.as_bytes(), b"h", b"NX", b"PX", b"3600000"],
                            );
                        }
                        conn.send_raw(&buf).await?;
                        for _ in chunk {
                            match conn.recv().await? {
                                Resp::Simple(s) if s == "OK" => {}
                                other => return Err(io::Error::other(format!("SET: {other:?}"))),
                            }
                        }
                    }
                }
            }
            Ok(())
        });
    }
    bounded(
        Duration::from_secs(300),
        "filling the table",
        collect(&mut set),
    )
    .await?;
    let secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let after = rss_bytes(pid)?;
    out.row(
        "held.rss_per_lock_b",
        after.saturating_sub(before) as f64 / n as f64,
    );
    out.row("held.rate", n as f64 / secs);
    Ok(())
}

/// `n` leases of `ttl`, taken in even batches over `spread` (so they end within one second
/// when `spread` is under one), each with a waiter queued (lockd) or polling every `retry`
/// (Redis): how late is each waiter's grant after its lease's end?
///
/// The lease's end is taken as the moment its LOCK was sent plus the ttl: the server's grant
/// (and so its deadline) comes after that, so lateness is measured high, never low.
pub async fn expiry(
    t: Target,
    n: usize,
    ttl: Duration,
    spread: Duration,
    retry: Duration,
    out: &Out,
) -> io::Result<()> {
    let limit = ttl + Duration::from_secs(120);
    let base = Instant::now();
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let ready = Arc::new(AtomicUsize::new(0));
    let (go_tx, go_rx) = watch::channel(false);
    let mut set = JoinSet::new();
    for i in 0..n {
        let (connecting, ready, mut go) =
            (Arc::clone(&connecting), Arc::clone(&ready), go_rx.clone());
        set.spawn(async move {
            let permit = connecting.acquire_owned().await.map_err(io::Error::other)?;
            let name = format!("exp-{i:012}");
            let granted = match t {
                Target::Dflockd(_) => return Err(t.lacks("scale")),
                Target::Lockd(addr) => {
                    let mut conn = Line::connect(addr).await?;
                    drop(permit);
                    ready.fetch_add(1, Ordering::Relaxed);
                    go.wait_for(|&g| g).await.map_err(io::Error::other)?;
                    let sent = ns(base);
                    conn.send(&format!("LOCK {name} w{i} ttl=1h")).await?;
                    conn.recv_token().await?;
                    (sent, ns(base))
                }
                Target::Redis(addr) => {
                    let mut conn = Redis::connect(addr).await?;
                    drop(permit);
                    ready.fetch_add(1, Ordering::Relaxed);
                    go.wait_for(|&g| g).await.map_err(io::Error::other)?;
                    let sent = ns(base);
                    let mut rng = XorShift::new(i as u64 + 11);
                    let mut first = true;
                    let value = format!("w{i}");
                    while !conn.try_lock(&name, &value, 3_600_000).await? {
                        let pause = if first {
                            first = false;
                            Duration::from_micros(rng.below(retry.as_micros() as u64))
                        } else {
                            retry
                        };
                        tokio::time::sleep(pause).await;
                    }
                    (sent, ns(base))
                }
            };
            Ok((i, granted))
        });
    }
    bounded(limit, "connecting waiters", async {
        while ready.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    })
    .await?;
    // Take every lease, remembering when each LOCK left.
    let mut leased = vec![0u64; n];
    let ttl_ms = ttl.as_millis() as u64;
    let batches = n.div_ceil(BATCH / 4).max(1);
    let leasing = tokio::time::Instant::now();
    let pace = |k: usize| leasing + spread.mul_f64(k as f64 / batches as f64);
    match t {
        Target::Dflockd(_) => return Err(t.lacks("scale")),
        Target::Lockd(addr) => {
            let mut conn = Line::connect(addr).await?;
            let mut buf = Vec::new();
            for (k, chunk) in (0..n).collect::<Vec<_>>().chunks(BATCH / 4).enumerate() {
                tokio::time::sleep_until(pace(k)).await;
                buf.clear();
                for i in chunk {
                    buf.extend_from_slice(
                        format!("LOCK exp-{i:012} holder ttl={ttl_ms}ms\n").as_bytes(),
                    );
                }
                let sent = ns(base);
                conn.send_raw(&buf).await?;
                for &i in chunk {
                    conn.recv_token().await?;
                    leased[i] = sent;
                }
            }
        }
        Target::Redis(addr) => {
            let mut conn = Redis::connect(addr).await?;
            let mut buf = Vec::new();
            let ttl_arg = ttl_ms.to_string();
            for (k, chunk) in (0..n).collect::<Vec<_>>().chunks(BATCH / 4).enumerate() {
                tokio::time::sleep_until(pace(k)).await;
                buf.clear();
                for i in chunk {
                    let name = format!("exp-{i:012}");
                    encode(
                        &mut buf,
                        &[
                            b"SET",
                            name.as_bytes(),
                            b"holder",
                            b"NX",
                            b"PX",
                            ttl_arg.as_bytes(),
                        ],
                    );
                }
                let sent = ns(base);
                conn.send_raw(&buf).await?;
                for &i in chunk {
                    match conn.recv().await? {
                        Resp::Simple(s) if s == "OK" => leased[i] = sent,
                        other => return Err(io::Error::other(format!("SET: {other:?}"))),
                    }
                }
            }
        }
    }
    let _ = go_tx.send(true);
    let done = bounded(limit, "waiting for the hand-overs", collect(&mut set)).await?;
    let ttl_ns = ttl.as_nanos() as u64;
    let mut late = Vec::with_capacity(n);
    let (mut early, mut queued_late) = (0u64, 0u64);
    for (i, (sent, granted)) in done {
        let end = leased[i] + ttl_ns;
        if sent >= end {
            queued_late += 1;
        }
        match granted.checked_sub(end) {
            Some(l) => late.push(l),
            None => early += 1,
        }
    }
    late.sort_unstable();
    let ms = |v: u64| v as f64 / 1e6;
    let spread = leased.iter().max().unwrap_or(&0) - leased.iter().min().unwrap_or(&0);
    out.row("exp.late_p50_ms", ms(stats::pct(&late, 50.0)));
    out.row("exp.late_p99_ms", ms(stats::pct(&late, 99.0)));
    out.row("exp.late_max_ms", ms(late.last().copied().unwrap_or(0)));
    out.row("exp.spread_ms", ms(spread));
    out.row("exp.early", early as f64);
    out.row("exp.queued_late", queued_late as f64);
    Ok(())
}
