//! A duration as a flag takes and shows it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A duration flag's value. Its own type so that clap's `default_value_t` can take the
/// crate's `Duration` constants and `--help` still shows them as they are typed (`30s`,
/// `24h`, `500ms`): `Duration` has no `Display`, and a string literal beside each flag would
/// be a second copy of every default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    /// In its largest whole unit (`24h`, `10m`, `30s`, `500ms`), as a flag is written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::locks::FlagDuration(self.0).fmt(f)
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    /// As lockd reads every duration: `250ms`, `30s`, `5m` or plain seconds.
    fn from_str(s: &str) -> Result<Self, String> {
        super::parse_duration("duration", s)
            .map(HumanDuration)
            .map_err(|e| e.message)
    }
}
