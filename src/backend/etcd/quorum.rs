//! Whether this front-end hears from an etcd quorum, and since when it has not.
//!
//! A front-end that can still reach one etcd member is not thereby able to grant: a member
//! cut off from the others (or the last one standing) accepts connections, keeps a watch
//! open and answers nothing that needs its leader. So readiness is not "a connection is up"
//! but the age of the last answer only a leader with its quorum gives: a linearizable read or
//! a transaction ([`super::Cluster::txn`], [`super::Cluster::get`]), a lease grant or a
//! keep-alive response (etcd answers those on the leader). Watch events prove nothing of the
//! sort and do not count. When nothing else was answered lately, [`Cluster::probe_loop`]
//! asks for one: a count-only linearizable read of the token base key, a quarter of the bound
//! apart.
//!
//! The bound is `max(1s, --etcd-lease-ttl / 3)`. A third of the lease: this front-end's
//! session leases and waiters hang on its etcd lease, which etcd ends `--etcd-lease-ttl`
//! after its last keep-alive, so a front-end that has not heard from a quorum for a third of
//! it is taken out of rotation (`/readyz` 503) with two thirds of the lease left for clients
//! to move; and the keep-alive itself runs every third of the lease, so a healthy front-end
//! is never near it. At least a second, so a healthy cluster whose commits take a few
//! hundred milliseconds under load does not flap the probe.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::rpc::GetOptions;

use crate::backend::now;

use super::Cluster;

/// No answer yet.
const NEVER: u64 = 0;

/// When a quorum last answered this front-end, and why nothing has since.
pub struct Quorum {
    origin: Instant,
    /// One more than the milliseconds from `origin` to the last answer, or [`NEVER`] (so
    /// that `fetch_max` keeps the latest answer whatever order threads report them in).
    last: AtomicU64,
    /// The cause of the last failure since that answer.
    failing: Mutex<Option<String>>,
    bound: Duration,
}

impl Quorum {
    pub fn new(lease_ttl: Duration) -> Quorum {
        Quorum {
            origin: now(),
            last: AtomicU64::new(NEVER),
            failing: Mutex::new(None),
            bound: bound(lease_ttl),
        }
    }

    /// Past this age, this front-end is not ready.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// A quorum answered just now. `Some(age)` if the answer before it was past the bound
    /// (the front-end is ready again), with how long ago that was.
    pub fn answered(&self) -> Option<Duration> {
        let at = now().saturating_duration_since(self.origin).as_millis() as u64 + 1;
        let before = self.last.load(Ordering::Relaxed);
        let recovered = (before != NEVER && !self.fresh()).then(|| self.age());
        self.last.fetch_max(at, Ordering::Relaxed);
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        *failing = None;
        recovered
    }

    /// A request failed, for `cause`.
    pub fn failed(&self, cause: &str) {
        *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = Some(cause.to_owned());
    }

    /// How long since a quorum last answered (since start if it never did).
    pub fn age(&self) -> Duration {
        let since = now().saturating_duration_since(self.origin);
        match self.last.load(Ordering::Relaxed) {
            NEVER => since,
            at => since.saturating_sub(Duration::from_millis(at - 1)),
        }
    }

    /// Whether the last answer is within the bound.
    pub fn fresh(&self) -> bool {
        self.last.load(Ordering::Relaxed) != NEVER && self.age() <= self.bound
    }

    /// Why this front-end is not ready, if it is not: "etcd: no quorum answer for 2.3s: etcd
    /// has no leader".
    pub fn stale(&self) -> Option<String> {
        if self.fresh() {
            return None;
        }
        let age = self.age().as_secs_f64();
        let failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        Some(match failing.as_deref() {
            Some(cause) => format!("etcd: no quorum answer for {age:.1}s: {cause}"),
            None => format!("etcd: no quorum answer for {age:.1}s: requests unanswered"),
        })
    }
}

/// The readiness bound for `lease_ttl` (see the module's doc).
pub fn bound(lease_ttl: Duration) -> Duration {
    (lease_ttl / 3).max(Duration::from_secs(1))
}

impl Cluster {
    /// Whether this front-end may serve: a quorum answered within the bound and its etcd
    /// lease is confirmed live; else why not, in one sentence.
    pub(super) fn ready(&self) -> Result<(), std::borrow::Cow<'static, str>> {
        if let Some(why) = self.quorum.stale() {
            Err(why.into())
        } else if !self.leased.load(Ordering::Relaxed) {
            Err("this front-end's etcd lease is not confirmed live (keep-alive unanswered, or it ran out and a new one is being taken)".into())
        } else {
            Ok(())
        }
    }

    /// How old this front-end's view is: the age of its last quorum answer, and the bound
    /// past which it is not ready.
    pub fn freshness(&self) -> crate::proto::EtcdAge {
        crate::proto::EtcdAge {
            age: self.quorum.age(),
            bound: self.quorum.bound(),
        }
    }

    /// Asks etcd for a quorum answer whenever nothing else brought one for a quarter of the
    /// bound, so the age `/readyz` and STATUS report is never older than that while etcd is
    /// well; and once none came for longer than the etcd lease, ends this front-end's waits
    /// ([`Cluster::end_waits_cut_off`]).
    pub(super) async fn probe_loop(self: Arc<Self>) {
        let period = (self.quorum.bound() / 4).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(period).await;
            let age = self.quorum.age();
            if age > self.config.lease_ttl {
                self.end_waits_cut_off(age);
            }
            if age < period {
                continue;
            }
            let key = self.layout.base();
            let read = self.get(key, Some(GetOptions::new().with_count_only()));
            if tokio::time::timeout(self.config.request_timeout, read)
                .await
                .is_err()
            {
                self.quorum.failed(&format!(
                    "etcd request timed out after {}",
                    humantime::format_duration(self.config.request_timeout)
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_is_a_third_of_the_lease_at_least_a_second() {
        assert_eq!(
            bound(Duration::from_secs(5)),
            Duration::from_nanos(1_666_666_666)
        );
        assert_eq!(bound(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(bound(Duration::from_secs(1)), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn stale_past_the_bound_with_the_cause() {
        let q = Quorum::new(Duration::from_secs(3));
        assert!(!q.fresh(), "never answered");
        assert_eq!(q.answered(), None, "a first answer is no recovery");
        assert!(q.fresh());
        assert!(q.stale().is_none());
        q.failed("etcd has no leader");
        tokio::time::advance(Duration::from_millis(1500)).await;
        let why = q.stale().expect("stale past 1s");
        assert!(why.starts_with("etcd: no quorum answer for 1.5s"), "{why}");
        assert!(why.ends_with(": etcd has no leader"), "{why}");
        assert_eq!(
            q.answered(),
            Some(Duration::from_millis(1500)),
            "ready again"
        );
        assert!(q.fresh());
        assert_eq!(q.age(), Duration::ZERO);
    }
}
