//! `lockctl watch`: one line per event until interrupted, readable or (`--json`) JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd::proto::{parse_reply, ReplyLine};

use crate::child::Signals;
use crate::cli::WatchArgs;
use crate::fail::{Failure, UNREACHABLE};
use crate::net::Server;
use crate::out::{json_string, print_line};

pub async fn watch(server: &Server, args: &WatchArgs) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let mut client = server.connect().await?;
    client
        .watch(args.name.as_deref())
        .await
        .map_err(|e| Failure::request("watch", server.addr(), e))?;
    loop {
        let line = tokio::select! {
            l = client.read_line() => l,
            _ = signals.recv() => return Ok(0),
        };
        let line = line.map_err(|e| Failure::request("watch", server.addr(), e))?;
        match parse_reply(&line) {
            ReplyLine::Other(event) if args.json => print_line(&json(event))?,
            ReplyLine::Other(event) => print_line(&readable(event))?,
            // The user was removed from the auth file, or lost the read right.
            ReplyLine::Err(e) if e.code == lockd::proto::ErrorCode::Denied => {
                return Err(Failure::refused(
                    e.code,
                    format!("watch: lockd ended the watch: {} {}", e.code, e.message),
                ))
            }
            ReplyLine::Err(e) => {
                return Err(Failure::new(
                    UNREACHABLE,
                    format!("watch: lockd ended the watch: {} {}", e.code, e.message),
                ))
            }
            ReplyLine::Ok(_) => {}
        }
    }
}

/// One event: `EVENT <kind> <name> <id> <token> <unix-ms>`.
struct Event<'a> {
    kind: &'a str,
    name: &'a str,
    id: &'a str,
    token: u64,
    unix_ms: u64,
}

impl<'a> Event<'a> {
    fn parse(line: &'a str) -> Option<Event<'a>> {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["EVENT", kind, name, id, token, unix_ms] => Some(Event {
                kind,
                name,
                id,
                token: token.parse().ok()?,
                unix_ms: unix_ms.parse().ok()?,
            }),
            _ => None,
        }
    }

    fn time(&self) -> String {
        let at = UNIX_EPOCH + Duration::from_millis(self.unix_ms);
        humantime::format_rfc3339_millis(at.max(SystemTime::UNIX_EPOCH)).to_string()
    }
}

/// `EVENT acquired deploy h:1 7 1700000000000` as
/// `2023-11-14T22:13:20.000Z acquired deploy id=h:1 token=7`; other lines as they came.
fn readable(line: &str) -> String {
    match Event::parse(line) {
        Some(e) => format!(
            "{} {} {} id={} token={}",
            e.time(),
            e.kind,
            e.name,
            e.id,
            e.token
        ),
        None => line.to_owned(),
    }
}

/// An event as one JSON object; a line that is not an event as `{"line":"..."}`, so that a
/// script reading JSON never meets anything else.
fn json(line: &str) -> String {
    match Event::parse(line) {
        Some(e) => format!(
            r#"{{"event":{},"name":{},"id":{},"token":{},"unix_ms":{},"time":{}}}"#,
            json_string(e.kind),
            json_string(e.name),
            json_string(e.id),
            e.token,
            e.unix_ms,
            json_string(&e.time())
        ),
        None => format!(r#"{{"line":{}}}"#, json_string(line)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn events_read_well() {
        assert_eq!(
            super::readable("EVENT acquired deploy h:1 7 1700000000000"),
            "2023-11-14T22:13:20.000Z acquired deploy id=h:1 token=7"
        );
        assert_eq!(super::readable("EVENT odd"), "EVENT odd");
    }

    #[test]
    fn events_as_json() {
        assert_eq!(
            super::json(r#"EVENT released de"p h\1 7 1700000000000"#),
            r#"{"event":"released","name":"de\"p","id":"h\\1","token":7,"unix_ms":1700000000000,"time":"2023-11-14T22:13:20.000Z"}"#
        );
        assert_eq!(super::json("EVENT odd"), r#"{"line":"EVENT odd"}"#);
    }
}
