//! The held-lock helper: a future run under a lock, its lease renewed in the background, and
//! the block stopped the moment the lease can no longer be trusted, before lockd can grant the
//! lock to anyone else.
//!
//! The deadline the helper works to is `time the last successful RENEW (or the LOCK) was
//! sent + window`, where the window is the ttl, or the session grace if that is shorter: the
//! server extended the lease at some moment after that send, so the ttl cannot run out
//! earlier, and it still had the connection then, so the grace cannot start earlier. Renewals
//! go every third of the window (at most every 2s with several addresses, as `lockctl run`'s:
//! a cluster front-end cut off from etcd loses its session leases with its etcd lease), each
//! one bounded so that a front-end that does not answer leaves time for the next address. A
//! margin before the deadline (a tenth of the window, 20ms to 2s) the lease counts as lost:
//! [`Lease::lost`] resolves, the block's future is dropped, and [`hold`] returns
//! [`LockError::Lost`]. A refused renewal (`ERR NOTHELD`: the lease ended, or lockd restarted
//! without it) is a loss at once. Dropping a future stops it at its next `.await`: a block
//! that computes for long between them (or hands work to other tasks or threads) must look
//! at [`Lease::is_lost`] or [`Lease::cancellation`] itself, within the margin.
//!
//! However the block ends (its value, the loss, a panic, or the [`hold`] future itself
//! dropped) the lock is released: UNLOCK, on a new connection if the old one is gone.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::connect::Connector;
use super::lock::{LockError, LockOptions};
use super::{Client, ClientError};
use crate::locks::Token;
use crate::proto::{ErrorCode, Tie};

/// The ttl of a held lock whose [`LockOptions`] name none: the helper must know how long a
/// lease lives to renew it in time.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The session grace of a held lock whose [`LockOptions`] tie it to nothing (at most the
/// ttl): a process that dies, even by SIGKILL, frees the lock this long after, not a whole
/// ttl later; a dropped connection is ridden out by renewing on a new one within it. As the
/// Go, Node, Ruby, Python and bash helpers do.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// The longest renewal interval with several addresses (see `lockctl`'s keeper): renewals move
/// to another front-end well within a cut-off one's etcd lease.
const CLUSTER_INTERVAL: Duration = Duration::from_secs(2);

/// The first pause after a failed renewal, doubled up to [`Timing::max_retry`].
pub const FIRST_RETRY: Duration = Duration::from_millis(50);

/// The lease a [`hold`] block runs under: its fencing token (to hand to whatever the lock
/// guards), and the signal that it was lost. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Lease {
    name: String,
    token: Token,
    tokens: Vec<Token>,
    lost: CancellationToken,
    why: Arc<Mutex<Option<String>>>,
}

impl Lease {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of this grant: the resource the lock guards should refuse writes
    /// carrying an older one.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Every name's token, of a set ([`LockOptions::and`]): the lock's own name first, then
    /// the further names in order (one for a single name). The set is one lease: it is
    /// renewed, lost and released as a whole, through the first name.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Resolves when the lease is lost (never, if it is not). The block's own future is
    /// dropped at that moment anyway; this is for work it handed to other tasks.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.lost.clone().cancelled_owned()
    }

    /// Whether the lease is lost already.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The token cancelled when the lease is lost: to hand to spawned tasks (or to make child
    /// tokens of).
    pub fn cancellation(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Why the lease was lost, once it is.
    pub fn why_lost(&self) -> Option<String> {
        self.why.lock().ok().and_then(|w| w.clone())
    }

    fn mark_lost(&self, why: String) {
        if let Ok(mut w) = self.why.lock() {
            w.get_or_insert(why);
        }
        self.lost.cancel();
    }
}

