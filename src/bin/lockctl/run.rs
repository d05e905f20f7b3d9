//! `lockctl run`: take the lock, run the command under it, release it.

use std::time::Duration;

use lockd::client::{Client, ClientError};
use lockd::locks::Token;
use lockd::proto::{ErrorCode, Tie};
use tokio::time::{sleep, sleep_until, Instant};

use crate::child::{exit_code, Child, Program, Signals};
use crate::cli::{OnLost, RunArgs, WaitArgs};
use crate::fail::{signal_code, Failure, LOST};
use crate::keeper::{Keeper, Lease, Link, Released, Timing};
use crate::net::Server;

/// How long lockctl waits for stragglers in the group between SIGTERM and SIGKILL.
const GROUP_POLL: Duration = Duration::from_millis(20);

pub async fn run(server: &Server, id: &str, args: &RunArgs) -> Result<u8, Failure> {
    let program = program(args)?;
    if args.ttl.is_zero() {
        return Err(Failure::usage("--ttl must be more than 0"));
    }
    if args.poll.is_zero() {
        return Err(Failure::usage("--poll must be more than 0"));
    }
    let mut signals = Signals::new()?;
    let timing = Timing::new(args.ttl, args.kill_grace);

    let granted = tokio::select! {
        g = lock(server, id, &args.name, args.ttl, &args.wait) => g?,
        sig = signals.recv() => {
            if server.verbose {
                eprintln!("lockctl: interrupted while waiting for {}", args.name);
            }
            return Ok(signal_code(sig));
        }
    };
    let Granted {
        mut client,
        token,
        sent,
    } = granted;
    let lease = Lease {
        name: args.name.clone(),
        token,
        ttl: args.ttl,
    };
    if server.verbose {
        eprintln!(
            "lockctl: acquired {} token {token} (ttl {})",
            lease.name,
            humantime::format_duration(args.ttl)
        );
    }

    // A grant after a long wait: the lease runs from the grant, which lockctl only knows to be
    // after the LOCK was sent. One RENEW now gives a deadline it can be sure of.
    let mut deadline = sent + args.ttl;
    let mut next_renew = sent + args.ttl / 3;
    if timing.needs_early_renew(sent.elapsed()) {
        let renew_sent = Instant::now();
        match client.renew(&lease.name, token, Some(args.ttl)).await {
            Ok(left) => {
                deadline = renew_sent + left.min(args.ttl);
                next_renew = renew_sent + args.ttl / 3;
            }
            Err(ClientError::Refused(e)) if e.code == ErrorCode::NotHeld => {
                return Err(lost_failure(&lease, &format!("{} {}", e.code, e.message)));
            }
            Err(_) => next_renew = Instant::now(),
        }
    }
    let keeper = Keeper::spawn(
        Link::new(server.clone(), client),
        lease.clone(),
        timing,
        deadline,
        next_renew,
    );
    let mut holder = Holder {
        signals,
        keeper,
        lease: &lease,
        grace: timing.grace,
        verbose: server.verbose,
    };
    let env = [
        ("LOCKD_NAME", lease.name.clone()),
        ("LOCKD_TOKEN", token.to_string()),
        ("LOCKD_ADDR", server.addr.clone()),
    ];
    let outcome = holder.work(&program, args, &env).await;
    let lost = outcome.as_ref().is_ok_and(|o| o.lost);
    holder.release(lost).await;
    let outcome = outcome?;
    if outcome.lost && args.on_lost == OnLost::Kill {
        return Ok(LOST);
    }
    Ok(outcome.code)
}

fn program(args: &RunArgs) -> Result<Program, Failure> {
    match (&args.shell, args.command.is_empty()) {
        (Some(line), true) => Ok(Program::Shell(line.clone())),
        (Some(_), false) => Err(Failure::usage(
            "give either -c '<shell command>' or a command after --, not both",
        )),
        (None, false) => Ok(Program::Argv(args.command.clone())),
        (None, true) => Err(Failure::usage(
            "no command: give one after -- (lockctl run NAME -- COMMAND ARGS...) or use -c",
        )),
    }
}

