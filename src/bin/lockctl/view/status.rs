//! `lockctl status`: STATUS as tables for people or JSON for scripts. With a name it asks for
//! the detail, "why am I waiting?": every holder and the queue in the order it will be granted.

use std::time::{Duration, UNIX_EPOCH};

use lockd::client::{Client, LockDetail};
use lockd::locks::Mode;
use lockd::proto::{HeldLine, HolderLine, StatusLine};

use crate::cli::StatusArgs;
use crate::fail::{Failure, UNAVAILABLE};
use crate::net::Server;
use crate::out::{columns, json_string, mode_words, print_line, short_duration, yes_no};

pub async fn status(server: &Server, args: &StatusArgs) -> Result<u8, Failure> {
    let mut client = server.connect().await?;
    let prefix = args.name.as_deref().and_then(lockd::proto::prefix_of);
    let (text, aged) = match &args.name {
        Some(name) if prefix.is_none() => {
            let lock = detail(&mut client, server, name).await?;
            let text = match args.json {
                true => json_lock(&lock),
                false => readable_lock(&lock),
            };
            (text, lock.aged)
        }
        _ => {
            let listed = match prefix {
                Some(prefix) => client.held_under_aged(prefix).await,
                None => client.held_locks_aged().await,
            };
            let (rows, aged) = listed.map_err(|e| Failure::request("status", server.addr(), e))?;
            let text = match (args.json, rows.is_empty()) {
                (true, _) => json_array(&rows),
                (false, true) => "no locks held".to_owned(),
                (false, false) => table(&rows),
            };
            (text, aged)
        }
    };
    print_line(&text)?;
    Ok(stale_view(aged))
}

/// After the table: a cluster front-end that has not heard from an etcd quorum within its
/// readiness bound may show holders that are gone (or miss new ones). The table is still
/// printed, as it is the best view there is, with a warning on stderr and exit code 5.
fn stale_view(aged: Option<lockd::proto::EtcdAge>) -> u8 {
    match aged {
        Some(aged) if aged.stale() => {
            eprintln!(
                "lockctl: warning: this front-end last heard from etcd {:.1}s ago; the holders shown may be stale",
                aged.age.as_secs_f64()
            );
            UNAVAILABLE
        }
        _ => 0,
    }
}

/// `STATUS`: every held lock, sorted by name.
pub async fn list(client: &mut Client, server: &Server) -> Result<Vec<HeldLine>, Failure> {
    client
        .held_locks()
        .await
        .map_err(|e| Failure::request("status", server.addr(), e))
}

/// `STATUS <name> detail`: the lock with its holders and queue.
pub async fn detail(
    client: &mut Client,
    server: &Server,
    name: &str,
) -> Result<LockDetail, Failure> {
    client
        .detail(name)
        .await
        .map_err(|e| Failure::request("status", server.addr(), e))
}

/// Every held lock, one line each.
fn table(rows: &[HeldLine]) -> String {
    let mut cells = vec![vec![
        "NAME".to_owned(),
        "MODE".into(),
        "HOLDER".into(),
        "TOKEN".into(),
        "TTL LEFT".into(),
        "SESSION".into(),
        "WAITERS".into(),
    ]];
    for h in rows {
        cells.push(vec![
            h.name.clone(),
            h.mode.to_string(),
            holder_and_others(h),
            h.token.to_string(),
            short_duration(h.left),
            yes_no(h.session),
            h.waiters.to_string(),
        ]);
    }
    with_notes(&mut cells, rows.iter().map(|h| h.note.as_deref()));
    columns(&cells)
}

/// Adds a NOTE column to a table (header first, one cell per row of `notes`), if any row has
/// a note: tables of locks without notes stay as they were.
pub fn with_notes<'a>(cells: &mut [Vec<String>], notes: impl Iterator<Item = Option<&'a str>>) {
    with_column(cells, "NOTE", notes.map(|n| n.map(str::to_owned)));
}

/// Adds an ALSO column (a set's other names, comma-separated) to a table of holders or
/// waiters, if any row is a set: tables without sets stay as they were.
fn with_sets<'a>(cells: &mut [Vec<String>], sets: impl Iterator<Item = &'a [String]>) {
    let sets = sets.map(|and| (!and.is_empty()).then(|| and.join(",")));
    with_column(cells, "ALSO", sets);
}