/// Runs `block` under the lock `name`, taken as `id` with `opts` (sent again through the next
/// address within its wait, as [`Connector::lock`], always as `id`: give each holder an id of
/// its own, such as a new [`default_id`](super::default_id), since two holders with one id are
/// one client to lockd; the ttl [`DEFAULT_TTL`] if it names none,
/// a session lease of grace [`DEFAULT_GRACE`] if it names no tie: [`LockOptions::detach`] for
/// a lease that outlives this process until its ttl), on a connection of its own; renews in
/// the background (see the module); releases the lock when the block ends, or is dropped, or
/// panics.
///
/// Returns the block's value; [`LockError::Lost`] if the lease was lost first (the block's
/// future is then dropped, before lockd can grant the lock to anyone else); the LOCK's error
/// if it was never granted.
///
/// ```
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// # let addr = listener.local_addr()?.to_string();
/// # let stop = tokio_util::sync::CancellationToken::new();
/// # tokio::spawn(lockd::server::run(Default::default(), listener, stop.clone()));
/// use std::time::Duration;
/// use lockd::client::{hold, Addrs, Client, Connector, LockOptions};
///
/// let lockd = Connector::new(Addrs::one(addr.clone()), Duration::from_secs(10));
/// let opts = LockOptions::new().ttl(Duration::from_secs(3)).session(Duration::from_secs(1));
/// let token = hold(&lockd, "deploy", "web-1", &opts, |lease| async move {
///     // Longer than the ttl: the lease is renewed meanwhile. The future is dropped the
///     // moment the lease is lost (and `hold` returns `LockError::Lost`).
///     tokio::time::sleep(Duration::from_secs(4)).await;
///     lease.token()
/// })
/// .await?;
/// // Released at the end.
/// let mut check = Client::connect(&addr).await?;
/// assert!(check.lock_status("deploy").await?.held().is_none());
/// # assert!(token > 0);
/// # stop.cancel();
/// # Ok(()) }
/// ```
pub async fn hold<F, Fut, T>(
    connector: &Connector,
    name: &str,
    id: &str,
    opts: &LockOptions,
    block: F,
) -> Result<T, LockError>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = T>,
{
    let ttl = opts.ttl.unwrap_or(DEFAULT_TTL);
    let tie = match opts.tie {
        Tie::Plain => Tie::Session(DEFAULT_GRACE.min(ttl)),
        tie => tie,
    };
    let opts = LockOptions {
        ttl: Some(ttl),
        tie,
        ..opts.clone()
    };
    let locked = connector.lock(name, id, &opts).await?;
    let timing = Timing::new(ttl, opts.tie, connector.addrs().len());
    let (mut client, token, tokens) = (locked.client, locked.token, locked.tokens);
    let (mut since, mut left) = (locked.sent, ttl);
    if timing.needs_early_renew(locked.sent.elapsed()) {
        let sent = Instant::now();
        let renewed = timeout(
            connector.connect_timeout(),
            client.renew(name, token, Some(ttl)),
        )
        .await;
        match renewed {
            Ok(Ok(l)) => (since, left) = (sent, l),
            failed => {
                let _ = timeout(connector.connect_timeout(), client.unlock(name, token)).await;
                return Err(match failed {
                    Ok(Err(e)) => LockError::Request(e),
                    _ => LockError::Lost(format!(
                        "lockd at {} did not answer the first RENEW",
                        connector.addr()
                    )),
                });
            }
        }
    }
    let lease = Lease {
        name: name.to_owned(),
        token,
        tokens,
        lost: CancellationToken::new(),
        why: Arc::new(Mutex::new(None)),
    };
    let keeper = Keeper {
        connector: connector.clone(),
        client: Some(client),
        lease: lease.clone(),
        timing,
        deadline: timing.deadline(since, left),
        next_renew: timing.next_renew(since),
    };
    let (stop, stopped) = oneshot::channel();
    let (done_tx, done) = oneshot::channel();
    tokio::spawn(async move {
        keeper.keep(stopped).await;
        let _ = done_tx.send(());
    });
    // Dropped with this future, or on a panic in the block: the keeper then releases the lock
    // on its own.
    let guard = Stop(Some(stop));
    let lost = lease.lost();
    let outcome = {
        let work = block(lease.clone());
        tokio::pin!(work);
        tokio::select! {
            biased;
            _ = lost => None,
            out = &mut work => Some(out),
        }
    };
    drop(guard);
    match outcome {
        // Returned once the lock is released (or the release gave up): the next holder may
        // be granted as soon as the caller goes on.
        Some(out) => {
            let _ = done.await;
            Ok(out)
        }
        // The loss is told at once; the release (which a lost lease needs only to free the
        // lock sooner, if it still stands) goes on in the background.
        None => Err(LockError::Lost(lease.why_lost().unwrap_or_default())),
    }
}