struct Granted {
    client: Client,
    token: Token,
    /// When the granted LOCK was sent: the lease began no earlier.
    sent: Instant,
}

/// LOCK with `session`, so that the server frees the lock at once if lockctl dies. If the
/// connection fails while waiting, it reconnects and asks again for the rest of the wait.
async fn lock(
    server: &Server,
    id: &str,
    name: &str,
    ttl: Duration,
    wait: &WaitArgs,
) -> Result<Granted, Failure> {
    let started = Instant::now();
    let mut client = server.connect().await?;
    loop {
        let wait_left = wait
            .server_wait()
            .map(|w| w.saturating_sub(started.elapsed()));
        let sent = Instant::now();
        match client
            .lock(name, id, Some(ttl), wait_left, Tie::Session(Duration::ZERO))
            .await
        {
            Ok(token) => {
                return Ok(Granted {
                    client,
                    token,
                    sent,
                })
            }
            Err(ClientError::Refused(e)) if e.code == ErrorCode::Timeout => {
                if server.verbose {
                    say_conflict(&mut client, name, wait).await;
                }
                return Err(Failure::silent(wait.conflict_exit_code));
            }
            Err(ClientError::Refused(e)) if e.code != ErrorCode::Shutdown => {
                return Err(Failure::request(
                    &format!("lock {name}"),
                    &server.addr,
                    ClientError::Refused(e),
                ));
            }
            Err(e) => {
                if server.verbose {
                    eprintln!(
                        "lockctl: lost the connection while waiting for {name} ({e}); reconnecting"
                    );
                }
                client = server.connect().await?;
            }
        }
    }
}

/// With --verbose, says who has the lock (flock itself says nothing).
pub async fn say_conflict(client: &mut Client, name: &str, wait: &WaitArgs) {
    let holder = match client
        .status(Some(name))
        .await
        .ok()
        .and_then(|l| l.into_iter().next())
    {
        Some(line) => match (
            lockd::proto::field(&line, "id"),
            lockd::proto::field(&line, "token"),
        ) {
            (Some(id), Some(token)) => format!("held by {id} (token {token})"),
            _ => "held".into(),
        },
        None => "held".into(),
    };
    match wait.wait {
        Some(w) if !wait.nonblock => eprintln!(
            "lockctl: {name} is {holder}; gave up after {}",
            humantime::format_duration(w)
        ),
        _ => eprintln!("lockctl: {name} is {holder}"),
    }
}

/// Everything needed while the lock is held.
struct Holder<'a> {
    signals: Signals,
    keeper: Keeper,
    lease: &'a Lease,
    /// Between SIGTERM and SIGKILL.
    grace: Duration,
    verbose: bool,
}

/// How a supervised command ended.
struct Outcome {
    code: u8,
    /// The lease was lost while it ran.
    lost: bool,
    /// A signal lockctl received and passed on.
    signalled: Option<i32>,
}

enum Step {
    Exited(std::io::Result<std::process::ExitStatus>),
    Signal(i32),
    Lost(crate::keeper::Lost),
    Kill,
}

