//! lockd: the lock server.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::{CommandFactory, Parser};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use lockd::auth::Gate;
use lockd::http::Endpoint;
use lockd::locks::Limits;
use lockd::server::{self, Config};

/// A small, fast lock server: named locks with leases, FIFO waiters and fencing tokens over a
/// line protocol (see proto.md). Try it with `nc 127.0.0.1 5001` and type HELP.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Address to listen on [default: 127.0.0.1:5001; with --compat, 127.0.0.1:5003].
    #[arg(long, env = "LOCKD_LISTEN")]
    listen: Option<String>,

    /// Lease length of a LOCK without ttl= (e.g. 30s, 5m).
    #[arg(long, env = "LOCKD_DEFAULT_TTL", default_value = "30s", value_parser = duration)]
    default_ttl: Duration,

    /// Longest lease a LOCK or RENEW may ask for; longer is refused with ERR BADARG.
    #[arg(long, env = "LOCKD_MAX_TTL", default_value = "24h", value_parser = duration)]
    max_ttl: Duration,

    /// Most client connections at once; more get ERR LIMIT and are closed.
    #[arg(long, env = "LOCKD_MAX_CONNECTIONS", default_value_t = lockd::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    max_connections: usize,

    /// Most client connections at once from one address (never more than --max-connections);
    /// more from it get ERR LIMIT and are closed, other addresses are unaffected.
    #[arg(long, env = "LOCKD_MAX_CONNECTIONS_PER_IP",
          default_value_t = lockd::DEFAULT_MAX_CONNECTIONS_PER_IP,
          value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    max_connections_per_ip: usize,

    /// Longest request line in bytes; a longer one gets ERR TOOLONG and the connection is closed.
    #[arg(long, env = "LOCKD_MAX_LINE", default_value_t = lockd::DEFAULT_MAX_LINE,
          value_parser = clap::value_parser!(u32).range(64..=1_048_576).map(|v| v as usize))]
    max_line: usize,

    /// Longest lock name or client id in bytes; longer ones get ERR BADARG.
    #[arg(long, env = "LOCKD_MAX_NAME", default_value_t = lockd::proto::MAX_NAME_LEN,
          value_parser = clap::value_parser!(u32).range(1..=255).map(|v| v as usize))]
    max_name: usize,

    /// Most leases held at once (each holder of a shared lock or semaphore counts one); a LOCK
    /// granted at once past it gets ERR LIMIT.
    #[arg(long, env = "LOCKD_MAX_LOCKS", default_value_t = lockd::DEFAULT_MAX_LOCKS,
          value_parser = clap::value_parser!(u64).range(1..).map(|v| v as usize))]
    max_locks: usize,

    /// Most waiters one lock may have; a LOCK that would queue past it gets ERR LIMIT.
    #[arg(long, env = "LOCKD_MAX_WAITERS", default_value_t = lockd::DEFAULT_MAX_WAITERS,
          value_parser = clap::value_parser!(u64).range(1..).map(|v| v as usize))]
    max_waiters: usize,

    /// Events a watcher may fall behind before it gets ERR LAGGED and is disconnected.
    #[arg(long, env = "LOCKD_WATCH_BUFFER", default_value_t = lockd::DEFAULT_WATCH_BUFFER,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576).map(|v| v as usize))]
    watch_buffer: usize,

    /// How long a client may leave replies unread before it is disconnected: each 16 KiB
    /// of a reply, event stream or STATUS answer must be taken within it.
    #[arg(long, env = "LOCKD_WRITE_TIMEOUT", default_value = "30s", value_parser = duration)]
    write_timeout: Duration,

    /// How long a connection that holds no session lease, waits for nothing and watches
    /// nothing may send no request line before it gets ERR LIMIT and is closed; 0 turns it off.
    #[arg(long, env = "LOCKD_IDLE_TIMEOUT", default_value = "10m", value_parser = duration)]
    idle_timeout: Duration,

    /// How long the start of a request line may wait for its newline before the connection
    /// gets ERR LIMIT and is closed (a client that trickles bytes); 0 turns it off.
    #[arg(long, env = "LOCKD_LINE_TIMEOUT", default_value = "30s", value_parser = duration)]
    line_timeout: Duration,

    /// Most copies of the lock table that STATUS answers being sent may hold at once (every
    /// STATUS made while the table does not change shares one); a STATUS that needs another
    /// waits until one is done.
    #[arg(long, env = "LOCKD_STATUS_COPIES", default_value_t = lockd::DEFAULT_STATUS_COPIES,
          value_parser = clap::value_parser!(u32).range(1..=1024).map(|v| v as usize))]
    status_copies: usize,

    /// How long shutdown (SIGINT/SIGTERM) lets connections finish before closing them.
    #[arg(long, env = "LOCKD_SHUTDOWN_GRACE", default_value = "5s", value_parser = duration)]
    shutdown_grace: Duration,

    /// How long a grant to a waiter that had half-closed is watched for a reset (its client
    /// was gone); a reset takes the grant back and grants the next waiter. Must exceed the
    /// network's round trip; 0 turns the check off.
    #[arg(long, env = "LOCKD_HALF_CLOSE_PROBE", default_value = "500ms", value_parser = duration)]
    half_close_probe: Duration,

    /// Keep locks durably in this directory (created if missing): a grant, renew or release is
    /// on disk before its OK, and a restart restores every lease that has not ended.
    /// Without it, locks live in memory only and a restart forgets every holder.
    /// Not used in cluster mode (--etcd), where etcd keeps the locks.
    #[arg(long, env = "LOCKD_DATA_DIR")]
    data_dir: Option<PathBuf>,

    /// Cluster mode: keep every lock in this etcd cluster (client URLs, comma separated, e.g.
    /// http://10.0.0.1:2379,http://10.0.0.2:2379), so that any number of lockd front-ends
    /// serve the same locks and losing one machine loses no lock. Needs a lockd built with
    /// the `etcd` feature. Without it, locks live in this process (see --data-dir).
    #[arg(long, env = "LOCKD_ETCD", value_name = "URLS", value_delimiter = ',')]
    etcd: Vec<String>,

    /// The etcd key prefix of this deployment: front-ends with the same --etcd and prefix
    /// share their locks; another prefix is another, separate set of locks.
    #[arg(long, env = "LOCKD_ETCD_PREFIX", default_value = lockd::DEFAULT_ETCD_PREFIX)]
    etcd_prefix: String,

    /// How long one etcd request may take; past it the client is answered ERR UNAVAILABLE
    /// (etcd unreachable or without quorum) and may try again (a LOCK tried again with the
    /// same id gets the grant if the first one was made after all).
    #[arg(long, env = "LOCKD_ETCD_REQUEST_TIMEOUT", default_value = "2s", value_parser = duration)]
    etcd_request_timeout: Duration,

    /// How long to keep trying to reach etcd at start before giving up.
    #[arg(long, env = "LOCKD_ETCD_CONNECT_TIMEOUT", default_value = "5s", value_parser = duration)]
    etcd_connect_timeout: Duration,

    /// This front-end's etcd lease, in whole seconds (at least 1s; etcd may round it up to
    /// 1.5 election timeouts): its session leases and waiters end within about this long
    /// after it dies, and it keeps them only while etcd hears from it within this long.
    #[arg(long, env = "LOCKD_ETCD_LEASE_TTL", default_value = "5s", value_parser = duration)]
    etcd_lease_ttl: Duration,

    /// Serve the line protocol over TLS with this certificate (PEM; the chain, leaf first).
    /// Needs --tls-key. The --compat ports stay plain.
    #[arg(long, env = "LOCKD_TLS_CERT", value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "LOCKD_TLS_KEY", value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Mutual TLS: clients must present a certificate signed by this CA (PEM). With
    /// --auth-file, a certificate whose common name (CN) is a user logs its connection in as
    /// that user (no AUTH).
    #[arg(
        long,
        env = "LOCKD_TLS_CLIENT_CA",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,

    /// How long a TLS client may take to complete its handshake before it is closed.
    #[arg(long, env = "LOCKD_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = duration)]
    tls_handshake_timeout: Duration,

    /// Serve Prometheus metrics at http://ADDR/metrics, with /healthz (the process is up)
    /// and /readyz (ready to grant: state recovered, data directory writable). Off by default.
    #[arg(long, env = "LOCKD_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,

    /// Lock names that get series of their own in /metrics (lockd_lock_holders,
    /// lockd_lock_waiters, lockd_lock_held_seconds), comma-separated; at most 100.
    #[arg(
        long,
        env = "LOCKD_METRICS_NAMES",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    metrics_names: Vec<String>,

    /// Require clients to authenticate: the users, their hashed secrets and their rights, one
    /// `user <name> <hash> [lock=<patterns>] [read=<patterns>]` line each (see proto.md).
    /// Before AUTH only PING, HELP and QUIT work. SIGHUP reloads the file. Without it, every
    /// client may do everything: for trusted networks only.
    #[arg(long, env = "LOCKD_AUTH_FILE", value_name = "FILE")]
    auth_file: Option<PathBuf>,

    /// Print an --auth-file line for USER (and its rights: "alice lock=ci-* read=*") with the
    /// secret read from standard input (one line, at least 16 bytes), and exit.
    #[arg(long, value_name = "USER [RIGHTS]", group = "docs")]
    auth_hash: Option<String>,

    /// Like --auth-hash, but make a strong random secret (256 bits, 64 hex digits): the
    /// --auth-file line goes to standard output, the secret to standard error, once; and exit.
    #[arg(long, value_name = "USER [RIGHTS]", group = "docs")]
    auth_hash_new: Option<String>,

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
    #[command(flatten)]
    compat: lockd::compat::CompatArgs,
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
    environment: &[(
        "RUST_LOG",
        "Log filter (as lockd=debug); when set, it takes precedence over -v.",
    )],
    exit_status: &[
        ("0", "shut down cleanly (SIGINT or SIGTERM)"),
        (
            "1",
            "cannot listen on an address (--listen, --metrics-listen), or the server failed",
        ),
        (
            "2",
            "usage error: a bad flag or flag value, an --auth-file that can't be read or \
             parsed, or --compat with --auth-file without --compat-no-auth",
        ),
    ],
    see_also: &["lockctl(1)"],
};