impl Connector {
    /// [`hold`] through this connector.
    pub async fn hold<F, Fut, T>(
        &self,
        name: &str,
        id: &str,
        opts: &LockOptions,
        block: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        hold(self, name, id, opts, block).await
    }
}

/// Tells the keeper to stop and release, when dropped.
struct Stop(Option<oneshot::Sender<()>>);

impl Drop for Stop {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            let _ = stop.send(());
        }
    }
}

/// How the time of one held lease is split up (see the module): when to renew, how long a
/// renewal may take, and when the lease can no longer be trusted. Public so that a keeper
/// of its own (`lockctl run`'s, which also stops a command) works to the same arithmetic.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    ttl: Duration,
    /// How long the lease surely lasts after a RENEW is sent: the ttl, or the session grace
    /// if shorter (the server may see the connection close at any moment after its reply).
    window: Duration,
    /// Between two renewals.
    interval: Duration,
    /// Kept free before the deadline, for clock-rate differences and scheduling delays.
    margin: Duration,
    several: bool,
    /// A plain session lease ends when the server sees the connection close.
    ends_with_connection: bool,
}

impl Timing {
    /// The timing of a lease of `ttl` tied by `tie`, renewed through `front_ends` addresses.
    /// With several, renewals come at least every 2s, so that they can move to another
    /// front-end well within a cut-off one's etcd lease.
    pub fn new(ttl: Duration, tie: Tie, front_ends: usize) -> Timing {
        let window = match tie {
            Tie::Session(grace) if !grace.is_zero() => ttl.min(grace),
            _ => ttl,
        };
        let interval = match front_ends > 1 {
            true => (window / 3).min(CLUSTER_INTERVAL),
            false => window / 3,
        };
        Timing {
            ttl,
            window,
            interval,
            margin: (window / 10).clamp(Duration::from_millis(20), Duration::from_secs(2)),
            several: front_ends > 1,
            ends_with_connection: tie == Tie::Session(Duration::ZERO),
        }
    }

    /// How long the lease surely lasts after a RENEW is sent (see [`Timing`]'s fields).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Between two renewals.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Kept free before the deadline: [`Timing::give_up`] is this much before it.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// The lease's end as far as the client can be sure, after a RENEW (or LOCK) sent at
    /// `sent` answered with `left`.
    pub fn deadline(&self, sent: Instant, left: Duration) -> Instant {
        sent + left.min(self.ttl).min(self.window)
    }

    /// When to renew after a RENEW (or LOCK) sent at `sent`.
    pub fn next_renew(&self, sent: Instant) -> Instant {
        sent + self.interval
    }

    /// Whether a grant that took `waited` after its LOCK was sent leaves too little of the
    /// lease to start on: a LOCK that waited does not say when it was granted, so counted
    /// from its send the lease could seem over already; a renewal at once gives a deadline
    /// from its own send.
    pub fn needs_early_renew(&self, waited: Duration) -> bool {
        waited > self.window / 10
    }

