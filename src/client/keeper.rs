//! The renewal loop: one held lease kept alive in a task of its own, and the loss told early
//! enough that what runs under the lease can be stopped before lockd could grant the lock to
//! anyone else. [`hold()`](super::hold()) runs a future under it; `lockctl run` a process.
//!
//! The deadline the loop works to is `time the last successful RENEW (or the LOCK) was sent +
//! window`, where the window is the ttl, or the session grace if that is shorter: the server
//! extended the lease at some moment after that send, so the ttl cannot run out earlier, and
//! it still had the connection then, so the grace cannot start earlier. Renewals go every
//! third of the window ([`Timing`]). A margin before the deadline (a tenth of the window, 20ms
//! to 2s) what runs under the lease must be stopped ([`Lost::stop_by`]); the loss is told the
//! stop grace before that ([`Timing::with_stop_grace`]: the time it is given to stop, as
//! lockctl's SIGTERM to SIGKILL). A refused renewal (`ERR NOTHELD`: the lease ended, was
//! broken, or lockd restarted without it) is a loss at once, and so is the end of the
//! connection of a plain session lease, which ends with it.
//!
//! A front-end that cannot serve the RENEW (a cluster front-end cut off from etcd answers
//! `ERR UNAVAILABLE` after its `--etcd-request-timeout`, or not at all) is left for the next
//! address at once: the lease moves to the front-end that renews it (proto.md). With several
//! addresses renewals come at least every 2s and each try is bounded by half an interval,
//! connection included, so that a try stuck on a cut-off front-end from its renewal time still
//! leaves the next address a sixth of the window (less the margin and the stop grace). Other
//! failures are tried again, from [`FIRST_RETRY`] doubled up to [`Timing::max_retry`], until
//! the loss.
//!
//! What happens is told to an observer ([`Event`]): each renewal, each failure and where the
//! next try goes, connections ended and made, and the loss.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::connect::Connector;
use super::{Client, ClientError};
use crate::locks::{EventKind, Token};
use crate::proto::{ErrorCode, Tie};

/// The longest renewal interval with several addresses: renewals move to another front-end
/// well within a cut-off one's etcd lease (its `--etcd-lease-ttl`, 5s by default, lasts at
/// least two thirds of its ttl after the cut: 3.3s; a renewal stuck on the cut-off front-end
/// is given up after half an interval, so the next address is renewing through 1.5 intervals
/// and a retry after the cut at worst, 3.1s, in time).
const CLUSTER_INTERVAL: Duration = Duration::from_secs(2);

/// The first pause after a failed renewal, doubled up to [`Timing::max_retry`].
pub const FIRST_RETRY: Duration = Duration::from_millis(50);

/// How the time of one held lease is split up (see the module): when to renew, how long a
/// renewal may take, when what runs under the lease must be stopped, and when the loss is
/// told.
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
    /// Given to what runs under the lease to stop, before the margin.
    stop_grace: Duration,
    several: bool,
    /// A plain session lease ends when the server sees the connection close.
    ends_with_connection: bool,
}

