//! `lockctl run`: take the lock, run the command under it, release it.

use std::time::Duration;

use lockd::client::{Client, ClientError};
use lockd::locks::Token;
use lockd::proto::{ErrorCode, Tie};
use tokio::time::{sleep, sleep_until, Instant};

use crate::child::{exit_code, Child, Program, Signals};
use crate::cli::{ModeArgs, OnLost, RunArgs, WaitArgs};
use crate::fail::{signal_code, Failure, LOST, UNTIL_TIMEOUT};
use crate::holder::{say_conflict, say_if_waiting};
use crate::keeper::{HeldLease, Keeper, Link, Released, Timing};
use crate::net::Server;
use crate::request::{self, Terms};

/// --session-grace unless given (never more than the ttl): long enough for a reconnect across
/// a server restart or a network blip, short enough that a killed lockctl's lock is soon free.
const DEFAULT_SESSION_GRACE: Duration = Duration::from_secs(10);

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
    let session_grace =
        match args.session_grace {
            Some(g) if g > args.ttl => return Err(Failure::usage(
                "--session-grace must not be longer than --ttl (the lease ends at its ttl anyway)",
            )),
            Some(g) => g,
            None => DEFAULT_SESSION_GRACE.min(args.ttl),
        };
    let mut signals = Signals::new()?;
    let timing = Timing::new(args.ttl, session_grace, args.kill_grace);

    let ask = LockAsk {
        name: &args.name,
        id,
        ttl: args.ttl,
        session_grace,
        wait: &args.wait,
        mode: args.mode,
    };
    let granted = tokio::select! {
        g = lock(server, &ask) => g?,
        sig = signals.recv() => {
            if server.verbose {
                eprintln!("lockctl: interrupted while waiting for {}", args.name);
            }
            return Ok(signal_code(sig));
        }
    };
    let Acquired {
        mut client,
        token,
        sent,
    } = granted;
    let lease = HeldLease {
        name: args.name.clone(),
        token,
        ttl: args.ttl,
    };
    if server.verbose {
        eprintln!(
            "lockctl: acquired {} token {token} ({}, ttl {}, session grace {})",
            lease.name,
            args.mode.describe(),
            humantime::format_duration(args.ttl),
            humantime::format_duration(session_grace)
        );
    }

    // A grant after a long wait: the lease runs from the grant, which lockctl only knows to be
    // after the LOCK was sent. One RENEW now gives a deadline it can be sure of.
    let mut deadline = timing.deadline(sent, args.ttl);
    let mut next_renew = timing.next_renew(sent);
    if timing.needs_early_renew(sent.elapsed()) {
        let renew_sent = Instant::now();
        match client.renew(&lease.name, token, Some(args.ttl)).await {
            Ok(left) => {
                deadline = timing.deadline(renew_sent, left);
                next_renew = timing.next_renew(renew_sent);
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
    let mut holder = Supervisor {
        signals,
        keeper,
        lease: &lease,
        grace: timing.grace,
        verbose: server.verbose,
    };
    let mut env = vec![
        ("LOCKD_NAME", lease.name.clone()),
        ("LOCKD_TOKEN", token.to_string()),
        ("LOCKD_ADDR", server.addrs().to_string()),
    ];
    env.extend(server.tls.iter().flat_map(crate::tls::environment));
    env.extend(server.auth.iter().flat_map(|auth| auth.environment()));
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
    if let Some(first) = args.stray.first() {
        return Err(Failure::usage(format!(
            "unexpected argument {first:?}: put the command after -- (options before it), \
             as in lockctl run {} -- {}",
            args.name,
            args.stray.join(" ")
        )));
    }
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

struct Acquired {
    client: Client,
    token: Token,
    /// When the granted LOCK was sent: the lease began no earlier.
    sent: Instant,
}

/// What `run` asks the server for.
struct LockAsk<'a> {
    name: &'a str,
    id: &'a str,
    ttl: Duration,
    session_grace: Duration,
    wait: &'a WaitArgs,
    mode: ModeArgs,
}

/// LOCK with `session=<grace>`, so that the server frees the lock soon if lockctl dies, but a
/// dropped connection can be ridden out. If the connection fails while waiting, it reconnects
/// and asks again for the rest of the wait.
async fn lock(server: &Server, ask: &LockAsk<'_>) -> Result<Acquired, Failure> {
    let started = Instant::now();
    let mut client = server.connect().await?;
    loop {
        let wait = ask
            .wait
            .server_wait()
            .map(|w| w.saturating_sub(started.elapsed()));
        let terms = Terms {
            ttl: Some(ask.ttl),
            wait,
            tie: Tie::Session(ask.session_grace),
            mode: ask.mode,
        };
        let sent = Instant::now();
        let lock = request::lock(&mut client, ask.name, ask.id, terms);
        let reply = say_if_waiting(server, ask.name, ask.id, lock).await;
        match reply {
            Ok(token) => {
                return Ok(Acquired {
                    client,
                    token,
                    sent,
                })
            }
            Err(ClientError::Refused(e)) if e.code == ErrorCode::Timeout => {
                if server.verbose {
                    say_conflict(&mut client, ask.name, ask.wait).await;
                }
                return Err(Failure::silent(ask.wait.conflict_exit_code));
            }
            Err(ClientError::Refused(e)) if e.code != ErrorCode::Shutdown => {
                return Err(Failure::request(
                    &format!("lock {}", ask.name),
                    server.addr(),
                    ClientError::Refused(e),
                ));
            }
            Err(e) => {
                if server.verbose {
                    eprintln!(
                        "lockctl: lost the connection while waiting for {} ({e}); reconnecting",
                        ask.name
                    );
                }
                // To the next address first: the one just lost may be the one that is down.
                client = server.reconnect().await?;
            }
        }
    }
}

/// Everything needed while the lock is held.
struct Supervisor<'a> {
    signals: Signals,
    keeper: Keeper,
    lease: &'a HeldLease,
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
    /// It was stopped because its time (--until-timeout) ran out.
    timed_out: bool,
}

enum SuperviseStep {
    Exited(std::io::Result<std::process::ExitStatus>),
    Signal(i32),
    Lost(crate::keeper::Lost),
    OutOfTime,
    Kill,
}

impl Supervisor<'_> {
    /// Runs the command, then the --until test if it exited 0.
    async fn work(
        &mut self,
        program: &Program,
        args: &RunArgs,
        env: &[(&str, String)],
    ) -> Result<Outcome, Failure> {
        let child = Child::spawn(program, env)?;
        let outcome = self.supervise(child, args.on_lost, None).await?;
        match &args.until {
            Some(test) if outcome.code == 0 && !outcome.lost => {
                let give_up = Instant::now() + args.until_timeout;
                let o = self.poll_until(test, args.poll, give_up, env).await?;
                if o.timed_out {
                    eprintln!(
                        "lockctl: the --until test did not pass within {} (--until-timeout); \
                         releasing {}",
                        humantime::format_duration(args.until_timeout),
                        self.lease.name
                    );
                }
                Ok(o)
            }
            _ => Ok(outcome),
        }
    }

    /// Waits for the command, passing on signals, and stops its group if the lease is lost or
    /// `stop_at` comes.
    async fn supervise(
        &mut self,
        mut child: Child,
        on_lost: OnLost,
        stop_at: Option<Instant>,
    ) -> Result<Outcome, Failure> {
        let mut lost = false;
        let mut timed_out = false;
        let mut signalled = None;
        let mut kill_at: Option<Instant> = None;
        let status = loop {
            let step = tokio::select! {
                s = child.wait() => SuperviseStep::Exited(s),
                sig = self.signals.recv() => SuperviseStep::Signal(sig),
                l = self.keeper.lost(), if !lost => SuperviseStep::Lost(l),
                _ = sleep_until(stop_at.unwrap_or_else(Instant::now)),
                    if stop_at.is_some() && !timed_out => SuperviseStep::OutOfTime,
                _ = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                    SuperviseStep::Kill
                }
            };
            match step {
                SuperviseStep::Exited(s) => break s,
                SuperviseStep::Signal(sig) => {
                    signalled = Some(sig);
                    child.signal_group(sig);
                }
                SuperviseStep::Lost(l) => {
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
                        kill_at = Some(kill_at.map_or(l.kill_at, |k| k.min(l.kill_at)));
                    } else {
                        eprintln!(
                            "lockctl: warning: lock lost: {} token {}: {}; the command runs on \
                             (--on-lost warn)",
                            self.lease.name, self.lease.token, l.why
                        );
                    }
                }
                SuperviseStep::OutOfTime => {
                    timed_out = true;
                    child.signal_group(libc::SIGTERM);
                    let at = Instant::now() + self.grace;
                    kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                }
                SuperviseStep::Kill => {
                    child.signal_group(libc::SIGKILL);
                    kill_at = None;
                }
            }
        };
        let status = status.map_err(|e| Failure::usage(format!("waiting for the command: {e}")))?;
        if (lost && on_lost == OnLost::Kill) || timed_out {
            // The leader is gone; whatever is left in its group must be gone before the
            // deadline too.
            let until = kill_at.unwrap_or_else(Instant::now);
            while child.group_alive() && Instant::now() < until {
                sleep(GROUP_POLL).await;
            }
            child.signal_group(libc::SIGKILL);
        }
        Ok(Outcome {
            code: if timed_out {
                UNTIL_TIMEOUT
            } else {
                exit_code(status)
            },
            lost,
            signalled,
            timed_out,
        })
    }

    /// --until: keeps holding, running `test` every `poll` until it exits 0, or until
    /// `give_up`. A lost lease always stops it (there is nothing left to wait for).
    async fn poll_until(
        &mut self,
        test: &str,
        poll: Duration,
        give_up: Instant,
        env: &[(&str, String)],
    ) -> Result<Outcome, Failure> {
        let program = Program::Shell(test.to_owned());
        loop {
            let child = Child::spawn(&program, env)?;
            let o = self.supervise(child, OnLost::Kill, Some(give_up)).await?;
            if o.lost || o.timed_out || o.code == 0 {
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
                _ = sleep_until(give_up) => return Ok(Outcome::out_of_time()),
                sig = self.signals.recv() => return Ok(Outcome::signalled(sig)),
                l = self.keeper.lost() => {
                    eprintln!(
                        "lockctl: lock lost: {} token {}: {}; stopped waiting for --until",
                        self.lease.name, self.lease.token, l.why
                    );
                    return Ok(Outcome { code: LOST, lost: true, signalled: None, timed_out: false });
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
            timed_out: false,
        }
    }

    fn out_of_time() -> Outcome {
        Outcome {
            code: UNTIL_TIMEOUT,
            lost: false,
            signalled: None,
            timed_out: true,
        }
    }
}

fn lost_failure(lease: &HeldLease, why: &str) -> Failure {
    Failure::new(
        LOST,
        format!("lock lost: {} token {}: {why}", lease.name, lease.token),
    )
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
