//! `lockctl watch`: one readable line per event until interrupted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd::proto::{parse_reply, ReplyLine};

use crate::child::Signals;
use crate::cli::WatchArgs;
use crate::fail::{Failure, UNREACHABLE};
use crate::net::Server;
use crate::out::print_line;

pub async fn watch(server: &Server, args: &WatchArgs) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let mut client = server.connect().await?;
    client
        .watch(args.name.as_deref())
        .await
        .map_err(|e| Failure::request("watch", &server.addr, e))?;
    loop {
        let line = tokio::select! {
            l = client.read_line() => l,
            _ = signals.recv() => return Ok(0),
        };
        let line = line.map_err(|e| Failure::request("watch", &server.addr, e))?;
        match parse_reply(&line) {
            ReplyLine::Other(event) => print_line(&readable(event))?,
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

/// `EVENT acquired deploy h:1 7 1700000000000` as
/// `2023-11-14T22:13:20.000Z acquired deploy id=h:1 token=7`; other lines as they came.
fn readable(line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    match words.as_slice() {
        ["EVENT", kind, name, id, token, unix_ms] => match unix_ms.parse::<u64>() {
            Ok(ms) => {
                let at = UNIX_EPOCH + Duration::from_millis(ms);
                format!(
                    "{} {kind} {name} id={id} token={token}",
                    humantime::format_rfc3339_millis(at.max(SystemTime::UNIX_EPOCH))
                )
            }
            Err(_) => line.to_owned(),
        },
        _ => line.to_owned(),
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
}
