//! `lockctl elect` and `lockctl leader`: leader election by name, over the lock of that name.
//! The leader is its holder; standbys are its queue, FIFO; leadership is `lockctl run`'s hold,
//! with its whole-service guarantee. `leader` reads STATUS, and with `--watch` follows WATCH.

use lockd::client::{retryable, Client, LockDetail, Retry};
use lockd::locks::EventKind;
use lockd::locks::Token;
use lockd::proto::EventLine;
use tokio::time::sleep;

use crate::cli::{ElectArgs, LeaderArgs, ModeArgs, OnLost, RunArgs, WaitArgs};
use crate::fail::Failure;
use crate::net::Server;
use crate::out::print_line;
use crate::signals::Signals;

/// Exit code of `leader` when there is none (as a held name's `-n`).
const NO_LEADER: u8 = 1;

/// `lockctl elect`: `lockctl run <name>`, one name, exclusive, waiting as long as it takes.
pub async fn elect(server: &Server, id: &str, args: &ElectArgs) -> Result<u8, Failure> {
    super::run::run(server, id, &as_run(args)).await
}

/// The service, checked before anything connects (a usage error, exit 2).
pub fn check(args: &ElectArgs) -> Result<(), Failure> {
    match (&args.shell, args.command.is_empty()) {
        (None, true) => Err(Failure::usage(
            "no service: give one after -- (lockctl elect NAME -- SERVICE ARGS...) or use -c",
        )),
        _ => super::run::program(&as_run(args)).map(|_| ()),
    }
}

/// The `run` an election is.
pub fn as_run(args: &ElectArgs) -> RunArgs {
    RunArgs {
        names: vec![args.name.clone()],
        wait: WaitArgs {
            wait: None,
            nonblock: false,
            conflict_exit_code: 1,
            supersede: false,
        },
        mode: ModeArgs::default(),
        shell: args.shell.clone(),
        ttl: args.ttl,
        session_grace: args.session_grace,
        on_lost: OnLost::Kill,
        kill_grace: args.kill_grace,
        until: None,
        poll: std::time::Duration::from_secs(5),
        until_timeout: std::time::Duration::from_secs(3600),
        command: args.command.clone(),
        note: args.note.clone(),
        note_command: false,
        at_least: None,
    }
}

/// The leader as one line, and its token: `<id> <note>` (`<id>` alone without a note).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Leader {
    token: Token,
    line: String,
}

/// `lockctl leader`: the leader now (exit 1 for none), or with `--watch` every change.
pub async fn leader(server: &Server, args: &LeaderArgs) -> Result<u8, Failure> {
    if !args.watch {
        let mut client = server.connect().await?;
        let now = current(&mut client, server, &args.name).await?;
        return match now {
            Some(l) => {
                print_line(&l.line)?;
                Ok(0)
            }
            None => Ok(NO_LEADER),
        };
    }
    follow(server, &args.name).await
}

/// The leader as STATUS shows it: the first holder whose lease is not over.
async fn current(
    client: &mut Client,
    server: &Server,
    name: &str,
) -> Result<Option<Leader>, Failure> {
    let lock = crate::view::status::detail(client, server, name).await?;
    Ok(of_detail(&lock))
}

fn of_detail(lock: &LockDetail) -> Option<Leader> {
    let h = lock.holders.iter().find(|h| !h.lingering)?;
    Some(Leader {
        token: h.token,
        line: line(&h.id, h.note.as_deref()),
    })
}

fn line(id: &str, note: Option<&str>) -> String {
    match note {
        Some(note) => format!("{id} {note}"),
        None => id.to_owned(),
    }
}

/// The leader after `event`, given the one before.
fn after(before: Option<Leader>, event: &EventLine) -> Option<Leader> {
    match event.kind {
        EventKind::Acquired => Some(Leader {
            token: event.token,
            line: line(&event.id, event.note.as_deref()),
        }),
        // Any end of the leader's lease (a `broken` one is over for it, even if it keeps its
        // place a while): no leader until the next grant.
        _ if before.as_ref().is_some_and(|l| l.token == event.token) => None,
        _ => before,
    }
}

/// `--watch`: the leader now, then a line per change, until SIGINT or SIGTERM. Across a
/// reconnect (another address of --server, a restarted lockd) the leader is read again, so
/// a change missed meanwhile is still printed once.
async fn follow(server: &Server, name: &str) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let mut retry = Retry::within(None);
    let mut shown: Option<Option<Leader>> = None;
    let show = |shown: &mut Option<Option<Leader>>, now: Option<Leader>| {
        let changed = match shown.as_ref() {
            None => true,
            Some(before) => before.as_ref().map(|l| l.token) != now.as_ref().map(|l| l.token),
        };
        let text = now.as_ref().map_or("-", |l| l.line.as_str()).to_owned();
        *shown = Some(now);
        match changed {
            true => print_line(&text),
            false => Ok(()),
        }
    };
    let mut client = Some(server.connect().await?);
    loop {
        let mut c = match client.take() {
            Some(c) => c,
            None => tokio::select! {
                c = server.reconnect_for(&retry) => c?,
                _ = signals.recv() => return Ok(0),
            },
        };
        // Watching first, then reading (on a second connection: a watch's carries events
        // only): no change falls between the two, and one seen twice is shown once.
        let ended = tokio::select! {
            r = c.watch(Some(name)) => r.err(),
            _ = signals.recv() => return Ok(0),
        };
        let ended = match ended {
            Some(e) => e,
            None => {
                let mut reader = tokio::select! {
                    r = server.connect() => r?,
                    _ = signals.recv() => return Ok(0),
                };
                let lock = tokio::select! {
                    r = reader.detail(name) => r,
                    _ = signals.recv() => return Ok(0),
                };
                drop(reader);
                match lock {
                    Ok(lock) => {
                        retry.succeeded();
                        show(&mut shown, of_detail(&lock))?;
                        loop {
                            let event = tokio::select! {
                                e = c.next_event() => e,
                                _ = signals.recv() => return Ok(0),
                            };
                            match event {
                                Ok(Ok(e)) => {
                                    let before = shown.clone().flatten();
                                    show(&mut shown, after(before, &e))?;
                                }
                                Ok(Err(_)) => {}
                                Err(e) => break e,
                            }
                        }
                    }
                    Err(e) => e,
                }
            }
        };
        if !retryable(&ended) {
            return Err(Failure::request("leader", server.addr(), ended));
        }
        let Some(pause) = server.retry_after(&mut retry, "leader", &ended) else {
            return Err(Failure::request("leader", server.addr(), ended));
        };
        drop(c);
        tokio::select! {
            _ = sleep(pause) => {}
            _ = signals.recv() => return Ok(0),
        }
    }
}