impl Holder<'_> {
    /// Runs the command, then the --until test if it exited 0.
    async fn work(
        &mut self,
        program: &Program,
        args: &RunArgs,
        env: &[(&str, String)],
    ) -> Result<Outcome, Failure> {
        let child = Child::spawn(program, env)?;
        let outcome = self.supervise(child, args.on_lost).await?;
        match &args.until {
            Some(test) if outcome.code == 0 && !outcome.lost => {
                self.poll_until(test, args.poll, env).await
            }
            _ => Ok(outcome),
        }
    }

    /// Waits for the command, passing on signals, and stops its group if the lease is lost.
    async fn supervise(&mut self, mut child: Child, on_lost: OnLost) -> Result<Outcome, Failure> {
        let mut lost = false;
        let mut signalled = None;
        let mut kill_at: Option<Instant> = None;
        let status = loop {
            let step = tokio::select! {
                s = child.wait() => Step::Exited(s),
                sig = self.signals.recv() => Step::Signal(sig),
                l = self.keeper.lost(), if !lost => Step::Lost(l),
                _ = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                    Step::Kill
                }
            };
            match step {
                Step::Exited(s) => break s,
                Step::Signal(sig) => {
                    signalled = Some(sig);
                    child.signal_group(sig);
                }
                Step::Lost(l) => {
                    lost = true;
                    if on_lost == OnLost::Kill {
                        let grace = l.kill_at.saturating_duration_since(Instant::now());
                        eprintln!(
                            "lockctl: lock lost: {} token {}: {}; stopping the command \
                             (SIGTERM now, SIGKILL in {})",
                            self.lease.name,
                            self.lease.token,
                            l.why,
                            humantime::format_duration(round_ms(grace.min(self.grace)))
                        );
                        child.signal_group(libc::SIGTERM);
                        kill_at = Some(l.kill_at);
                    } else {
                        eprintln!(
                            "lockctl: warning: lock lost: {} token {}: {}; the command runs on \
                             (--on-lost warn)",
                            self.lease.name, self.lease.token, l.why
                        );
                    }
                }
                Step::Kill => {
                    child.signal_group(libc::SIGKILL);
                    kill_at = None;
                }
            }
        };
        let status = status.map_err(|e| Failure::usage(format!("waiting for the command: {e}")))?;
        if lost && on_lost == OnLost::Kill {
            // The leader is gone; whatever is left in its group must be gone before the
            // deadline too.
            let until = kill_at.unwrap_or_else(Instant::now);
            while child.group_alive() && Instant::now() < until {
                sleep(GROUP_POLL).await;
            }
            child.signal_group(libc::SIGKILL);
        }
        Ok(Outcome {
            code: exit_code(status),
            lost,
            signalled,
        })
    }

    /// --until: keeps holding, running `test` every `poll` until it exits 0. A lost lease
    /// always stops it (there is nothing left to wait for).
    async fn poll_until(
        &mut self,
        test: &str,
        poll: Duration,
        env: &[(&str, String)],
    ) -> Result<Outcome, Failure> {
        let program = Program::Shell(test.to_owned());
        loop {
            let child = Child::spawn(&program, env)?;
            let o = self.supervise(child, OnLost::Kill).await?;
            if o.lost || o.code == 0 {
                return Ok(o);
            }
            if let Some(sig) = o.signalled {
                return Ok(Outcome::signalled(sig));
            }
            if self.verbose {
                eprintln!(
                    "lockctl: --until test exited {}; next try in {}",
                    o.code,
                    humantime::format_duration(poll)
                );
            }
            tokio::select! {
                _ = sleep(poll) => {}
                sig = self.signals.recv() => return Ok(Outcome::signalled(sig)),
                l = self.keeper.lost() => {
                    eprintln!(
                        "lockctl: lock lost: {} token {}: {}; stopped waiting for --until",
                        self.lease.name, self.lease.token, l.why
                    );
                    return Ok(Outcome { code: LOST, lost: true, signalled: None });
                }
            }
        }
    }

    /// Stops renewing and releases the lock; trouble here is only a warning, since the
    /// command's outcome is what the exit code reports.
    async fn release(self, lost: bool) {
        let lease = self.lease;
        match self.keeper.release().await {
            Released::Done if self.verbose => {
                eprintln!("lockctl: released {} token {}", lease.name, lease.token)
            }
            Released::Done => {}
            Released::NotHeld(e) if !lost => eprintln!(
                "lockctl: warning: {} token {} was no longer held when released ({e})",
                lease.name, lease.token
            ),
            Released::NotHeld(_) => {}
            Released::Failed(e) => eprintln!(
                "lockctl: warning: could not release {} token {}: {e}; the server frees it \
                 when its lease ends",
                lease.name, lease.token
            ),
        }
    }
}

impl Outcome {
    fn signalled(sig: i32) -> Outcome {
        Outcome {
            code: signal_code(sig),
            lost: false,
            signalled: Some(sig),
        }
    }
}

fn lost_failure(lease: &Lease, why: &str) -> Failure {
    Failure::new(
        LOST,
        format!("lock lost: {} token {}: {why}", lease.name, lease.token),
    )
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