/// --completions, --man and --man-dir; `None` when none was asked for.
fn docs(args: &Args) -> Option<std::io::Result<()>> {
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

/// Most names `--metrics-names` may list: each adds series to every scrape.
const MAX_METRICS_NAMES: usize = 100;

fn duration(s: &str) -> Result<Duration, String> {
    lockd::proto::parse_duration("duration", s).map_err(|e| e.message)
}

impl Args {
    fn config(&self) -> Result<Config, String> {
        if self.default_ttl < lockd::MIN_TTL || self.max_ttl < lockd::MIN_TTL {
            return Err(format!(
                "--default-ttl and --max-ttl must be at least {}",
                humantime::format_duration(lockd::MIN_TTL)
            ));
        }
        if self.write_timeout.is_zero() {
            return Err("--write-timeout must be more than 0".into());
        }
        if self.default_ttl > self.max_ttl {
            return Err("--default-ttl must not exceed --max-ttl".into());
        }
        if self.tls_handshake_timeout.is_zero() {
            return Err("--tls-handshake-timeout must be more than 0".into());
        }
        if self.metrics_names.len() > MAX_METRICS_NAMES {
            return Err(format!(
                "--metrics-names lists {} names; at most {MAX_METRICS_NAMES}",
                self.metrics_names.len()
            ));
        }
        for name in &self.metrics_names {
            lockd::proto::validate_name("--metrics-names entry", name).map_err(|e| e.message)?;
        }
        if self.compat.compat && self.auth_file.is_some() && !self.compat.compat_no_auth {
            return Err("--compat serves the old two-port protocol, which has no \
                        authentication: anyone who reaches its ports can take and release the \
                        lock --compat-name, whatever --auth-file says. Add --compat-no-auth \
                        (LOCKD_COMPAT_NO_AUTH=1) to run both anyway, with those ports \
                        firewalled to trusted clients, or drop --compat"
                .into());
        }
        if !self.etcd.is_empty() {
            if !cfg!(feature = "etcd") {
                return Err("--etcd needs a lockd built with the etcd feature \
                            (cargo build --release --features etcd; it needs protoc)"
                    .into());
            }
            if self.etcd_request_timeout.is_zero() || self.etcd_connect_timeout.is_zero() {
                return Err(
                    "--etcd-request-timeout and --etcd-connect-timeout must be more than 0".into(),
                );
            }
            if self.etcd_lease_ttl < Duration::from_secs(1) {
                return Err("--etcd-lease-ttl must be at least 1s".into());
            }
            if self.etcd_prefix.is_empty() {
                return Err("--etcd-prefix must not be empty".into());
            }
        }
        Ok(Config {
            limits: Limits {
                default_ttl: self.default_ttl,
                max_ttl: self.max_ttl,
                max_locks: self.max_locks,
                max_waiters: self.max_waiters,
            },
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            max_line: self.max_line,
            max_name: self.max_name,
            watch_buffer: self.watch_buffer,
            write_timeout: self.write_timeout,
            idle_timeout: self.idle_timeout,
            line_timeout: self.line_timeout,
            status_copies: self.status_copies,
            shutdown_grace: self.shutdown_grace,
            half_close_probe: self.half_close_probe,
            compat: self.compat.config(self.max_ttl)?,
            // In cluster mode etcd is the durable store (warned about in `main`).
            data_dir: self.data_dir.clone().filter(|_| self.etcd.is_empty()),
            etcd: (!self.etcd.is_empty()).then(|| lockd::backend::EtcdConfig {
                endpoints: self.etcd.clone(),
                prefix: self.etcd_prefix.clone(),
                request_timeout: self.etcd_request_timeout,
                connect_timeout: self.etcd_connect_timeout,
                lease_ttl: self.etcd_lease_ttl,
            }),
            endpoint: None,
            auth: None,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(lockd::tls::server(
                    cert,
                    key,
                    self.tls_client_ca.as_deref(),
                )?),
                _ => None,
            },
            tls_handshake_timeout: self.tls_handshake_timeout,
        })
    }
}

