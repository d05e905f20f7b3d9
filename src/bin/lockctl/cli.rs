//! Command-line flags. The doc comments are the `--help` text, so they speak to the user.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Printed after `--help`: flock(1) users look here first, so every exit code is listed.
pub const EXIT_CODES: &str = "\
Exit codes:
  0        success (run: the command's own exit code is passed through)
  1        the lock is held by someone else: -n found it held or -w ran out
           (change it with -E/--conflict-exit-code)
  2        usage error, or the server refused the request (its ERR text is printed)
  3        the server is unreachable, or the connection was lost and could not be restored
  4        the lock was lost: lost while the command ran (the command was stopped),
           or release/renew was given a token that is not the live lease
  126/127  the command could not be run / was not found
  128+N    the command was killed by signal N (or lockctl was, while it waited)

Environment:
  LOCKD_ADDR   default for --server
  The command started by `run` gets LOCKD_NAME, LOCKD_TOKEN (the fencing token) and LOCKD_ADDR.";

/// flock(1) across machines: run a command while holding a named lock on a lockd server.
///
/// `lockctl run deploy -- ./deploy.sh` waits its turn for the lock `deploy`, runs the command
/// with the fencing token in $LOCKD_TOKEN, renews the lease while it runs and releases it when
/// it exits. If the lease is lost, the command is stopped before anyone else can get the lock.
#[derive(Parser, Debug)]
#[command(name = "lockctl", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    /// lockd address as host:port.
    #[arg(short, long, global = true, env = "LOCKD_ADDR", default_value = lockd::DEFAULT_LISTEN)]
    pub server: String,

    /// How long to keep trying to reach the server at start (with backoff) before exit code 3.
    #[arg(long, global = true, default_value = "10s", value_parser = duration)]
    pub connect_timeout: Duration,

    /// This client's id on the server [default: <hostname>:<pid>]. Use one id per process.
    #[arg(long, global = true)]
    pub id: Option<String>,

    /// Say what is happening on stderr (acquired, renewed, released, who holds the lock).
    #[arg(short, long, global = true)]
    pub verbose: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hold <name> while a command runs: wait, run it, renew, release, exit with its code.
    #[command(after_help = EXIT_CODES)]
    Run(RunArgs),
    /// Take <name> with a plain lease (not tied to this process) and print its token.
    #[command(after_help = EXIT_CODES)]
    Acquire(AcquireArgs),
    /// Release <name> held with <token>.
    #[command(after_help = EXIT_CODES)]
    Release(TokenArgs),
    /// Extend the lease of <name> held with <token>.
    #[command(after_help = EXIT_CODES)]
    Renew(RenewArgs),
    /// Show who holds <name>, or every held lock.
    #[command(after_help = EXIT_CODES)]
    Status(StatusArgs),
    /// Print lock events (acquired, released, expired, dropped) as they happen, until interrupted.
    #[command(after_help = EXIT_CODES)]
    Watch(WatchArgs),
    /// Print shell completions for SHELL (bash, zsh, fish, ...).
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `lockctl man > /usr/local/share/man/man1/lockctl.1`.
    Man,
}

/// How long to wait for the lock: flock's -w and -n.
#[derive(Args, Debug, Clone)]
pub struct WaitArgs {
    /// Give up (exit code 1, see -E) if the lock is not granted within this time (e.g. 30s, 5m).
    #[arg(short, long, value_parser = duration, conflicts_with = "nonblock")]
    pub wait: Option<Duration>,

    /// Do not wait: if the lock is held, exit at once with the conflict code.
    #[arg(short, long)]
    pub nonblock: bool,

    /// Exit code when the lock is held (-n) or the wait ran out (-w).
    #[arg(short = 'E', long, default_value_t = 1)]
    pub conflict_exit_code: u8,
}

impl WaitArgs {
    /// The LOCK request's `wait=`: `None` waits as long as it takes.
    pub fn server_wait(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.wait
        }
    }
}

/// What to do when the lease is lost while the command runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLost {
    /// Stop the command's process group (SIGTERM, then SIGKILL) before the lease can end; exit 4.
    Kill,
    /// Only print a warning; the command runs on and its exit code is passed through.
    Warn,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Lock name.
    pub name: String,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Run this through /bin/sh -c instead of a command after `--` (as flock -c).
    #[arg(short = 'c', long = "command", value_name = "SHELL_COMMAND")]
    pub shell: Option<String>,

    /// Lease length. lockctl renews about every third of it; if renewals keep failing, the
    /// command is stopped before it runs out.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub ttl: Duration,

    /// What to do if the lease is lost while the command runs.
    #[arg(long, value_enum, default_value_t = OnLost::Kill)]
    pub on_lost: OnLost,

    /// Time between SIGTERM and SIGKILL when the command must be stopped (capped at ttl/4 so
    /// that the SIGKILL still lands before the lease ends).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub kill_grace: Duration,

    /// After the command exits 0, keep holding the lock and run this shell test every --poll
    /// until it exits 0; then release. For work that finishes asynchronously.
    #[arg(long, value_name = "SHELL_COMMAND")]
    pub until: Option<String>,

    /// Time between two runs of the --until test.
    #[arg(long, default_value = "5s", value_parser = duration, requires = "until")]
    pub poll: Duration,

    /// The command and its arguments (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct AcquireArgs {
    /// Lock name.
    pub name: String,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Lease length [default: the server's, 30s unless configured]. Nothing renews it: renew
    /// it with `lockctl renew` or release it with `lockctl release`.
    #[arg(long, value_parser = duration)]
    pub ttl: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct TokenArgs {
    /// Lock name.
    pub name: String,
    /// The token `acquire` printed.
    #[arg(value_parser = token)]
    pub token: u64,
}

#[derive(Args, Debug)]
pub struct RenewArgs {
    #[command(flatten)]
    pub lock: TokenArgs,

    /// New lease length from now [default: the lease's own ttl].
    #[arg(long, value_parser = duration)]
    pub ttl: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Lock name; without it, every held lock.
    pub name: Option<String>,

    /// Print JSON for scripts: an object for a named lock, an array of held locks otherwise.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Lock name; without it, every lock.
    pub name: Option<String>,
}

fn duration(s: &str) -> Result<Duration, String> {
    lockd::proto::parse_duration("duration", s).map_err(|e| e.message)
}

fn token(s: &str) -> Result<u64, String> {
    lockd::proto::parse_token(s).map_err(|e| e.message)
}
