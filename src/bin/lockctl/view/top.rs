//! `lockctl top`: the held locks, longest queue first, redrawn every --interval until
//! interrupted. At a terminal the screen is cleared for each snapshot; otherwise (a pipe, a
//! file) the snapshots follow each other, a blank line apart.

use std::cmp::Reverse;
use std::io::IsTerminal as _;
use std::time::{Duration, SystemTime};

use lockd::client::Client;
use lockd::proto::{ErrorCode, StatusLine};
use tokio::time::{interval, timeout, MissedTickBehavior};

use super::status::{detail, holder_and_others, list, with_notes};
use crate::cli::TopArgs;
use crate::fail::{Failure, UNREACHABLE};
use crate::net::{Server, ONE_SHOT_CONNECT};
use crate::out::{columns, print_line, short_duration};
use crate::signals::Signals;

/// The shortest --interval: a refresh costs the server a STATUS of the whole table.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Clears the screen and puts the cursor top left.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// One line of the view: a lock, and how long it has been held if its detail was asked for.
struct ViewLine {
    row: StatusLine,
    age: Option<Duration>,
    /// The first holder's user (`--auth-file`), where its detail was asked for and says one.
    user: Option<String>,
}

pub async fn top(server: &Server, args: &TopArgs) -> Result<u8, Failure> {
    if args.interval < MIN_INTERVAL {
        return Err(Failure::usage(format!(
            "--interval must be at least {}",
            humantime::format_duration(MIN_INTERVAL)
        )));
    }
    for name in &args.names {
        lockd::proto::validate_name("lock name", name).map_err(|e| Failure::usage(e.message))?;
    }
    let mut signals = Signals::new()?;
    let terminal = std::io::stdout().is_terminal();
    let mut client = Some(server.connect().await?);
    let mut ticks = interval(args.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    for n in 0u64.. {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = signals.recv() => return Ok(0),
        }
        let entries = tokio::select! {
            e = take(server, &mut client, args) => e,
            _ = signals.recv() => return Ok(0),
        };
        let mut text = header(server, args, entries.as_deref().ok());
        match entries {
            Ok(entries) => text.push_str(&view(&entries, terminal.then(terminal_rows).flatten())),
            // Refused its login or its rights: every refresh would be refused alike.
            Err(f) if f.is_denied() => return Err(f),
            Err(f) => text.push_str(&format!(
                "{}; trying again every {}",
                f.message.unwrap_or_default(),
                humantime::format_duration(args.interval)
            )),
        }
        if terminal {
            text.insert_str(0, CLEAR);
        } else if n > 0 {
            text.insert(0, '\n');
        }
        print_line(&text)?;
    }
    Ok(0)
}

/// One snapshot: the names given, or every held lock with the detail of the first
/// `--detail` by queue length. A failure is said in the view, and the next refresh tries
/// again (on a new connection if this one failed), unless lockd refused the login or the
/// rights ([`Failure::is_denied`]).
async fn take(
    server: &Server,
    client: &mut Option<Client>,
    args: &TopArgs,
) -> Result<Vec<ViewLine>, Failure> {
    let limit = args.interval.max(ONE_SHOT_CONNECT);
    let mut c = match client.take() {
        Some(c) => c,
        // After a failure: from the next address, in case the current one is the trouble.
        None => server.reconnect_once(limit).await.map_err(|f| {
            // Several addresses: the message names each already.
            if f.is_denied() || server.addrs().len() > 1 {
                return f;
            }
            let why = f.message.unwrap_or_default();
            Failure::new(
                UNREACHABLE,
                format!("cannot reach lockd at {}: {why}", server.addr()),
            )
        })?,
    };
    match timeout(limit, snapshot(server, &mut c, args)).await {
        Ok(Ok(entries)) => {
            *client = Some(c);
            Ok(entries)
        }
        Ok(Err(f)) => {
            // A front-end that can't serve now (etcd out of its reach, shutting down) is
            // left for the next address at the next refresh, as a lost connection is.
            let move_on = match f.refusal {
                Some(ErrorCode::Shutdown) => true,
                Some(ErrorCode::Unavailable) => server.addrs().len() > 1,
                _ => false,
            };
            if f.code != UNREACHABLE && !move_on {
                *client = Some(c);
            }
            Err(f)
        }
        Err(_) => Err(Failure::new(
            UNREACHABLE,
            format!(
                "lockd at {} did not answer within {}",
                server.addr(),
                humantime::format_duration(limit)
            ),
        )),
    }
}

