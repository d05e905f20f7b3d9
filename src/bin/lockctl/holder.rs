//! Who holds a lock, for -v: said when lockctl has to wait for it, and when it gives up.

use std::future::Future;
use std::time::Duration;

use lockd::client::Client;
use tokio::time::sleep;

use crate::cli::WaitArgs;
use crate::net::Server;
use crate::snapshot::{mode_words, Held, Row};

/// How long a LOCK may go unanswered before lockctl asks who holds the lock: a free lock is
/// granted in one round trip.
const WAITING_AFTER: Duration = Duration::from_millis(100);

/// Longest the question may take: it is only for the message.
const ASK_LIMIT: Duration = Duration::from_secs(2);

/// Awaits `lock`, the reply to a LOCK of `name`. With -v, if the reply does not come at once,
/// asks on a second connection who holds the lock and says that lockctl waits behind them.
pub async fn say_if_waiting<T>(
    server: &Server,
    name: &str,
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
        () = say_waiting(server, name, id) => {}
    }
    lock.await
}

async fn say_waiting(server: &Server, name: &str, id: &str) {
    let Ok(mut client) = server
        .connect_once(ASK_LIMIT.min(server.connect_timeout()))
        .await
    else {
        return;
    };
    let Some(line) = status_line(&mut client, name).await else {
        return;
    };
    // Held by this very id: the grant is on its way. Free: it is about to be granted.
    let Some(held) = Row::parse(&line)
        .and_then(|r| r.held)
        .filter(|h| h.id != id)
    else {
        return;
    };
    eprintln!(
        "lockctl: waiting for {name}: {}; {} in the queue",
        held_by(&held),
        held.waiters
    );
}

/// `held by h:1 (token 7)`, or for a shared lock or a semaphore
/// `held shared by h:1 (token 7) and 2 more`, `held as a semaphore of 3 by ...`.
fn held_by(held: &Held) -> String {
    let mode = match held.mode.as_str() {
        "exclusive" => String::new(),
        m => format!("{} ", mode_words(m)),
    };
    let more = match held.holders {
        0 | 1 => String::new(),
        k => format!(" and {} more", k - 1),
    };
    format!("held {mode}by {} (token {}){more}", held.id, held.token)
}

/// With -v, when -n or -w gave up: says who has the lock (flock itself says nothing).
pub async fn say_conflict(client: &mut Client, name: &str, wait: &WaitArgs) {
    let holder = match status_line(client, name)
        .await
        .as_deref()
        .and_then(Row::parse)
        .and_then(|r| r.held)
    {
        Some(h) => held_by(&h),
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

async fn status_line(client: &mut Client, name: &str) -> Option<String> {
    let lines = tokio::time::timeout(ASK_LIMIT, client.status(Some(name)))
        .await
        .ok()?
        .ok()?;
    lines.into_iter().next()
}
