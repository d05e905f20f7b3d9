//! Writing to stdout without panicking when the reader has gone (`lockctl watch | head`), and
//! JSON strings for `--json`.

use std::fmt::Write as _;
use std::io::Write as _;

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

#[cfg(test)]
mod tests {
    #[test]
    fn json_escapes() {
        assert_eq!(super::json_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(super::json_string("a\tb\u{1}"), r#""a\u0009b\u0001""#);
    }
}
