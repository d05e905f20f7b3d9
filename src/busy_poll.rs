//! Busy polling: after a request, one runtime worker stays on its core for a short window,
//! polling the sockets, instead of going to sleep in the kernel until the next one.
//!
//! A worker with nothing to do parks in `epoll_wait`, and its core goes idle; the next
//! request must then wake it. On a virtual machine that does not poll before it halts an
//! idle vCPU, that wake-up is an inter-processor interrupt through the hypervisor, which can
//! cost more than the request itself: measured on the project's 2-core VM, an uncontended
//! LOCK+UNLOCK round trip took 200 µs with the workers parking and 23 µs with a 50 µs window,
//! and a contended hand-over chain ran 2.3× faster (contrib/bench/RESULTS.md). Go's runtime
//! spins the same way before it parks, which is what dflockd gains from.
//!
//! The cost is CPU while requests come: at most one core, and only within the window after
//! the latest request, so an idle server spends nothing. A machine whose cores are wanted by
//! other programs between requests (lockd beside the jobs it serves, on a small box) can turn
//! it off with `--busy-poll 0`.
//!
//! Polling also stops by itself where it does not pay ([`Ledger`]): where requests come
//! further apart than the window (a holder that works 100 µs between its requests), each
//! window is spun for nothing; where they come so fast that a worker is busy anyway (64
//! clients), the spinning catches nothing a worker would not have read, and keeping a worker
//! from ever sleeping costs the other programs on the machine their CPU (13-18% fewer
//! cycles at C=64 with the clients on the same cores, RESULTS.md). So the poller counts what it
//! catches: a request it reads after spinning idle for a while is one that would have had to
//! wake a sleeping worker. Each time it has spun for [`JUDGE_EVERY`], it must have caught at
//! least one request per window it spent idle, or it rests (workers sleep as with
//! `--busy-poll 0`) and tries again later, resting twice as long each time it fails, up to
//! [`LONGEST_REST`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::BusyPollSeries;

/// The longest `--busy-poll` window: past a few milliseconds it only burns CPU.
pub const MAX_WINDOW: Duration = Duration::from_millis(10);

/// How long the poller spins between two judgements of whether it pays: long enough to
/// count hundreds of requests and to ride out a client descheduled for a few milliseconds,
/// short enough that a try after a rest costs little.
pub const JUDGE_EVERY: Duration = Duration::from_millis(20);

/// A request counts as caught by the poller when it arrives after at least this much idle
/// spinning: one that comes while the worker is still busy needed no polling to be read.
pub const CAUGHT_AFTER: Duration = Duration::from_micros(5);

/// A turn of the poller shorter than this (or than twice the fastest turn seen, on a
/// machine where one turn's syscall is slower) ran nothing else: the worker was idle.
const IDLE_TURN: Duration = Duration::from_micros(3);

/// The first rest after polling did not pay; each further failed try doubles it.
pub const FIRST_REST: Duration = Duration::from_millis(10);

/// The longest rest: the longest a change of workload waits before polling is tried again.
pub const LONGEST_REST: Duration = Duration::from_secs(1);

/// Whether polling pays: how long it spun, how much of that idle, and what it caught since
/// the last judgement. Pure (no clock of its own), so that its rule is tested on its own.
#[derive(Debug)]
pub struct Ledger {
    window: Duration,
    spun: Duration,
    idle: Duration,
    caught: u64,
    rest: Duration,
    /// The fastest turn seen: what one turn that ran nothing else costs on this machine.
    fastest: Duration,
}

/// What the ledger says after a judgement.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Polling caught enough: keep on.
    Poll,
    /// Polling did not pay: let the workers sleep this long before trying again.
    Rest(Duration),
}

impl Ledger {
    /// A ledger for a poller that spins `window` after each request.
    pub fn new(window: Duration) -> Ledger {
        Ledger {
            window,
            spun: Duration::ZERO,
            idle: Duration::ZERO,
            caught: 0,
            rest: FIRST_REST,
            fastest: Duration::MAX,
        }
    }

    /// Whether a turn that took `took` ran nothing else (the worker was idle): under
    /// [`IDLE_TURN`], or under twice the fastest turn seen, on a machine whose syscalls make
    /// even an empty turn slower.
    pub fn idle_turn(&mut self, took: Duration) -> bool {
        self.fastest = self.fastest.min(took);
        took < IDLE_TURN.max(self.fastest.saturating_mul(2))
    }