/// Adds a column to a table (header first, one cell per row of `values`), if any row has a
/// value; `-` where a row has none.
fn with_column(
    cells: &mut [Vec<String>],
    title: &str,
    values: impl Iterator<Item = Option<String>>,
) {
    let values: Vec<Option<String>> = values.collect();
    if values.iter().all(Option::is_none) {
        return;
    }
    let Some((header, rows)) = cells.split_first_mut() else {
        return;
    };
    let width = header.len();
    header.push(title.into());
    // A short row (a free lock in top) stays short.
    for (row, value) in rows
        .iter_mut()
        .zip(values)
        .filter(|(r, _)| r.len() == width)
    {
        row.push(value.unwrap_or_else(|| "-".into()));
    }
}

/// The first holder, and how many more there are: `h:1`, `h:1 +2`.
pub fn holder_and_others(h: &HeldLine) -> String {
    match h.holders {
        0 | 1 => h.id.clone(),
        k => format!("{} +{}", h.id, k - 1),
    }
}

/// A summary line, the holders and the queue.
fn readable_lock(lock: &LockDetail) -> String {
    let name = lock.status.name();
    let Some(held) = lock.status.held() else {
        return format!("{name}: free");
    };
    let holders = match held.holders {
        1 => "1 holder".to_owned(),
        k => format!("{k} holders"),
    };
    let mut out = format!(
        "{name}: held {}, {holders}, {} waiting\n\n",
        mode_words(held.mode),
        held.waiters
    );
    let mut cells = vec![vec![
        "HOLDER".to_owned(),
        "TOKEN".into(),
        "USER".into(),
        "PEER".into(),
        "GRANTED".into(),
        "HELD FOR".into(),
        "TTL LEFT".into(),
        "SESSION".into(),
        "MODE".into(),
    ]];
    for h in &lock.holders {
        cells.push(vec![
            h.id.clone(),
            h.token.to_string(),
            h.user.clone().unwrap_or_else(|| "-".into()),
            h.peer.clone().unwrap_or_else(|| "-".into()),
            granted_at(h).unwrap_or_else(|| "-".into()),
            short_duration(h.held),
            short_duration(h.left),
            yes_no(h.session),
            h.mode.to_string(),
        ]);
    }
    with_sets(&mut cells, lock.holders.iter().map(|h| &h.and[..]));
    // A lease that only keeps its place (broken, or in its lock-delay): why the next one
    // waits although its holder has lost it. The column shows only when one does.
    let state = lock.holders.iter().map(|h| {
        h.lingering
            .then(|| "letting go (broken or lock-delay)".to_owned())
    });
    with_column(&mut cells, "STATE", state);
    with_notes(&mut cells, lock.holders.iter().map(|h| h.note.as_deref()));
    out.push_str(&columns(&cells));
    out.push_str("\n\n");
    if lock.waiters.is_empty() {
        out.push_str("nobody waiting");
        return out;
    }
    let mut cells = vec![vec![
        "#".to_owned(),
        "WAITER".into(),
        "WAITED FOR".into(),
        "SESSION".into(),
        "MODE".into(),
    ]];
    for w in &lock.waiters {
        cells.push(vec![
            w.position.to_string(),
            w.id.clone(),
            short_duration(w.waited),
            yes_no(w.session),
            w.mode.to_string(),
        ]);
    }
    with_sets(&mut cells, lock.waiters.iter().map(|w| &w.and[..]));
    out.push_str(&columns(&cells));
    let unlisted = held.waiters.saturating_sub(lock.waiters.len());
    if unlisted > 0 {
        out.push_str(&format!("\n... and {unlisted} more waiting"));
    }
    out
}

