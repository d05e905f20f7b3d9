//! What a script line means as bytes to send (a template) and as a line to expect (a
//! pattern); the grammar is in tests/scripts/README.md.

use std::collections::HashMap;

/// The values captured so far in one script run (`$t` and the like).
pub type Vars = HashMap<String, String>;

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The bytes of a line to send: `\t \r \n \\ \$ \xHH` escapes, `$name` replaced by its
/// captured value, and `${text*N}` replaced by `text` repeated `N` times.
pub fn expand(template: &str, vars: &Vars) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = template.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                let Some(&c) = chars.get(i + 1) else {
                    return Err("a line ends with a lone '\\'".into());
                };
                i += 2;
                match c {
                    't' => out.push(b'\t'),
                    'r' => out.push(b'\r'),
                    'n' => out.push(b'\n'),
                    'x' => {
                        let hex: String = chars.get(i..i + 2).unwrap_or(&[]).iter().collect();
                        let byte = u8::from_str_radix(&hex, 16)
                            .map_err(|_| format!("\\x needs two hex digits, got {hex:?}"))?;
                        out.push(byte);
                        i += 2;
                    }
                    other => {
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
            '$' if chars.get(i + 1) == Some(&'{') => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .map(|p| i + p)
                    .ok_or("`${` without its `}`")?;
                let inner: String = chars[i + 2..end].iter().collect();
                let (text, n) = inner
                    .rsplit_once('*')
                    .ok_or_else(|| format!("`${{{inner}}}` is not `${{text*N}}`"))?;
                let n: usize = n
                    .parse()
                    .map_err(|_| format!("`${{{inner}}}`: {n:?} is not a count"))?;
                out.extend_from_slice(&expand(text, vars)?.repeat(n));
                i = end + 1;
            }
            '$' => {
                let name: String = chars[i + 1..]
                    .iter()
                    .take_while(|c| is_name_char(**c))
                    .collect();
                if name.is_empty() {
                    return Err("a `$` without a name (write `\\$` for a dollar)".into());
                }
                let value = vars
                    .get(&name)
                    .ok_or_else(|| format!("${name} is used before it was captured"))?;
                out.extend_from_slice(value.as_bytes());
                i += 1 + name.chars().count();
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                i += 1;
            }
        }
    }
    Ok(out)
}

/// One piece of a pattern word.
#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Lit(char),
    /// `*`: any run of characters within the word (a whole-word `*` is any one word).
    Star,
    /// `$name`: captured on first use (one or more characters), compared after.
    Var(String),
}

fn pieces(word: &str) -> Vec<Piece> {
    let chars: Vec<char> = word.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 < chars.len() => {
                out.push(Piece::Lit(chars[i + 1]));
                i += 2;
            }
            '*' => {
                out.push(Piece::Star);
                i += 1;
            }
            '$' if chars.get(i + 1).is_some_and(|c| is_name_char(*c)) => {
                let name: String = chars[i + 1..]
                    .iter()
                    .take_while(|c| is_name_char(**c))
                    .collect();
                i += 1 + name.chars().count();
                out.push(Piece::Var(name));
            }
            c => {
                out.push(Piece::Lit(c));
                i += 1;
            }
        }
    }
    out
}

fn match_word(pieces: &[Piece], text: &[char], vars: &mut Vars) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return text.is_empty();
    };
    match first {
        Piece::Lit(c) => text.first() == Some(c) && match_word(rest, &text[1..], vars),
        Piece::Star => (0..=text.len()).any(|k| match_word(rest, &text[k..], vars)),
        Piece::Var(name) => {
            if let Some(value) = vars.get(name) {
                let value: Vec<char> = value.chars().collect();
                return text.starts_with(&value) && match_word(rest, &text[value.len()..], vars);
            }
            for k in 1..=text.len() {
                vars.insert(name.clone(), text[..k].iter().collect());
                if match_word(rest, &text[k..], vars) {
                    return true;
                }
                vars.remove(name);
            }
            false
        }
    }
}

