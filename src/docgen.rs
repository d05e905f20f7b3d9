//! Shell completions and man pages, generated from a binary's clap definition, so they can
//! never drift from `--help`.

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

/// Writes the man page (roff) of the command `cmd`.
pub fn man(cmd: clap::Command, out: &mut dyn Write) -> io::Result<()> {
    clap_mangen::Man::new(cmd).render(out)
}
