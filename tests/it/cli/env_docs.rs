//! Every setting is documented where an operator looks for it. Each flag of `lockd --help` has
//! an environment variable, and each of those variables is in contrib/systemd/lockd.env (the
//! unit's environment file, which lists them all) and in proto.md or README.md; lockd.env
//! lists nothing lockd does not read. lockctl's variables are in README.md or proto.md.
//! The flags are read from the binaries' own --help, so a flag added later without its
//! variable and its documentation fails here.

use std::path::PathBuf;
use std::process::Command;

/// Flags that are not settings: they print something and exit, or count (-v; RUST_LOG is its
/// variable). Any other flag whose help says it does something "and exit" is not one either.
const NOT_SETTINGS: &[&str] = &["--help", "--version", "--completions", "--man", "--verbose"];

/// Variables lockd.env may set that are not a flag's.
const NOT_FLAGS: &[&str] = &["RUST_LOG", "LOCKD_ETCD_PASSWORD"];

/// One option of a --help text.
#[derive(Debug)]
struct Flag {
    /// `--name`.
    long: String,
    /// The NAME of its `[env: NAME=...]`, if it has one.
    env: Option<String>,
    /// Its whole entry, help text included.
    entry: String,
}

impl Flag {
    fn is_setting(&self) -> bool {
        !NOT_SETTINGS.contains(&self.long.as_str()) && !self.entry.contains(" and exit")
    }
}

/// `bin args...`'s standard output, run with an empty environment so that no variable of ours
/// shows up as a value in `[env: NAME=value]`.
fn output(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .env_clear()
        .output()
        .expect("run the binary");
    assert!(out.status.success(), "{bin} {args:?} failed");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The options of a --help text. An option's entry starts with a line indented by at most six
/// spaces whose first word starts with `-` (`  -v, --verbose...`, `      --listen <LISTEN>`),
/// and runs to the next entry, heading or blank line; its `[env: NAME=` may be anywhere in it.
fn flags(help: &str) -> Vec<Flag> {
    let mut entries: Vec<String> = Vec::new();
    let mut open = false;
    for line in help.lines() {
        let indent = line.len() - line.trim_start().len();
        if (1..=6).contains(&indent) && line.trim_start().starts_with('-') {
            entries.push(line.to_string());
            open = true;
        } else if line.trim().is_empty() || indent == 0 {
            open = false;
        } else if open {
            if let Some(entry) = entries.last_mut() {
                entry.push(' ');
                entry.push_str(line.trim());
            }
        }
    }
    entries
        .iter()
        .filter_map(|entry| {
            let long = entry
                .split_whitespace()
                .find(|w| w.starts_with("--"))?
                .trim_end_matches(['.', ','])
                .to_string();
            let env = entry
                .split_once("[env: ")
                .and_then(|(_, rest)| rest.split_once('='))
                .map(|(name, _)| name.to_string());
            Some(Flag {
                long,
                env,
                entry: entry.clone(),
            })
        })
        .collect()
}

fn read(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether `text` names `var` as a whole word (LOCKD_COMPAT is not in LOCKD_COMPAT_NAME).
fn names(text: &str, var: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(var).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + var.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// The variables an environment file sets or shows commented out: `NAME=...` or `#NAME=...`.
fn env_file_vars(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim().trim_start_matches('#');
            let (name, _) = line.split_once('=')?;
            let is_var = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            is_var.then(|| name.to_string())
        })
        .collect()
}

#[test]
fn the_help_parser_finds_flags_and_their_variables() {
    let help = "Options:\n      --listen <LISTEN>\n          Address [env: LOCKD_LISTEN=]\n  \
                -v, --verbose...\n          More\n      --long <X>\n          Text that\n          \
                wraps [env: LOCKD_LONG=x] [default: 1]\n\nMore:\n      --plain  Short [env: P=]\n";
    let found: Vec<(String, Option<String>)> =
        flags(help).into_iter().map(|f| (f.long, f.env)).collect();
    let want = [
        ("--listen", Some("LOCKD_LISTEN")),
        ("--verbose", None),
        ("--long", Some("LOCKD_LONG")),
        ("--plain", Some("P")),
    ];
    let want: Vec<(String, Option<String>)> = want
        .iter()
        .map(|(l, e)| (l.to_string(), e.map(str::to_string)))
        .collect();
    assert_eq!(found, want);
    let docs_only =
        flags("      --man-dir <DIR>\n          Write the man page into DIR and exit\n");
    assert!(!docs_only[0].is_setting());
    assert!(names("LOCKD_COMPAT=1", "LOCKD_COMPAT"));
    assert!(!names("LOCKD_COMPAT_NAME=x", "LOCKD_COMPAT"));
    assert_eq!(
        env_file_vars("# text\n#A_B=1\nC=2\n# see: x=y\n"),
        ["A_B", "C"]
    );
}

#[test]
fn every_lockd_flag_has_a_documented_environment_variable() {
    let help = output(env!("CARGO_BIN_EXE_lockd"), &["--help"]);
    let flags = flags(&help);
    assert!(
        flags.iter().any(|f| f.long == "--listen"),
        "could not read the flags of:\n{help}"
    );
    let env_file = read("contrib/systemd/lockd.env");
    let listed = env_file_vars(&env_file);
    let docs = read("README.md") + &read("proto.md");
    let mut problems = Vec::new();
    let mut vars = Vec::new();
    for flag in flags.iter().filter(|f| f.is_setting()) {
        let Some(var) = &flag.env else {
            problems.push(format!("{} has no environment variable", flag.long));
            continue;
        };
        if !listed.contains(var) {
            problems.push(format!(
                "{var} ({}) is not in contrib/systemd/lockd.env",
                flag.long
            ));
        }
        if !names(&docs, var) {
            problems.push(format!(
                "{var} ({}) is in neither proto.md nor README.md",
                flag.long
            ));
        }
        vars.push(var.clone());
    }
    for var in &listed {
        if !vars.contains(var) && !NOT_FLAGS.contains(&var.as_str()) {
            problems.push(format!(
                "contrib/systemd/lockd.env lists {var}, which no flag of lockd reads"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_lockctl_environment_variable_is_documented() {
    let lockctl = env!("CARGO_BIN_EXE_lockctl");
    let main_help = output(lockctl, &["--help"]);
    // The subcommands are the first words of the lines under "Commands:".
    let commands: Vec<&str> = main_help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"run"), "no commands in:\n{main_help}");
    let mut helps = vec![main_help.clone()];
    for command in &commands {
        helps.push(output(lockctl, &[command, "--help"]));
    }
    let docs = read("README.md") + &read("proto.md");
    let mut vars: Vec<String> = Vec::new();
    for help in &helps {
        vars.extend(flags(help).into_iter().filter_map(|f| f.env));
        // Variables the help text names in its prose (its Environment section).
        for word in help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("LOCKD_") && word.len() > "LOCKD_".len() {
                vars.push(word.to_string());
            }
        }
    }
    vars.sort();
    vars.dedup();
    assert!(
        vars.iter().any(|v| v == "LOCKD_ADDR"),
        "no variables found in lockctl's help"
    );
    let missing: Vec<&String> = vars.iter().filter(|v| !names(&docs, v)).collect();
    assert!(
        missing.is_empty(),
        "lockctl variables in neither README.md nor proto.md: {missing:?}"
    );
}
