//! `STATUS <name> detail` as the semaphore and shared-lock tests compare it: whole lines, with
//! the values that count time blanked.
//!
//! Part of the one test harness (`tests/common`): `common::detail`.

use super::Raw;

/// `line` with every `*_ms=` value blanked as `*`: they count time.
pub fn shape(line: &str) -> String {
    line.split(' ')
        .map(|w| match w.split_once('=') {
            Some((key, _)) if key.ends_with("_ms") => format!("{key}=*"),
            _ => w.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `STATUS <name> detail`, every line up to and including its `OK` line, shaped.
pub async fn detail(c: &mut Raw, name: &str) -> Vec<String> {
    c.send(&format!("STATUS {name} detail")).await;
    let mut lines = Vec::new();
    loop {
        let line = c.line().await;
        let last = line.starts_with("OK ") || line.starts_with("ERR ");
        lines.push(shape(&line));
        if last {
            return lines;
        }
    }
}
