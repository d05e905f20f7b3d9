//! Shell completions and man pages, generated from a binary's clap definition, so they can
//! never drift from `--help`.

use std::fmt::Write as _;
use std::io::{self, Write};

use clap_complete::Shell;

/// Writes completions for `shell` of the command `cmd`.
pub fn completions(mut cmd: clap::Command, shell: Shell, out: &mut dyn Write) -> io::Result<()> {
    let name = cmd.get_name().to_owned();
    // Generated in memory first: clap_complete panics on a failed write (a closed pipe).
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut text);
    out.write_all(&text)
}

/// What a man page says beyond the clap definition.
#[derive(Clone, Copy, Debug, Default)]
pub struct ManPage<'a> {
    /// The NAME line's description, when the command's `about` is too long for it (the
    /// `about` then opens the DESCRIPTION).
    pub summary: Option<&'a str>,
    /// The DESCRIPTION, when the command's own `long_about` is missing or too short for it.
    pub description: Option<&'a str>,
    /// ENVIRONMENT entries beyond the variables of the command's own flags, which are listed
    /// by themselves: (variable, meaning).
    pub environment: &'a [(&'a str, &'a str)],
    /// EXIT STATUS entries: (code, meaning).
    pub exit_status: &'a [(&'a str, &'a str)],
    /// SEE ALSO entries, as `lockd(1)`.
    pub see_also: &'a [&'a str],
}

/// Writes the man page (roff) of the command `cmd`: clap's NAME, SYNOPSIS, DESCRIPTION,
/// OPTIONS and the subcommands' pages, then ENVIRONMENT (every variable a flag reads, and
/// `page.environment`), EXIT STATUS and SEE ALSO. `code` in the help text is set in bold.
pub fn man(cmd: clap::Command, page: &ManPage, out: &mut dyn Write) -> io::Result<()> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    // A subcommand has no version of its own: it is the package's, as the binaries' is.
    let version = cmd
        .get_version()
        .unwrap_or(env!("CARGO_PKG_VERSION"))
        .to_owned();
    // The program, also on a subcommand's page ("lockctl run" is lockctl's).
    let program = cmd.get_bin_name().unwrap_or(cmd.get_name());
    let program = program.split(' ').next().unwrap_or(program);
    let source = format!("{program} {version}");
    // Clap's after-help is a plain-text rendering of what the sections below say in roff, and
    // its VERSION section would come before them: both are left out.
    let mut cmd = cmd
        .after_help(None::<&str>)
        .after_long_help(None::<&str>)
        .version(None::<&str>)
        .long_version(None::<&str>);
    // The DESCRIPTION need not open with the NAME line again.
    if let (Some(about), Some(long)) = (cmd.get_about(), cmd.get_long_about()) {
        let (about, long) = (about.to_string(), long.to_string());
        let rest = long
            .strip_prefix(about.trim_end_matches('.'))
            .map(|r| r.trim_start_matches('.').trim_start());
        if let Some(rest) = rest.filter(|r| !r.is_empty()) {
            cmd = cmd.long_about(rest.to_owned());
        }
    }
    if let Some(summary) = page.summary {
        if let Some(long) = cmd.get_long_about().or(cmd.get_about()).cloned() {
            cmd = cmd.long_about(long);
        }
        cmd = cmd.about(summary.to_owned());
    }
    if let Some(description) = page.description {
        cmd = cmd.long_about(description.to_owned());
    }
    let environment = flag_variables(&cmd);
    let mut roff = Vec::new();
    clap_mangen::Man::new(cmd)
        .source(source)
        .render(&mut roff)?;
    let mut text = String::from_utf8_lossy(&roff).into_owned();

    let mut entries: Vec<(&str, String)> = environment
        .iter()
        .map(|(var, flag)| (var.as_str(), format!("The same as {flag} (see OPTIONS).")))
        .collect();
    entries.extend(page.environment.iter().map(|(v, m)| (*v, (*m).to_owned())));
    section(&mut text, "ENVIRONMENT", &entries);
    let codes: Vec<(&str, String)> = page
        .exit_status
        .iter()
        .map(|(c, m)| (*c, (*m).to_owned()))
        .collect();
    section(&mut text, "EXIT STATUS", &codes);
    if !page.see_also.is_empty() {
        text.push_str(".SH \"SEE ALSO\"\n");
        text.push_str(&escape(&page.see_also.join(", ")));
        text.push('\n');
    }
    out.write_all(code_spans(&text).as_bytes())
}

/// The subcommand `name` of `cmd`, ready for a page of its own: global flags included, and
/// named `<cmd>-<name>` (as in `lockctl-run(1)`, which the main page's list points to).
pub fn subcommand(cmd: clap::Command, name: &str) -> Option<clap::Command> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    cmd.find_subcommand(name).cloned()
}

/// `(variable, --flag)` for every shown flag that reads an environment variable.
fn flag_variables(cmd: &clap::Command) -> Vec<(String, String)> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let var = a.get_env()?.to_string_lossy().into_owned();
            let flag = match (a.get_long(), a.get_short()) {
                (Some(long), _) => format!("--{long}"),
                (None, Some(short)) => format!("-{short}"),
                (None, None) => a.get_id().to_string(),
            };
            Some((var, flag))
        })
        .collect()
}

/// Appends a section of tagged paragraphs.
fn section(text: &mut String, title: &str, entries: &[(&str, String)]) {
    if entries.is_empty() {
        return;
    }
    let _ = writeln!(text, ".SH \"{title}\"");
    for (tag, body) in entries {
        let _ = writeln!(text, ".TP\n\\fB{}\\fR\n{}", escape(tag), escape(body));
    }
}

/// Text for a roff text line: backslashes and dashes escaped, no leading control character.
fn escape(s: &str) -> String {
    let s = s
        .replace('\\', "\\\\")
        .replace('-', "\\-")
        .replace('\'', "\\*(Aq");
    match s.starts_with('.') {
        true => format!("\\&{s}"),
        false => s,
    }
}

/// Sets Markdown-style `code` spans in bold: a man page shows no raw backticks.
fn code_spans(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "\\fB{part}\\fR");
        } else {
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_spans_become_bold() {
        assert_eq!(
            code_spans("run `lockctl run x` now"),
            "run \\fBlockctl run x\\fR now"
        );
        assert!(!code_spans("a `b` c `d").contains('`'));
    }

    #[test]
    fn escapes() {
        assert_eq!(escape(".a-b\\c"), "\\&.a\\-b\\\\c");
    }
}