/// When the holder was granted, on the server's wall clock, as RFC 3339 UTC to the second
/// (`2026-12-01T03:12:00Z`); `None` where the server did not say.
fn granted_at(h: &HolderLine) -> Option<String> {
    let at = UNIX_EPOCH.checked_add(Duration::from_millis(h.granted_unix_ms?))?;
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

/// `,"and":[...]`, a set's other names, for a holder or waiter that is a set; nothing for
/// one of one name (objects without sets are as they were).
fn json_and(and: &[String]) -> String {
    if and.is_empty() {
        return String::new();
    }
    let names: Vec<String> = and.iter().map(|n| json_string(n)).collect();
    format!(r#","and":[{}]"#, names.join(","))
}

/// A JSON string, or `null` for `None`.
fn json_opt(s: Option<&str>) -> String {
    s.map_or_else(|| "null".to_owned(), json_string)
}

fn json_array(rows: &[HeldLine]) -> String {
    let items: Vec<String> = rows.iter().map(|h| json_held(h, "")).collect();
    format!("[{}]", items.join(","))
}

/// One lock as STATUS describes it; `more` is added inside the object, after its fields.
fn json_row(r: &StatusLine, more: &str) -> String {
    match r {
        StatusLine::Free(name) => {
            let name = json_string(name);
            format!(r#"{{"name":{name},"held":false{more}}}"#)
        }
        StatusLine::Held(h) => json_held(h, more),
    }
}

/// A held lock's object: its fields, `limit` for a semaphore, then `more`.
fn json_held(h: &HeldLine, more: &str) -> String {
    let limit = match h.mode {
        Mode::Limit(n) => format!(r#","limit":{n}"#),
        _ => String::new(),
    };
    // Only a lock with a note has the field: objects of locks without one are as they were.
    let note = match &h.note {
        Some(note) => format!(r#","note":{}"#, json_string(note)),
        None => String::new(),
    };
    format!(
        r#"{{"name":{},"held":true,"id":{},"token":{},"ttl_ms":{},"session":{},"waiters":{},"holder_count":{},"mode":{}{limit}{note}{more}}}"#,
        json_string(&h.name),
        json_string(&h.id),
        h.token,
        h.left.as_millis(),
        h.session,
        h.waiters,
        h.holders,
        json_string(&h.mode.to_string()),
    )
}

/// The lock as [`json_row`] has it, with `holders` and `queue` arrays.
fn json_lock(lock: &LockDetail) -> String {
    let holders: Vec<String> = lock
        .holders
        .iter()
        .map(|h| {
            let note = match &h.note {
                Some(note) => format!(r#","note":{}"#, json_string(note)),
                None => String::new(),
            };
            let and = json_and(&h.and);
            format!(
                r#"{{"id":{},"token":{},"held_ms":{},"ttl_ms":{},"session":{},"mode":{},"user":{},"granted_at":{},"granted_unix_ms":{},"peer":{}{and}{note}}}"#,
                json_string(&h.id),
                h.token,
                h.held.as_millis(),
                h.left.as_millis(),
                h.session,
                json_string(&h.mode.to_string()),
                json_opt(h.user.as_deref()),
                json_opt(granted_at(h).as_deref()),
                h.granted_unix_ms
                    .map_or_else(|| "null".to_owned(), |ms| ms.to_string()),
                json_opt(h.peer.as_deref()),
            )
        })
        .collect();
    let queue: Vec<String> = lock
        .waiters
        .iter()
        .map(|w| {
            format!(
                r#"{{"position":{},"id":{},"waited_ms":{},"session":{},"mode":{}{}}}"#,
                w.position,
                json_string(&w.id),
                w.waited.as_millis(),
                w.session,
                json_string(&w.mode.to_string()),
                json_and(&w.and)
            )
        })
        .collect();
    let more = format!(
        r#","holders":[{}],"queue":[{}]"#,
        holders.join(","),
        queue.join(",")
    );
    json_row(&lock.status, &more)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use lockd::proto::WaiterLine;

    fn held_lock() -> LockDetail {
        LockDetail {
            aged: None,
            status: StatusLine::parse("d held id=h:1 token=7 ttl_ms=800 session=1 waiters=3")
                .unwrap(),
            holders: vec![HolderLine {
                name: "d".into(),
                id: "h:1".into(),
                token: 7,
                held: Duration::from_millis(12_300),
                left: Duration::from_millis(800),
                session: true,
                mode: Mode::Exclusive,
                user: Some("alice".into()),
                granted_unix_ms: Some(1_796_095_920_000),
                peer: Some("10.0.0.7:41234".into()),
                and: Vec::new(),
                note: None,
                lingering: false,
            }],
            waiters: vec![WaiterLine {
                name: "d".into(),
                position: 1,
                id: "w\"1".into(),
                waited: Duration::from_millis(300),
                session: false,
                mode: Mode::Exclusive,
                and: Vec::new(),
            }],
        }
    }

    #[test]
    fn json_of_a_free_lock_has_empty_arrays() {
        let lock = LockDetail {
            aged: None,
            status: StatusLine::parse("x free").unwrap(),
            holders: vec![],
            waiters: vec![],
        };
        assert_eq!(
            json_lock(&lock),
            r#"{"name":"x","held":false,"holders":[],"queue":[]}"#
        );
        assert_eq!(readable_lock(&lock), "x: free");
    }

    #[test]
    fn json_of_a_held_lock() {
        assert_eq!(
            json_lock(&held_lock()),
            r#"{"name":"d","held":true,"id":"h:1","token":7,"ttl_ms":800,"session":true,"waiters":3,"holder_count":1,"mode":"exclusive","holders":[{"id":"h:1","token":7,"held_ms":12300,"ttl_ms":800,"session":true,"mode":"exclusive","user":"alice","granted_at":"2026-12-01T03:32:00Z","granted_unix_ms":1796095920000,"peer":"10.0.0.7:41234"}],"queue":[{"position":1,"id":"w\"1","waited_ms":300,"session":false,"mode":"exclusive"}]}"#
        );
    }

    #[test]
    fn an_older_servers_holder_says_nothing_of_who_or_when() {
        let mut lock = held_lock();
        let h = HolderLine::parse("HOLDER d id=h:1 token=7 held_ms=5 ttl_ms=8 session=0").unwrap();
        lock.holders = vec![h];
        assert!(json_lock(&lock).contains(
            r#""mode":"exclusive","user":null,"granted_at":null,"granted_unix_ms":null,"peer":null}"#
        ));
        let text = readable_lock(&lock);
        let row: Vec<&str> = text.lines().nth(3).unwrap().split_whitespace().collect();
        assert_eq!(row[..5], ["h:1", "7", "-", "-", "-"], "{text}");
    }

    #[test]
    fn readable_lock_says_who_holds_and_who_waits() {
        let text = readable_lock(&held_lock());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "d: held exclusive, 1 holder, 3 waiting");
        assert!(
            lines[2].starts_with(
                "HOLDER  TOKEN  USER   PEER            GRANTED               HELD FOR"
            ),
            "{text}"
        );
        assert!(
            lines[3]
                .starts_with("h:1     7      alice  10.0.0.7:41234  2026-12-01T03:32:00Z  12.3s"),
            "{text}"
        );
        assert!(lines[5].starts_with("#  WAITER  WAITED FOR"), "{text}");
        assert!(lines[6].starts_with("1  w\"1     300ms"), "{text}");
        assert_eq!(lines[7], "... and 2 more waiting");
    }

    #[test]
    fn notes_show_where_there_are_some() {
        let mut lock = held_lock();
        lock.holders[0].note = Some("release 1.4.2".into());
        if let StatusLine::Held(h) = &mut lock.status {
            h.note = Some("release 1.4.2".into());
        }
        let json = json_lock(&lock);
        assert!(
            json.contains(r#""mode":"exclusive","note":"release 1.4.2","holders":"#),
            "{json}"
        );
        assert!(
            json.contains(r#""peer":"10.0.0.7:41234","note":"release 1.4.2"}"#),
            "{json}"
        );
        let text = readable_lock(&lock);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].ends_with("MODE       NOTE"), "{text}");
        assert!(lines[3].ends_with("exclusive  release 1.4.2"), "{text}");
        let StatusLine::Held(h) = lock.status else {
            panic!()
        };
        assert!(table(&[h])
            .lines()
            .nth(1)
            .unwrap()
            .ends_with("release 1.4.2"));
    }

    #[test]
    fn a_sets_other_names_show_where_there_are_some() {
        let mut lock = held_lock();
        lock.holders[0].and = vec!["db-migrate".into(), "cache".into()];
        lock.waiters[0].and = vec!["db-migrate".into()];
        let json = json_lock(&lock);
        assert!(
            json.contains(r#""peer":"10.0.0.7:41234","and":["db-migrate","cache"]}"#),
            "{json}"
        );
        assert!(
            json.contains(r#""mode":"exclusive","and":["db-migrate"]}"#),
            "{json}"
        );
        let text = readable_lock(&lock);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].ends_with("MODE       ALSO"), "{text}");
        assert!(lines[3].ends_with("exclusive  db-migrate,cache"), "{text}");
        assert!(lines[5].ends_with("MODE       ALSO"), "{text}");
        assert!(lines[6].ends_with("exclusive  db-migrate"), "{text}");
        // Without sets, the tables are as they were.
        assert!(!readable_lock(&held_lock()).contains("ALSO"));
    }

    #[test]
    fn semaphores_say_their_limit() {
        let r = StatusLine::parse(
            "s held id=a token=3 ttl_ms=9 session=0 waiters=0 holders=2 mode=limit:3",
        )
        .unwrap();
        assert!(json_row(&r, "").ends_with(r#""holder_count":2,"mode":"limit:3","limit":3}"#));
        assert_eq!(mode_words(Mode::Limit(3)), "as a semaphore of 3");
        let StatusLine::Held(r) = r else { panic!() };
        assert!(table(&[r]).contains("a +1"));
    }
}
