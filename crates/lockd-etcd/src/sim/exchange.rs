//! One request's round trip through the simulated network: out, applied at etcd (unless
//! refused), back (unless lost), each leg's time and fate chosen by the seeded source, so
//! that every request of a front-end meets what a real network and etcd can do to it.

use tokio::time::sleep;

use super::super::Error;
use super::words::{status, timed_out};
use super::{Net, World};

impl Net {
    /// One request's round trip: out, applied by `apply` (unless refused), back; see the
    /// description of [`sim`](super). `apply` returns the answer and how it went, in words.
    pub(super) async fn exchange<T, F>(&self, fe: usize, what: String, apply: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut World) -> Result<(T, String), Error> + Send + 'static,
    {
        let (there, back, timeout, lose, reachable, instant) = {
            let mut w = self.world();
            let per_mille = w.faults.lose_per_mille;
            let lose = w.faulty && w.rng.chance(per_mille);
            let reachable = w.reachable(fe);
            let instant = w.faults.delay.is_zero();
            (
                w.delay(),
                w.delay(),
                w.request_timeout,
                lose,
                reachable,
                instant,
            )
        };
        if !reachable {
            sleep(timeout).await;
            return Err(timed_out());
        }
        if there >= timeout {
            let net = self.clone();
            tokio::spawn(async move {
                sleep(there).await;
                let before = net.revision();
                if net.arrive(fe, &what, apply, true).is_ok() && net.revision() != before {
                    let mut w = net.world();
                    let (at, rev) = (w.now_ms(), w.etcd.revision());
                    w.late.push((fe, at, rev));
                }
            });
            sleep(timeout).await;
            return Err(timed_out());
        }
        travel(there, instant).await;
        let before = self.revision();
        let result = self.arrive(fe, &what, apply, lose || there + back >= timeout);
        let after = self.revision();
        if lose || there + back >= timeout {
            if result.is_ok() && after != before {
                self.world().lost.push((fe, after));
            }
            sleep(timeout - there).await;
            return Err(timed_out());
        }
        travel(back, instant).await;
        // An answer that comes to a crashed front-end was lost too.
        if result.is_ok() && after != before {
            let mut w = self.world();
            let at = w.now_ms();
            if w.front(fe).dead {
                w.lost.push((fe, after));
            } else {
                w.answered.push((fe, after, at));
            }
        }
        result
    }

    /// A request reaches etcd (`lost`: its answer will not reach the client).
    fn arrive<T, F>(&self, fe: usize, what: &str, apply: F, lost: bool) -> Result<T, Error>
    where
        F: FnOnce(&mut World) -> Result<(T, String), Error>,
    {
        let mut w = self.world();
        if !w.reachable(fe) {
            return Err(timed_out());
        }
        if w.leaderless {
            w.note(format_args!("fe{fe}: {what}: refused, no leader"));
            return Err(status(tonic::Code::Unavailable, "etcdserver: no leader"));
        }
        let per_mille = w.faults.fail_per_mille;
        if w.faulty && w.rng.chance(per_mille) {
            let why = match w.rng.below(3) {
                0 => "etcdserver: leader changed",
                1 => "etcdserver: request timed out",
                _ => "etcdserver: too many requests",
            };
            w.note(format_args!("fe{fe}: {what}: refused, not applied ({why})"));
            return Err(status(tonic::Code::Unavailable, why));
        }
        w.tick();
        let result = apply(&mut w);
        let rev = w.etcd.revision();
        let lost = if lost { ", answer lost" } else { "" };
        match &result {
            Ok((_, how)) if how.is_empty() && lost.is_empty() => {}
            Ok((_, how)) => w.note(format_args!("fe{fe}: {what}: {how}{lost} (revision {rev})")),
            Err(e) => w.note(format_args!("fe{fe}: {what}: failed: {e}")),
        }
        result.map(|(t, _)| t)
    }
}

/// One leg's travel time. On an instant network (a zero [`Faults::delay`](super::Faults)) a
/// leg of zero takes no time at all; elsewhere it still waits for the timer's next tick (a
/// `sleep` of zero does, up to a millisecond), as the simulator's seeds were recorded with.
async fn travel(d: std::time::Duration, instant: bool) {
    if !(instant && d.is_zero()) {
        sleep(d).await;
    }
}
