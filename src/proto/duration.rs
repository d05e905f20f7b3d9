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
        let d = self.0;
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            return write!(f, "{}", humantime::format_duration(d));
        }
        let ms = d.as_millis();
        let (n, unit) = match ms {
            0 => (0, "s"),
            _ if ms.is_multiple_of(3_600_000) => (ms / 3_600_000, "h"),
            _ if ms.is_multiple_of(60_000) => (ms / 60_000, "m"),
            _ if ms.is_multiple_of(1000) => (ms / 1000, "s"),
            _ => (ms, "ms"),
        };
        write!(f, "{n}{unit}")
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
