//! Throughput and latency: floor (PING), uncontended cycles, contended critical sections.
//!
//! Every client connects before the clock starts; samples from the first `warm` of a run are
//! dropped. Runs end at a deadline: a client finishes the cycle it is in and stops, and a
//! Redis client still polling past the deadline (plus a grace) gives up.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::stats::{self, spin, Held, XorShift};
use crate::wire::{Dflockd, Line, Redis};
use crate::{Out, Target};

/// How long a run may overrun its deadline before it is called failed.
const OVERRUN: Duration = Duration::from_secs(30);
/// The lease every benchmark lock asks for: far longer than any hold.
const TTL_MS: u64 = 30_000;
/// How long a dflockd client waits in its queue (a lockd client waits without a bound): far
/// longer than any run.
const DFLOCKD_WAIT_S: u64 = 120;

/// The measured window of a run, on one process clock.
#[derive(Clone, Copy)]
pub(crate) struct Window {
    base: Instant,
    from: u64,
    until: u64,
}

impl Window {
    fn new(base: Instant, warm: Duration, dur: Duration) -> Self {
        Window {
            base,
            from: warm.as_nanos() as u64,
            until: (warm + dur).as_nanos() as u64,
        }
    }
    pub(crate) fn ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
    pub(crate) fn counts(&self, at: u64) -> bool {
        at >= self.from && at < self.until
    }
    pub(crate) fn over(&self) -> bool {
        self.ns() >= self.until
    }
}

async fn join<T: 'static>(mut set: JoinSet<io::Result<T>>, limit: Duration) -> io::Result<Vec<T>> {
    let mut out = Vec::new();
    let all = async {
        while let Some(r) = set.join_next().await {
            out.push(r.map_err(io::Error::other)??);
        }
        Ok::<_, io::Error>(())
    };
    match tokio::time::timeout(limit, all).await {
        Ok(r) => r.map(|()| out),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "run overran its bound",
        )),
    }
}

/// Starts `c` clients together; each runs `body(i, window)` and returns its samples.
pub(crate) async fn clients<T, F, Fut>(
    c: usize,
    warm: Duration,
    dur: Duration,
    body: F,
) -> io::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize, Arc<Barrier>, Arc<std::sync::OnceLock<Window>>) -> Fut,
    Fut: std::future::Future<Output = io::Result<T>> + Send + 'static,
{
    let ((), per) = clients_after(c, warm, dur, async { Ok(()) }, body).await?;
    Ok(per)
}

/// `clients`, with `before` run once every client has connected and before the clock starts
/// (a reading of counters that the run is then measured against); its output comes first.
pub(crate) async fn clients_after<S, B, T, F, Fut>(
    c: usize,
    warm: Duration,
    dur: Duration,
    before: B,
    body: F,
) -> io::Result<(S, Vec<T>)>
where
    B: std::future::Future<Output = io::Result<S>>,
    T: Send + 'static,
    F: Fn(usize, Arc<Barrier>, Arc<std::sync::OnceLock<Window>>) -> Fut,
    Fut: std::future::Future<Output = io::Result<T>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(c + 1));
    let window = Arc::new(std::sync::OnceLock::new());
    let mut set = JoinSet::new();
    for i in 0..c {
        set.spawn(body(i, Arc::clone(&barrier), Arc::clone(&window)));
    }
    // Connections are made before this barrier, the clock starts after it. A client that
    // fails before it (its connection refused) ends the run at once, with its error.
    let connected = tokio::time::timeout(OVERRUN, async {
        tokio::select! {
            _ = barrier.wait() => Ok(()),
            Some(failed) = set.join_next() => match failed {
                Ok(Err(e)) => Err(e),
                Ok(Ok(_)) => Err(io::Error::other("a client ended before the start")),
                Err(e) => Err(io::Error::other(e)),
            },
        }
    })
    .await;
    match connected {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            set.abort_all();
            return Err(e);
        }
        Err(_) => {
            set.abort_all();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "clients failed to connect",
            ));
        }
    }
    let before = match before.await {
        Ok(b) => b,
        Err(e) => {
            set.abort_all();
            return Err(e);
        }
    };
    let _ = window.set(Window::new(Instant::now(), warm, dur));
    barrier.wait().await;
    Ok((before, join(set, warm + dur + OVERRUN).await?))
}

