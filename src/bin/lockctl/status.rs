//! `lockctl status`: STATUS as tables for people or JSON for scripts. With a name it asks for
//! the detail, "why am I waiting?": every holder and the queue in the order it will be granted.

use lockd::client::Client;

use crate::cli::StatusArgs;
use crate::fail::Failure;
use crate::net::Server;
use crate::out::{columns, json_string, print_line, short_duration, yes_no};
use crate::snapshot::{mode_words, Held, Lock, Row};

pub async fn status(server: &Server, args: &StatusArgs) -> Result<u8, Failure> {
    let mut client = server.connect().await?;
    let text = match &args.name {
        Some(name) => {
            let lock = detail(&mut client, server, name).await?;
            if args.json {
                json_lock(&lock)
            } else {
                readable_lock(&lock)
            }
        }
        None => {
            let rows = list(&mut client, server).await?;
            match (args.json, rows.is_empty()) {
                (true, _) => json_array(&rows),
                (false, true) => "no locks held".to_owned(),
                (false, false) => table(&rows),
            }
        }
    };
    print_line(&text)?;
    Ok(0)
}

/// `STATUS`: every held lock, sorted by name.
pub async fn list(client: &mut Client, server: &Server) -> Result<Vec<Row>, Failure> {
    let lines = client
        .status(None)
        .await
        .map_err(|e| Failure::request("status", server.addr(), e))?;
    lines
        .iter()
        .map(|l| Row::parse(l).ok_or_else(|| unexpected(server, l)))
        .collect()
}

/// `STATUS <name> detail`: the lock with its holders and queue.
pub async fn detail(client: &mut Client, server: &Server, name: &str) -> Result<Lock, Failure> {
    let detail = client
        .status_detail(name)
        .await
        .map_err(|e| Failure::request("status", server.addr(), e))?;
    Lock::parse(&detail).map_err(|line| unexpected(server, &line))
}

fn unexpected(server: &Server, line: &str) -> Failure {
    Failure::usage(format!(
        "status: unexpected reply from lockd at {}: {line:?}",
        server.addr()
    ))
}

/// Every held lock, one line each.
fn table(rows: &[Row]) -> String {
    let mut cells = vec![vec![
        "NAME".to_owned(),
        "MODE".into(),
        "HOLDER".into(),
        "TOKEN".into(),
        "TTL LEFT".into(),
        "SESSION".into(),
        "WAITERS".into(),
    ]];
    for r in rows {
        cells.push(match &r.held {
            None => vec![r.name.clone(), "free".into()],
            Some(h) => vec![
                r.name.clone(),
                h.mode.clone(),
                holder_and_others(h),
                h.token.to_string(),
                short_duration(h.ttl),
                yes_no(h.session),
                h.waiters.to_string(),
            ],
        });
    }
    columns(&cells)
}

/// The first holder, and how many more there are: `h:1`, `h:1 +2`.
pub fn holder_and_others(h: &Held) -> String {
    match h.holders {
        0 | 1 => h.id.clone(),
        k => format!("{} +{}", h.id, k - 1),
    }
}

