//! Keeps a lease alive while the command runs: renews it, reconnects when the connection
//! drops, and says when the lease is lost, early enough that the command can be stopped before
//! the server could grant the lock to anyone else.
//!
//! The deadline lockctl works to is `time the last successful RENEW was sent + window`, where
//! the window is the ttl, or the session grace if that is shorter. The server extended the
//! lease at some moment after that send, so the ttl cannot run out earlier; and it still had
//! the connection then, so if it sees the connection close, the grace cannot start earlier.
//! Renewing every third of the window (at most every 2s with several addresses, see
//! [`CLUSTER_INTERVAL`]) keeps that deadline ahead, across dropped connections.
//!
//! A front-end that cannot serve the RENEW (a cluster front-end cut off from etcd answers
//! `ERR UNAVAILABLE` after its `--etcd-request-timeout`, or not at all) is left for the next
//! address at once: the lease moves to the front-end that renews it (proto.md). With several
//! addresses each try is bounded by half an interval, connection included, so that a try
//! stuck on a cut-off front-end from its renewal time still leaves the next address a sixth
//! of the window (less the margin and the kill grace) before the command must be stopped.

use std::sync::Arc;
use std::time::Duration;

use lockd::client::hold::{self, FIRST_RETRY};
use lockd::client::{Client, ClientError};
use lockd::locks::{EventKind, Token};
use lockd::proto::{ErrorCode, Tie};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};

use crate::net::Server;

/// The lock being held.
#[derive(Clone, Debug)]
pub struct HeldLease {
    /// The name renewed and released: of a set, its first, which stands for the whole set.
    pub name: String,
    pub token: Token,
    pub ttl: Duration,
    /// A set's further names, for messages only (one lease: nothing is sent for them).
    pub also: Vec<String>,
}

impl HeldLease {
    /// The lease as messages name it: `deploy`, or `db-migrate (with cache-flush)`.
    pub fn shown(&self) -> String {
        if self.also.is_empty() {
            return self.name.clone();
        }
        format!("{} (with {})", self.name, self.also.join(", "))
    }
}

/// How the time of one lease is split up: the library's [`hold::Timing`] (when to renew, how
/// long a try may take, the margin kept before the deadline), and the kill grace between
/// SIGTERM and SIGKILL, which must land before the margin.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    lease: hold::Timing,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

impl Timing {
    /// `session_grace` of zero is a plain `session` lease: it ends when the server sees the
    /// connection close, which lockctl cannot bound, so only the ttl counts. `kill_grace` is
    /// capped at a quarter of the window: SIGTERM must not come before lockctl has had a fair
    /// chance to renew, and SIGKILL must still land before the deadline.
    ///
    /// With several `front_ends`, renewals come at least every 2s, so that they can move to
    /// another front-end before a cut-off one's etcd lease ends (its `--etcd-lease-ttl`, 5s by
    /// default, lasts at least two thirds of its ttl after the cut: 3.3s; a renewal stuck on
    /// the cut-off front-end is given up after half an interval, so the next address is
    /// renewing through 1.5 intervals and a retry after the cut at worst, 3.1s, in time).
    pub fn new(
        ttl: Duration,
        session_grace: Duration,
        kill_grace: Duration,
        front_ends: usize,
    ) -> Timing {
        let lease = hold::Timing::new(ttl, Tie::Session(session_grace), front_ends);
        Timing {
            lease,
            grace: kill_grace.min(lease.window() / 4),
        }
    }

    /// The deadline after a RENEW (or LOCK) sent at `sent` answered with `left` of lease.
    pub fn deadline(&self, sent: Instant, left: Duration) -> Instant {
        self.lease.deadline(sent, left)
    }

    /// When to renew after a RENEW (or LOCK) sent at `sent`.
    pub fn next_renew(&self, sent: Instant) -> Instant {
        self.lease.next_renew(sent)
    }

    /// Whether a grant that took `waited` leaves too little of the lease to start on.
    pub fn needs_early_renew(&self, waited: Duration) -> bool {
        self.lease.needs_early_renew(waited)
    }

    /// When the lease must count as lost and SIGTERM go out: the kill grace before SIGKILL.
    fn term_at(&self, deadline: Instant) -> Instant {
        self.kill_at(deadline)
            .checked_sub(self.grace)
            .unwrap_or(deadline)
    }

