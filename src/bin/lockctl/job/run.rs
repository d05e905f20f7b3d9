//! `lockctl run`: take the lock, run the command under it, release it.

use std::time::Duration;

use lockd::client::keeper::Held;
use lockd::client::{ClientError, Locked};
use lockd::proto::{ErrorCode, Tie};
use tokio::time::{timeout, Instant};

use super::child::Program;
use super::keeper::{self, HeldLease};
use super::set_env;
use super::supervise::Supervisor;
use crate::cli::{ModeArgs, OnLost, RunArgs, WaitArgs};
use crate::fail::{signal_code, Failure, LOST};
use crate::net::Server;
use crate::out::held_tokens;
use crate::request::{self, Terms};
use crate::signals::Signals;

/// --session-grace unless given (never more than the ttl): long enough for a reconnect across
/// a server restart or a network blip, short enough that a killed lockctl's lock is soon free.
const DEFAULT_SESSION_GRACE: Duration = Duration::from_secs(10);
/// The shortest `--ttl` run takes: renewals every third of it, with a margin and a kill grace
/// inside it, need a second at least to be worth trying over a network.
const MIN_RUN_TTL: Duration = Duration::from_secs(1);

pub async fn run(server: &Server, id: &str, args: &RunArgs) -> Result<u8, Failure> {
    let program = program(args)?;
    let first = &args.names[0];
    if args.names.len() > 1 && args.wait.supersede {
        return Err(Failure::usage(
            "--supersede takes one name: a set waits in the queue of each of its names, and \
             would take every one of them",
        ));
    }
    if args.ttl.is_zero() {
        return Err(Failure::usage("--ttl must be more than 0"));
    }
    if args.poll.is_zero() {
        return Err(Failure::usage("--poll must be more than 0"));
    }
    if args.at_least.is_some_and(|d| d.is_zero()) {
        return Err(Failure::usage("--at-least must be more than 0"));
    }
    // A lease must outlive a few renewal round trips and the kill schedule; shorter, it would
    // be lost at once (and the command stopped) on any network.
    if args.ttl < MIN_RUN_TTL {
        return Err(Failure::usage(format!(
            "--ttl {} is too short to renew: at least {}",
            humantime::format_duration(args.ttl),
            humantime::format_duration(MIN_RUN_TTL)
        )));
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
    let timing = keeper::timing(
        args.ttl,
        session_grace,
        args.kill_grace,
        server.addrs().len(),
    );

    let ask = LockAsk {
        names: &args.names,
        id,
        ttl: args.ttl,
        session_grace,
        wait: &args.wait,
        mode: args.mode,
        note: default_note(args),
    };
    let granted = tokio::select! {
        g = lock(server, &ask) => g?,
        sig = signals.recv() => {
            if server.verbose {
                eprintln!("lockctl: interrupted while waiting for {}", args.names.join(", "));
            }
            return Ok(signal_code(sig));
        }
    };
    // `--at-least` counts from here: no earlier than the grant, so the lock is never let go
    // before the window is over.
    let granted_at = Instant::now();
    let Locked {
        mut client,
        token,
        tokens,
        sent,
    } = granted;
    // One lease covers the set: the first name stands for it in RENEW and UNLOCK.
    let lease = HeldLease {
        name: first.clone(),
        token,
        also: args.names[1..].to_vec(),
    };
    if server.verbose {
        eprintln!(
            "lockctl: acquired {} ({}, ttl {}, session grace {})",
            held_tokens(&args.names, &tokens),
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
        let renewed = timeout(
            timing.attempt_limit(),
            client.renew(&lease.name, token, Some(args.ttl)),
        )
        .await;
        match renewed.unwrap_or(Err(ClientError::Closed)) {
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
    let held = Held {
        name: lease.name.clone(),
        token,
        ttl: args.ttl,
        deadline,
        next_renew,
    };
    let mut holder = Supervisor {
        signals,
        keeper: keeper::spawn(server, client, held, &lease, timing),
        lease: &lease,
        grace: timing.stop_grace(),
        verbose: server.verbose,
    };
    let tokens_env = match set_env::environment(&args.names, &tokens) {
        Ok(env) => env,
        Err(why) => {
            // Checked before the LOCK was sent; a reply with the wrong count of tokens is
            // refused by the client. Never run a job that cannot tell its tokens apart.
            holder.release(false).await;
            return Err(Failure::usage(why));
        }
    };
    let mut env = vec![
        ("LOCKD_NAME", lease.name.clone()),
        ("LOCKD_ADDR", server.addrs().to_string()),
    ];
    env.extend(server.tls.iter().flat_map(crate::tls::environment));
    env.extend(server.auth.iter().flat_map(|auth| auth.environment()));
    let mut env: Vec<(&str, String)> = env.into_iter().collect();
    env.extend(tokens_env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let outcome = holder.work(&program, args, &env).await;
    let lost = outcome.as_ref().is_ok_and(|o| o.lost);
    let keep = match (&outcome, args.at_least) {
        (Ok(o), Some(window)) if o.ended_normally() => window
            .checked_sub(granted_at.elapsed())
            .filter(|more| *more >= Duration::from_millis(1)),
        _ => None,
    };
    match keep {
        Some(more) => holder.keep(more).await,
        None => holder.release(lost).await,
    }
    let outcome = outcome?;
    if outcome.lost && args.on_lost == OnLost::Kill {
        return Ok(LOST);
    }
    Ok(outcome.code)
}

/// The command to run, or a usage error. Called before the names are checked: a command
/// given without `--` lands among the names, and is pointed to `--` instead.
pub fn program(args: &RunArgs) -> Result<Program, Failure> {
    match (&args.shell, args.command.is_empty()) {
        (Some(line), true) => Ok(Program::Shell(line.clone())),
        (Some(_), false) => Err(Failure::usage(
            "give either -c '<shell command>' or a command after --, not both",
        )),
        (None, false) => Ok(Program::Argv(args.command.clone())),
        (None, true) => match args.names.split_first() {
            // Several words and no command: most likely `run NAME COMMAND ARGS...`.
            Some((name, stray)) if !stray.is_empty() => Err(Failure::usage(format!(
                "no command: put the command after -- (options and names before it), as in \
                 lockctl run {name} -- {}; several names are one set, as in lockctl run \
                 {name} {} -- COMMAND",
                stray.join(" "),
                stray.join(" ")
            ))),
            _ => Err(Failure::usage(
                "no command: give one after -- (lockctl run NAME... -- COMMAND ARGS...) or \
                 use -c",
            )),
        },
    }
}

/// What `run` asks the server for.
struct LockAsk<'a> {
    /// One name, or a set's names in the order given.
    names: &'a [String],
    id: &'a str,
    ttl: Duration,
    session_grace: Duration,
    wait: &'a WaitArgs,
    mode: ModeArgs,
    note: Option<String>,
}

/// `--note`; by default the program's name (the file name of the command's first word, or of
/// the -c script's: `deploy.sh`), which says what holds the lock without publishing its
/// arguments (a password on a command line is read by everyone who may read the lock); with
/// `--note-command` the whole command line (its words joined by spaces, or the -c text). Cut
/// to [`request::DEFAULT_NOTE_MAX`] bytes; control characters (a newline in a -c script)
/// become spaces: the server takes printable text only.
fn default_note(args: &RunArgs) -> Option<String> {
    if let Some(note) = &args.note {
        return Some(note.clone());
    }
    let line = match (&args.shell, args.note_command) {
        (Some(shell), true) => shell.clone(),
        (None, true) => args.command.join(" "),
        (Some(shell), false) => program_name(shell.split_whitespace().next()),
        (None, false) => program_name(args.command.first().map(String::as_str)),
    };
    let line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.trim_end();
    Some(request::cut_note(line, request::DEFAULT_NOTE_MAX).to_owned())
}

/// The file name of `word`, the program a command runs; `sh` for a -c script that starts
/// with a variable (`PGPASSWORD=... psql`: the word itself may be the secret).
fn program_name(word: Option<&str>) -> String {
    match word {
        Some(w) if !w.contains('=') => w.rsplit('/').next().unwrap_or(w).to_owned(),
        _ => "sh".to_owned(),
    }
}

/// LOCK with `session=<grace>`, so that the server frees the lock soon if lockctl dies, but a
/// dropped connection can be ridden out. What can be mended by trying again (`ERR
/// UNAVAILABLE`, a lost connection) is tried again through the next address, for the rest of
/// the wait ([`request::lock_retrying`]).
async fn lock(server: &Server, ask: &LockAsk<'_>) -> Result<Locked, Failure> {
    let terms = Terms {
        ttl: Some(ask.ttl),
        tie: Tie::Session(ask.session_grace),
        mode: ask.mode,
        note: ask.note.clone(),
    };
    let what = format!("lock {}", ask.names.join(" "));
    request::lock_retrying(server, &what, (ask.names, ask.id), terms, ask.wait).await
}

fn lost_failure(lease: &HeldLease, why: &str) -> Failure {
    Failure::new(
        LOST,
        format!("lock lost: {} token {}: {why}", lease.shown(), lease.token),
    )
}