impl Timing {
    /// The timing of a lease of `ttl` tied by `tie`, renewed through `front_ends` addresses.
    /// With several, renewals come at least every 2s, so that they can move to another
    /// front-end well within a cut-off one's etcd lease. A plain session lease (`Tie::Session`
    /// of zero) ends when the server sees the connection close, which the client cannot
    /// bound, so only the ttl counts for its window; the loop tells its loss as soon as it
    /// sees the connection end.
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
            stop_grace: Duration::ZERO,
            several: front_ends > 1,
            ends_with_connection: tie == Tie::Session(Duration::ZERO),
        }
    }

    /// This timing with the loss told `grace` earlier, the time what runs under the lease is
    /// given to stop (lockctl's SIGTERM to SIGKILL). Capped at a quarter of the window: the
    /// loss must not come before the loop has had a fair chance to renew.
    pub fn with_stop_grace(self, grace: Duration) -> Timing {
        Timing {
            stop_grace: grace.min(self.window / 4),
            ..self
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

    /// Kept free before the deadline: [`Timing::stop_by`] is this much before it.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// The time what runs under the lease is given to stop ([`Timing::with_stop_grace`]).
    pub fn stop_grace(&self) -> Duration {
        self.stop_grace
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

    /// When what runs under the lease must be stopped: the margin before its deadline.
    pub fn stop_by(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.margin).unwrap_or(deadline)
    }

    /// When the lease counts as lost: the stop grace before [`Timing::stop_by`].
    pub fn give_up(&self, deadline: Instant) -> Instant {
        let stop_by = self.stop_by(deadline);
        stop_by.checked_sub(self.stop_grace).unwrap_or(stop_by)
    }

    /// The longest one RENEW may take, connecting included: with several addresses half an
    /// interval, so that one stuck on a front-end from its renewal time (at a third of the
    /// window) is given up at half the window, and the next address is tried well before
    /// the loss (at least 65% of the window: the margin is at most a tenth and the stop
    /// grace at most a quarter). With one there is no other to try: a whole interval, for a
    /// slow answer.
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

/// The lease a [`Keeper`] renews, and where it stands when the keeper starts.
#[derive(Clone, Debug)]
pub struct Held {
    /// The name renewed and released: of a set, its first, which stands for the whole set.
    pub name: String,
    /// The lease's fencing token (of a set, its first name's).
    pub token: Token,
    /// Asked for again with every RENEW.
    pub ttl: Duration,
    /// The lease's end as far as the client can be sure ([`Timing::deadline`]).
    pub deadline: Instant,
    /// When to renew first ([`Timing::next_renew`], or now).
    pub next_renew: Instant,
}

/// What the renewal loop did, told to its observer as it happens (for a log, or lockctl's
/// -v). The loss is also [`Keeper::lost`].
#[derive(Clone, Debug)]
pub enum Event {
    /// A RENEW got through.
    Renewed {
        /// The lease left, as lockd said.
        left: Duration,
        /// After failed ones.
        again: bool,
    },
    /// A RENEW failed; it is tried again.
    Failed {
        /// What went wrong, naming the address it came from.
        error: String,
        /// Where the next try goes.
        next_addr: String,
        /// When the next try goes.
        retry_in: Duration,
        /// The lease left, as far as the client can be sure.
        left: Duration,
    },
    /// The connection ended between requests; the next request opens one.
    Disconnected {
        /// Where it was connected.
        addr: String,
        /// What ended it.
        why: String,
    },
    /// A new connection.
    Reconnected {
        /// Where to.
        addr: String,
    },
    /// The lease is lost; nothing is renewed after this.
    Lost(Lost),
}

/// The lease is lost (or soon will be): what runs under it must be stopped by `stop_by`.
#[derive(Clone, Debug)]
pub struct Lost {
    /// Why.
    pub why: Loss,
    /// [`Timing::stop_by`] the deadline when no renewal got through; when lockd said the
    /// lease is over already, the stop grace from the moment it said so.
    pub stop_by: Instant,
}

/// Why a lease was lost.
#[derive(Clone, Debug)]
pub enum Loss {
    /// No renewal got through in time.
    OutOfTime {
        /// The last failure, if any.
        last_failure: Option<String>,
    },
    /// A renewal was refused with `ERR NOTHELD`: the lease ended, was broken (the message
    /// says by whom), or lockd restarted without it.
    NotHeld {
        /// Who refused it.
        addr: String,
        /// The words after `ERR NOTHELD`.
        message: String,
    },
    /// The connection of a plain session lease ended, and the lease with it.
    ConnectionEnded {
        /// Where it was connected.
        addr: String,
    },
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::OutOfTime { last_failure: None } => {
                f.write_str("no renewal got through before the lease could end")
            }
            Loss::OutOfTime {
                last_failure: Some(e),
            } => write!(f, "no renewal got through before the lease could end: {e}"),
            Loss::NotHeld { addr, message } => write!(
                f,
                "lockd at {addr} refused the renewal: ERR {} {message}",
                ErrorCode::NotHeld
            ),
            Loss::ConnectionEnded { addr } => write!(
                f,
                "the connection to lockd at {addr} ended, and the session lease with it"
            ),
        }
    }
}