    /// When SIGKILL must go out, if the command is still running: the margin before the
    /// deadline.
    fn kill_at(&self, deadline: Instant) -> Instant {
        self.lease.give_up(deadline)
    }

    /// The longest one RENEW may take, connecting included ([`hold::Timing::attempt_limit`]):
    /// one stuck on a front-end from its renewal time is given up at half the window, and the
    /// next address is tried well before [`Timing::term_at`] (at least 65% of the window: the
    /// margin is at most a tenth and the kill grace at most a quarter).
    pub fn attempt_limit(&self) -> Duration {
        self.lease.attempt_limit()
    }

    fn max_retry(&self) -> Duration {
        self.lease.max_retry()
    }
}

/// The lease is lost (or about to be): stop the command by `kill_at`.
#[derive(Debug)]
pub struct Lost {
    pub why: String,
    pub kill_at: Instant,
}

/// How the final UNLOCK went.
#[derive(Debug)]
pub enum Released {
    Done,
    /// The lease had already ended.
    NotHeld(String),
    Failed(String),
    /// Not released: made a plain lease that lasts this long more (`run --at-least`).
    Kept(Duration),
    /// `run --at-least`: lockd did not keep it (`why`), so it was released, as `then` says.
    NotKept {
        why: String,
        then: Box<Released>,
    },
}

/// A connection that is re-opened when it fails. A request cut short drops the connection, so
/// a late reply can never be taken for the answer to a later request.
pub struct Link {
    server: Server,
    client: Option<Client>,
}

enum RenewError {
    NotHeld(String),
    Failed(String),
}

impl Link {
    pub fn new(server: Server, client: Client) -> Link {
        Link {
            server,
            client: Some(client),
        }
    }

    async fn client(&mut self, limit: Duration) -> Result<Client, String> {
        match self.client.take() {
            Some(c) => Ok(c),
            None => {
                let c = self
                    .server
                    .reconnect_once(limit)
                    .await
                    .map_err(|f| f.message.unwrap_or_default())?;
                if self.server.verbose {
                    eprintln!("lockctl: reconnected to lockd at {}", self.server.addr());
                }
                Ok(c)
            }
        }
    }

    /// Waits until `at`, or less if the connection ends first: nothing is owed to lockctl
    /// between requests, so a line, an end or an error all mean this connection is done. With a
    /// session lease the server lets the lock go when it sees the close, so the sooner lockctl
    /// renews (and learns it lost the lease), the sooner the command is stopped.
    async fn idle_until(&mut self, at: Instant) {
        let Some(client) = self.client.as_mut() else {
            return sleep_until(at).await;
        };
        tokio::select! {
            _ = sleep_until(at) => {}
            r = client.read_line() => {
                if self.server.verbose {
                    let why = match r {
                        Ok(line) => format!("unexpected {line:?}"),
                        Err(e) => e.to_string(),
                    };
                    eprintln!("lockctl: connection to lockd at {} ended ({why}); reconnecting", self.server.addr());
                }
                self.client = None;
            }
        }
    }

    /// One RENEW, on a new connection if need be, all within `limit`; returns when it was
    /// sent and the lease left. A failure names the address it came from. One that the next
    /// address may not share (`ERR UNAVAILABLE`, no reply in time, a lost connection) leaves
    /// this connection behind, so that the next try goes to the next address; with a single
    /// address an `ERR UNAVAILABLE` keeps the connection, which is still good.
    async fn renew(
        &mut self,
        lease: &HeldLease,
        limit: Duration,
    ) -> Result<(Instant, Duration), RenewError> {
        let started = Instant::now();
        let mut client = self
            .client(limit.min(self.server.connect_timeout()))
            .await
            .map_err(RenewError::Failed)?;
        let addr = self.server.addr().to_owned();
        let sent = Instant::now();
        let left = limit.saturating_sub(started.elapsed());
        match timeout(
            left,
            client.renew(&lease.name, lease.token, Some(lease.ttl)),
        )
        .await
        {
            Err(_) => Err(RenewError::Failed(format!(
                "lockd at {addr} did not answer RENEW within {}",
                humantime::format_duration(round_ms(limit))
            ))),
            Ok(Ok(left)) => {
                self.client = Some(client);
                Ok((sent, left))
            }
            Ok(Err(ClientError::Refused(e))) => {
                let text = format!("{} {}", e.code, e.message);
                if e.code == ErrorCode::NotHeld {
                    self.client = Some(client);
                    return Err(RenewError::NotHeld(text));
                }
                let move_on = e.code == ErrorCode::Unavailable && self.server.addrs().len() > 1;
                if !e.code.may_close() && !move_on {
                    self.client = Some(client);
                }
                Err(RenewError::Failed(format!(
                    "lockd at {addr} answered ERR {text}"
                )))
            }
            Ok(Err(ClientError::Closed)) => Err(RenewError::Failed(format!(
                "lockd at {addr} closed the connection"
            ))),
            Ok(Err(e)) => Err(RenewError::Failed(format!("lockd at {addr}: {e}"))),
        }
    }

