//! One seed's run: the front-ends, the clients and the director of faults, on one thread and
//! tokio's paused clock; then the history's verdict, and liveness once the faults stop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockd::backend::etcd::sim;
use lockd::backend::{Backend, EtcdConfig};
use lockd::locks::Limits;
use lockd_etcd::sim::{Faults, Net, Rng};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use crate::client;
use crate::etcd_order::Mark;
use crate::history::{self, Op, Seen};

/// A front-end that crashes this soon after an answer had no time to act on it (a round
/// trip at the network's usual delays, 20 ms each way, and some).
const CRASH_WINDOW: Duration = Duration::from_millis(100);

/// How long clients send requests and the director makes faults.
const ACTIVE: Duration = Duration::from_secs(20);
/// Each request's limit (`--etcd-request-timeout`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A front-end's etcd lease (`--etcd-lease-ttl`).
const LEASE_TTL: Duration = Duration::from_secs(3);
/// The wall clock's reading at the start of every run.
const EPOCH_MS: u64 = 1_780_000_000_000;
/// Front-ends alive at most at once.
const MAX_FRONTS: usize = 4;
/// One seed in this many runs on a prefix an older lockd began (plain tokens).
const PLAIN_EVERY: u64 = 5;

/// One seed in this many is calm: no fault at all (answers are only slow, never past the
/// request timeout), so no request may be answered `UNAVAILABLE`. Chosen by the seed's number,
/// not its random source, so that every other seed runs as before.
const CALM_EVERY: u64 = 8;

/// What a run found.
pub struct Outcome {
    pub seed: u64,
    pub steps: u64,
    pub violations: Vec<String>,
    /// Findings of a kind known and not yet fixed (see README.md): reported, not failed.
    pub known: Vec<String>,
    pub trace: Vec<String>,
}

/// A live front-end as its clients reach it.
#[derive(Clone)]
pub struct Front {
    pub backend: Backend,
    /// Cancelled when it crashes: every connection to it breaks then.
    pub crashed: CancellationToken,
}

impl Front {
    /// A request's answer, or `None` if the front-end crashed first (the connection broke).
    pub async fn call<T>(&self, request: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            () = self.crashed.cancelled() => None,
            answer = request => Some(answer),
        }
    }
}

/// What the clients share: the front-ends and the history.
pub struct World {
    pub net: Net,
    pub start: Instant,
    /// Front-ends by number: `None` once crashed.
    pub fronts: Mutex<Vec<Option<Front>>>,
    pub ops: Mutex<Vec<Op>>,
    pub events: Mutex<Vec<Seen>>,
    /// BREAKs sent: the name, when.
    pub breaks: Mutex<Vec<(String, Duration)>>,
    /// LOCKs given up on after a request timeout: the id, the front-end, when it was sent.
    pub gave_up: Mutex<Vec<(String, usize, Duration)>>,
    /// Lock-delays and grants, for [`crate::delays`]'s check.
    pub delays: crate::delays::Delays,
    /// LOCKs' sends and answers, and crashes, in etcd's order, for [`crate::etcd_order`].
    pub etcd_order: crate::etcd_order::EtcdOrder,
    /// Found by the clients themselves (a holder's RENEW refused within its lease).
    pub violations: Mutex<Vec<String>>,
    /// A calm run: no faults ([`CALM_EVERY`]).
    pub calm: bool,
    /// The front-ends' `--etcd-join-wait` ([`join_wait`]).
    pub join_wait: Duration,
    /// Requests answered `UNAVAILABLE`: a violation in a calm run, where nothing made etcd
    /// hard to reach (lockd refused for a reason of its own: a malformed write, a grant it
    /// took for lost).
    pub unavailable: Mutex<Vec<String>>,
    pub stop: CancellationToken,
}

impl World {
    pub fn since_start(&self) -> Duration {
        Instant::now().duration_since(self.start)
    }

