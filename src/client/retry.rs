//! What a client may try again, and how long it waits in between: a cluster front-end that
//! answers `ERR UNAVAILABLE` (etcd out of reach, an election), closes the connection or
//! cannot be reached at all may be followed by a healthy one a moment later, or by the same
//! one once etcd is back. [`Retry`] is the policy of one request: tries until a deadline (the
//! caller's wait; none waits as long as it takes) or one round over the addresses
//! (`wait=0`, which answers at once), with a jittered, capped [`Backoff`] between tries.
//!
//! Retrying a LOCK is safe because the retry is the same LOCK with the same id: one answered
//! `ERR UNAVAILABLE` may have been granted after all (the answer was lost, not the write), and
//! the same id again gets that grant back (proto.md, "The same id again").

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::ClientError;
use crate::proto::ErrorCode;

/// The first pause after a failed try: an etcd election is over in about a second, a lost
/// connection is often back at once.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest pause: a front-end that is back is found within a second.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Whether a request that failed this way may succeed if sent again (through the next
/// address, or the same one later): `ERR UNAVAILABLE` and `ERR SHUTDOWN` (this front-end can't
/// serve it now; another may), a closed or failed connection. Every other `ERR` would be
/// answered alike, and an unexpected reply means this client and the server disagree.
pub fn retryable(e: &ClientError) -> bool {
    match e {
        ClientError::Refused(e) => matches!(e.code, ErrorCode::Unavailable | ErrorCode::Shutdown),
        ClientError::Io(_) | ClientError::Closed => true,
        ClientError::Unexpected(_) => false,
    }
}

/// Pauses that double from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`], each one drawn between
/// half and all of its step (so that clients turned away at the same moment do not all come
/// back at the same moment).
#[derive(Clone, Debug)]
pub struct Backoff {
    step: Duration,
    first: Duration,
    max: Duration,
    /// xorshift64 state: the jitter needs no more than that, and never zero.
    state: u64,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new(FIRST_BACKOFF, MAX_BACKOFF)
    }
}

impl Backoff {
    /// From `first` doubling up to `max`, seeded from the clock.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Backoff::seeded(
            first,
            max,
            u64::from(nanos) ^ u64::from(std::process::id()) << 32,
        )
    }

    /// The same with a given seed: the same pauses every time (for tests).
    pub fn seeded(first: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            step: first,
            first,
            max: max.max(first),
            state: seed | 1,
        }
    }

    /// The next pause.
    pub fn next_pause(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        // Half of the step, plus up to the other half.
        let half = step / 2;
        let spread = u64::try_from((step - half).as_micros()).unwrap_or(u64::MAX);
        let extra = match spread {
            0 => 0,
            s => self.random() % (s + 1),
        };
        half + Duration::from_micros(extra)
    }

    /// Back to the first step: after a success, the next failure is a new one.
    pub fn reset(&mut self) {
        self.step = self.first;
    }

    fn random(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }
}

/// The retry policy of one request: until when it may be tried again, the pauses in between,
/// and the last reason it failed (for the message when it gives up).
#[derive(Clone, Debug)]
pub struct Retry {
    /// `None`: as long as it takes.
    until: Option<Instant>,
    /// Tries left when there is no time to wait (`wait=0`): one per address.
    tries_left: Option<usize>,
    backoff: Backoff,
    last: Option<String>,
    failures: usize,
}

impl Retry {
    /// Retries for `wait` from now, or (`None`) as long as it takes.
    pub fn within(wait: Option<Duration>) -> Retry {
        Retry {
            until: wait.map(|w| Instant::now() + w),
            tries_left: None,
            backoff: Backoff::default(),
            last: None,
            failures: 0,
        }
    }

    /// No waiting at all (a LOCK with `wait=0`): `tries` tries (one per address, so that a
    /// front-end that can't serve does not hide one that can), with no pause in between.
    pub fn once(tries: usize) -> Retry {
        Retry {
            until: Some(Instant::now()),
            tries_left: Some(tries.max(1)),
            backoff: Backoff::default(),
            last: None,
            failures: 0,
        }
    }

    /// The same policy with another [`Backoff`] (for tests).
    pub fn with_backoff(mut self, backoff: Backoff) -> Retry {
        self.backoff = backoff;
        self
    }

    /// Whether this is [`Retry::once`]: a round over the addresses, no waiting.
    pub fn answers_at_once(&self) -> bool {
        self.tries_left.is_some()
    }

    /// Whether the retrying is over: the round of [`Retry::once`], or the wait ran out. A
    /// connection that can't be made then ends it for good.
    pub fn ran_out(&self) -> bool {
        self.answers_at_once() || self.left().is_some_and(|l| l.is_zero())
    }

    /// The time left; `None` without a deadline.
    pub fn left(&self) -> Option<Duration> {
        self.until
            .map(|u| u.saturating_duration_since(Instant::now()))
    }