/// Raises the open-files limit towards what `--max-connections` needs (each connection is a
/// file descriptor), as far as the hard limit allows, and warns if that is not enough.
#[cfg(unix)]
fn raise_fd_limit(max_connections: usize) {
    // Connections, plus listeners, the data files and some slack.
    let want = max_connections.saturating_add(64) as libc::rlim_t;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    if lim.rlim_cur < want {
        let raised = libc::rlimit {
            rlim_cur: want.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    if lim.rlim_cur < want {
        tracing::warn!(
            open_files = lim.rlim_cur,
            max_connections,
            "the open-files limit is below --max-connections; connections past it will fail to be accepted"
        );
    }
}

#[cfg(not(unix))]
fn raise_fd_limit(_max_connections: usize) {}

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

/// Cancels `token` on the first SIGINT or SIGTERM.
async fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("signal received");
    token.cancel();
}

/// Reloads the auth file on every SIGHUP. A file that fails to load is logged (never a
/// secret: errors name the line and what is wrong with it) and the users in force stay.
/// Without an auth file SIGHUP is caught all the same and logged: a `systemctl reload`
/// (the unit's ExecReload) must never stop the server.
/// Registers the handler at once (before the server accepts anything), and returns the task
/// that reloads.
#[cfg(unix)]
fn reload_on_hangup(
    auth: Option<(Arc<Gate>, PathBuf)>,
) -> impl std::future::Future<Output = ()> + Send {
    use tokio::signal::unix::{signal, SignalKind};
    let hangups = signal(SignalKind::hangup());
    async move {
        let mut hangups = match hangups {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(target: "lockd::auth", error = %e, "cannot catch SIGHUP");
                return;
            }
        };
        reload_each(&mut hangups, auth).await;
    }
}

