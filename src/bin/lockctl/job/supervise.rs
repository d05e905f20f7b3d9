//! Holding the lock while the job runs (the command and every process it starts, see
//! [`super::child`]): signals passed on, the lease watched, the whole job stopped when the
//! lease is lost or its time runs out.

use std::time::Duration;

use tokio::time::{sleep, sleep_until, Instant};

use super::child::{exit_code, Child, Event, Program};
use lockd::client::keeper::{Keeper, Lost, Released};

use super::keeper::{lost_words, HeldLease};
use crate::cli::{OnLost, RunArgs};
use crate::fail::{signal_code, Failure, LOST, UNTIL_TIMEOUT};
use crate::out::round_ms;
use crate::signals::Signals;

/// Everything needed while the lock is held.
pub struct Supervisor<'a> {
    pub signals: Signals,
    pub keeper: Keeper,
    pub lease: &'a HeldLease,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    pub verbose: bool,
}

/// How a supervised command ended.
pub struct Outcome {
    pub code: u8,
    /// The lease was lost while it ran.
    pub lost: bool,
    /// A signal lockctl received and passed on.
    signalled: Option<i32>,
    /// It was stopped because its time (--until-timeout) ran out.
    timed_out: bool,
}

enum SuperviseStep {
    Job(std::io::Result<Event>),
    Signal(i32),
    Lost(Lost),
    OutOfTime,
    Kill,
}

