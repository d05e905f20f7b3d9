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
    // Held by this very id: the grant is on its way. Free: it is about to be granted.
    let Some(StatusLine::Held(held)) = status_line(&mut client, name).await else {
        return;
    };
    if held.id == id {
        return;
    }
    eprintln!(
        "lockctl: waiting for {name}: {}; {} in the queue",
        held_by(&held),
        held.waiters
    );
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

/// With -v, when -n or -w gave up: says who has the lock (flock itself says nothing).
pub async fn say_conflict(client: &mut Client, name: &str, wait: &WaitArgs) {
    let holder = match status_line(client, name).await {
        Some(StatusLine::Held(h)) => held_by(&h),
        _ => "held".into(),
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