    /// A request arrived after the poller had spun idle for `idle` since the one before it
    /// (or since it began to spin).
    pub fn request(&mut self, idle: Duration) {
        if idle >= CAUGHT_AFTER {
            self.caught += 1;
        }
    }

    /// One turn of the spin took `took`, and ran nothing else if `idle`. Every
    /// [`JUDGE_EVERY`] of spinning, a verdict: polling pays while it catches at least one
    /// request per `window` it spent idle.
    pub fn turn(&mut self, took: Duration, idle: bool) -> Option<Verdict> {
        self.spun += took;
        if idle {
            self.idle += took;
        }
        if self.spun < JUDGE_EVERY {
            return None;
        }
        let pays = u128::from(self.caught) * self.window.as_nanos() >= self.idle.as_nanos();
        self.spun = Duration::ZERO;
        self.idle = Duration::ZERO;
        self.caught = 0;
        Some(if pays {
            self.rest = FIRST_REST;
            Verdict::Poll
        } else {
            let rest = self.rest;
            self.rest = (rest * 2).min(LONGEST_REST);
            Verdict::Rest(rest)
        })
    }
}

/// The poller, shared by every connection (which tells it of each request) and its task.
#[derive(Debug)]
pub struct BusyPoll {
    window: Duration,
    /// Requests seen so far: the task spins while this keeps moving.
    requests: AtomicU64,
    /// The task is parked (the window passed with no request): the next request wakes it.
    parked: AtomicBool,
    wake: Notify,
    series: BusyPollSeries,
}

impl BusyPoll {
    /// A poller that spins `window` after each request and counts its rests in `series`;
    /// `None` for zero (no polling).
    pub fn new(window: Duration, series: BusyPollSeries) -> Option<Arc<BusyPoll>> {
        (!window.is_zero()).then(|| {
            Arc::new(BusyPoll {
                window,
                requests: AtomicU64::new(0),
                parked: AtomicBool::new(false),
                wake: Notify::new(),
                series,
            })
        })
    }