    /// A live front-end, chosen at random.
    pub fn pick(&self, rng: &mut Rng) -> Option<(usize, Front)> {
        let fronts = self.fronts.lock().unwrap();
        let live: Vec<(usize, &Front)> = fronts
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((i, b.as_ref()?)))
            .collect();
        if live.is_empty() {
            return None;
        }
        let (i, b) = live[rng.below(live.len() as u64) as usize];
        Some((i, b.clone()))
    }

    /// Front-end `fe`, if it is live; else any live one.
    pub fn pick_again(&self, rng: &mut Rng, fe: usize) -> Option<(usize, Front)> {
        let live = self.fronts.lock().unwrap().get(fe).cloned().flatten();
        match live {
            Some(front) => Some((fe, front)),
            None => self.pick(rng),
        }
    }

    /// A live front-end, the first.
    pub fn any_front(&self) -> Option<Front> {
        let fronts = self.fronts.lock().unwrap();
        fronts.iter().flatten().next().cloned()
    }

    /// A BREAK of `name` is being sent now.
    pub fn broke(&self, name: &str) {
        let at = self.since_start();
        self.breaks.lock().unwrap().push((name.to_owned(), at));
    }

    /// Whether a BREAK of one of `names` was sent since `since`.
    pub fn broken_since(&self, names: &[String], since: Duration) -> bool {
        let breaks = self.breaks.lock().unwrap();
        breaks
            .iter()
            .any(|(n, at)| *at >= since && names.contains(n))
    }

    pub fn note(&self, line: String) {
        self.net.note(&line);
    }

    /// A request of client `me` was answered `UNAVAILABLE`.
    pub fn unavailable(&self, what: String) {
        self.unavailable.lock().unwrap().push(what);
    }

    pub fn violation(&self, what: String) {
        self.note(format!("VIOLATION: {what}"));
        self.violations.lock().unwrap().push(what);
    }
}

pub fn run(seed: u64) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(simulate(seed))
}

/// The front-ends' `--etcd-join-wait` in run `seed`: the default, none, or the most (the
/// batch wait, when a join most often shares a release's transaction), by the seed's number.
fn join_wait(seed: u64) -> Duration {
    match seed % 3 {
        0 => lockd::DEFAULT_ETCD_JOIN_WAIT,
        1 => Duration::ZERO,
        _ => lockd::DEFAULT_ETCD_BATCH_WAIT,
    }
}

fn config() -> EtcdConfig {
    EtcdConfig {
        endpoints: vec!["sim:2379".into()],
        prefix: "/lockd-sim/".into(),
        request_timeout: REQUEST_TIMEOUT,
        connect_timeout: Duration::from_secs(60),
        lease_ttl: LEASE_TTL,
        batch: lockd::DEFAULT_ETCD_BATCH,
        batch_wait: lockd::DEFAULT_ETCD_BATCH_WAIT,
        join_wait: lockd::DEFAULT_ETCD_JOIN_WAIT,
        security: Default::default(),
    }
}

/// Starts front-end `fe`: its background work, and a collector of its events.
async fn start_front(world: &Arc<World>, fe: usize) -> Option<JoinHandle<()>> {
    let config = EtcdConfig {
        join_wait: world.join_wait,
        ..config()
    };
    let backend = match sim::front_end(&world.net, fe, config, Limits::default()).await {
        Ok(b) => b,
        Err(e) => {
            world.violation(format!("fe{fe} could not start: {e}"));
            return None;
        }
    };
    let mut events = backend.subscribe();
    let collector = Arc::clone(world);
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(p) => {
                    let e = &p.event;
                    let seen = Seen {
                        kind: e.kind.as_str().to_owned(),
                        name: e.name.to_string(),
                        id: e.id.to_string(),
                        token: e.token,
                        at: collector.since_start(),
                    };
                    collector.events.lock().unwrap().push(seen);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
    });
    {
        let mut fronts = world.fronts.lock().unwrap();
        if fronts.len() <= fe {
            fronts.resize(fe + 1, None);
        }
        world.delays.started(fe, world.since_start());
        fronts[fe] = Some(Front {
            backend: backend.clone(),
            crashed: CancellationToken::new(),
        });
    }
    world.note(format!("fe{fe}: started"));
    Some(tokio::spawn(backend.run(CancellationToken::new())))
}