/// A pattern with each `${text*N}` written out: `text` repeated `N` times, taken literally.
fn repeat_in_pattern(pattern: &str) -> String {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let expanded = after.find('}').and_then(|end| {
            let (text, n) = after[..end].rsplit_once('*')?;
            let n: usize = n.parse().ok()?;
            let literal: String = text
                .chars()
                .flat_map(|c| match c {
                    '*' | '$' | '\\' => vec!['\\', c],
                    c => vec![c],
                })
                .collect();
            Some((literal.repeat(n), end))
        });
        match expanded {
            Some((text, end)) => {
                out.push_str(&text);
                rest = &after[end + 1..];
            }
            None => {
                out.push_str("${");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Does `line` match `pattern`? Words are compared one by one (the line split at single
/// spaces, so its spacing is checked too); a pattern word `...` takes any number of words
/// (none included). New captures are kept only on a match.
pub fn matches(pattern: &str, line: &str, vars: &mut Vars) -> bool {
    let pattern = repeat_in_pattern(pattern);
    let want: Vec<Vec<Piece>> = pattern
        .split_whitespace()
        .map(|w| if w == "..." { Vec::new() } else { pieces(w) })
        .collect();
    let got: Vec<Vec<char>> = if line.is_empty() {
        Vec::new()
    } else {
        line.split(' ').map(|w| w.chars().collect()).collect()
    };
    let mut trial = vars.clone();
    if match_words(&want, &got, &mut trial) {
        *vars = trial;
        true
    } else {
        false
    }
}

/// Pattern words against line words; an empty pattern word stands for `...`.
fn match_words(want: &[Vec<Piece>], got: &[Vec<char>], vars: &mut Vars) -> bool {
    let Some((first, rest)) = want.split_first() else {
        return got.is_empty();
    };
    if first.is_empty() {
        return (0..=got.len()).any(|k| {
            let mut trial = vars.clone();
            let ok = match_words(rest, &got[k..], &mut trial);
            if ok {
                *vars = trial;
            }
            ok
        });
    }
    let Some((word, more)) = got.split_first() else {
        return false;
    };
    let mut trial = vars.clone();
    if match_word(first, word, &mut trial) && match_words(rest, more, &mut trial) {
        *vars = trial;
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_wildcards_and_captures() {
        let mut v = Vars::new();
        assert!(matches("OK $t", "OK 17", &mut v));
        assert_eq!(v["t"], "17");
        assert!(matches(
            "OK x held id=a token=$t ttl_ms=* ...",
            "OK x held id=a token=17 ttl_ms=5 session=0",
            &mut v
        ));
        assert!(!matches(
            "OK x held id=a token=$t",
            "OK x held id=a token=18",
            &mut v
        ));
        assert!(!matches("OK *", "OK", &mut v));
        assert!(matches("ERR NOTHELD ...", "ERR NOTHELD", &mut v));
        assert!(!matches("OK", "OK  ", &mut v));
        assert!(!matches("OK $u x", "OK 5 y", &mut v));
        assert!(!v.contains_key("u"), "a failed match keeps no capture");
        assert!(matches(r"OK \*", "OK *", &mut v));
        assert!(matches(
            "OK ... holders=2 ...",
            "OK a b holders=2 mode=x",
            &mut v
        ));
        assert!(matches("OK ... holders=2", "OK a b holders=2", &mut v));
        assert!(!matches("OK ... holders=2", "OK a b holders=3", &mut v));
        assert!(matches("OK ${ab*2}c ${**2}", "OK ababc **", &mut v));
    }

    #[test]
    fn templates() {
        let mut v = Vars::new();
        v.insert("t".into(), "42".into());
        assert_eq!(expand(r"UNLOCK x $t\r", &v).unwrap(), b"UNLOCK x 42\r");
        assert_eq!(expand("${ab*3}c", &v).unwrap(), b"abababc");
        assert_eq!(expand(r"${P\n*2}", &v).unwrap(), b"P\nP\n");
        assert_eq!(expand(r"\xff\t\$", &v).unwrap(), b"\xff\t$");
        assert!(expand("$nope", &v).is_err());
    }
}