    /// When the lease counts as lost: a margin before its deadline, time for what runs under
    /// it to be stopped.
    pub fn give_up(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.margin).unwrap_or(deadline)
    }

    /// The longest one RENEW may take, connecting included: with several addresses half an
    /// interval, so that one stuck on a front-end from its renewal time (at a third of the
    /// window) is given up at half the window, and the next address is tried well before
    /// the loss. With one there is no other to try: a whole interval, for a slow answer.
    pub fn attempt_limit(&self) -> Duration {
        match self.several {
            true => self.interval / 2,
            false => self.interval,
        }
        .max(Duration::from_millis(100))
    }

    /// The longest pause between failed renewals: from [`FIRST_RETRY`], doubled up to a tenth
    /// of the window (2s at most).
    pub fn max_retry(&self) -> Duration {
        (self.window / 10).clamp(FIRST_RETRY, Duration::from_secs(2))
    }
}

/// Renews one lease in its own task, and releases it when told to stop.
struct Keeper {
    connector: Connector,
    /// `None` once the connection failed: the next request opens one at the next address.
    client: Option<Client>,
    lease: Lease,
    timing: Timing,
    deadline: Instant,
    next_renew: Instant,
}

enum Renewed {
    Ok(Instant, Duration),
    Refused(String),
    Failed(String),
}