    /// A request came in. One relaxed increment and one load while the task spins; a wake
    /// only for the first request after a quiet window.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// Spins within the window after each request, parks after a quiet one, rests where
    /// polling does not pay ([`Ledger`]), until `shutdown`. Each turn is a `yield_now`, which
    /// tokio runs after polling the sockets without waiting: a request arriving meanwhile is
    /// read at once, on a worker that is already awake.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ledger = Ledger::new(self.window);
        loop {
            let mut seen = self.requests.load(Ordering::Relaxed);
            let mut turn = Instant::now();
            let mut until = turn + self.window;
            // Spun idle since the latest request (or since the spin began).
            let mut idle = Duration::ZERO;
            let mut rest = None;
            while turn < until && rest.is_none() {
                tokio::task::yield_now().await;
                let now = Instant::now();
                let took = now - turn;
                turn = now;
                let idle_turn = ledger.idle_turn(took);
                if idle_turn {
                    idle += took;
                }
                if let Some(Verdict::Rest(time)) = ledger.turn(took, idle_turn) {
                    rest = Some(time);
                }
                let requests = self.requests.load(Ordering::Relaxed);
                if requests != seen {
                    seen = requests;
                    until = now + self.window;
                    ledger.request(idle);
                    idle = Duration::ZERO;
                }
                if shutdown.is_cancelled() {
                    return;
                }
            }
            if let Some(rest) = rest {
                tracing::debug!(
                    ?rest,
                    "busy polling rests: it caught too few requests to pay"
                );
                self.series.rests.inc();
                self.series.resting.set(1);
                tokio::select! {
                    () = tokio::time::sleep(rest) => {}
                    () = shutdown.cancelled() => return,
                }
                self.series.resting.set(0);
            }
            let woken = self.wake.notified();
            tokio::pin!(woken);
            // Registered before `parked` is set, so a request in between is not missed.
            woken.as_mut().enable();
            self.parked.store(true, Ordering::Release);
            if self.requests.load(Ordering::Acquire) != seen {
                self.parked.store(false, Ordering::Release);
                continue;
            }
            tokio::select! {
                () = &mut woken => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_micros(50);
    const TURN: Duration = Duration::from_micros(1);

    /// Spins `JUDGE_EVERY` in idle turns of `TURN`, a request arriving every `every` turns
    /// (none for 0), and returns the verdict at the end.
    fn judge(ledger: &mut Ledger, every: u32) -> Verdict {
        let turns = (JUDGE_EVERY.as_nanos() / TURN.as_nanos()) as u32;
        let mut idle = Duration::ZERO;
        for i in 1..=turns {
            idle += TURN;
            if every != 0 && i % every == 0 {
                ledger.request(idle);
                idle = Duration::ZERO;
            }
            if let Some(verdict) = ledger.turn(TURN, true) {
                assert_eq!(i, turns, "a verdict only after JUDGE_EVERY of spinning");
                return verdict;
            }
        }
        panic!("no verdict after JUDGE_EVERY of spinning");
    }

    #[test]
    fn polling_that_catches_a_request_per_window_goes_on() {
        let mut ledger = Ledger::new(WINDOW);
        // A client whose next request comes 20 µs after the reply (one uncontended client).
        assert_eq!(judge(&mut ledger, 20), Verdict::Poll);
        // Exactly one per window is still enough.
        assert_eq!(judge(&mut ledger, 50), Verdict::Poll);
    }

    #[test]
    fn polling_that_catches_too_little_rests_longer_each_time_until_it_pays_again() {
        let mut ledger = Ledger::new(WINDOW);
        // A holder working 100 µs between requests: most windows run out with nothing.
        let mut rests = Vec::new();
        for _ in 0..9 {
            match judge(&mut ledger, 150) {
                Verdict::Rest(rest) => rests.push(rest.as_millis()),
                Verdict::Poll => panic!("polling that catches one request in 150 µs pays"),
            }
        }
        assert_eq!(rests, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        // Quiet: nothing caught at all.
        assert_eq!(judge(&mut ledger, 0), Verdict::Rest(LONGEST_REST));
        // A try that pays keeps polling on, and the next failure rests the shortest time.
        assert_eq!(judge(&mut ledger, 10), Verdict::Poll);
        assert_eq!(judge(&mut ledger, 0), Verdict::Rest(FIRST_REST));
    }

    #[test]
    fn requests_read_while_the_worker_was_busy_are_not_caught() {
        let mut ledger = Ledger::new(WINDOW);
        // Many requests, each right after the one before (64 clients keep the workers busy):
        // polling read nothing a busy worker would not have read.
        let turns = (JUDGE_EVERY.as_nanos() / TURN.as_nanos()) as u32;
        let mut verdict = None;
        for i in 0..turns {
            ledger.request(Duration::from_micros(1));
            // One idle turn in 100, the rest spent running connections.
            verdict = ledger.turn(TURN, i % 100 == 0);
        }
        assert_eq!(verdict, Some(Verdict::Rest(FIRST_REST)));
    }

    #[test]
    fn an_idle_turn_is_a_short_one_or_up_to_twice_the_fastest() {
        let us = Duration::from_micros;
        let mut ledger = Ledger::new(WINDOW);
        // A fast machine: under 3 µs is idle, longer turns ran connections.
        assert!(ledger.idle_turn(us(1)));
        assert!(ledger.idle_turn(us(2)));
        assert!(!ledger.idle_turn(us(3)));
        assert!(!ledger.idle_turn(us(40)));
        // A machine whose empty turn takes 5 µs: up to twice that is idle.
        let mut slow = Ledger::new(WINDOW);
        assert!(slow.idle_turn(us(8)), "the first turn is the yardstick");
        assert!(!slow.idle_turn(us(40)));
        assert!(slow.idle_turn(us(5)));
        assert!(slow.idle_turn(us(9)));
        assert!(!slow.idle_turn(us(10)));
        assert!(!slow.idle_turn(us(40)));
    }

    #[test]
    fn zero_is_no_polling() {
        let series = BusyPollSeries::default;
        assert!(BusyPoll::new(Duration::ZERO, series()).is_none());
        assert!(BusyPoll::new(Duration::from_micros(50), series()).is_some());
    }

    /// The task parks after a quiet window, a request wakes it, and it ends with shutdown.
    #[tokio::test(flavor = "current_thread", start_paused = false)]
    async fn parks_when_quiet_wakes_on_a_request_and_ends_with_shutdown() {
        let poll =
            BusyPoll::new(Duration::from_micros(200), BusyPollSeries::default()).expect("a poller");
        let stop = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&poll).run(stop.clone()));
        let parked = || poll.parked.load(Ordering::Acquire);
        let guard = Instant::now() + Duration::from_secs(10);
        while !parked() {
            assert!(Instant::now() < guard, "never parked");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        poll.request();
        assert!(!parked(), "a request unparks it");
        while !parked() {
            assert!(Instant::now() < guard, "never parked again");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("ends with shutdown")
            .expect("no panic");
    }
}