async fn simulate(seed: u64) -> Outcome {
    sim::pin_thread(EPOCH_MS);
    let mut rng = Rng::new(seed);
    let calm = seed.is_multiple_of(CALM_EVERY);
    let faults = if calm {
        // Slow answers at most, both ways within the request timeout.
        Faults {
            slow: REQUEST_TIMEOUT * 2 / 5,
            fail_per_mille: 0,
            lose_per_mille: 0,
            ..Faults::default()
        }
    } else {
        Faults::default()
    };
    let net = Net::new(seed, faults, REQUEST_TIMEOUT);
    let world = Arc::new(World {
        net: net.clone(),
        start: Instant::now(),
        fronts: Mutex::new(Vec::new()),
        ops: Mutex::new(Vec::new()),
        events: Mutex::new(Vec::new()),
        delays: Default::default(),
        etcd_order: Default::default(),
        violations: Mutex::new(Vec::new()),
        gave_up: Mutex::new(Vec::new()),
        breaks: Mutex::new(Vec::new()),
        stop: CancellationToken::new(),
        calm,
        join_wait: join_wait(seed),
        unavailable: Mutex::new(Vec::new()),
    });
    let plain = seed % PLAIN_EVERY == 1;
    if plain {
        // A prefix an older lockd began: tokens of the base plus the revision, one grant a
        // transaction (`tokens.rs`). Chosen by the seed's number, not its random source.
        let base = format!("{}meta/base", config().prefix);
        net.put(&base, &lockd::backend::first_token().to_string());
    }
    let fronts = 2 + rng.below(3) as usize;
    let clients = 3 + rng.below(5) as usize;
    world.note(format!(
        "seed {seed}: {fronts} front-ends, {clients} clients{}{}",
        if calm { ", calm" } else { "" },
        if plain { ", plain tokens" } else { "" }
    ));
    let mut runs: Vec<Option<JoinHandle<()>>> = Vec::new();
    for fe in 0..fronts {
        runs.push(start_front(&world, fe).await);
    }
    net.faults(true);
    let tasks: Vec<JoinHandle<()>> = (0..clients)
        .map(|c| {
            let rng = Rng::new(rng.next_u64());
            tokio::spawn(client::client(Arc::clone(&world), c, rng))
        })
        .collect();
    let mirrors = tokio::spawn(crate::mirrors::watch(Arc::clone(&world)));
    direct(&world, &mut rng, &mut runs).await;

    // Faults off: every client must finish, and every name drain.
    world.stop.cancel();
    net.faults(false);
    net.leaderless(false);
    for fe in 0..runs.len() {
        net.cut(fe, false);
    }
    let mut violations = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for (c, task) in tasks.into_iter().enumerate() {
        if tokio::time::timeout_at(deadline, task).await.is_err() {
            violations.push(format!(
                "liveness: client {c} had not finished 120s after the faults stopped"
            ));
        }
    }
    if let Some(left) = drained(&world).await {
        violations.push(format!(
            "liveness: names still held or queued 60s after the last client finished: {left}"
        ));
    }
    violations.extend(unregistered(&world).await);
    let ops = world.ops.lock().unwrap().clone();
    let events = world.events.lock().unwrap().clone();
    let verdict = history::check(&ops, &[], &events);
    violations.extend(verdict.violations);
    if world.calm {
        violations.extend(crate::stall::stalls(&ops));
    }
    violations.extend(world.delays.violations(&net, &events));
    if let Some(front) = world.any_front() {
        violations.extend(world.etcd_order.violations(&front.backend, &events));
    }
    violations.extend(world.violations.lock().unwrap().drain(..));
    if world.calm {
        let unavailable = world
            .unavailable
            .lock()
            .unwrap()
            .drain(..)
            .collect::<Vec<_>>();
        violations.extend(
            unavailable
                .into_iter()
                .map(|what| format!("in a calm run (no faults), {what}")),
        );
    }
    violations.extend(net.malformed().into_iter().map(|(fe, at_ms, txn)| {
        format!("fe{fe} sent a transaction etcd refuses as malformed at {at_ms}ms: {txn}")
    }));
    violations.sort();
    violations.dedup();
    let gave_up = world.gave_up.lock().unwrap().clone();
    let (mut known, violations) = known_findings(&net, &gave_up, violations);
    let (lost, violations) = lost_with_its_front_end(&world, violations);
    known.extend(lost);
    mirrors.abort();
    for run in runs.into_iter().flatten() {
        run.abort();
    }
    Outcome {
        seed,
        steps: net.steps(),
        violations,
        known,
        trace: net.trace(),
    }
}