    /// When it gives up; `None` without a deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.until
    }

    /// A try failed because of `cause` (one line, naming the server and what it said): how
    /// long to pause before the next try, or `None` when the time (or the round) is up.
    pub fn failed(&mut self, cause: impl Into<String>) -> Option<Duration> {
        self.last = Some(cause.into());
        self.failures += 1;
        if let Some(n) = self.tries_left.as_mut() {
            *n = n.saturating_sub(1);
            return (*n > 0).then_some(Duration::ZERO);
        }
        let pause = self.backoff.next_pause();
        match self.left() {
            None => Some(pause),
            Some(left) if left.is_zero() => None,
            Some(left) => Some(pause.min(left)),
        }
    }

    /// A try got through (an answer that is not a retryable failure): the next failure
    /// starts the backoff again.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// Why the latest try failed, if one did.
    pub fn last_cause(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// How many tries failed so far.
    pub fn failures(&self) -> usize {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ProtoError;

    fn backoff() -> Backoff {
        Backoff::seeded(FIRST_BACKOFF, MAX_BACKOFF, 7)
    }

    #[test]
    fn pauses_double_up_to_the_cap_each_within_its_step() {
        let mut b = backoff();
        let mut step = FIRST_BACKOFF;
        for _ in 0..12 {
            let p = b.next_pause();
            assert!(p >= step / 2 && p <= step, "{p:?} outside {step:?}");
            step = (step * 2).min(MAX_BACKOFF);
        }
        // Capped: never more than the cap however long it goes on.
        assert!((0..100).all(|_| b.next_pause() <= MAX_BACKOFF));
    }

    #[test]
    fn pauses_are_jittered() {
        let mut b = backoff();
        for _ in 0..10 {
            b.next_pause();
        }
        let capped: Vec<Duration> = (0..20).map(|_| b.next_pause()).collect();
        assert!(
            capped.windows(2).any(|w| w[0] != w[1]),
            "the same pause every time: {capped:?}"
        );
    }

    #[test]
    fn reset_starts_from_the_first_step() {
        let mut b = backoff();
        for _ in 0..10 {
            b.next_pause();
        }
        b.reset();
        assert!(b.next_pause() <= FIRST_BACKOFF);
    }

    #[test]
    fn what_may_be_retried() {
        let refused = |code| ClientError::Refused(ProtoError::new(code, "x"));
        assert!(retryable(&refused(ErrorCode::Unavailable)));
        assert!(retryable(&refused(ErrorCode::Shutdown)));
        assert!(retryable(&ClientError::Closed));
        assert!(retryable(&ClientError::Io(std::io::Error::other("reset"))));
        assert!(!retryable(&refused(ErrorCode::NotHeld)));
        assert!(!retryable(&refused(ErrorCode::Timeout)));
        assert!(!retryable(&refused(ErrorCode::Conflict)));
        assert!(!retryable(&ClientError::Unexpected("OK?".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_deadline_it_never_gives_up() {
        let mut r = Retry::within(None).with_backoff(backoff());
        for k in 0..1000 {
            let pause = r.failed(format!("try {k}")).expect("goes on");
            assert!(pause <= MAX_BACKOFF);
            tokio::time::advance(pause).await;
        }
        assert_eq!(r.last_cause(), Some("try 999"));
        assert_eq!(r.failures(), 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn it_gives_up_when_the_wait_is_over_and_never_pauses_past_it() {
        let wait = Duration::from_millis(1500);
        let mut r = Retry::within(Some(wait)).with_backoff(backoff());
        let start = Instant::now();
        let mut tries = 0;
        while let Some(pause) = r.failed("lockd at a:1 answered ERR UNAVAILABLE") {
            assert!(
                Instant::now() + pause <= start + wait,
                "pauses past the wait"
            );
            tokio::time::advance(pause).await;
            tries += 1;
            assert!(tries < 100, "never gives up");
        }
        assert!(Instant::now() >= start + wait);
        assert!(tries >= 3, "only {tries} tries in {wait:?}");
        assert_eq!(r.left(), Some(Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_wait_each_address_is_tried_once_without_a_pause() {
        let mut r = Retry::once(3);
        assert_eq!(r.failed("a"), Some(Duration::ZERO));
        assert_eq!(r.failed("b"), Some(Duration::ZERO));
        assert_eq!(r.failed("c"), None);
        assert_eq!(r.last_cause(), Some("c"));
        let mut one = Retry::once(1);
        assert_eq!(one.failed("a"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_restarts_the_backoff() {
        let mut r = Retry::within(None).with_backoff(backoff());
        for _ in 0..10 {
            r.failed("x");
        }
        r.succeeded();
        assert!(r.failed("x").expect("goes on") <= FIRST_BACKOFF);
    }
}