#[cfg(unix)]
async fn reload_each(
    hangups: &mut tokio::signal::unix::Signal,
    auth: Option<(Arc<Gate>, PathBuf)>,
) {
    while hangups.recv().await.is_some() {
        let Some((gate, path)) = &auth else {
            tracing::info!(target: "lockd::auth", "SIGHUP: no --auth-file, nothing to reload");
            continue;
        };
        match gate.reload(path) {
            Ok(users) => tracing::info!(
                target: "lockd::auth",
                file = %path.display(),
                users,
                "auth file reloaded"
            ),
            Err(e) => tracing::error!(
                target: "lockd::auth",
                error = %e,
                "auth file not reloaded; the users loaded before stay in force"
            ),
        }
    }
}

#[cfg(not(unix))]
fn reload_on_hangup(
    _auth: Option<(Arc<Gate>, PathBuf)>,
) -> impl std::future::Future<Output = ()> + Send {
    std::future::ready(())
}

/// Loads `--auth-file`, for the start: its users, or why not.
fn load_users(path: &Path) -> Result<Arc<Gate>, String> {
    let users = lockd::auth::load(path, None).map_err(|e| format!("--auth-file {e}"))?;
    if users.is_empty() {
        tracing::warn!(
            target: "lockd::auth",
            file = %path.display(),
            "the auth file has no users: every command but PING, HELP, QUIT is refused"
        );
    } else {
        tracing::info!(target: "lockd::auth", file = %path.display(), users = users.len(), "auth file loaded");
    }
    Ok(Gate::new(users))
}