    /// `RENEW ... ttl=<ttl> detach`, on a new connection (or the next address) if the old
    /// one fails: the lease becomes a plain one that ends `ttl` from now; the time left.
    pub async fn renew_detach(
        &mut self,
        lease: &HeldLease,
        ttl: Duration,
    ) -> Result<Duration, String> {
        let limit = self.server.connect_timeout();
        let mut last = String::new();
        for _ in 0..2 {
            let mut client = self.client(limit).await?;
            match timeout(
                limit,
                client.renew_detach(&lease.name, lease.token, Some(ttl)),
            )
            .await
            {
                Ok(Ok(left)) => {
                    self.client = Some(client);
                    return Ok(left);
                }
                Ok(Err(ClientError::Refused(e))) if e.code == ErrorCode::Unavailable => {
                    last = format!("lockd answered ERR {} {}", e.code, e.message);
                }
                Ok(Err(ClientError::Refused(e))) => {
                    if !e.code.may_close() {
                        self.client = Some(client);
                    }
                    return Err(format!("lockd refused: {} {}", e.code, e.message));
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "no reply to RENEW".into(),
            }
        }
        Err(last)
    }

    /// UNLOCK, on a new connection if the old one fails.
    pub async fn release(&mut self, lease: &HeldLease) -> Released {
        let limit = self.server.connect_timeout();
        let mut last = String::new();
        for _ in 0..2 {
            let mut client = match self.client(limit).await {
                Ok(c) => c,
                Err(e) => return Released::Failed(e),
            };
            match timeout(limit, client.unlock(&lease.name, lease.token)).await {
                Ok(Ok(())) => return Released::Done,
                Ok(Err(ClientError::Refused(e))) if e.code == ErrorCode::NotHeld => {
                    return Released::NotHeld(format!("{} {}", e.code, e.message))
                }
                Ok(Err(ClientError::Refused(e))) => {
                    return Released::Failed(format!("lockd refused: {} {}", e.code, e.message))
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "no reply to UNLOCK".into(),
            }
        }
        Released::Failed(last)
    }
}

/// The handle of a running keeper.
pub struct Keeper {
    lost: mpsc::Receiver<Lost>,
    /// `None`: release; `Some(d)`: keep the lock `d` more as a plain lease (`--at-least`).
    stop: Option<oneshot::Sender<Option<Duration>>>,
    task: JoinHandle<Released>,
    /// [`watch_breaks`], ended with the keeper.
    _watch: AbortOnDrop,
}

/// A task that ends when its handle is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Keeper {
    /// Starts renewing. `deadline` is the lease's end as far as lockctl can be sure of it.
    pub fn spawn(
        link: Link,
        lease: HeldLease,
        timing: Timing,
        deadline: Instant,
        next_renew: Instant,
    ) -> Keeper {
        let (lost_tx, lost) = mpsc::channel(1);
        let (stop, stop_rx) = oneshot::channel();
        let wake = Arc::new(Notify::new());
        let watch = tokio::spawn(watch_breaks(
            link.server.clone(),
            lease.name.clone(),
            lease.token,
            Arc::clone(&wake),
        ));
        let state = KeeperState {
            link,
            lease,
            timing,
            deadline,
            next_renew,
            wake,
        };
        Keeper {
            lost,
            stop: Some(stop),
            task: tokio::spawn(state.keep(lost_tx, stop_rx)),
            _watch: AbortOnDrop(watch),
        }
    }

    /// Resolves when the lease is lost; never again after that. Cancel-safe.
    pub async fn lost(&mut self) -> Lost {
        match self.lost.recv().await {
            Some(lost) => lost,
            None => std::future::pending().await,
        }
    }

    /// Stops renewing and releases the lock.
    pub async fn release(self) -> Released {
        self.stop_with(None).await
    }

    /// Stops renewing and, rather than release the lock, makes its lease a plain one that
    /// ends `more` from now (`run --at-least`); releases it if lockd refuses that.
    pub async fn keep(self, more: Duration) -> Released {
        self.stop_with(Some(more)).await
    }

    async fn stop_with(mut self, keep: Option<Duration>) -> Released {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(keep);
        }
        match self.task.await {
            Ok(r) => r,
            Err(e) => Released::Failed(format!("lease keeper failed: {e}")),
        }
    }
}

