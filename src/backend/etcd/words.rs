//! The text form of every value under the prefix: `key=value` words, separated by spaces,
//! each value percent-encoded (`keys.rs`'s `encode`), and the words a mode, a uid and a set's
//! names are written as. Pure, no I/O.

use std::fmt::Write as _;

use crate::locks::Mode;

use super::keys::{decode, encode};

/// A set's names as one word's value: each percent-encoded (so no name holds a comma), then
/// joined by commas.
pub(super) fn set_word(names: &[String]) -> String {
    names
        .iter()
        .map(|n| encode(n))
        .collect::<Vec<_>>()
        .join(",")
}

/// [`set_word`] read back: `None` (a record that can't be read) if a name can't be decoded.
pub(super) fn parse_set(word: Option<&str>) -> Option<Vec<String>> {
    match word {
        None | Some("") => Some(Vec::new()),
        Some(word) => word.split(',').map(decode).collect(),
    }
}

pub(super) fn mode_word(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "x".into(),
        Mode::Shared => "s".into(),
        Mode::Limit(n) => format!("l{n}"),
    }
}

pub(super) fn parse_mode(word: &str) -> Option<Mode> {
    match word {
        "x" => Some(Mode::Exclusive),
        "s" => Some(Mode::Shared),
        _ => word.strip_prefix('l')?.parse().ok().map(Mode::limit),
    }
}

/// The uid's word, left out when empty (a record of an older lockd, written again).
pub(super) fn uid_word(s: &mut String, uid: &str) {
    if !uid.is_empty() {
        word(s, "uid", uid);
    }
}

pub(super) fn word(s: &mut String, key: &str, value: &str) {
    if !s.is_empty() {
        s.push(' ');
    }
    let _ = write!(s, "{key}={}", encode(value));
}

/// A value's words.
pub(super) struct Words(Vec<(String, String)>);

impl Words {
    pub(super) fn parse(text: &[u8]) -> Option<Words> {
        let text = std::str::from_utf8(text).ok()?;
        let mut words = Vec::new();
        for w in text.split(' ').filter(|w| !w.is_empty()) {
            let (k, v) = w.split_once('=')?;
            words.push((k.to_owned(), decode(v)?));
        }
        Some(Words(words))
    }

    pub(super) fn get(&self, key: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    pub(super) fn num<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.get(key)?.parse().ok()
    }
}