/// `--auth-hash` and `--auth-hash-new`: prints an auth file line; `None` when neither was
/// asked for.
fn auth_hash(args: &Args) -> Option<Result<(), String>> {
    let (spec, new) = match (&args.auth_hash, &args.auth_hash_new) {
        (Some(spec), _) => (spec, false),
        (None, Some(spec)) => (spec, true),
        (None, None) => return None,
    };
    Some((|| {
        let secret = if new {
            lockd::auth::hex(&random_bytes::<32>()?)
        } else {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| format!("cannot read the secret from standard input: {e}"))?;
            line.trim_end_matches(['\n', '\r']).to_owned()
        };
        let line = lockd::auth::user_line(spec, &secret, random_bytes()?)?;
        println!("{line}");
        if new {
            let user = spec.split_whitespace().next().unwrap_or_default();
            eprintln!("secret of {user} (shown only now; give it to its clients): {secret}");
        }
        Ok(())
    })())
}

/// `N` bytes from the system's random source.
fn random_bytes<const N: usize>() -> Result<[u8; N], String> {
    use std::io::Read as _;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read random bytes from /dev/urandom: {e}"))?;
    Ok(bytes)
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
    if let Some(done) = auth_hash(&args) {
        return exit_status(done, 2);
    }
    if let Some(written) = docs(&args) {
        return exit_status(written, 1);
    }
    init_logging(args.verbose, args.log_format);
    if let (false, Some(dir)) = (args.etcd.is_empty(), &args.data_dir) {
        tracing::warn!(dir = %dir.display(), "cluster mode: --data-dir is not used (etcd keeps the locks)");
    }
    let mut config = match args.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lockd: {e}");
            return ExitCode::from(2);
        }
    };
    let mut reloadable = None;
    if let Some(path) = &args.auth_file {
        match load_users(path) {
            Ok(gate) => {
                reloadable = Some((Arc::clone(&gate), path.clone()));
                config.auth = Some(gate);
            }
            Err(e) => {
                eprintln!("lockd: {e}");
                return ExitCode::from(2);
            }
        }
    }
    tokio::spawn(reload_on_hangup(reloadable));
    let listen = args
        .listen
        .as_deref()
        .unwrap_or(args.compat.default_listen());
    raise_fd_limit(config.max_connections);
    let listener = match TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("lockd: cannot listen on {listen}: {e}");
            return ExitCode::from(1);
        }
    };
    let shutdown = CancellationToken::new();
    if let Some(addr) = &args.metrics_listen {
        let metrics_listener = match TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("lockd: cannot listen for metrics on {addr}: {e}");
                return ExitCode::from(1);
            }
        };
        let endpoint = Endpoint::new(args.metrics_names.clone());
        config.endpoint = Some(endpoint.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = endpoint.run(metrics_listener, stop).await {
                tracing::error!(error = %e, "the metrics endpoint failed");
            }
        });
    }
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    match server::run(config, listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockd: {e}");
            ExitCode::from(1)
        }
    }
}