async fn snapshot(
    server: &Server,
    client: &mut Client,
    args: &TopArgs,
) -> Result<Vec<ViewLine>, Failure> {
    let mut entries = Vec::new();
    // `<prefix>*` lists the held locks under it; a plain name is shown held or free.
    let prefixes: Vec<&str> = args
        .names
        .iter()
        .filter_map(|n| lockd::proto::prefix_of(n))
        .collect();
    let names = args
        .names
        .iter()
        .filter(|n| lockd::proto::prefix_of(n).is_none());
    if args.names.is_empty() || !prefixes.is_empty() {
        let mut held = Vec::new();
        if prefixes.is_empty() {
            held = list(client, server).await?;
        }
        for prefix in &prefixes {
            let (under, _) = client
                .held_under_aged(prefix)
                .await
                .map_err(|e| Failure::request("top", server.addr(), e))?;
            held.extend(under);
        }
        held.sort_by(|a, b| a.name.cmp(&b.name));
        held.dedup_by(|a, b| a.name == b.name);
        let mut rows: Vec<StatusLine> = held.into_iter().map(StatusLine::Held).collect();
        rows.sort_by_cached_key(order);
        for (i, row) in rows.into_iter().enumerate() {
            if i >= args.detail {
                entries.push(ViewLine {
                    row,
                    age: None,
                    user: None,
                });
                continue;
            }
            // Newer than the list: it may have changed, or been freed, since.
            let lock = detail(client, server, row.name()).await?;
            if lock.status.held().is_some() {
                entries.push(ViewLine::of(lock));
            }
        }
    }
    for name in names {
        entries.push(ViewLine::of(detail(client, server, name).await?));
    }
    entries.sort_by_cached_key(|e| order(&e.row));
    Ok(entries)
}

impl ViewLine {
    /// A lock's line with its age and first holder's user, from its detail.
    fn of(lock: lockd::client::LockDetail) -> ViewLine {
        ViewLine {
            age: lock.age(),
            user: first_user(&lock),
            row: lock.status,
        }
    }
}

/// The user of the holder a STATUS line describes (the first one).
fn first_user(lock: &lockd::client::LockDetail) -> Option<String> {
    lock.holders.first().and_then(|h| h.user.clone())
}

/// Longest queue first, then by name.
fn order(row: &StatusLine) -> (Reverse<usize>, String) {
    let waiters = row.held().map_or(0, |h| h.waiters);
    (Reverse(waiters), row.name().to_owned())
}

/// `lockd at <addr>, <time>: 3 held, 5 waiting (every 1s; Ctrl-C quits)`.
fn header(server: &Server, args: &TopArgs, entries: Option<&[ViewLine]>) -> String {
    let now = humantime::format_rfc3339_seconds(SystemTime::now());
    let counts = match entries {
        Some(entries) => {
            let held = entries.iter().filter(|e| e.row.held().is_some()).count();
            let waiting: usize = entries
                .iter()
                .filter_map(|e| e.row.held())
                .map(|h| h.waiters)
                .sum();
            format!(": {held} held, {waiting} waiting")
        }
        None => String::new(),
    };
    format!(
        "lockd at {}, {now}{counts} (every {}; Ctrl-C quits)\n",
        server.addr(),
        humantime::format_duration(args.interval)
    )
}

