//! The compat mode's `lockd` flags. Their environment names are the old server's own
//! (`SERVER_ADDR`, `LOCK_PORT`, `UNLOCK_PORT`, `UNLOCK_PORT_TIMEOUT`), so its configuration
//! works as it is.

use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::Args;

use crate::proto::HumanDuration;

use super::{
    CompatConfig, DEFAULT_COMPAT_LISTEN, DEFAULT_HOST, DEFAULT_LOCK_PORT, DEFAULT_NAME,
    DEFAULT_READ_TIMEOUT, DEFAULT_UNLOCK_PORT, DEFAULT_UNLOCK_TIMEOUT,
};

// The compat flags, flattened into `daemon::Flags`. Not a doc comment: clap may take that as
// help text (the about of the command it is flattened into).
#[allow(missing_docs)]
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Compatibility mode (the old two-port bash/netcat protocol)")]
pub struct CompatArgs {
    /// Also serve the old two-port lock protocol, on one lock of the table (--compat-name).
    /// The line protocol then listens on 127.0.0.1:5003 unless --listen is given.
    #[arg(long, env = "LOCKD_COMPAT", value_parser = BoolishValueParser::new())]
    pub compat: bool,

    /// Host or address the lock and unlock ports bind on (on every address it resolves to).
    #[arg(long = "compat-addr", env = "SERVER_ADDR", default_value = DEFAULT_HOST)]
    pub host: String,

    /// Port that answers `lock:<id>:<time>` with `oklocked` while the lock is free.
    #[arg(long, env = "LOCK_PORT", default_value_t = DEFAULT_LOCK_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub lock_port: u16,

    /// Port that answers `unlock:<id>:<time>` with `okunlocked` while the lock is held.
    #[arg(long, env = "UNLOCK_PORT", default_value_t = DEFAULT_UNLOCK_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub unlock_port: u16,

    /// Lease of a lock taken through the lock port: released if no unlock comes within it.
    /// Plain seconds as the old server took them (30), or a duration (90s, 5m).
    #[arg(long, env = "UNLOCK_PORT_TIMEOUT", default_value_t = HumanDuration(DEFAULT_UNLOCK_TIMEOUT))]
    pub unlock_timeout: HumanDuration,

    /// The lock in the table the two ports stand for (line-protocol clients use this name).
    #[arg(long, env = "LOCKD_COMPAT_NAME", default_value = DEFAULT_NAME)]
    pub compat_name: String,

    /// Serve --compat alongside --auth-file. The old protocol has no authentication, so
    /// lockd refuses to start with both unless told so here: the two ports must then be
    /// reachable by trusted clients only.
    #[arg(long, env = "LOCKD_COMPAT_NO_AUTH", value_parser = BoolishValueParser::new())]
    pub compat_no_auth: bool,

    /// How long a connection to either port may take to send its message before it is
    /// closed unanswered.
    #[arg(long, env = "LOCKD_COMPAT_READ_TIMEOUT",
          default_value_t = HumanDuration(DEFAULT_READ_TIMEOUT))]
    pub compat_read_timeout: HumanDuration,
}

impl CompatArgs {
    /// The compat settings if `--compat` is on, checked against the server's `--max-ttl`.
    pub fn config(&self, max_ttl: Duration) -> Result<Option<CompatConfig>, String> {
        if !self.compat {
            return Ok(None);
        }
        let config = CompatConfig {
            host: self.host.clone(),
            lock_port: self.lock_port,
            unlock_port: self.unlock_port,
            unlock_timeout: self.unlock_timeout.0,
            name: self.compat_name.clone(),
            read_timeout: self.compat_read_timeout.0,
        };
        config.validate(max_ttl)?;
        Ok(Some(config))
    }

    /// Where the line protocol listens when `--listen` is not given.
    pub fn default_listen(&self) -> &'static str {
        if self.compat {
            DEFAULT_COMPAT_LISTEN
        } else {
            crate::DEFAULT_LISTEN
        }
    }
}
