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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The longest `--busy-poll` window: past a few milliseconds it only burns CPU.
pub const MAX_WINDOW: Duration = Duration::from_millis(10);

/// The poller, shared by every connection (which tells it of each request) and its task.
#[derive(Debug)]
pub struct BusyPoll {
    window: Duration,
    /// Requests seen so far: the task spins while this keeps moving.
    requests: AtomicU64,
    /// The task is parked (the window passed with no request): the next request wakes it.
    parked: AtomicBool,
    wake: Notify,
}

impl BusyPoll {
    /// A poller that spins `window` after each request; `None` for zero (no polling).
    pub fn new(window: Duration) -> Option<Arc<BusyPoll>> {
        (!window.is_zero()).then(|| {
            Arc::new(BusyPoll {
                window,
                requests: AtomicU64::new(0),
                parked: AtomicBool::new(false),
                wake: Notify::new(),
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

    /// Spins within the window after each request, parks after a quiet one, until
    /// `shutdown`. Each turn is a `yield_now`, which tokio runs after polling the sockets
    /// without waiting: a request arriving meanwhile is read at once, on a worker that is
    /// already awake.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let mut seen = self.requests.load(Ordering::Relaxed);
            let mut until = Instant::now() + self.window;
            while Instant::now() < until {
                tokio::task::yield_now().await;
                let now = self.requests.load(Ordering::Relaxed);
                if now != seen {
                    seen = now;
                    until = Instant::now() + self.window;
                }
                if shutdown.is_cancelled() {
                    return;
                }
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

    #[test]
    fn zero_is_no_polling() {
        assert!(BusyPoll::new(Duration::ZERO).is_none());
        assert!(BusyPoll::new(Duration::from_micros(50)).is_some());
    }

    /// The task parks after a quiet window, a request wakes it, and it ends with shutdown.
    #[tokio::test(flavor = "current_thread", start_paused = false)]
    async fn parks_when_quiet_wakes_on_a_request_and_ends_with_shutdown() {
        let poll = BusyPoll::new(Duration::from_micros(200)).expect("a poller");
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
