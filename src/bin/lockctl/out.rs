//! Writing to stdout without panicking when the reader has gone (`lockctl watch | head`).

use std::io::Write as _;

/// stdout could not be written: the reader went away.
#[derive(Debug)]
pub struct Printed;

pub fn print_line(line: &str) -> Result<(), Printed> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|_| Printed)
}