/// The table; cut to `height` lines (the terminal's), with a last line that says so.
fn view(entries: &[ViewLine], height: Option<usize>) -> String {
    if entries.is_empty() {
        return "no locks held".into();
    }
    let mut cells = vec![vec![
        "NAME".to_owned(),
        "MODE".into(),
        "HOLDER".into(),
        "AGE".into(),
        "TTL LEFT".into(),
        "QUEUE".into(),
    ]];
    // The header line, the table's header and the line that says what was cut.
    let room = height.map_or(usize::MAX, |h| h.saturating_sub(3).max(1));
    for e in entries.iter().take(room) {
        cells.push(match e.row.held() {
            None => vec![e.row.name().to_owned(), "free".into()],
            Some(h) => vec![
                h.name.clone(),
                h.mode.to_string(),
                holder_and_others(h),
                e.age.map_or_else(|| "-".into(), short_duration),
                short_duration(h.left),
                h.waiters.to_string(),
            ],
        });
    }
    let shown = || entries.iter().take(room);
    // A USER column only where a holder has one (--auth-file), as NOTE only with notes.
    if shown().any(|e| e.user.is_some()) {
        let width = cells[0].len();
        let rows = cells
            .iter_mut()
            .zip(std::iter::once(None).chain(shown().map(Some)));
        // A free lock's short row stays short.
        for (row, e) in rows.filter(|(r, _)| r.len() == width) {
            row.push(match e {
                None => "USER".into(),
                Some(e) => e.user.clone().unwrap_or_else(|| "-".into()),
            });
        }
    }
    with_notes(
        &mut cells,
        shown().map(|e| e.row.held().and_then(|h| h.note.as_deref())),
    );
    let mut text = columns(&cells);
    if entries.len() > room {
        text.push_str(&format!("\n... and {} more", entries.len() - room));
    }
    text
}

/// The terminal's height in lines, if stdout is one that says.
fn terminal_rows() -> Option<usize> {
    // SAFETY: TIOCGWINSZ writes one winsize into the struct it is given, which outlives the call.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (r == 0 && size.ws_row > 0).then_some(usize::from(size.ws_row))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(line: &str, age_ms: Option<u64>) -> ViewLine {
        ViewLine {
            row: StatusLine::parse(line).unwrap(),
            age: age_ms.map(Duration::from_millis),
            user: None,
        }
    }

    #[test]
    fn longest_queue_first_then_name() {
        let mut rows: Vec<StatusLine> = [
            "b held id=x token=1 ttl_ms=1 session=0 waiters=1",
            "c held id=x token=2 ttl_ms=1 session=0 waiters=5",
            "a held id=x token=3 ttl_ms=1 session=0 waiters=1",
        ]
        .iter()
        .map(|l| StatusLine::parse(l).unwrap())
        .collect();
        rows.sort_by_cached_key(order);
        let names: Vec<&str> = rows.iter().map(StatusLine::name).collect();
        assert_eq!(names, ["c", "a", "b"]);
    }

    #[test]
    fn the_view_fits_the_terminal() {
        let entries: Vec<ViewLine> = (0..10)
            .map(|i| {
                entry(
                    &format!("l{i} held id=h token={i} ttl_ms=1500 session=0 waiters=0"),
                    (i == 0).then_some(61_000),
                )
            })
            .collect();
        let all = view(&entries, None);
        assert_eq!(all.lines().count(), 11, "{all}");
        assert!(all.lines().nth(1).unwrap().contains("1m1s"), "{all}");
        assert!(all.lines().nth(2).unwrap().contains(" - "), "{all}");
        let cut = view(&entries, Some(6));
        assert_eq!(cut.lines().count(), 5, "{cut}");
        assert!(cut.ends_with("... and 7 more"), "{cut}");
    }

    #[test]
    fn users_and_notes_get_columns_where_there_are_some() {
        let plain = view(
            &[entry(
                "a held id=h token=1 ttl_ms=1500 session=0 waiters=0",
                Some(1000),
            )],
            None,
        );
        assert!(plain.lines().next().unwrap().ends_with("QUEUE"), "{plain}");
        let mut noted = entry(
            "a held id=h token=1 ttl_ms=1500 session=0 waiters=0 note=release%201.4.2",
            Some(1000),
        );
        noted.user = Some("alice".into());
        let text = view(&[noted], None);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("QUEUE  USER   NOTE"), "{text}");
        assert!(lines[1].ends_with("0      alice  release 1.4.2"), "{text}");
    }
}
