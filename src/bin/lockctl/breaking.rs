//! `lockctl break`: an operator's force-release, asked for at a terminal.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use lockd::client::{Client, ClientError};
use lockd::proto::{ErrorCode, StatusLine};

use crate::cli::BreakArgs;
use crate::fail::{Failure, LOST};
use crate::net::Server;

/// BREAK, once: never sent again after a lost answer or `ERR UNAVAILABLE`, because a BREAK
/// of every holder that was carried out would, sent again, break the next holder too.
pub async fn break_lock(server: &Server, args: &BreakArgs) -> Result<u8, Failure> {
    let what = match args.token {
        Some(token) => format!("break {} {token}", args.name),
        None => format!("break {}", args.name),
    };
    let interactive = std::io::stdin().is_terminal();
    if !args.yes && !interactive {
        return Err(Failure::usage(format!(
            "{what}: stdin is not a terminal to confirm at: give -y to break it"
        )));
    }
    let mut client = server.connect().await?;
    if !args.yes && !confirmed(&mut client, server, args, &what).await? {
        eprintln!("lockctl: {what}: not broken");
        return Ok(1);
    }
    match client.break_lock(&args.name, args.token, args.force).await {
        Ok(n) => {
            // An admin action says what it did, with -y too (a script's log keeps the line).
            let s = if n == 1 { "" } else { "s" };
            let then = match args.force {
                true => "handed on now",
                false => "it passes on once its holder has let go, or its lease runs out",
            };
            eprintln!("lockctl: broke {} ({n} lease{s} ended; {then})", args.name);
            Ok(0)
        }
        Err(ClientError::Refused(e)) if e.code == ErrorCode::NotHeld => Err(Failure::new(
            LOST,
            format!("{what}: not held: {} {}", e.code, e.message),
        )),
        Err(e) => Err(Failure::request(&what, server.addr(), e)),
    }
}

/// Shows the holder the BREAK would end and asks at the terminal; whether the answer was
/// yes. A user with the admin right but not read is asked without the holder shown.
async fn confirmed(
    client: &mut Client,
    server: &Server,
    args: &BreakArgs,
    what: &str,
) -> Result<bool, Failure> {
    // Every holder (STATUS detail), to name the one --token picks.
    let detail = match client.detail(&args.name).await {
        Ok(detail) => detail,
        Err(ClientError::Refused(e)) if e.code == ErrorCode::Denied => {
            eprint!(
                "break {}? (its holder is not shown: {}) [y/N] ",
                args.name, e.message
            );
            return Ok(yes());
        }
        Err(e) => return Err(Failure::request(what, server.addr(), e)),
    };
    let holders = &detail.holders;
    let first = match args.token {
        Some(token) => holders.iter().find(|h| h.token == token),
        None => holders.first(),
    };
    let Some(first) = first else {
        let why = match (args.token, &detail.status) {
            (_, StatusLine::Free(_)) => format!("{} is free", args.name),
            (Some(token), _) => format!("no lease of {} has token {token}", args.name),
            (None, _) => format!("{} has no holder to break", args.name),
        };
        return Err(Failure::new(LOST, format!("{what}: {why}")));
    };
    let whom = match (args.token, holders.len()) {
        (None, n) if n > 1 => format!(
            "token {}, and {} more holders: all of them",
            first.token,
            n - 1
        ),
        _ => format!("token {}", first.token),
    };
    eprint!("break {} held by {} ({whom})? [y/N] ", args.name, first.id);
    Ok(yes())
}

/// Reads the answer typed at the terminal: yes only for `y` or `yes`.
fn yes() -> bool {
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes")
}