/// A summary line, the holders and the queue.
fn readable_lock(lock: &Lock) -> String {
    let name = &lock.row.name;
    let Some(held) = &lock.row.held else {
        return format!("{name}: free");
    };
    let holders = match held.holders {
        1 => "1 holder".to_owned(),
        k => format!("{k} holders"),
    };
    let mut out = format!(
        "{name}: held {}, {holders}, {} waiting\n\n",
        mode_words(&held.mode),
        held.waiters
    );
    let mut cells = vec![vec![
        "HOLDER".to_owned(),
        "TOKEN".into(),
        "HELD FOR".into(),
        "TTL LEFT".into(),
        "SESSION".into(),
        "MODE".into(),
    ]];
    for h in &lock.holders {
        cells.push(vec![
            h.id.clone(),
            h.token.to_string(),
            short_duration(h.held),
            short_duration(h.ttl),
            yes_no(h.session),
            h.mode.clone(),
        ]);
    }
    out.push_str(&columns(&cells));
    out.push_str("\n\n");
    if lock.queue.is_empty() {
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
    for w in &lock.queue {
        cells.push(vec![
            w.position.to_string(),
            w.id.clone(),
            short_duration(w.waited),
            yes_no(w.session),
            w.mode.clone(),
        ]);
    }
    out.push_str(&columns(&cells));
    let unlisted = held.waiters.saturating_sub(lock.queue.len() as u64);
    if unlisted > 0 {
        out.push_str(&format!("\n... and {unlisted} more waiting"));
    }
    out
}

fn json_array(rows: &[Row]) -> String {
    let items: Vec<String> = rows.iter().map(|r| json_row(r, "")).collect();
    format!("[{}]", items.join(","))
}

/// One lock as STATUS describes it; `more` is added inside the object, after its fields.
fn json_row(r: &Row, more: &str) -> String {
    let name = json_string(&r.name);
    match &r.held {
        None => format!(r#"{{"name":{name},"held":false{more}}}"#),
        Some(h) => {
            let limit = match h.mode.strip_prefix("limit:") {
                Some(n) => format!(r#","limit":{}"#, n.parse::<u64>().unwrap_or(0)),
                None => String::new(),
            };
            format!(
                r#"{{"name":{name},"held":true,"id":{},"token":{},"ttl_ms":{},"session":{},"waiters":{},"holder_count":{},"mode":{}{limit}{more}}}"#,
                json_string(&h.id),
                h.token,
                h.ttl.as_millis(),
                h.session,
                h.waiters,
                h.holders,
                json_string(&h.mode),
            )
        }
    }
}

/// The lock as [`json_row`] has it, with `holders` and `queue` arrays.
fn json_lock(lock: &Lock) -> String {
    let holders: Vec<String> = lock
        .holders
        .iter()
        .map(|h| {
            format!(
                r#"{{"id":{},"token":{},"held_ms":{},"ttl_ms":{},"session":{},"mode":{}}}"#,
                json_string(&h.id),
                h.token,
                h.held.as_millis(),
                h.ttl.as_millis(),
                h.session,
                json_string(&h.mode)
            )
        })
        .collect();
    let queue: Vec<String> = lock
        .queue
        .iter()
        .map(|w| {
            format!(
                r#"{{"position":{},"id":{},"waited_ms":{},"session":{},"mode":{}}}"#,
                w.position,
                json_string(&w.id),
                w.waited.as_millis(),
                w.session,
                json_string(&w.mode)
            )
        })
        .collect();
    let more = format!(
        r#","holders":[{}],"queue":[{}]"#,
        holders.join(","),
        queue.join(",")
    );
    json_row(&lock.row, &more)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::snapshot::{Holder, Waiter};

    fn held_lock() -> Lock {
        Lock {
            row: Row::parse("d held id=h:1 token=7 ttl_ms=800 session=1 waiters=3").unwrap(),
            holders: vec![Holder {
                id: "h:1".into(),
                token: 7,
                held: Duration::from_millis(12_300),
                ttl: Duration::from_millis(800),
                session: true,
                mode: "exclusive".into(),
            }],
            queue: vec![Waiter {
                position: 1,
                id: "w\"1".into(),
                waited: Duration::from_millis(300),
                session: false,
                mode: "exclusive".into(),
            }],
        }
    }

    #[test]
    fn json_of_a_free_lock_has_empty_arrays() {
        let lock = Lock {
            row: Row::parse("x free").unwrap(),
            holders: vec![],
            queue: vec![],
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
            r#"{"name":"d","held":true,"id":"h:1","token":7,"ttl_ms":800,"session":true,"waiters":3,"holder_count":1,"mode":"exclusive","holders":[{"id":"h:1","token":7,"held_ms":12300,"ttl_ms":800,"session":true,"mode":"exclusive"}],"queue":[{"position":1,"id":"w\"1","waited_ms":300,"session":false,"mode":"exclusive"}]}"#
        );
    }

    #[test]
    fn readable_lock_says_who_holds_and_who_waits() {
        let text = readable_lock(&held_lock());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "d: held exclusive, 1 holder, 3 waiting");
        assert!(lines[2].starts_with("HOLDER  TOKEN  HELD FOR"), "{text}");
        assert!(lines[3].starts_with("h:1     7      12.3s"), "{text}");
        assert!(lines[5].starts_with("#  WAITER  WAITED FOR"), "{text}");
        assert!(lines[6].starts_with("1  w\"1     300ms"), "{text}");
        assert_eq!(lines[7], "... and 2 more waiting");
    }

    #[test]
    fn semaphores_say_their_limit() {
        let r =
            Row::parse("s held id=a token=3 ttl_ms=9 session=0 waiters=0 holders=2 mode=limit:3")
                .unwrap();
        assert!(json_row(&r, "").ends_with(r#""holder_count":2,"mode":"limit:3","limit":3}"#));
        assert_eq!(mode_words("limit:3"), "as a semaphore of 3");
        assert!(table(&[r]).contains("a +1"));
    }
}
