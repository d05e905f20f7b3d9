//! lockd: the lock server. This binary parses its flags and calls the library: the server's
//! flags, their checks and the daemon's assembly are [`lockd::daemon`]'s.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use tracing_subscriber::EnvFilter;

use lockd::daemon::{self, Flags};

/// A small, fast lock server: named locks with leases, FIFO waiters and fencing tokens over a
/// line protocol (see proto.md). Try it with `nc 127.0.0.1 5001` and type HELP.
#[derive(Parser, Debug)]
#[command(version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("LOCKD_COMMIT"), ")"), about, long_about = None)]
struct Args {
    #[command(flatten)]
    server: Flags,

    // The flags of this binary alone, back under the plain "Options" heading (after the
    // compat flags' own heading in `server`).
    #[command(flatten, next_help_heading = None::<&str>)]
    exits: Exits,
}

/// The flags that print something and exit, and the logging ones.
#[derive(clap::Args, Debug)]
struct Exits {
    /// Print an --auth-file line for USER (and its rights: "alice lock=ci-* read=*") with the
    /// secret read from standard input (one line, at least 16 bytes), and exit.
    #[arg(long, value_name = "USER [RIGHTS]", group = "docs")]
    auth_hash: Option<String>,

    /// Like --auth-hash, but make a strong random secret (256 bits, 64 hex digits): the
    /// --auth-file line goes to standard output, the secret to standard error, once; and exit.
    #[arg(long, value_name = "USER [RIGHTS]", group = "docs")]
    auth_hash_new: Option<String>,

    /// With --auth-hash-new: write the new secret alone to FILE (one line), a new file
    /// readable by its owner only (refused if FILE exists), instead of saying it on standard
    /// error (a script's clean way to take it, as lockctl's --secret-file reads it), and exit.
    #[arg(long, value_name = "FILE", requires = "auth_hash_new")]
    auth_secret_out: Option<std::path::PathBuf>,

    /// Log format on stderr: text (for people) or json (one object per line, for machines).
    #[arg(long, env = "LOCKD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// More logging: -v logs every grant, release and expiry; -vv and -vvv more still.
    /// RUST_LOG, when set, takes precedence.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,

    /// Print shell completions for SHELL (bash, zsh, fish, ...) and exit.
    #[arg(long, value_name = "SHELL", group = "docs")]
    completions: Option<clap_complete::Shell>,

    /// Print the man page (roff) and exit.
    #[arg(long, group = "docs")]
    man: bool,

    /// Write the man page (lockd.1) into DIR and exit.
    #[arg(long, value_name = "DIR", group = "docs")]
    man_dir: Option<PathBuf>,
}

/// What lockd's man page says beyond its flags.
const MAN_PAGE: lockd::docgen::ManPage = lockd::docgen::ManPage {
    summary: Some("the lock server: named leases, FIFO waiters and fencing tokens over TCP"),
    description: Some(
        "lockd serves named locks on one TCP port, over a line protocol (see proto.md) that \
         `nc` can speak: try `nc 127.0.0.1 5001` and type HELP. A lock is held with a lease \
         (a holder that dies loses it when its ttl ends), waiters are served first come, \
         first served, and every grant carries a fencing token larger than every earlier \
         one. Without --data-dir, locks live in memory and a restart forgets every holder; \
         with it, every grant, renewal and release is on disk before its OK. lockctl(1) is \
         the client. Every flag can also be set by an environment variable (see \
         ENVIRONMENT).",
    ),
    environment: &[
        (
            "RUST_LOG",
            "Log filter (as lockd=debug); when set, it takes precedence over -v.",
        ),
        (
            "LOCKD_ETCD_PASSWORD",
            "The password of --etcd-user (or --etcd-password-file): no flag carries it, \
             because a process's flags show in ps.",
        ),
    ],
    exit_status: &[
        ("0", "shut down cleanly (SIGINT or SIGTERM)"),
        (
            "1",
            "cannot listen on an address (--listen, --metrics-listen), or the server failed",
        ),
        (
            "2",
            "usage error: a bad flag or flag value, an --auth-file that can't be read or \
             parsed, --compat with --auth-file without --compat-no-auth, or etcd refusing \
             this front-end at start (its certificates, --etcd-user or its password, the \
             rights on --etcd-prefix, or a file of --etcd-ca and the like that can't be used)",
        ),
    ],
    see_also: &["lockctl(1)"],
};

/// --completions, --man and --man-dir; `None` when none was asked for.
fn docs(args: &Exits) -> Option<std::io::Result<()>> {
    let mut out = std::io::stdout();
    if let Some(shell) = args.completions {
        return Some(lockd::docgen::completions(Args::command(), shell, &mut out));
    }
    if args.man {
        return Some(lockd::docgen::man(Args::command(), &MAN_PAGE, &mut out));
    }
    let dir = args.man_dir.as_ref()?;
    let mut page = Vec::new();
    Some(
        lockd::docgen::man(Args::command(), &MAN_PAGE, &mut page)
            .and_then(|()| std::fs::write(dir.join("lockd.1"), page)),
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The log on stderr. Here and not in the library: a library sets no global subscriber, and
/// the JSON format's serde_json stays out of the library's dependencies.
fn init_logging(verbose: u8, format: LogFormat) {
    let default = match verbose {
        0 => "warn,lockd::server=info,lockd::compat=info,lockd::http=info,lockd::auth=info",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // Fields at the top level of each object, so `jq .name` finds them.
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

/// `--auth-hash` and `--auth-hash-new`: prints an auth file line; `None` when neither was
/// asked for.
fn auth_hash(args: &Exits) -> Option<Result<(), String>> {
    match (&args.auth_hash, &args.auth_hash_new) {
        (Some(spec), _) => Some(daemon::print_auth_line(spec, None)),
        (None, Some(spec)) => Some(daemon::print_auth_line(
            spec,
            Some(args.auth_secret_out.as_deref()),
        )),
        (None, None) => None,
    }
}

/// Success, or `failure` after the error on stderr: for the flags that print and exit.
fn exit_status<E: std::fmt::Display>(done: Result<(), E>, failure: u8) -> ExitCode {
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockd: {e}");
            ExitCode::from(failure)
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(done) = auth_hash(&args.exits) {
        return exit_status(done, 2);
    }
    if let Some(written) = docs(&args.exits) {
        return exit_status(written, 1);
    }
    init_logging(args.exits.verbose, args.exits.log_format);
    match daemon::run(args.server).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit_status(Err(&e), e.exit_status()),
    }
}