pub(crate) fn window_of(w: &std::sync::OnceLock<Window>) -> Window {
    // Set by `clients` between the two barrier waits, so always there after the second.
    *w.get()
        .unwrap_or_else(|| unreachable!("window set before the start barrier"))
}

/// One PING round trip after another on `c` connections.
pub async fn floor(
    t: Target,
    c: usize,
    warm: Duration,
    dur: Duration,
    out: &Out,
    key: &str,
) -> io::Result<()> {
    let per = clients(c, warm, dur, move |_i, barrier, window| async move {
        let mut lat = Vec::new();
        match t {
            Target::Lockd(addr) => {
                let mut conn = Line::connect(addr).await?;
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                while !w.over() {
                    let t0 = w.ns();
                    let reply = conn.call("PING").await?;
                    if reply != "OK PONG" {
                        return Err(io::Error::other(format!("PING: {reply:?}")));
                    }
                    if w.counts(t0) {
                        lat.push(w.ns() - t0);
                    }
                }
            }
            Target::Redis(addr) => {
                let mut conn = Redis::connect(addr).await?;
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                while !w.over() {
                    let t0 = w.ns();
                    conn.ping().await?;
                    if w.counts(t0) {
                        lat.push(w.ns() - t0);
                    }
                }
            }
            Target::Dflockd(_) => return Err(t.lacks("PING")),
        }
        Ok(lat)
    })
    .await?;
    rate_and_latency(out, key, "rps", per, dur, false);
    Ok(())
}

/// Connections made before the measured ones, uncounted (the first ones pay for cold caches).
const WARM_CONNECTS: u64 = 100;
/// At most this many measured connections in one run of `connects`: each leaves a socket in
/// TIME_WAIT for a minute, and loopback has about 28,000 ports to give.
const MAX_CONNECTS: u64 = 2000;

/// One new connection after another, for `dur` or [`MAX_CONNECTS`] connections: connect
/// (and, over TLS, the handshake), one PING round trip, close. A sample is the time from the
/// connect to the PING's reply: what a client that connects per request pays before its first
/// answer. The close is not timed.
pub async fn connects(t: Target, dur: Duration, out: &Out, key: &str) -> io::Result<()> {
    let per = clients(
        1,
        Duration::ZERO,
        dur,
        move |_i, barrier, window| async move {
            let mut lat = Vec::new();
            barrier.wait().await;
            barrier.wait().await;
            let w = window_of(&window);
            let mut made = 0;
            while !w.over() && made < WARM_CONNECTS + MAX_CONNECTS {
                made += 1;
                let t0 = w.ns();
                match t {
                    Target::Lockd(addr) => {
                        let mut conn = Line::connect(addr).await?;
                        let reply = conn.call("PING").await?;
                        if reply != "OK PONG" {
                            return Err(io::Error::other(format!("PING: {reply:?}")));
                        }
                        if made > WARM_CONNECTS {
                            lat.push(w.ns() - t0);
                        }
                        conn.close().await?;
                    }
                    Target::Redis(addr) => {
                        let mut conn = Redis::connect(addr).await?;
                        conn.ping().await?;
                        if made > WARM_CONNECTS {
                            lat.push(w.ns() - t0);
                        }
                    }
                    Target::Dflockd(_) => return Err(t.lacks("PING")),
                }
            }
            Ok(lat)
        },
    )
    .await?;
    let mut all: Vec<u64> = per.into_iter().flatten().collect();
    out.row(&format!("{key}.n"), all.len() as f64);
    let (p50, p99, _) = stats::summary_us(&mut all);
    out.row(&format!("{key}.p50_us"), p50);
    out.row(&format!("{key}.p99_us"), p99);
    Ok(())
}