/// Watches the lease's name for a BREAK of this very lease, so that lockctl learns of one at
/// once rather than at its next renewal: a `broken` event of its token wakes the keeper, whose
/// RENEW is then told who broke it, and the command is stopped as for any lost lease. The
/// server hands the name on only once lockctl's UNLOCK says the command is gone (or the lease
/// runs out), so this costs nothing in safety when it can't watch: each time the watch starts
/// (again) the keeper renews at once too, which covers a break while nobody watched. A
/// refusal (no `read` right on the name) leaves it to the renewals.
async fn watch_breaks(server: Server, name: String, token: Token, wake: Arc<Notify>) {
    let mut pause = FIRST_RETRY;
    loop {
        let limit = server.connect_timeout();
        if let Ok(client) = server.connect_once(limit).await {
            match client.events(Some(&name)).await {
                Ok(mut events) => {
                    wake.notify_one();
                    pause = FIRST_RETRY;
                    loop {
                        match events.next().await {
                            Ok(e) if e.kind == EventKind::Broken && e.token == token => {
                                wake.notify_one();
                                return;
                            }
                            Ok(_) | Err(ClientError::Unexpected(_)) => {}
                            Err(_) => break,
                        }
                    }
                }
                Err(ClientError::Refused(e)) if e.code != ErrorCode::Unavailable => return,
                Err(_) => {}
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

struct KeeperState {
    link: Link,
    lease: HeldLease,
    timing: Timing,
    deadline: Instant,
    next_renew: Instant,
    /// Renew now: the lease may have been broken ([`watch_breaks`]).
    wake: Arc<Notify>,
}

enum KeeperStep {
    Stop(Option<Duration>),
    DeadlineNear,
    Renewed(Result<(Instant, Duration), RenewError>),
}

impl KeeperState {
    async fn keep(
        mut self,
        lost_tx: mpsc::Sender<Lost>,
        mut stop: oneshot::Receiver<Option<Duration>>,
    ) -> Released {
        let verbose = self.link.server.verbose;
        let mut lost = false;
        let mut last_error: Option<String> = None;
        let mut retry = FIRST_RETRY;
        loop {
            let term_at = self.timing.term_at(self.deadline);
            let attempt_limit = self.timing.attempt_limit();
            let step = tokio::select! {
                biased;
                keep = &mut stop => KeeperStep::Stop(keep.unwrap_or(None)),
                _ = sleep_until(term_at), if !lost => KeeperStep::DeadlineNear,
                r = async {
                    tokio::select! {
                        _ = self.link.idle_until(self.next_renew) => {}
                        _ = self.wake.notified() => {}
                    }
                    self.link.renew(&self.lease, attempt_limit).await
                }, if !lost => KeeperStep::Renewed(r),
            };
            let lost_now = match step {
                KeeperStep::Stop(keep) => {
                    // One budget for the whole release: an unreachable server must not keep
                    // lockctl from reporting the command's end for long.
                    let budget = self.link.server.connect_timeout();
                    let mut not_kept = None;
                    if let Some(more) = keep.filter(|_| !lost) {
                        match timeout(budget, self.link.renew_detach(&self.lease, more)).await {
                            Ok(Ok(left)) => return Released::Kept(left),
                            Ok(Err(why)) => not_kept = Some(why),
                            Err(_) => not_kept = Some("no reply to RENEW".into()),
                        }
                    }
                    let released = match timeout(budget, self.link.release(&self.lease)).await {
                        Ok(r) => r,
                        Err(_) => Released::Failed("no reply to UNLOCK".into()),
                    };
                    return match not_kept {
                        Some(why) => Released::NotKept {
                            why,
                            then: Box::new(released),
                        },
                        None => released,
                    };
                }
                KeeperStep::DeadlineNear => {
                    let why = match &last_error {
                        Some(e) => format!("could not renew the lease before it ends: {e}"),
                        None => "could not renew the lease before it ends".into(),
                    };
                    Some(Lost {
                        why,
                        kill_at: self.timing.kill_at(self.deadline),
                    })
                }
                KeeperStep::Renewed(Ok((sent, left))) => {
                    self.deadline = self.timing.deadline(sent, left);
                    self.next_renew = self.timing.next_renew(sent);
                    retry = FIRST_RETRY;
                    let again = last_error.take().is_some();
                    if verbose {
                        eprintln!(
                            "lockctl: renewed {} token {}{}: {} left",
                            self.lease.shown(),
                            self.lease.token,
                            if again { " again" } else { "" },
                            humantime::format_duration(round_ms(left))
                        );
                    }
                    None
                }
                KeeperStep::Renewed(Err(RenewError::NotHeld(e))) => Some(Lost {
                    why: format!(
                        "the server no longer holds it for this token ({})",
                        crate::out::broken_words(&e)
                    ),
                    kill_at: Instant::now() + self.timing.grace,
                }),
                KeeperStep::Renewed(Err(RenewError::Failed(e))) => {
                    if verbose {
                        let left = self.deadline.saturating_duration_since(Instant::now());
                        // No connection: the next try starts at the next address.
                        let next = match self.link.client.is_some() {
                            true => self.link.server.addr().to_owned(),
                            false => self.link.server.next_addr().to_owned(),
                        };
                        eprintln!(
                            "lockctl: renewing {} failed: {e}; trying {next} in {} ({} of \
                             lease left)",
                            self.lease.shown(),
                            humantime::format_duration(round_ms(retry)),
                            humantime::format_duration(round_ms(left))
                        );
                    }
                    last_error = Some(e);
                    self.next_renew = Instant::now() + retry;
                    retry = (retry * 2).min(self.timing.max_retry());
                    None
                }
            };
            if let Some(l) = lost_now {
                lost = true;
                let _ = lost_tx.send(l).await;
            }
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// A RENEW sent at its time to a front-end that never answers, given up after its limit,
    /// then sent to the next address after the first retry pause: that one starts well
    /// before the command must be stopped, whatever the window (from 3s up).
    #[test]
    fn a_renew_stuck_for_its_limit_leaves_the_next_address_time() {
        for window in [S(3), S(6), S(10), S(30), S(60), S(3600)] {
            for front_ends in [2, 3] {
                let t = Timing::new(window, window, S(5), front_ends);
                let renewed = Instant::now();
                let next_try = t.next_renew(renewed) + t.attempt_limit() + FIRST_RETRY;
                let term = t.term_at(t.deadline(renewed, window));
                assert!(
                    next_try + window / 20 <= term,
                    "window {window:?}: the next address tried at {:?}, SIGTERM at {:?}",
                    next_try - renewed,
                    term - renewed
                );
            }
        }
    }

    /// With several front-ends the renewals move within two thirds of the default
    /// `--etcd-lease-ttl` (5s) after a cut, however long the lease.
    #[test]
    fn with_several_front_ends_renewals_move_before_an_etcd_lease_can_end() {
        for ttl in [S(6), S(30), S(3600)] {
            let t = Timing::new(ttl, S(10).min(ttl), S(5), 3);
            let moved = t.lease.interval() + t.attempt_limit() + FIRST_RETRY;
            assert!(moved < S(5) * 2 / 3, "ttl {ttl:?}: moved after {moved:?}");
        }
        // One address: nowhere to move, the renewals (and their patience) as before.
        let one = Timing::new(S(30), S(10), S(5), 1);
        assert_eq!(one.lease.interval(), S(10) / 3);
        assert_eq!(one.attempt_limit(), S(10) / 3);
    }
}
