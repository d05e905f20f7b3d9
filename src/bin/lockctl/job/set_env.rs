//! What a job run under a set of names (`lockctl run a b -- cmd`) is told about its tokens:
//! `LOCKD_NAMES` (the names, space-separated, in the order given), `LOCKD_TOKEN` (the first
//! name's, as for one name) and `LOCKD_TOKEN_<NAME>` for each name. Each name has its own
//! fencing token in the reply, and a job that writes to two resources must fence each write
//! with its own (proto.md: a client must not assume the tokens of a set are equal or differ).
//! One name gets the same variables, so that a script written for a set runs under one name.

use lockd::locks::Token;

/// The variable that carries `name`'s token: `LOCKD_TOKEN_` and the name upper-cased, every
/// other ASCII byte (`-`, `.`, `/`, ...) as `_`, and each byte outside ASCII as `_` and its two
/// hex digits (`é` is `_C3_A9`), so that any name gives a valid shell variable and names
/// that differ in a letter of another alphabet never give the same one. (Names that differ
/// only in case or ASCII punctuation may: [`environment`] refuses those.)
pub fn token_variable(name: &str) -> String {
    use std::fmt::Write as _;
    let mut var = String::from("LOCKD_TOKEN_");
    for b in name.bytes() {
        match b.to_ascii_uppercase() {
            up @ (b'A'..=b'Z' | b'0'..=b'9') => var.push(char::from(up)),
            b if b.is_ascii() => var.push('_'),
            b => {
                let _ = write!(var, "_{b:02X}");
            }
        }
    }
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

/// The names as given to `run` or `acquire`, checked before anything is sent: each a valid
/// name, none twice, and (for `run`, `for_job`) no two that give the same variable.
pub fn check_names(names: &[String], for_job: bool) -> Result<(), String> {
    for (i, name) in names.iter().enumerate() {
        lockd::proto::validate_name("lock name", name).map_err(|e| e.message)?;
        if names[..i].contains(name) {
            return Err(format!("lock name {name} is given twice"));
        }
    }
    if for_job {
        environment(names, &vec![1; names.len()])?;
    }
    Ok(())
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
        // A byte outside ASCII is `_` and its hex digits: é and ü are told apart.
        assert_eq!(token_variable("é"), "LOCKD_TOKEN__C3_A9");
        assert_eq!(token_variable("ü"), "LOCKD_TOKEN__C3_BC");
        let names = ["é".to_owned(), "ü".to_owned()];
        assert!(check_names(&names, true).is_ok());
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
        assert!(check_names(&names, true).is_err());
        assert!(check_names(&names, false).is_ok());
        let twice = ["a".to_owned(), "b".to_owned(), "a".to_owned()];
        let e = check_names(&twice, false).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
    }
}