/// How the keeper's last request went.
#[derive(Debug)]
pub enum Released {
    /// UNLOCKed.
    Done,
    /// The lease had already ended (the `ERR NOTHELD` words).
    NotHeld(String),
    /// The UNLOCK did not get through (why).
    Failed(String),
    /// Not released: made a plain lease that lasts this long more ([`Keeper::detach`]).
    Detached(Duration),
    /// [`Keeper::detach`]: lockd did not detach it, so it was released.
    NotDetached {
        /// Why it was not detached.
        why: String,
        /// How the release went.
        then: Box<Released>,
    },
}

/// The handle of a running renewal loop. Dropping it stops the loop and releases the lock in
/// the background.
pub struct Keeper {
    lost: mpsc::Receiver<Lost>,
    /// `None`: release; `Some(ttl)`: detach the lease for `ttl` instead.
    stop: Option<oneshot::Sender<Option<Duration>>>,
    task: JoinHandle<Released>,
    /// [`watch_breaks`], ended with the keeper.
    _watch: Option<AbortOnDrop>,
}

/// A task that ends when its handle is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Keeper {
    /// Starts renewing `held`, granted on `client`, reconnecting through `connector`; tells
    /// `observe` what happens (it runs in the loop's task: it must not block). With
    /// `watch_breaks` a BREAK of the lease is learnt at once rather than at the next renewal:
    /// a WATCH of its name on a connection of its own, whose `broken` event of this token
    /// makes the loop renew at once (and be told who broke it); each time the watch starts
    /// (again) it renews at once too, which covers a break while nobody watched.
    pub fn spawn(
        connector: Connector,
        client: Client,
        held: Held,
        timing: Timing,
        watch_breaks: bool,
        observe: impl FnMut(&Event) + Send + 'static,
    ) -> Keeper {
        let (lost_tx, lost) = mpsc::channel(1);
        let (stop, stop_rx) = oneshot::channel();
        let wake = Arc::new(Notify::new());
        let watch = watch_breaks.then(|| {
            AbortOnDrop(tokio::spawn(self::watch_breaks(
                connector.clone(),
                held.name.clone(),
                held.token,
                Arc::clone(&wake),
            )))
        });
        let task = Task {
            link: Link {
                connector,
                client: Some(client),
                observe: Box::new(observe),
            },
            held,
            timing,
            wake,
        };
        Keeper {
            lost,
            stop: Some(stop),
            task: tokio::spawn(task.keep(lost_tx, stop_rx)),
            _watch: watch,
        }
    }

    /// Resolves when the lease is lost; never again after that. Cancel-safe.
    pub async fn lost(&mut self) -> Lost {
        match self.lost.recv().await {
            Some(lost) => lost,
            None => std::future::pending().await,
        }
    }

    /// Stops renewing and releases the lock (UNLOCK, once more on a new connection if the
    /// first fails, within the connector's connect timeout). A lost lease is released too: if
    /// it still stands, the next holder need not wait out its ttl; if not, the token is
    /// refused (`ERR NOTHELD`) and nothing else changes.
    pub async fn release(self) -> Released {
        self.stop_with(None).await
    }

    /// Stops renewing and, rather than release the lock, makes its lease a plain one that
    /// ends `ttl` from now (`RENEW ... detach`: `lockctl run --at-least`); releases it if
    /// lockd refuses that.
    pub async fn detach(self, ttl: Duration) -> Released {
        self.stop_with(Some(ttl)).await
    }

    async fn stop_with(mut self, detach: Option<Duration>) -> Released {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(detach);
        }
        match self.task.await {
            Ok(r) => r,
            Err(e) => Released::Failed(format!("lease keeper failed: {e}")),
        }
    }
}