impl Supervisor<'_> {
    /// Runs the command, then the --until test if it exited 0.
    pub async fn work(
        &mut self,
        program: &Program,
        args: &RunArgs,
        env: &[(&str, String)],
    ) -> Result<Outcome, Failure> {
        let child = Child::spawn(program, env).await?;
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
                        self.lease.shown()
                    );
                }
                Ok(o)
            }
            _ => Ok(outcome),
        }
    }

    /// Waits for the job (the command and every process it started) to end, passing on
    /// signals, and stops it if the lease is lost or `stop_at` comes. The lock is held until
    /// the last process is gone, as flock(1) holds it; the exit code is the command's.
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
        let mut status = None;
        loop {
            let step = tokio::select! {
                e = child.next() => SuperviseStep::Job(e),
                sig = self.signals.recv() => SuperviseStep::Signal(sig),
                l = self.keeper.lost(), if !lost => SuperviseStep::Lost(l),
                _ = sleep_until(stop_at.unwrap_or_else(Instant::now)),
                    if stop_at.is_some() && !timed_out => SuperviseStep::OutOfTime,
                _ = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                    SuperviseStep::Kill
                }
            };
            match step {
                SuperviseStep::Job(Err(e)) => {
                    return Err(Failure::usage(format!("waiting for the command: {e}")))
                }
                SuperviseStep::Job(Ok(Event::Exited { status: s, running })) => {
                    status = Some(s);
                    if running > 0 && self.verbose {
                        eprintln!(
                            "lockctl: the command exited {}, but {running} process{} it \
                             started still run{}; holding {} until they are gone",
                            exit_code(s),
                            if running == 1 { "" } else { "es" },
                            if running == 1 { "s" } else { "" },
                            self.lease.shown()
                        );
                    }
                }
                SuperviseStep::Job(Ok(Event::Gone)) => break,
                SuperviseStep::Signal(sig) => {
                    // Told to stop: the whole job is, and what ignores the signal is killed
                    // after the grace.
                    signalled = Some(sig);
                    child.signal_job(sig);
                    let at = Instant::now() + self.grace;
                    kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                }
                SuperviseStep::Lost(l) => {
                    lost = true;
                    if on_lost == OnLost::Kill {
                        let grace = l.stop_by.saturating_duration_since(Instant::now());
                        eprintln!(
                            "lockctl: lock lost: {} token {}: {}; stopping the command \
                             (SIGTERM now, SIGKILL in {})",
                            self.lease.shown(),
                            self.lease.token,
                            lost_words(&l.why),
                            humantime::format_duration(round_ms(grace.min(self.grace)))
                        );
                        child.signal_job(libc::SIGTERM);
                        kill_at = Some(kill_at.map_or(l.stop_by, |k| k.min(l.stop_by)));
                    } else {
                        eprintln!(
                            "lockctl: warning: lock lost: {} token {}: {}; the command runs on \
                             (--on-lost warn)",
                            self.lease.shown(),
                            self.lease.token,
                            lost_words(&l.why)
                        );
                    }
                }
                SuperviseStep::OutOfTime => {
                    timed_out = true;
                    child.signal_job(libc::SIGTERM);
                    let at = Instant::now() + self.grace;
                    kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                }
                SuperviseStep::Kill => {
                    child.signal_job(libc::SIGKILL);
                    kill_at = None;
                }
            }
        }
        let Some(status) = status else {
            return Err(Failure::usage(
                "waiting for the command: its exit status never came",
            ));
        };
        let stopped = (lost && on_lost == OnLost::Kill) || timed_out;
        child
            .finish(stopped.then(|| kill_at.unwrap_or_else(Instant::now)))
            .await;
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
            let child = Child::spawn(&program, env).await?;
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
                        self.lease.shown(), self.lease.token, lost_words(&l.why)
                    );
                    return Ok(Outcome { code: LOST, lost: true, signalled: None, timed_out: false });
                }
            }
        }
    }

    /// Stops renewing and releases the lock; trouble here is only a warning, since the
    /// command's outcome is what the exit code reports.
    pub async fn release(self, lost: bool) {
        let lease = self.lease;
        match self.keeper.release().await {
            Released::Done if self.verbose => {
                eprintln!("lockctl: released {} token {}", lease.shown(), lease.token)
            }
            Released::Done => {}
            Released::NotHeld(e) if !lost => eprintln!(
                "lockctl: warning: {} token {} was no longer held when released ({e})",
                lease.shown(),
                lease.token
            ),
            Released::NotHeld(_) => {}
            Released::Failed(e) => eprintln!(
                "lockctl: warning: could not release {} token {}: {e}; the server frees it \
                 when its lease ends",
                lease.shown(),
                lease.token
            ),
            // Only from `keep`.
            Released::Detached(_) | Released::NotDetached { .. } => {}
        }
    }

    /// `run --at-least`: the job ended before its window was over, so the lock is not
    /// released: its lease becomes a plain one that lockd ends `more` from now (nobody renews
    /// it). If lockd refuses that (a window over `--max-ttl`), it is released, and stderr says
    /// so.
    pub async fn keep(self, more: Duration) {
        let (lease, verbose) = (self.lease, self.verbose);
        match self.keeper.detach(more).await {
            Released::Detached(left) => {
                if verbose {
                    eprintln!(
                        "lockctl: keeping {} token {} for {} more (--at-least); lockd ends it then",
                        lease.shown(),
                        lease.token,
                        humantime::format_duration(round_ms(left))
                    );
                }
            }
            Released::NotDetached { why, then } => {
                let how = match *then {
                    Released::Done | Released::NotHeld(_) => "released it".to_owned(),
                    Released::Failed(e) => {
                        format!("could not release it either ({e}); the server frees it when its lease ends")
                    }
                    Released::Detached(_) | Released::NotDetached { .. } => String::new(),
                };
                eprintln!(
                    "lockctl: --at-least: could not keep {} token {} held ({why}); {how}",
                    lease.shown(),
                    lease.token
                );
            }
            Released::Done | Released::NotHeld(_) | Released::Failed(_) => {}
        }
    }
}

impl Outcome {
    /// The job ran to its own end: not stopped for a lost lease, a signal or --until-timeout.
    pub fn ended_normally(&self) -> bool {
        !self.lost && self.signalled.is_none() && !self.timed_out
    }

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
