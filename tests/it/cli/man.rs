//! Man pages and shell completions of both binaries, as a packager generates them: every page
//! exists, says what its tool is, lists every environment variable and exit code, and has no
//! Markdown left in it.

use std::process::Command;

const LOCKD: &str = env!("CARGO_BIN_EXE_lockd");
const LOCKCTL: &str = env!("CARGO_BIN_EXE_lockctl");

/// lockctl's commands, each with a page of its own.
const COMMANDS: [&str; 11] = [
    "run", "elect", "leader", "acquire", "release", "renew", "status", "top", "watch", "break",
    "mcp",
];

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(bin: &str, args: &[&str]) -> Ran {
    let out = Command::new(bin)
        .args(args)
        .env_remove("LOCKD_ADDR")
        .output()
        .expect("run");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).expect("UTF-8"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The page that `args` prints; fails the test if it fails.
fn page(bin: &str, args: &[&str]) -> String {
    let ran = run(bin, args);
    assert_eq!(ran.code, 0, "{args:?}: {}", ran.stderr);
    ran.stdout
}

/// The text of section `title`, up to the next `.SH`.
fn section(page: &str, title: &str) -> String {
    let start = [format!(".SH {title}\n"), format!(".SH \"{title}\"\n")]
        .iter()
        .find_map(|h| page.find(h.as_str()).map(|i| i + h.len()))
        .unwrap_or_else(|| panic!("no {title} section in:\n{page}"));
    let rest = &page[start..];
    rest[..rest.find("\n.SH ").unwrap_or(rest.len())].to_owned()
}

/// What every page must have: a title, a NAME line that says what the page is about, the
/// sections a reader looks for, and no raw backticks.
fn check_page(page: &str, title: &str, name_line: &str) {
    let th = page
        .lines()
        .find(|l| l.starts_with(".TH "))
        .unwrap_or_else(|| panic!("no .TH in:\n{page}"));
    assert!(th.starts_with(&format!(".TH {title} 1 ")), "{th}");
    let name = section(page, "NAME");
    assert!(name.trim().starts_with(name_line), "{name}");
    for s in [
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "EXIT STATUS",
        "SEE ALSO",
    ] {
        section(page, s);
    }
    assert!(!page.contains('`'), "raw backticks in {title}:\n{page}");
    let fonts = page.matches("\\fB").count() + page.matches("\\fI").count();
    assert_eq!(
        fonts,
        page.matches("\\fR").count(),
        "unbalanced fonts in {title}"
    );
}

#[test]
fn lockctl_page_describes_lockctl_and_points_to_every_command() {
    let main = page(LOCKCTL, &["--man"]);
    check_page(&main, "lockctl", "lockctl \\- flock(1) across machines");
    assert!(!section(&main, "NAME").contains("lock server"));
    let commands = section(&main, "SUBCOMMANDS");
    let see_also = section(&main, "SEE ALSO");
    for c in COMMANDS {
        let reference = format!("lockctl\\-{c}(1)");
        assert!(commands.contains(&reference), "{reference} in:\n{commands}");
        assert!(see_also.contains(&reference), "{reference} in:\n{see_also}");
    }
    for hidden in ["help", "man", "completions"] {
        assert!(
            !commands.contains(&format!("lockctl\\-{hidden}(")),
            "{commands}"
        );
    }
    let env = section(&main, "ENVIRONMENT");
    for var in ["LOCKD_ADDR", "LOCKD_NAME", "LOCKD_TOKEN"] {
        assert!(env.contains(var), "{var} in:\n{env}");
    }
    let codes = section(&main, "EXIT STATUS");
    for code in ["0", "1", "2", "3", "4", "124", "126/127", "128+N"] {
        assert!(
            codes.contains(&format!(".TP\n\\fB{code}\\fR\n")),
            "{code} in:\n{codes}"
        );
    }
    // The old form prints the same page.
    assert_eq!(page(LOCKCTL, &["man"]), main);
}

#[test]
fn every_lockctl_command_has_its_page() {
    for c in COMMANDS {
        let text = page(LOCKCTL, &["--man", c]);
        check_page(
            &text,
            &format!("lockctl-{c}"),
            &format!("lockctl\\-{c} \\- "),
        );
        // Global flags are on every page, with their variable.
        assert!(section(&text, "OPTIONS").contains("\\-\\-server"), "{c}");
        assert!(section(&text, "ENVIRONMENT").contains("LOCKD_ADDR"), "{c}");
        assert!(section(&text, "SEE ALSO").contains("lockctl(1)"), "{c}");
        assert!(section(&text, "EXIT STATUS").contains("124"), "{c}");
        assert_eq!(page(LOCKCTL, &["--man", &format!("lockctl-{c}")]), text);
    }
    let run_page = page(LOCKCTL, &["--man", "run"]);
    for needle in [
        "\\-\\-session\\-grace",
        "\\-\\-until\\-timeout",
        "\\-\\-kill\\-grace",
    ] {
        assert!(section(&run_page, "OPTIONS").contains(needle), "{needle}");
    }
    assert!(section(&run_page, "ENVIRONMENT").contains("LOCKD_TOKEN"));
    assert!(section(&run_page, "DESCRIPTION").contains("with a grace (\\-\\-session\\-grace)"));
    let acquire = section(&page(LOCKCTL, &["--man", "acquire"]), "SYNOPSIS");
    assert!(
        acquire.contains("\\-w") && acquire.contains("\\-n"),
        "{acquire}"
    );

    let ran = run(LOCKCTL, &["--man", "nosuch"]);
    assert_eq!(ran.code, 2);
    assert!(
        ran.stderr.contains("run, elect, leader, acquire"),
        "{}",
        ran.stderr
    );
}

#[test]
fn lockd_page_lists_every_variable_of_its_flags() {
    let text = page(LOCKD, &["--man"]);
    check_page(&text, "lockd", "lockd \\- the lock server");
    let env = section(&text, "ENVIRONMENT");
    let help = page(LOCKD, &["--help"]);
    let vars: Vec<&str> = help
        .split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next())
        .collect();
    assert!(vars.len() >= 10, "{help}");
    for var in vars
        .iter()
        .chain(&["LOCKD_DATA_DIR", "LOCKD_COMPAT_READ_TIMEOUT", "RUST_LOG"])
    {
        assert!(env.contains(&format!("\\fB{var}\\fR")), "{var} in:\n{env}");
    }
    assert!(section(&text, "SEE ALSO").contains("lockctl(1)"));
}