/// The director: a fault every so often while the clients run (a front-end cut off for a
/// while, etcd without a leader, a compaction, a front-end's clock moved up to 5 s either
/// way, a front-end crashed and another started).
async fn direct(world: &Arc<World>, rng: &mut Rng, runs: &mut Vec<Option<JoinHandle<()>>>) {
    let until = Instant::now() + ACTIVE;
    if world.calm {
        sleep(ACTIVE).await;
        return;
    }
    let mut crashes = 0;
    while Instant::now() < until {
        sleep(Duration::from_millis(300 + rng.below(2700))).await;
        let live: Vec<usize> = (0..runs.len()).filter(|i| runs[*i].is_some()).collect();
        match rng.below(10) {
            0..=2 => {
                let fe = live[rng.below(live.len() as u64) as usize];
                let net = world.net.clone();
                let cut_for = Duration::from_millis(200 + rng.below(6000));
                net.cut(fe, true);
                tokio::spawn(async move {
                    sleep(cut_for).await;
                    net.cut(fe, false);
                });
            }
            3 => {
                let net = world.net.clone();
                let for_ms = Duration::from_millis(100 + rng.below(2500));
                net.leaderless(true);
                tokio::spawn(async move {
                    sleep(for_ms).await;
                    net.leaderless(false);
                });
            }
            4 => world.net.compact(),
            6 => {
                // proto.md: a front-end's clock up to 5 s ahead or behind ends no lease early.
                let fe = live[rng.below(live.len() as u64) as usize];
                let ms = rng.below(10_001) as i64 - 5_000;
                if let Some(front) = &world.fronts.lock().unwrap()[fe] {
                    sim::skew(&front.backend, ms);
                }
                world.note(format!("fe{fe}: its clock is now {ms} ms off"));
            }
            5 if crashes < 2 && live.len() > 1 => {
                crashes += 1;
                let fe = live[rng.below(live.len() as u64) as usize];
                if let Some(run) = runs[fe].take() {
                    run.abort();
                }
                world.net.kill(fe);
                let at = world.net.revision();
                world.etcd_order.crashes.lock().unwrap().push((fe, at));
                if let Some(front) = world.fronts.lock().unwrap()[fe].take() {
                    front.crashed.cancel();
                }
                if live.len() <= MAX_FRONTS {
                    let next = runs.len();
                    let started = start_front(world, next).await;
                    runs.push(started);
                }
            }
            _ => {}
        }
    }
}