/// Watches the lease's name for a BREAK of this very lease, so that the loop learns of one at
/// once rather than at its next renewal: a `broken` event of its token wakes the loop, whose
/// RENEW is then told who broke it, and the loss follows as for any refused renewal. The
/// server hands the name on only once the holder's UNLOCK says the work is stopped (or the
/// lease runs out), so this costs nothing in safety when it can't watch: each time the watch
/// starts (again) the loop renews at once too, which covers a break while nobody watched. A
/// refusal (no `read` right on the name) leaves it to the renewals.
async fn watch_breaks(connector: Connector, name: String, token: Token, wake: Arc<Notify>) {
    let mut pause = FIRST_RETRY;
    loop {
        let limit = connector.connect_timeout();
        if let Ok(client) = connector.connect_once(limit).await {
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
        sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// A connection that is re-opened when it fails. A request cut short drops the connection, so
/// a late reply can never be taken for the answer to a later request.
struct Link {
    connector: Connector,
    /// `None` once the connection failed: the next request opens one at the next address.
    client: Option<Client>,
    observe: Box<dyn FnMut(&Event) + Send>,
}

/// One RENEW's outcome.
enum Renewal {
    /// When it was sent, and the lease left.
    Ok(Instant, Duration),
    Lost(Loss),
    /// Worth another try; the words name the address.
    Failed(String),
}

impl Link {
    async fn client(&mut self, limit: Duration) -> Result<Client, String> {
        if let Some(c) = self.client.take() {
            return Ok(c);
        }
        let c = self
            .connector
            .reconnect_once(limit)
            .await
            .map_err(|e| e.to_string())?;
        let addr = self.connector.addr().to_owned();
        (self.observe)(&Event::Reconnected { addr });
        Ok(c)
    }

    /// Waits until `at`, or less if the connection ends first: nothing is owed to the client
    /// between requests, so a line, an end or an error all mean this connection is done. With
    /// a session lease the server lets the lock go when it sees the close, so the sooner the
    /// loop renews (and learns it lost the lease), the sooner the work is stopped. Returns why
    /// the connection ended, if it did.
    async fn idle_until(&mut self, at: Instant) -> Option<String> {
        let Some(client) = self.client.as_mut() else {
            sleep_until(at).await;
            return None;
        };
        tokio::select! {
            _ = sleep_until(at) => None,
            r = client.read_line() => {
                self.client = None;
                Some(match r {
                    Ok(line) => format!("unexpected {line:?}"),
                    Err(e) => e.to_string(),
                })
            }
        }
    }

    /// One RENEW, on a new connection if need be, all within `limit`. A failure names the
    /// address it came from. One that the next address may not share (`ERR UNAVAILABLE`, no
    /// reply in time, a lost connection) leaves this connection behind, so that the next try
    /// goes to the next address; with a single address an `ERR UNAVAILABLE` keeps the
    /// connection, which is still good.
    async fn renew(&mut self, held: &Held, limit: Duration) -> Renewal {
        let started = Instant::now();
        let connect = limit.min(self.connector.connect_timeout());
        let mut client = match self.client(connect).await {
            Ok(c) => c,
            Err(e) => return Renewal::Failed(e),
        };
        let addr = self.connector.addr().to_owned();
        let sent = Instant::now();
        let left = limit.saturating_sub(started.elapsed());
        match timeout(left, client.renew(&held.name, held.token, Some(held.ttl))).await {
            Err(_) => Renewal::Failed(format!(
                "lockd at {addr} did not answer RENEW within {}",
                humantime::format_duration(round_ms(limit))
            )),
            Ok(Ok(left)) => {
                self.client = Some(client);
                Renewal::Ok(sent, left)
            }
            Ok(Err(ClientError::Refused(e))) if e.code == ErrorCode::NotHeld => {
                self.client = Some(client);
                Renewal::Lost(Loss::NotHeld {
                    addr,
                    message: e.message,
                })
            }
            Ok(Err(ClientError::Refused(e))) => {
                let several = self.connector.addrs().len() > 1;
                let move_on = e.code == ErrorCode::Unavailable && several;
                if !e.code.may_close() && !move_on {
                    self.client = Some(client);
                }
                Renewal::Failed(format!(
                    "lockd at {addr} answered ERR {} {}",
                    e.code, e.message
                ))
            }
            Ok(Err(ClientError::Closed)) => {
                Renewal::Failed(format!("lockd at {addr} closed the connection"))
            }
            Ok(Err(e)) => Renewal::Failed(format!("lockd at {addr}: {e}")),
        }
    }

    /// `RENEW ... ttl=<ttl> detach`, on a new connection (or the next address) if the old
    /// one fails: the lease becomes a plain one that ends `ttl` from now; the time left.
    async fn detach(&mut self, held: &Held, ttl: Duration) -> Result<Duration, String> {
        let limit = self.connector.connect_timeout();
        let mut last = String::new();
        for _ in 0..2 {
            let mut client = self.client(limit).await?;
            match timeout(
                limit,
                client.renew_detach(&held.name, held.token, Some(ttl)),
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

    /// UNLOCK, once more on a new connection if the first one fails.
    async fn release(&mut self, held: &Held) -> Released {
        let limit = self.connector.connect_timeout();
        let mut last = String::new();
        for _ in 0..2 {
            let mut client = match self.client(limit).await {
                Ok(c) => c,
                Err(e) => return Released::Failed(e),
            };
            match timeout(limit, client.unlock(&held.name, held.token)).await {
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

/// The renewal loop's state, in its own task.
struct Task {
    link: Link,
    held: Held,
    timing: Timing,
    /// Renew now: the lease may have been broken ([`watch_breaks`]).
    wake: Arc<Notify>,
}

enum Step {
    Stop(Option<Duration>),
    OutOfTime,
    /// Time to renew (with why the connection ended, if it did).
    Due(Option<String>),
    Renewed(Renewal),
}

impl Task {
    async fn keep(
        mut self,
        lost_tx: mpsc::Sender<Lost>,
        mut stop: oneshot::Receiver<Option<Duration>>,
    ) -> Released {
        let mut lost = false;
        let mut last_failure: Option<String> = None;
        let mut retry = FIRST_RETRY;
        loop {
            let give_up = self.timing.give_up(self.held.deadline);
            let step = tokio::select! {
                biased;
                detach = &mut stop => Step::Stop(detach.unwrap_or(None)),
                _ = sleep_until(give_up), if !lost => Step::OutOfTime,
                ended = self.due(), if !lost => Step::Due(ended),
            };
            // A RENEW once sent is answered (or given up) before a stop is looked at: the
            // end's RENEW detach or UNLOCK may go through another connection, and a RENEW
            // still on its way could otherwise reach lockd after it and keep the lease a whole
            // ttl more (`lockctl run --at-least`'s window).
            let step = match step {
                Step::Due(ended) => tokio::select! {
                    biased;
                    _ = sleep_until(give_up) => Step::OutOfTime,
                    r = self.renew(ended) => Step::Renewed(r),
                },
                step => step,
            };
            let loss = match step {
                Step::Stop(detach) => return self.end(detach.filter(|_| !lost)).await,
                Step::Due(_) => continue,
                Step::OutOfTime => Lost {
                    why: Loss::OutOfTime {
                        last_failure: last_failure.clone(),
                    },
                    stop_by: self.timing.stop_by(self.held.deadline),
                },
                Step::Renewed(Renewal::Ok(sent, left)) => {
                    self.held.deadline = self.timing.deadline(sent, left);
                    self.held.next_renew = self.timing.next_renew(sent);
                    retry = FIRST_RETRY;
                    let again = last_failure.take().is_some();
                    (self.link.observe)(&Event::Renewed { left, again });
                    continue;
                }
                Step::Renewed(Renewal::Lost(why)) => Lost {
                    why,
                    stop_by: Instant::now() + self.timing.stop_grace,
                },
                Step::Renewed(Renewal::Failed(error)) => {
                    // No connection: the next try starts at the next address.
                    let next_addr = match self.link.client.is_some() {
                        true => self.link.connector.addr(),
                        false => self.link.connector.next_addr(),
                    };
                    let failed = Event::Failed {
                        error: error.clone(),
                        next_addr: next_addr.to_owned(),
                        retry_in: retry,
                        left: self.held.deadline.saturating_duration_since(Instant::now()),
                    };
                    (self.link.observe)(&failed);
                    last_failure = Some(error);
                    self.held.next_renew = Instant::now() + retry;
                    retry = (retry * 2).min(self.timing.max_retry());
                    continue;
                }
            };
            lost = true;
            (self.link.observe)(&Event::Lost(loss.clone()));
            let _ = lost_tx.try_send(loss);
        }
    }

    /// Waits for the renewal time (or less: the connection ended, or [`watch_breaks`] woke
    /// it); why the connection ended, if it did.
    async fn due(&mut self) -> Option<String> {
        tokio::select! {
            ended = self.link.idle_until(self.held.next_renew) => ended,
            _ = self.wake.notified() => None,
        }
    }

    /// One RENEW within [`Timing::attempt_limit`], after the connection ended (`ended`)
    /// or not.
    async fn renew(&mut self, ended: Option<String>) -> Renewal {
        if let Some(why) = ended {
            let addr = self.link.connector.addr().to_owned();
            if self.timing.ends_with_connection {
                return Renewal::Lost(Loss::ConnectionEnded { addr });
            }
            (self.link.observe)(&Event::Disconnected { addr, why });
        }
        self.link
            .renew(&self.held, self.timing.attempt_limit())
            .await
    }

    /// Detaches the lease for `detach` if asked (and not lost), else (or if that fails)
    /// releases it. One budget for each: an unreachable server must not hold up the end of
    /// what ran under the lease for long.
    async fn end(mut self, detach: Option<Duration>) -> Released {
        let budget = self.link.connector.connect_timeout();
        let mut not_detached = None;
        if let Some(ttl) = detach {
            match timeout(budget, self.link.detach(&self.held, ttl)).await {
                Ok(Ok(left)) => return Released::Detached(left),
                Ok(Err(why)) => not_detached = Some(why),
                Err(_) => not_detached = Some("no reply to RENEW".into()),
            }
        }
        let released = match timeout(budget, self.link.release(&self.held)).await {
            Ok(r) => r,
            Err(_) => Released::Failed("no reply to UNLOCK".into()),
        };
        match not_detached {
            Some(why) => Released::NotDetached {
                why,
                then: Box::new(released),
            },
            None => released,
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

    /// With a stop grace (lockctl's kill grace, up to a quarter of the window): a RENEW sent
    /// at its time to a front-end that never answers, given up after its limit, then sent to
    /// the next address after the first retry pause, starts well before the loss is told,
    /// whatever the window (from 3s up).
    #[test]
    fn a_renew_stuck_for_its_limit_leaves_the_next_address_time_before_the_stop() {
        for window in [S(3), S(6), S(10), S(30), S(60), S(3600)] {
            for front_ends in [2, 3] {
                let t = Timing::new(window, Tie::Session(window), front_ends).with_stop_grace(S(5));
                let renewed = Instant::now();
                let next_try = t.next_renew(renewed) + t.attempt_limit() + FIRST_RETRY;
                let term = t.give_up(t.deadline(renewed, window));
                assert!(
                    next_try + window / 20 <= term,
                    "window {window:?}: the next address tried at {:?}, the loss at {:?}",
                    next_try - renewed,
                    term - renewed
                );
                assert_eq!(
                    t.stop_by(t.deadline(renewed, window)) - term,
                    t.stop_grace()
                );
            }
        }
    }

    /// With several front-ends the renewals move within two thirds of the default
    /// `--etcd-lease-ttl` (5s) after a cut, however long the lease.
    #[test]
    fn with_several_front_ends_renewals_move_before_an_etcd_lease_can_end() {
        for ttl in [S(6), S(30), S(3600)] {
            let t = Timing::new(ttl, Tie::Session(S(10).min(ttl)), 3).with_stop_grace(S(5));
            let moved = t.interval() + t.attempt_limit() + FIRST_RETRY;
            assert!(moved < S(5) * 2 / 3, "ttl {ttl:?}: moved after {moved:?}");
        }
        // One address: nowhere to move, the renewals (and their patience) as before.
        let one = Timing::new(S(30), Tie::Session(S(10)), 1);
        assert_eq!(one.interval(), S(10) / 3);
        assert_eq!(one.attempt_limit(), S(10) / 3);
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
        // The stop grace is at most a quarter of the window.
        let t = Timing::new(S(30), Tie::Session(S(8)), 1).with_stop_grace(S(5));
        assert_eq!(t.stop_grace(), S(2));
    }
}
