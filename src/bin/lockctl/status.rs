//! `lockctl status`: STATUS as a table for people or JSON for scripts.

use std::fmt::Write as _;
use std::time::Duration;

use lockd::proto::field;

use crate::cli::StatusArgs;
use crate::fail::Failure;
use crate::net::Server;
use crate::out::{json_string, print_line};

/// One lock as STATUS describes it.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    name: String,
    held: Option<Held>,
}

#[derive(Debug, PartialEq, Eq)]
struct Held {
    id: String,
    token: u64,
    ttl: Duration,
    session: bool,
    waiters: u64,
}

/// Parses `<name> free` or `<name> held id=.. token=.. ttl_ms=.. session=.. waiters=..`.
fn parse_row(line: &str) -> Option<Row> {
    let mut words = line.split(' ');
    let name = words.next()?.to_owned();
    match words.next()? {
        "free" => Some(Row { name, held: None }),
        "held" => Some(Row {
            name,
            held: Some(Held {
                id: field(line, "id")?.to_owned(),
                token: field(line, "token")?.parse().ok()?,
                ttl: Duration::from_millis(field(line, "ttl_ms")?.parse().ok()?),
                session: field(line, "session")? == "1",
                waiters: field(line, "waiters")?.parse().ok()?,
            }),
        }),
        _ => None,
    }
}

pub async fn status(server: &Server, args: &StatusArgs) -> Result<u8, Failure> {
    let mut client = server.connect().await?;
    let lines = client
        .status(args.name.as_deref())
        .await
        .map_err(|e| Failure::request("status", &server.addr, e))?;
    let rows = lines
        .iter()
        .map(|l| {
            parse_row(l).ok_or_else(|| {
                Failure::usage(format!("status: unexpected reply from lockd: {l:?}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let text = match (args.json, args.name.is_some()) {
        (true, true) => rows.first().map(json_row).unwrap_or_default(),
        (true, false) => json_array(&rows),
        (false, _) if rows.is_empty() => "no locks held".to_owned(),
        (false, _) => table(&rows),
    };
    print_line(&text)?;
    Ok(0)
}

fn table(rows: &[Row]) -> String {
    let mut cells = vec![[
        "NAME".to_owned(),
        "STATE".into(),
        "HOLDER".into(),
        "TOKEN".into(),
        "TTL".into(),
        "SESSION".into(),
        "WAITERS".into(),
    ]];
    for r in rows {
        cells.push(match &r.held {
            None => [
                r.name.clone(),
                "free".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ],
            Some(h) => [
                r.name.clone(),
                "held".into(),
                h.id.clone(),
                h.token.to_string(),
                short_duration(h.ttl),
                if h.session { "yes" } else { "no" }.into(),
                h.waiters.to_string(),
            ],
        });
    }
    let mut widths = [0; 7];
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for (i, row) in cells.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut line = String::new();
        for (j, (c, w)) in row.iter().zip(widths).enumerate() {
            if j + 1 == row.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
    }
    out
}

/// `850ms`, `29.1s`, `4m59s`, `2h0m`: short enough for a column.
fn short_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        60_000..=3_599_999 => format!("{}m{}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn json_array(rows: &[Row]) -> String {
    let items: Vec<String> = rows.iter().map(json_row).collect();
    format!("[{}]", items.join(","))
}

fn json_row(r: &Row) -> String {
    match &r.held {
        None => format!(r#"{{"name":{},"held":false}}"#, json_string(&r.name)),
        Some(h) => format!(
            r#"{{"name":{},"held":true,"id":{},"token":{},"ttl_ms":{},"session":{},"waiters":{}}}"#,
            json_string(&r.name),
            json_string(&h.id),
            h.token,
            h.ttl.as_millis(),
            h.session,
            h.waiters
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse() {
        let r = parse_row("a held id=h:1 token=7 ttl_ms=1500 session=1 waiters=2").unwrap();
        assert_eq!(r.name, "a");
        let h = r.held.unwrap();
        assert_eq!(
            (h.id.as_str(), h.token, h.session, h.waiters),
            ("h:1", 7, true, 2)
        );
        assert_eq!(parse_row("b free").unwrap().held, None);
        assert!(parse_row("b gone").is_none());
    }

    #[test]
    fn json_rows() {
        let r = Row {
            name: "x".into(),
            held: None,
        };
        assert_eq!(json_row(&r), r#"{"name":"x","held":false}"#);
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(short_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(short_duration(Duration::from_millis(29_140)), "29.1s");
        assert_eq!(short_duration(Duration::from_secs(299)), "4m59s");
        assert_eq!(short_duration(Duration::from_secs(7200)), "2h0m");
    }
}
