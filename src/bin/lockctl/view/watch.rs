//! `lockctl watch`: one line per event until interrupted, readable or (`--json`) JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd::client::{retryable, ClientError, Retry};
use lockd::proto::{BadReply, ErrorCode, EventLine};
use tokio::time::sleep;

use crate::cli::WatchArgs;
use crate::fail::{Failure, UNREACHABLE};
use crate::net::Server;
use crate::out::{json_string, print_line};
use crate::signals::Signals;

/// Watches until interrupted. A front-end that can't go on (`ERR UNAVAILABLE`, `ERR
/// SHUTDOWN`, a lost connection) is left for the next address, with backoff, as long as it
/// takes; the events in between are missed (-v says so). Nothing reachable for
/// --connect-timeout is exit 3, as at the start.
pub async fn watch(server: &Server, args: &WatchArgs) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let mut retry = Retry::within(None);
    let mut client = Some(server.connect().await?);
    let show = |event: Result<&EventLine, &str>| match (args.json, event) {
        (true, Ok(e)) => json_event(e),
        (true, Err(line)) => json_other(line),
        (false, Ok(e)) => readable_event(e),
        (false, Err(line)) => line.to_owned(),
    };
    loop {
        let mut c = match client.take() {
            Some(c) => c,
            None => tokio::select! {
                c = server.reconnect_for(&retry) => c?,
                _ = signals.recv() => return Ok(0),
            },
        };
        let started = tokio::select! {
            r = c.watch(args.name.as_deref()) => r,
            _ = signals.recv() => return Ok(0),
        };
        let (ended, watching) = match started {
            Ok(()) => {
                if retry.failures() > 0 && server.verbose {
                    eprintln!(
                        "lockctl: watching again through lockd at {} (events meanwhile were \
                         missed)",
                        server.addr()
                    );
                }
                retry.succeeded();
                loop {
                    let event = tokio::select! {
                        e = c.next_event() => e,
                        _ = signals.recv() => return Ok(0),
                    };
                    match event {
                        Ok(Ok(e)) => print_line(&show(Ok(&e)))?,
                        // A line that is no event is shown as it came.
                        Ok(Err(BadReply(line))) => print_line(&show(Err(&line)))?,
                        Err(e) => break (e, true),
                    }
                }
            }
            Err(e) => (e, false),
        };
        match ended {
            e if retryable(&e) => {
                let Some(pause) = server.retry_after(&mut retry, "watch", &e) else {
                    return Err(Failure::request("watch", server.addr(), e));
                };
                drop(c);
                tokio::select! {
                    _ = sleep(pause) => {}
                    _ = signals.recv() => return Ok(0),
                }
            }
            // The user was removed from the auth file, or lost the read right.
            ClientError::Refused(e) if watching && e.code == ErrorCode::Denied => {
                return Err(Failure::refused(
                    e.code,
                    format!("watch: lockd ended the watch: {} {}", e.code, e.message),
                ))
            }
            ClientError::Refused(e) if watching => {
                return Err(Failure::new(
                    UNREACHABLE,
                    format!("watch: lockd ended the watch: {} {}", e.code, e.message),
                ))
            }
            e => return Err(Failure::request("watch", server.addr(), e)),
        }
    }
}

/// When it happened, in RFC 3339 with milliseconds.
fn time(e: &EventLine) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(e.unix_ms);
    humantime::format_rfc3339_millis(at.max(SystemTime::UNIX_EPOCH)).to_string()
}

/// `2023-11-14T22:13:20.000Z acquired deploy id=h:1 token=7` (a `broken` event ends with
/// `by=<who>`), and for a holder that gave a note ` note: <its text>` (last: it may have
/// spaces).
fn readable_event(e: &EventLine) -> String {
    let mut line = format!(
        "{} {} {} id={} token={}",
        time(e),
        e.kind.as_str(),
        e.name,
        e.id,
        e.token
    );
    if let Some(by) = &e.by {
        line.push_str(&format!(" by={by}"));
    }
    if let Some(note) = &e.note {
        line.push_str(&format!(" note: {note}"));
    }
    line
}

/// An event as one JSON object (a `broken` event with `"by"` too).
fn json_event(e: &EventLine) -> String {
    // Only an event with a note has the field.
    let note = e
        .note
        .as_ref()
        .map_or_else(String::new, |n| format!(r#","note":{}"#, json_string(n)));
    let object = format!(
        r#"{{"event":{},"name":{},"id":{},"token":{},"unix_ms":{},"time":{}{note}}}"#,
        json_string(e.kind.as_str()),
        json_string(&e.name),
        json_string(&e.id),
        e.token,
        e.unix_ms,
        json_string(&time(e))
    );
    match &e.by {
        Some(by) => format!(
            r#"{},"by":{}}}"#,
            &object[..object.len() - 1],
            json_string(by)
        ),
        None => object,
    }
}

/// A line that is not an event as `{"line":"..."}`, so that a script reading JSON never meets
/// anything else.
fn json_other(line: &str) -> String {
    format!(r#"{{"line":{}}}"#, json_string(line))
}

/// `EVENT acquired deploy h:1 7 1700000000000` as [`readable_event`] says it; other lines as
/// they came.
#[cfg(test)]
fn readable(line: &str) -> String {
    match EventLine::parse(line) {
        Ok(e) => readable_event(&e),
        Err(_) => line.to_owned(),
    }
}

/// A line as `--json` shows it.
#[cfg(test)]
fn json(line: &str) -> String {
    match EventLine::parse(line) {
        Ok(e) => json_event(&e),
        Err(_) => json_other(line),
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
        assert_eq!(
            super::readable("EVENT acquired deploy h:1 7 1700000000000 note=release%201.4.2"),
            "2023-11-14T22:13:20.000Z acquired deploy id=h:1 token=7 note: release 1.4.2"
        );
        assert!(super::json("EVENT acquired d h 7 1700000000000 note=a%20b")
            .ends_with(r#""time":"2023-11-14T22:13:20.000Z","note":"a b"}"#));
    }

    #[test]
    fn events_as_json() {
        assert_eq!(
            super::json(r#"EVENT released de"p h\1 7 1700000000000"#),
            r#"{"event":"released","name":"de\"p","id":"h\\1","token":7,"unix_ms":1700000000000,"time":"2023-11-14T22:13:20.000Z"}"#
        );
        assert_eq!(super::json("EVENT odd"), r#"{"line":"EVENT odd"}"#);
    }

    #[test]
    fn a_broken_event_says_who_broke_it() {
        let line = "EVENT broken deploy h:1 7 1700000000000 by=ops";
        assert_eq!(
            super::readable(line),
            "2023-11-14T22:13:20.000Z broken deploy id=h:1 token=7 by=ops"
        );
        assert_eq!(
            super::json(line),
            r#"{"event":"broken","name":"deploy","id":"h:1","token":7,"unix_ms":1700000000000,"time":"2023-11-14T22:13:20.000Z","by":"ops"}"#
        );
    }
}