/// Waits until a live front-end shows no holder and no waiter (up to a minute); otherwise
/// what it still shows.
async fn drained(world: &Arc<World>) -> Option<String> {
    let mut left = String::new();
    for _ in 0..60 {
        sleep(Duration::from_secs(1)).await;
        let front = world
            .fronts
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .next()
            .cloned();
        let Some(front) = front else {
            return Some("no front-end left".into());
        };
        match front.backend.status_snapshot().await {
            Ok(view) if view.is_empty() => return None,
            Ok(view) => {
                left = view
                    .iter()
                    .map(|s| {
                        format!(
                            "{} ({} holders, {} waiters; {} token {} {:?}, {:?} left)",
                            s.name, s.holders, s.waiters, s.holder, s.token, s.mode, s.left
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
            }
            Err(e) => left = format!("status failed: {e}"),
        }
    }
    Some(left)
}

/// Every live front-end's registration key, a while after the faults stopped: a front-end
/// whose key is gone looks dead to the others, which then end its leases' expiries
/// themselves (simulator seed 43119: every key gone, no lease ever ended).
async fn unregistered(world: &Arc<World>) -> Vec<String> {
    // Long enough for a late write on an etcd lease given up on to lapse with it, and for
    // the keep-alive after that to see the key gone and put it again.
    sleep(LEASE_TTL * 3).await;
    let live: Vec<usize> = world
        .fronts
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .filter_map(|(fe, f)| f.as_ref().map(|_| fe))
        .collect();
    let prefix = config().prefix;
    live.into_iter()
        .filter(|fe| world.net.value(&format!("{prefix}fe/fe{fe}")).is_none())
        .map(|fe| format!("liveness: fe{fe}'s registration key was gone after the faults stopped"))
        .collect()
}

/// Splits off a grant to a waiter that left which sat out its ttl because the one front-end
/// that knew it left had not learned of the grant when it crashed: its write that made or
/// confirmed the grant (at the grant's revision or later) was applied with its answer lost,
/// and its watch had not brought that revision (seed 528010: the confirmation's answer lost,
/// the front-end cut off, the client gone, the front-end crashed; seed 661463: the release
/// that granted the front-end's own waiter lost its answer, the client went, the front-end's
/// deletes of its key found it gone, and it crashed half a second later, its watch behind).
/// A lost answer is proto.md's case: such a grant ends with its ttl. Or it learned of it from
/// its write's answer and crashed within [`CRASH_WINDOW`], before any write of it after that
/// one was applied (seed 788562: fe3's confirmation answered as its client went, fe3 crashed
/// 20 ms later): no take-back could have reached etcd.
fn lost_with_its_front_end(world: &World, violations: Vec<String>) -> (Vec<String>, Vec<String>) {
    let Some(front) = world.any_front() else {
        return (Vec::new(), violations);
    };
    let locks = world.etcd_order.locks.lock().unwrap();
    violations.into_iter().partition(|v| {
        let Some(rest) = v.strip_prefix("the grant of ") else {
            return false;
        };
        if !v.ends_with("which had left, sat out its ttl") {
            return false;
        }
        let mut words = rest.split(' ');
        let (id, token) = (words.nth(2), words.nth(1));
        let token = token.and_then(|t| t.trim_end_matches("),").parse::<u64>().ok());
        let Some(rev) = token.and_then(|t| sim::revision_of(&front.backend, t)) else {
            return false;
        };
        let fe = locks.iter().rev().find_map(|(who, mark, _)| match mark {
            Mark::Sent(fe) if Some(who.as_str()) == id => Some(*fe),
            _ => None,
        });
        fe.is_some_and(|fe| {
            world.net.never_learned(fe, rev).is_some()
                || world.net.crashed_on_answer(fe, rev, CRASH_WINDOW).is_some()
        })
    })
}

/// Splits off the findings of a known kind: a grant to a request that was told its wait
/// ended (or that sat out its ttl), where a LOCK of that id was given up on after a request
/// timeout and a write of its front-end reached etcd after that (a late write: lockd cannot
/// always tell a grant it made from one it gave up on; it costs the name its ttl, never a
/// second holder). See README.md.
fn known_findings(
    net: &Net,
    gave_up: &[(String, usize, Duration)],
    violations: Vec<String>,
) -> (Vec<String>, Vec<String>) {
    let late = net.late_writes();
    violations.into_iter().partition(|v| {
        let id = if let Some(rest) = v.strip_prefix("the grant of ") {
            rest.split(' ').nth(2)
        } else {
            v.split(' ').next()
        };
        let told_left =
            v.contains("sat out its ttl") || v.contains("after it was told its wait ended");
        // A grant judged in etcd's order names its revision: the late write is at or before
        // it (it made the waiter key the grant came from).
        let granted_at: Option<i64> = v
            .split_once(", revision ")
            .and_then(|(_, rest)| rest.split(')').next()?.parse().ok());
        told_left
            && gave_up.iter().any(|(who, fe, sent)| {
                Some(who.as_str()) == id
                    && late.iter().any(|(f, at, rev)| {
                        f == fe
                            && Duration::from_millis(*at) >= *sent
                            && granted_at.is_none_or(|g| *rev <= g)
                    })
            })
    })
}
