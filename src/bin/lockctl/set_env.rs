//! What a job run under a set of names (`lockctl run a b -- cmd`) is told about its tokens:
//! `LOCKD_NAMES` (the names, space-separated, in the order given), `LOCKD_TOKEN` (the first
//! name's, as for one name) and `LOCKD_TOKEN_<NAME>` for each name. Each name has its own
//! fencing token, and a job that writes to two resources must fence each write with its own.
//!
//! Not wired into `run` yet: the server grants no sets until both backends do (issue 20,
//! part 4); this is the part of lockctl's side that needs no server.

// Used by `run` once the server grants sets; tested here meanwhile.
#![allow(dead_code)]

use lockd::locks::Token;

/// The variable that carries `name`'s token: `LOCKD_TOKEN_` and the name upper-cased, every
/// byte outside `[A-Z0-9]` (after upper-casing) as `_`, so that any name gives a valid
/// shell variable.
pub fn token_variable(name: &str) -> String {
    let mut var = String::from("LOCKD_TOKEN_");
    var.extend(name.bytes().map(|b| match b.to_ascii_uppercase() {
        up @ (b'A'..=b'Z' | b'0'..=b'9') => char::from(up),
        _ => '_',
    }));
    var
}

/// The environment for a job holding `names` with `tokens` (the same order, one each).
/// Two names that give the same variable (`db-migrate` and `db.migrate`) are refused: the
/// job could not tell which token is which, and fencing with the wrong one is worse than
/// not starting.
pub fn environment(names: &[String], tokens: &[Token]) -> Result<Vec<(String, String)>, String> {
    if names.len() != tokens.len() || names.is_empty() {
        return Err(format!(
            "{} names but {} tokens in the server's reply",
            names.len(),
            tokens.len()
        ));
    }
    let mut env = vec![
        ("LOCKD_NAMES".to_owned(), names.join(" ")),
        ("LOCKD_TOKEN".to_owned(), tokens[0].to_string()),
    ];
    for (name, token) in names.iter().zip(tokens) {
        let var = token_variable(name);
        if let Some(other) = names
            .iter()
            .find(|other| *other != name && token_variable(other) == var)
        {
            return Err(format!(
                "names {name} and {other} would both be ${var}; rename one of them"
            ));
        }
        env.push((var, token.to_string()));
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_becomes_a_shell_variable() {
        assert_eq!(token_variable("db-migrate"), "LOCKD_TOKEN_DB_MIGRATE");
        assert_eq!(
            token_variable("cache.flush/eu"),
            "LOCKD_TOKEN_CACHE_FLUSH_EU"
        );
        assert_eq!(token_variable("Q3"), "LOCKD_TOKEN_Q3");
        // Each byte of a multi-byte character is one `_`.
        assert_eq!(token_variable("é"), "LOCKD_TOKEN___");
    }

    #[test]
    fn each_name_gets_its_token_and_the_first_is_lockd_token() {
        let names = ["db-migrate".to_owned(), "cache-flush".to_owned()];
        let env = environment(&names, &[41, 42]).unwrap();
        let get = |k: &str| env.iter().find(|(v, _)| v == k).map(|(_, t)| t.as_str());
        assert_eq!(get("LOCKD_NAMES"), Some("db-migrate cache-flush"));
        assert_eq!(get("LOCKD_TOKEN"), Some("41"));
        assert_eq!(get("LOCKD_TOKEN_DB_MIGRATE"), Some("41"));
        assert_eq!(get("LOCKD_TOKEN_CACHE_FLUSH"), Some("42"));
    }

    #[test]
    fn names_that_collide_or_a_short_reply_are_refused() {
        let names = ["db-migrate".to_owned(), "db.migrate".to_owned()];
        let e = environment(&names, &[1, 2]).unwrap_err();
        assert!(e.contains("LOCKD_TOKEN_DB_MIGRATE"), "{e}");
        assert!(environment(&names[..1], &[1, 2]).is_err());
    }
}
