//! Writing to stdout without panicking when the reader has gone (`lockctl watch | head`),
//! JSON strings for `--json`, and columns and durations for people.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use lockd::locks::Mode;

/// stdout could not be written: the reader went away.
#[derive(Debug)]
pub struct Printed;

pub fn print_line(line: &str) -> Result<(), Printed> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|_| Printed)
}

/// A JSON string. Names and ids have no whitespace or control characters, but may hold `"`
/// and `\`; other lines (an unexpected reply) may hold anything.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Cells in columns two spaces apart, each as wide as its widest cell (the last one unpadded);
/// lines end without spaces.
pub fn columns<R: AsRef<[String]>>(rows: &[R]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, c) in row.as_ref().iter().enumerate() {
            let w = c.chars().count();
            match widths.get_mut(i) {
                Some(old) => *old = (*old).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut line = String::new();
        for (c, w) in row.as_ref().iter().zip(&widths) {
            let _ = write!(line, "{c:<w$}  ");
        }
        out.push_str(line.trim_end());
    }
    out
}

/// `850ms`, `29.1s`, `4m59s`, `2h0m`: short enough for a column.
pub fn short_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        60_000..=3_599_999 => format!("{}m{}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// `yes` or `no`, for a column.
/// A mode in words: `exclusive`, `shared`, `as a semaphore of 3`.
pub fn mode_words(mode: Mode) -> String {
    match mode {
        Mode::Limit(n) => format!("as a semaphore of {n}"),
        m => m.to_string(),
    }
}

pub fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

/// The names a LOCK was granted and their tokens, for `-v`: `a token 7, b token 7`.
pub fn held_tokens(names: &[String], tokens: &[u64]) -> String {
    let held: Vec<String> = names
        .iter()
        .zip(tokens)
        .map(|(name, token)| format!("{name} token {token}"))
        .collect();
    held.join(", ")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_are_short() {
        use super::short_duration;
        assert_eq!(short_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(short_duration(Duration::from_millis(29_140)), "29.1s");
        assert_eq!(short_duration(Duration::from_secs(299)), "4m59s");
        assert_eq!(short_duration(Duration::from_secs(7200)), "2h0m");
    }

    #[test]
    fn columns_line_up() {
        let rows = [
            vec!["NAME".to_owned(), "HOLDER".into(), "QUEUE".into()],
            vec!["deploy".into(), "-".into(), "12".into()],
        ];
        assert_eq!(
            super::columns(&rows),
            "NAME    HOLDER  QUEUE\ndeploy  -       12"
        );
    }

    #[test]
    fn json_escapes() {
        assert_eq!(super::json_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(super::json_string("a\tb\u{1}"), r#""a\u0009b\u0001""#);
    }
}

/// The server's blocked-by answer (`<name>: held by <id> [user=<u>] held_ms=<ms> waiters=<n>
/// [note=<encoded>]`, proto.md) in words, its note decoded: `deploy: held by web-3:4242 for
/// 3m 12s, 1 waiting: release 1.4.2`. A message of another shape is returned as it is.
pub fn blocked_by_words(message: &str) -> String {
    let Some((head, fields)) = message.split_once(" held by ") else {
        return message.to_owned();
    };
    let mut words = fields.split(' ');
    let id = words.next().unwrap_or_default();
    let mut out = format!("{head} held by {id}");
    let (mut held, mut waiting, mut note) = (None, 0u64, None);
    for word in words {
        match word.split_once('=') {
            Some(("user", user)) => {
                let _ = write!(out, " (user {user})");
            }
            Some(("held_ms", ms)) => held = ms.parse().ok().map(Duration::from_millis),
            Some(("waiters", n)) => waiting = n.parse().unwrap_or(0),
            Some(("note", encoded)) => note = lockd::proto::note::decode_note(encoded),
            _ => return message.to_owned(),
        }
    }
    if let Some(held) = held {
        let _ = write!(out, " for {}", short_duration(held));
    }
    if waiting > 0 {
        let _ = write!(out, ", {waiting} waiting");
    }
    if let Some(note) = note {
        let _ = write!(out, ": {note}");
    }
    out
}

/// `d` to the millisecond, as -v says a time.
pub fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A `... was broken by <who> at <unix-ms>` message with the time as a person reads it (UTC,
/// RFC 3339); any other message as it is.
pub fn broken_words(message: &str) -> String {
    let Some((before, ms)) = message.rsplit_once(" at ") else {
        return message.to_owned();
    };
    let Ok(ms) = ms.trim_end_matches(')').parse::<u64>() else {
        return message.to_owned();
    };
    if !before.contains(" was broken by ") {
        return message.to_owned();
    }
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let close = if message.ends_with(')') { ")" } else { "" };
    format!(
        "{before} at {}{close}",
        humantime::format_rfc3339_seconds(at)
    )
}

#[cfg(test)]
mod words_tests {
    use super::*;

    #[test]
    fn a_blocked_by_answer_reads_as_words_with_its_note_decoded() {
        assert_eq!(
            blocked_by_words(
                "nu: held by vm:26459 held_ms=205 waiters=0 note=d%C3%A9ploiement%20web"
            ),
            "nu: held by vm:26459 for 205ms: déploiement web"
        );
        assert_eq!(
            blocked_by_words(
                "nu still held after waiting 1s; held by a user=ci held_ms=61000 waiters=2"
            ),
            "nu still held after waiting 1s; held by a (user ci) for 1m1s, 2 waiting"
        );
        assert_eq!(
            blocked_by_words("nu: held by (queue)"),
            "nu: held by (queue)"
        );
        assert_eq!(blocked_by_words("something else"), "something else");
    }

    #[test]
    fn a_break_s_time_reads_as_a_date() {
        assert_eq!(
            broken_words("NOTHELD d: lease 7 was broken by ops at 1796434404576"),
            "NOTHELD d: lease 7 was broken by ops at 2026-12-05T01:33:24Z"
        );
        assert_eq!(
            broken_words("(NOTHELD d: lease 7 was broken by ops at 1796434404576)"),
            "(NOTHELD d: lease 7 was broken by ops at 2026-12-05T01:33:24Z)"
        );
        assert_eq!(
            broken_words("NOTHELD d: gone at noon"),
            "NOTHELD d: gone at noon"
        );
    }
}