#[test]
fn man_dir_writes_every_page() {
    let dir = std::env::temp_dir().join(format!("lockd-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    page(LOCKCTL, &["--man-dir", d]);
    page(LOCKD, &["--man-dir", d]);
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).expect(file);
    assert_eq!(read("lockctl.1"), page(LOCKCTL, &["--man"]));
    assert_eq!(read("lockd.1"), page(LOCKD, &["--man"]));
    for c in COMMANDS {
        assert_eq!(
            read(&format!("lockctl-{c}.1")),
            page(LOCKCTL, &["--man", c])
        );
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2 + COMMANDS.len(), "{files:?}");
    let _ = std::fs::remove_dir_all(&dir);

    let ran = run(LOCKCTL, &["--man-dir", "/nonexistent/dir"]);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
}

#[test]
fn completions_in_one_form_for_both() {
    for shell in ["bash", "zsh", "fish"] {
        let lockd = page(LOCKD, &["--completions", shell]);
        assert!(lockd.contains("max-ttl"), "{shell}: {lockd}");
        let lockctl = page(LOCKCTL, &["--completions", shell]);
        assert!(
            lockctl.contains("nonblock") && lockctl.contains("session-grace"),
            "{shell}: {lockctl}"
        );
        // The old form still works.
        assert_eq!(page(LOCKCTL, &["completions", shell]), lockctl);
    }
    // One documentation flag at a time, and no command with it.
    assert_eq!(run(LOCKCTL, &["--completions", "bash", "status"]).code, 2);
    assert_eq!(run(LOCKCTL, &["--completions", "bash", "--man"]).code, 2);
    assert_eq!(run(LOCKD, &["--man", "--completions", "bash"]).code, 2);
}

/// `--version` of both binaries names the version and the commit they were built from (the
/// checkout's HEAD here; "unknown" only where there is no git and no LOCKD_COMMIT).
#[test]
fn both_binaries_name_their_version_and_commit() {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    for (bin, name) in [(LOCKD, "lockd"), (LOCKCTL, "lockctl")] {
        let out = Command::new(bin).arg("--version").output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let want = format!("{name} {} (commit ", env!("CARGO_PKG_VERSION"));
        assert!(text.starts_with(&want), "{text}");
        if let Some(head) = &head {
            assert!(
                text.contains(head.as_str()),
                "{text} does not name HEAD {head}"
            );
        }
    }
}