/// Each of `c` clients locks and unlocks a name of its own, over and over.
pub async fn uncontended(
    t: Target,
    c: usize,
    warm: Duration,
    dur: Duration,
    out: &Out,
    key: &str,
) -> io::Result<()> {
    let per = clients(c, warm, dur, move |i, barrier, window| async move {
        let name = format!("unc-{i:012}");
        let mut lat = Vec::new();
        match t {
            Target::Lockd(addr) => {
                let mut conn = Line::connect(addr).await?;
                let lock = format!("LOCK {name} c{i} ttl=30s");
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                while !w.over() {
                    let t0 = w.ns();
                    conn.send(&lock).await?;
                    let token = conn.recv_token().await?;
                    conn.call_ok(&format!("UNLOCK {name} {token}")).await?;
                    if w.counts(t0) {
                        lat.push(w.ns() - t0);
                    }
                }
            }
            Target::Redis(addr) => {
                let mut conn = Redis::connect(addr).await?;
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                let mut seq = 0u64;
                while !w.over() {
                    seq += 1;
                    let value = format!("c{i}-{seq}");
                    let t0 = w.ns();
                    if !conn.try_lock(&name, &value, TTL_MS).await? {
                        return Err(io::Error::other(format!("{name} unexpectedly held")));
                    }
                    if !conn.unlock(&name, &value).await? {
                        return Err(io::Error::other(format!("{name} lost before release")));
                    }
                    if w.counts(t0) {
                        lat.push(w.ns() - t0);
                    }
                }
            }
            Target::Dflockd(addr) => {
                let mut conn = Dflockd::connect(addr).await?;
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                while !w.over() {
                    let t0 = w.ns();
                    let Some(token) = conn.lock(&name, 0, TTL_MS / 1000).await? else {
                        return Err(io::Error::other(format!("{name} unexpectedly held")));
                    };
                    if !conn.unlock(&name, &token).await? {
                        return Err(io::Error::other(format!("{name} lost before release")));
                    }
                    if w.counts(t0) {
                        lat.push(w.ns() - t0);
                    }
                }
            }
        }
        Ok(lat)
    })
    .await?;
    rate_and_latency(out, key, "cps", per, dur, true);
    Ok(())
}

/// Rows for one run of request latencies (ns) from every client: the rate over `dur` as
/// `{key}.{rate}`, and p50/p99 (and the max, if asked) in µs.
fn rate_and_latency(
    out: &Out,
    key: &str,
    rate: &str,
    per: Vec<Vec<u64>>,
    dur: Duration,
    max: bool,
) {
    let mut all: Vec<u64> = per.into_iter().flatten().collect();
    out.row(
        &format!("{key}.{rate}"),
        all.len() as f64 / dur.as_secs_f64(),
    );
    let (p50, p99, worst) = stats::summary_us(&mut all);
    out.row(&format!("{key}.p50_us"), p50);
    out.row(&format!("{key}.p99_us"), p99);
    if max {
        out.row(&format!("{key}.max_us"), worst);
    }
}

/// How a critical section passes its time.
#[derive(Clone, Copy, Debug)]
pub enum Hold {
    /// Busy-waits: a section doing CPU work (tokio's timer is too coarse for 100 µs, and a
    /// sleep would hand the core to someone else).
    Spin(Duration),
    /// Sleeps: a section waiting on something else (a disk, a service), which leaves the core
    /// free, so that the holders of a semaphore's slots really are inside together.
    Sleep(Duration),
}

impl Hold {
    async fn pass(self) {
        match self {
            Hold::Spin(d) => spin(d),
            Hold::Sleep(d) => tokio::time::sleep(d).await,
        }
    }
}

/// `clients` on one name with `limit` slots (1: a mutex), each holding a slot for `hold`.
#[derive(Clone, Copy, Debug)]
pub struct Contention {
    pub clients: usize,
    pub limit: u32,
    pub hold: Hold,
    /// How long a Redis client sleeps before it tries again (a lockd client waits in the
    /// server's queue instead).
    pub retry: Duration,
}

/// One client's record of a contended run.
#[derive(Default)]
struct Contender {
    held: Vec<Held>,
    /// Per grant: (asked at, granted at, requests it took including the release).
    grants: Vec<(u64, u64, u64)>,
}

