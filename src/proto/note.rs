//! A holder's note on the wire: how a LOCK carries it (`note=` takes the rest of the line, so
//! someone typing into `nc` writes it as it is) and how replies and events show it (one
//! percent-encoded word, so every reply line stays space-separated `key=value` fields).

use std::fmt;

use super::{ErrorCode, ProtoError};

/// The option key, as LOCK takes it and as replies show it.
pub const NOTE_KEY: &str = "note";

/// Splits a LOCK line at its `note=`: the words before it, and the note (the rest of the line
/// after `note=`, trailing spaces and tabs dropped). Only a word from the fourth on (after
/// `LOCK <name> <id>`) counts, so a name or id that starts with `note=` stays one. The key is
/// case-insensitive, as every option key.
pub fn split_note(line: &str) -> (&str, Option<&str>) {
    let mut words = 0;
    let mut in_word = false;
    for (at, c) in line.char_indices() {
        if c == ' ' || c == '\t' {
            in_word = false;
            continue;
        }
        if in_word {
            continue;
        }
        in_word = true;
        words += 1;
        let key = line.get(at..at + NOTE_KEY.len() + 1);
        if words >= 4 && key.is_some_and(|k| k.eq_ignore_ascii_case("note=")) {
            let rest = &line[at + NOTE_KEY.len() + 1..];
            return (&line[..at], Some(rest.trim_end_matches([' ', '\t', '\r'])));
        }
    }
    (line, None)
}

/// Checks a note as a LOCK gave it: no control characters (a tab, an escape), so that it
/// prints as it was typed. `None` for an empty note: no note.
pub fn valid_note(note: &str) -> Result<Option<Box<str>>, ProtoError> {
    if note.is_empty() {
        return Ok(None);
    }
    if note.chars().any(char::is_control) {
        return Err(ProtoError::new(
            ErrorCode::BadArg,
            "note has a control character; a note is printable text",
        ));
    }
    Ok(Some(note.into()))
}

/// A note as one word of a reply: a space is `%20`, `%` is `%25`, and every other byte
/// outside printable ASCII (below `!`, DEL, each byte of a non-ASCII character) is `%XX`.
pub struct Encoded<'a>(pub &'a str);

impl fmt::Display for Encoded<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        for &b in self.0.as_bytes() {
            if (b'!'..=b'~').contains(&b) && b != b'%' {
                f.write_char(char::from(b))?;
            } else {
                write!(f, "%{b:02X}")?;
            }
        }
        Ok(())
    }
}

/// Reads a note back from its reply word; `None` for a bad escape or bytes that are not UTF-8.
pub fn decode_note(word: &str) -> Option<String> {
    let bytes = word.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = word.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_encode_to_one_word_and_back() {
        for note in [
            "release 1.4.2 by ci job 8812",
            "100% done",
            "déploiement ☃ 🚀",
            "a=b c=d",
            "%20 is a space",
            "~!",
        ] {
            let word = Encoded(note).to_string();
            assert!(!word.contains(' '), "{word}");
            assert!(word.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{word}");
            assert_eq!(decode_note(&word).as_deref(), Some(note), "{word}");
        }
        assert_eq!(Encoded("a b%c").to_string(), "a%20b%25c");
        assert_eq!(Encoded("é").to_string(), "%C3%A9");
        assert_eq!(decode_note("%c3%a9").as_deref(), Some("é"));
        assert_eq!(decode_note("%"), None);
        assert_eq!(decode_note("%2"), None);
        assert_eq!(decode_note("%zz"), None);
        assert_eq!(decode_note("%FF"), None);
    }

    #[test]
    fn note_takes_the_rest_of_a_lock_line() {
        let line = "LOCK deploy ci-42 ttl=5m note=release 1.4.2  by ci wait=0 \t ";
        assert_eq!(
            split_note(line),
            (
                "LOCK deploy ci-42 ttl=5m ",
                Some("release 1.4.2  by ci wait=0")
            )
        );
        assert_eq!(
            split_note("LOCK note=a note=b"),
            ("LOCK note=a note=b", None)
        );
        assert_eq!(split_note("LOCK a b NOTE=x"), ("LOCK a b ", Some("x")));
        assert_eq!(split_note("LOCK a b note="), ("LOCK a b ", Some("")));
        assert_eq!(split_note("LOCK a b ttl=1s"), ("LOCK a b ttl=1s", None));
        assert_eq!(split_note("LOCK a b xnote=1"), ("LOCK a b xnote=1", None));
    }

    #[test]
    fn bad_notes_are_refused() {
        assert_eq!(valid_note("").unwrap(), None);
        assert_eq!(valid_note("ok").unwrap().as_deref(), Some("ok"));
        assert_eq!(valid_note("a\tb").unwrap_err().code, ErrorCode::BadArg);
        assert_eq!(
            valid_note("a\u{1b}[2J").unwrap_err().code,
            ErrorCode::BadArg
        );
        assert_eq!(valid_note("a\u{7f}").unwrap_err().code, ErrorCode::BadArg);
    }
}
