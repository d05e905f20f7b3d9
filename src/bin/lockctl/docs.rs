//! `--completions`, `--man` and `--man-dir` (and the older `completions` and `man` commands):
//! lockctl(1) and one page per command, lockctl-run(1) and so on, all from the clap definition.

use std::path::Path;

use clap::CommandFactory as _;
use lockd::docgen::{self, ManPage};

use crate::cli::{Cli, Command, COMMAND_ENVIRONMENT, EXIT_STATUS, SECRET_ENVIRONMENT};
use crate::fail::Failure;

/// The commands with a page of their own.
const PAGES: &[&str] = &[
    "run", "elect", "leader", "acquire", "release", "renew", "status", "top", "watch", "break",
    "mcp",
];

/// Does what a documentation flag (or command) asks; `None` when none was given.
pub fn requested(cli: &Cli) -> Option<Result<u8, Failure>> {
    let flags = cli.completions.is_some() || cli.man.is_some() || cli.man_dir.is_some();
    if flags && cli.command.is_some() {
        return Some(Err(Failure::usage(
            "--completions, --man and --man-dir take no command",
        )));
    }
    let mut out = std::io::stdout();
    let written = match (
        &cli.command,
        cli.completions.as_ref(),
        &cli.man,
        &cli.man_dir,
    ) {
        (Some(Command::Completions { shell }), ..) | (_, Some(shell), ..) => {
            docgen::completions(Cli::command(), *shell, &mut out)
        }
        (Some(Command::Man), ..) => page("lockctl", &mut out),
        (_, _, Some(name), _) => page(name, &mut out),
        (_, _, _, Some(dir)) => write_all(dir),
        _ => return None,
    };
    Some(
        written
            .map(|()| 0)
            .map_err(|e| Failure::usage(e.to_string())),
    )
}

/// Writes the page `name`: `lockctl`, or a command as `run` or `lockctl-run`.
fn page(name: &str, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let command = name.strip_prefix("lockctl-").unwrap_or(name);
    if command == "lockctl" {
        let see_also: Vec<String> = PAGES
            .iter()
            .map(|p| format!("lockctl-{p}(1)"))
            .chain(["lockd(1)".into(), "flock(1)".into()])
            .collect();
        let see_also: Vec<&str> = see_also.iter().map(String::as_str).collect();
        let environment: Vec<_> = SECRET_ENVIRONMENT
            .iter()
            .chain(COMMAND_ENVIRONMENT)
            .copied()
            .collect();
        let main = ManPage {
            environment: &environment,
            exit_status: EXIT_STATUS,
            see_also: &see_also,
            ..ManPage::default()
        };
        return docgen::man(Cli::command(), &main, out);
    }
    let Some(cmd) = PAGES
        .contains(&command)
        .then(|| docgen::subcommand(Cli::command(), command))
        .flatten()
    else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "no man page {name:?}; there are lockctl and {}",
                PAGES.join(", ")
            ),
        ));
    };
    let set_for_command: &[(&str, &str)] = if command == "run" {
        COMMAND_ENVIRONMENT
    } else {
        &[]
    };
    let environment: Vec<_> = SECRET_ENVIRONMENT
        .iter()
        .chain(set_for_command)
        .copied()
        .collect();
    let sub = ManPage {
        environment: &environment,
        exit_status: EXIT_STATUS,
        see_also: &["lockctl(1)", "lockd(1)"],
        ..ManPage::default()
    };
    docgen::man(cmd, &sub, out)
}

/// Writes lockctl.1 and lockctl-<command>.1 for every command into `dir`.
fn write_all(dir: &Path) -> std::io::Result<()> {
    for name in std::iter::once("lockctl").chain(PAGES.iter().copied()) {
        let file = match name {
            "lockctl" => "lockctl.1".to_owned(),
            command => format!("lockctl-{command}.1"),
        };
        let mut text = Vec::new();
        page(name, &mut text)?;
        std::fs::write(dir.join(&file), text).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot write {}: {e}", dir.join(file).display()),
            )
        })?;
    }
    Ok(())
}