/// A contended run: every client asks, holds, releases, and asks again. A semaphore (`limit`
/// above 1) is lockd's alone: Redis has no lock of that kind in this benchmark.
pub async fn contended(
    t: Target,
    how: Contention,
    warm: Duration,
    dur: Duration,
    out: &Out,
    key: &str,
) -> io::Result<()> {
    let Contention {
        clients: c,
        limit,
        hold,
        retry,
    } = how;
    if limit > 1 && !matches!(t, Target::Lockd(_)) {
        return Err(t.lacks("semaphore"));
    }
    let name = if limit > 1 {
        "bench-semaphore"
    } else {
        "bench-contended"
    };
    let per = clients(c, warm, dur, move |i, barrier, window| async move {
        let mut me = Contender::default();
        match t {
            Target::Lockd(addr) => {
                let mut conn = Line::connect(addr).await?;
                let lock = if limit > 1 {
                    format!("LOCK {name} c{i} ttl=30s limit={limit}")
                } else {
                    format!("LOCK {name} c{i} ttl=30s")
                };
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                while !w.over() {
                    let asked = w.ns();
                    conn.send(&lock).await?;
                    let token = conn.recv_token().await?;
                    let start = w.ns();
                    hold.pass().await;
                    let end = w.ns();
                    conn.call_ok(&format!("UNLOCK {name} {token}")).await?;
                    me.held.push(Held { start, end });
                    me.grants.push((asked, start, 2));
                }
            }
            Target::Redis(addr) => {
                let mut conn = Redis::connect(addr).await?;
                let mut rng = XorShift::new(i as u64 + 1);
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                // Past the deadline a grant no longer counts: stop polling.
                let give_up = w.until;
                let mut seq = 0u64;
                'run: while !w.over() {
                    seq += 1;
                    let value = format!("c{i}-{seq}");
                    let asked = w.ns();
                    let mut requests = 0;
                    loop {
                        requests += 1;
                        if conn.try_lock(name, &value, TTL_MS).await? {
                            break;
                        }
                        if w.ns() > give_up {
                            break 'run;
                        }
                        // Lock libraries sleep the retry delay, some with jitter; a small
                        // jitter keeps 64 clients from waking in lockstep.
                        let jitter = rng.below(retry.as_micros() as u64 / 10 + 1);
                        tokio::time::sleep(retry + Duration::from_micros(jitter)).await;
                    }
                    let start = w.ns();
                    hold.pass().await;
                    let end = w.ns();
                    if !conn.unlock(name, &value).await? {
                        return Err(io::Error::other("Redis lock lost before release"));
                    }
                    me.held.push(Held { start, end });
                    me.grants.push((asked, start, requests + 1));
                }
            }
            Target::Dflockd(addr) => {
                let mut conn = Dflockd::connect(addr).await?;
                barrier.wait().await;
                barrier.wait().await;
                let w = window_of(&window);
                while !w.over() {
                    let asked = w.ns();
                    let Some(token) = conn.lock(name, DFLOCKD_WAIT_S, TTL_MS / 1000).await? else {
                        return Err(io::Error::other("dflockd: wait ran out"));
                    };
                    let start = w.ns();
                    hold.pass().await;
                    let end = w.ns();
                    if !conn.unlock(name, &token).await? {
                        return Err(io::Error::other("dflockd lock lost before release"));
                    }
                    me.held.push(Held { start, end });
                    me.grants.push((asked, start, 2));
                }
            }
        }
        Ok((i, me))
    })
    .await?;
    let mut held = Vec::new();
    let mut counts = vec![0u64; c];
    let mut acquire = Vec::new();
    let mut requests = 0u64;
    let from = warm.as_nanos() as u64;
    let until = (warm + dur).as_nanos() as u64;
    for (i, me) in per {
        held.extend_from_slice(&me.held);
        for &(asked, granted, reqs) in &me.grants {
            if granted >= from && granted < until {
                counts[i] += 1;
                acquire.push(granted - asked);
                requests += reqs;
            }
        }
    }
    let grants: u64 = counts.iter().sum();
    let mut slots = stats::slots(&held, u64::from(limit));
    // Gaps are taken over the whole run: the hand-off is the same before the window.
    let (gap_p50, gap_p99, _) = stats::summary_us(&mut slots.gaps);
    let (acq_p50, acq_p99, acq_max) = stats::summary_us(&mut acquire);
    let secs = dur.as_secs_f64();
    out.row(&format!("{key}.cps"), grants as f64 / secs);
    out.row(&format!("{key}.gap_p50_us"), gap_p50);
    out.row(&format!("{key}.gap_p99_us"), gap_p99);
    out.row(&format!("{key}.acq_p50_us"), acq_p50);
    out.row(&format!("{key}.acq_p99_us"), acq_p99);
    out.row(&format!("{key}.acq_max_us"), acq_max);
    out.row(&format!("{key}.jain"), stats::jain(&counts));
    out.row(&format!("{key}.minmax"), stats::min_max_share(&counts));
    out.row(
        &format!("{key}.rpg"),
        if grants == 0 {
            0.0
        } else {
            requests as f64 / grants as f64
        },
    );
    out.row(&format!("{key}.peak"), slots.peak as f64);
    out.row(&format!("{key}.violations"), slots.violations as f64);
    Ok(())
}
