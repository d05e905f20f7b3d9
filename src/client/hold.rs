//! The held-lock helper: a future run under a lock, its lease renewed in the background, and
//! the block stopped the moment the lease can no longer be trusted, before lockd can grant the
//! lock to anyone else.
//!
//! The lease is renewed by the library's renewal loop ([`super::keeper::Keeper`], see
//! [`super::keeper`] for its timing): renewals every third of the lease's window (the ttl, or
//! the session grace if shorter), moving to the next address when a front-end cannot serve
//! them. A margin before the lease could end on the server (a tenth of the window, 20ms to
//! 2s) it counts as lost: [`Lease::lost`] resolves, the block's future is dropped, and
//! [`hold`] returns [`LockError::Lost`]. A refused renewal (`ERR NOTHELD`: the lease ended, or
//! lockd restarted without it) is a loss at once. Dropping a future stops it at its next
//! `.await`: a block that computes for long between them (or hands work to other tasks or
//! threads) must look at [`Lease::is_lost`] or [`Lease::cancellation`] itself, within the
//! margin.
//!
//! However the block ends (its value, the loss, a panic, or the [`hold`] future itself
//! dropped) the lock is released: UNLOCK, on a new connection if the old one is gone.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{timeout, Instant};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::connect::Connector;
use super::keeper::{Event, Held, Keeper, Timing};
use super::lock::{LockError, LockOptions};
use crate::locks::Token;
use crate::proto::Tie;

/// The ttl of a held lock whose [`LockOptions`] name none: the helper must know how long a
/// lease lives to renew it in time.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The session grace of a held lock whose [`LockOptions`] tie it to nothing (at most the
/// ttl): a process that dies, even by SIGKILL, frees the lock this long after, not a whole
/// ttl later; a dropped connection is ridden out by renewing on a new one within it. As the
/// Go, Node, Ruby, Python and bash helpers do.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

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
    let held = Held {
        name: name.to_owned(),
        token,
        ttl,
        deadline: timing.deadline(since, left),
        next_renew: timing.next_renew(since),
    };
    let marked = lease.clone();
    // Dropped with this future, or on a panic in the block: the keeper then releases the lock
    // on its own.
    let keeper = Keeper::spawn(connector.clone(), client, held, timing, false, move |e| {
        if let Event::Lost(lost) = e {
            marked.mark_lost(lost.why.to_string());
        }
    });
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
    match outcome {
        // Returned once the lock is released (or the release gave up): the next holder may
        // be granted as soon as the caller goes on.
        Some(out) => {
            keeper.release().await;
            Ok(out)
        }
        // The loss is told at once; the release (which a lost lease needs only to free the
        // lock sooner, if it still stands) goes on in the background, the keeper dropped.
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
