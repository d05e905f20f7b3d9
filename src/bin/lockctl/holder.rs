//! Who holds a lock, for -v: said when lockctl has to wait for it, and when it gives up.

use std::future::Future;
use std::time::Duration;

use lockd::client::Client;
use lockd::locks::Mode;
use lockd::proto::{HeldLine, StatusLine};
use tokio::time::sleep;

use crate::cli::WaitArgs;
use crate::net::Server;
use crate::out::mode_words;

/// How long a LOCK may go unanswered before lockctl asks who holds the lock: a free lock is
/// granted in one round trip.
const WAITING_AFTER: Duration = Duration::from_millis(100);

/// Longest the question may take: it is only for the message.
const ASK_LIMIT: Duration = Duration::from_secs(2);

/// Awaits `lock`, the reply to a LOCK of `names` (one, or a set). With -v, if the reply does
/// not come at once, asks on a second connection who holds the lock (of a set: the first name
/// held by someone else) and says that lockctl waits behind them.
pub async fn say_if_waiting<T>(
    server: &Server,
    names: &[String],
    id: &str,
    lock: impl Future<Output = T>,
) -> T {
    if !server.verbose {
        return lock.await;
    }
    tokio::pin!(lock);
    tokio::select! {
        r = &mut lock => return r,
        _ = sleep(WAITING_AFTER) => {}
    }
    tokio::select! {
        r = &mut lock => return r,
        () = say_waiting(server, names, id) => {}
    }
    lock.await
}

async fn say_waiting(server: &Server, names: &[String], id: &str) {
    let Ok(mut client) = server
        .connect_once(ASK_LIMIT.min(server.connect_timeout()))
        .await
    else {
        return;
    };
    for name in names {
        // Held by this very id: the grant is on its way. Free: it is about to be granted, or
        // (a set) the wait is for another of its names.
        let Some(StatusLine::Held(held)) = status_line(&mut client, name).await else {
            continue;
        };
        if held.id == id {
            continue;
        }
        eprintln!(
            "lockctl: waiting for {name}: {}; {} in the queue",
            held_by(&held),
            held.waiters
        );
        return;
    }
}

/// `held by h:1 (token 7)`, or for a shared lock or a semaphore
/// `held shared by h:1 (token 7) and 2 more`, `held as a semaphore of 3 by ...`.
fn held_by(held: &HeldLine) -> String {
    let mode = match held.mode {
        Mode::Exclusive => String::new(),
        m => format!("{} ", mode_words(m)),
    };
    let more = match held.holders {
        0 | 1 => String::new(),
        k => format!(" and {} more", k - 1),
    };
    format!("held {mode}by {} (token {}){more}", held.id, held.token)
}

/// With -v, when -n or -w gave up: says who has the lock (flock itself says nothing); of a
/// set, the first of its names that is held. Asked on a connection of its own.
pub async fn say_conflict(server: &Server, names: &[String], wait: &WaitArgs) {
    let mut found = None;
    if let Ok(mut client) = server
        .connect_once(ASK_LIMIT.min(server.connect_timeout()))
        .await
    {
        for name in names {
            if let Some(StatusLine::Held(h)) = status_line(&mut client, name).await {
                found = Some((name, held_by(&h)));
                break;
            }
        }
    }
    let (name, holder) = match found {
        Some(found) => found,
        // Free by now, or only waited for: the server's own answer says more.
        None => (&names[0], "held".into()),
    };
    match wait.wait {
        Some(w) if !wait.nonblock => eprintln!(
            "lockctl: {name} is {holder}; gave up after {}",
            humantime::format_duration(w)
        ),
        _ => eprintln!("lockctl: {name} is {holder}"),
    }
}

async fn status_line(client: &mut Client, name: &str) -> Option<StatusLine> {
    tokio::time::timeout(ASK_LIMIT, client.lock_status(name))
        .await
        .ok()?
        .ok()
}
