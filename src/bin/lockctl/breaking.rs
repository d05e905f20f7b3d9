//! `lockctl break`: an operator's force-release, asked for at a terminal.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use lockd::client::ClientError;
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
    if !args.yes {
        let held = match client.lock_status(&args.name).await {
            Ok(StatusLine::Held(h)) => h,
            Ok(StatusLine::Free(_)) => {
                return Err(Failure::new(LOST, format!("{what}: {} is free", args.name)))
            }
            Err(e) => return Err(Failure::request(&what, server.addr(), e)),
        };
        let whom = match args.token {
            Some(token) => format!("token {token}"),
            None if held.holders > 1 => format!(
                "token {}, and {} more holders: all of them",
                held.token,
                held.holders - 1
            ),
            None => format!("token {}", held.token),
        };
        eprint!("break {} held by {} ({whom})? [y/N] ", args.name, held.id);
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            eprintln!("lockctl: {what}: not broken");
            return Ok(1);
        }
    }
    match client.break_lock(&args.name, args.token).await {
        Ok(n) => {
            if server.verbose || !args.yes {
                let s = if n == 1 { "" } else { "s" };
                eprintln!("lockctl: broke {} ({n} lease{s} ended)", args.name);
            }
            Ok(0)
        }
        Err(ClientError::Refused(e)) if e.code == ErrorCode::NotHeld => Err(Failure::new(
            LOST,
            format!("{what}: not held: {} {}", e.code, e.message),
        )),
        Err(e) => Err(Failure::request(&what, server.addr(), e)),
    }
}