impl Keeper {
    async fn keep(mut self, mut stop: oneshot::Receiver<()>) {
        let mut last_error: Option<String> = None;
        let mut retry = FIRST_RETRY;
        loop {
            let lost = self.lease.is_lost();
            let give_up = self.timing.give_up(self.deadline);
            let limit = self.timing.attempt_limit();
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = sleep_until(give_up), if !lost => {
                    let why = match &last_error {
                        Some(e) => format!("no renewal got through before the lease could end: {e}"),
                        None => "no renewal got through before the lease could end".to_owned(),
                    };
                    self.lease.mark_lost(why);
                }
                r = self.renew_at(limit, give_up), if !lost => match r {
                    Renewed::Ok(sent, left) => {
                        self.deadline = self.timing.deadline(sent, left);
                        self.next_renew = self.timing.next_renew(sent);
                        retry = FIRST_RETRY;
                        last_error = None;
                    }
                    Renewed::Refused(why) => self.lease.mark_lost(why),
                    Renewed::Failed(why) => {
                        last_error = Some(why);
                        self.next_renew = Instant::now() + retry;
                        retry = (retry * 2).min(self.timing.max_retry());
                    }
                },
            }
        }
        // One budget for the whole release: an unreachable server must not hold up the end
        // of the block for long.
        let budget = self.connector.connect_timeout();
        let _ = timeout(budget, self.release()).await;
    }

    /// Waits for the renewal time (or less, if the connection ends first: nothing is owed to
    /// the client between requests), then one RENEW within `limit`, never past `give_up`.
    async fn renew_at(&mut self, limit: Duration, give_up: Instant) -> Renewed {
        if let Some(client) = self.client.as_mut() {
            tokio::select! {
                _ = sleep_until(self.next_renew) => {}
                _ = client.read_line() => {
                    self.client = None;
                    if self.timing.ends_with_connection {
                        return Renewed::Refused(format!(
                            "the connection to lockd at {} ended, and the session lease with it",
                            self.connector.addr()
                        ));
                    }
                }
            }
        } else {
            sleep_until(self.next_renew).await;
        }
        let limit = limit.min(give_up.saturating_duration_since(Instant::now()));
        match timeout(limit, self.renew_once()).await {
            Ok(r) => r,
            Err(_) => {
                // A late reply must never be read as the answer to a later request.
                self.client = None;
                Renewed::Failed(format!(
                    "lockd at {} did not answer RENEW within {limit:?}",
                    self.connector.addr()
                ))
            }
        }
    }

    async fn renew_once(&mut self) -> Renewed {
        let mut client = match self.client.take() {
            Some(c) => c,
            None => match self
                .connector
                .reconnect_once(self.timing.attempt_limit())
                .await
            {
                Ok(c) => c,
                Err(e) => return Renewed::Failed(e.to_string()),
            },
        };
        let addr = self.connector.addr().to_owned();
        let sent = Instant::now();
        let (name, token) = (&self.lease.name, self.lease.token);
        match client.renew(name, token, Some(self.timing.ttl)).await {
            Ok(left) => {
                self.client = Some(client);
                Renewed::Ok(sent, left)
            }
            Err(ClientError::Refused(e))
                if !matches!(e.code, ErrorCode::Unavailable | ErrorCode::Shutdown) =>
            {
                Renewed::Refused(format!(
                    "lockd at {addr} refused the renewal: ERR {} {}",
                    e.code, e.message
                ))
            }
            Err(ClientError::Refused(e)) => {
                // One address: the connection is still good. Several: the next one may serve.
                if !self.timing.several && !e.code.may_close() {
                    self.client = Some(client);
                }
                Renewed::Failed(format!(
                    "lockd at {addr} answered ERR {} {}",
                    e.code, e.message
                ))
            }
            Err(e) => Renewed::Failed(format!("lockd at {addr}: {e}")),
        }
    }

    /// UNLOCK, once more on a new connection if the first one fails. A lost lease is released
    /// too: if it still stands, the next holder need not wait out its ttl; if not, the token
    /// is refused (`ERR NOTHELD`) and nothing else changes.
    async fn release(&mut self) {
        let limit = self.connector.connect_timeout();
        for _ in 0..2 {
            let mut client = match self.client.take() {
                Some(c) => c,
                None => match self.connector.reconnect_once(limit).await {
                    Ok(c) => c,
                    Err(_) => return,
                },
            };
            match client.unlock(&self.lease.name, self.lease.token).await {
                Ok(()) | Err(ClientError::Refused(_)) => return,
                Err(_) => sleep(FIRST_RETRY).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// A renewal sent at its time to a front-end that never answers is given up after its
    /// limit, and the next try (at the next address) still comes before the lease counts as
    /// lost, whatever the window (from 1s up) and the tie.
    #[test]
    fn a_renewal_stuck_for_its_limit_leaves_time_for_another_before_the_loss() {
        for ttl in [S(1), S(3), S(10), S(30), S(3600)] {
            for tie in [Tie::Plain, Tie::Detach, Tie::Session(S(10).min(ttl))] {
                for front_ends in [1, 2, 3] {
                    let t = Timing::new(ttl, tie, front_ends);
                    let renewed = Instant::now();
                    let deadline = t.deadline(renewed, ttl);
                    let next_try = t.next_renew(renewed) + t.attempt_limit() + FIRST_RETRY;
                    assert!(
                        next_try < t.give_up(deadline),
                        "ttl {ttl:?} {tie:?} x{front_ends}: next try at {:?}, lost at {:?}",
                        next_try - renewed,
                        t.give_up(deadline) - renewed
                    );
                    assert!(t.give_up(deadline) < deadline);
                }
            }
        }
    }

    /// The window is the grace when it is shorter than the ttl; a plain session ends with its
    /// connection.
    #[test]
    fn the_window_is_the_shorter_of_the_ttl_and_the_grace() {
        let now = Instant::now();
        let t = Timing::new(S(30), Tie::Session(S(10)), 1);
        assert_eq!(t.deadline(now, S(30)), now + S(10));
        assert!(!t.ends_with_connection);
        let t = Timing::new(S(30), Tie::Detach, 1);
        assert_eq!(t.deadline(now, S(30)), now + S(30));
        // The server's answer, if shorter (a --max-ttl), counts.
        assert_eq!(t.deadline(now, S(5)), now + S(5));
        assert!(Timing::new(S(30), Tie::Session(Duration::ZERO), 1).ends_with_connection);
        // Several front-ends: at most every 2s.
        assert_eq!(
            Timing::new(S(30), Tie::Detach, 2).interval,
            CLUSTER_INTERVAL
        );
    }
}
