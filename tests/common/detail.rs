//! `STATUS <name> detail` as the semaphore and shared-lock tests compare it: whole lines, with
//! the values that count time blanked, and who took each lease and when left out.
//!
//! Part of the one test harness (`tests/common`): `common::detail`.

use super::Raw;

/// `line` with every `*_ms=` value blanked as `*` (they count time), without `granted=` and
/// `peer=`.
pub fn shape(line: &str) -> String {
    line.split(' ')
        // When and from which address a holder took its lease differ from run to run and say
        // nothing of the lock's shape (tests/it/audit.rs checks them): left out.
        .filter(|w| !w.starts_with("granted=") && !w.starts_with("peer="))
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
