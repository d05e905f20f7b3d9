//! Command-line flags. The doc comments are the `--help` text, so they speak to the user.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use lockd::client::Addrs;
use lockd::proto::MAX_LIMIT;

/// Every exit code, for `--help` and the man pages: flock(1) users look here first.
pub const EXIT_STATUS: &[(&str, &str)] = &[
    (
        "0",
        "success (run: the command's own exit code is passed through)",
    ),
    (
        "1",
        "the lock is held by someone else: -n found it held or -w ran out \
         (change it with -E/--conflict-exit-code)",
    ),
    (
        "2",
        "usage error (a bad flag, an address that is not host:port), \
         or the server refused the request (its ERR text is printed)",
    ),
    (
        "3",
        "the server is unreachable (after --connect-timeout), \
         or the connection was lost and could not be restored",
    ),
    (
        "4",
        "the lock was lost: lost while the command ran (the command was stopped), \
         or release/renew was given a token that is not the live lease, \
         or break found nothing of the name (or of --token) to break",
    ),
    (
        "5",
        "lockd could not serve the request for the whole wait: every try, through every \
         address, was answered ERR UNAVAILABLE (cluster mode: etcd out of reach) or lost its \
         connection, until -w ran out (with -n: at its one try per address; release and \
         renew: for --connect-timeout); status: the cluster front-end that answered has not \
         heard from etcd lately, so what it shows may be stale (a warning says so)",
    ),
    (
        "6",
        "superseded: a newer request (--supersede) took its place in the queue",
    ),
    (
        "124",
        "run --until: the --until test did not pass within --until-timeout \
         (the lock was released)",
    ),
    ("126/127", "the command could not be run / was not found"),
    (
        "128+N",
        "the command was killed by signal N (or lockctl was, while it waited)",
    ),
];

/// The variables lockctl reads that no flag stands for.
pub const SECRET_ENVIRONMENT: &[(&str, &str)] = &[(
    "LOCKD_SECRET",
    "the secret of --user (LOCKD_USER), unless --secret-file (LOCKD_SECRET_FILE) is given; \
     there is no flag for it, since a command line is visible to every user of the machine",
)];

/// The variables lockctl sets for the command `run` starts.
pub const COMMAND_ENVIRONMENT: &[(&str, &str)] = &[
    (
        "LOCKD_NAME, LOCKD_TOKEN, LOCKD_ADDR",
        "set for the command that run starts: the lock's name, its fencing token and the \
         server's address (every address of --server, comma-separated, so that a lockctl the \
         command runs fails over the same way). With several names: the first name and its \
         token",
    ),
    (
        "LOCKD_NAMES, LOCKD_TOKEN_<NAME>",
        "also set for the command: every name given to run, space-separated in the order \
         given, and each name's own fencing token (fence each resource with its own), in a \
         variable named after it: upper-cased, every byte outside A-Z and 0-9 as _ \
         (db-migrate: LOCKD_TOKEN_DB_MIGRATE). Two names that give the same variable are \
         refused (exit 2) before anything is sent",
    ),
    (
        "LOCKD_USER, LOCKD_SECRET_FILE",
        "with --user, also set for the command: LOCKD_USER, and LOCKD_SECRET_FILE (as an \
         absolute path) if the secret came from a file, so that a lockctl it runs logs in the \
         same way. lockctl never puts the secret itself in the command's environment: a secret \
         from LOCKD_SECRET reaches it only by being inherited, as any variable is",
    ),
    (
        "LOCKD_TLS, LOCKD_TLS_CA, LOCKD_CLIENT_CERT, LOCKD_CLIENT_KEY",
        "with TLS, also set for the command (LOCKD_TLS=1, and the files given, as absolute \
         paths), so that a lockctl it runs reaches the server the same way",
    ),
];

/// Printed after `--help`.
fn after_help() -> String {
    let mut text = String::from("Exit codes:\n");
    for (code, meaning) in EXIT_STATUS {
        text.push_str(&hanging(code, 9, meaning));
    }
    text.push_str("\nEnvironment:\n");
    text.push_str(&hanging(
        "LOCKD_ADDR",
        11,
        "default for --server: host:port, or several comma-separated (a:5001,b:5001)",
    ));
    for (name, meaning) in SECRET_ENVIRONMENT.iter().chain(COMMAND_ENVIRONMENT) {
        text.push_str(&hanging(name, 11, meaning));
    }
    text.push_str("\nEvery command has a man page: lockctl-run(1), lockctl-acquire(1), ...");
    text
}

/// `label` in a column `width` wide, then `text` wrapped with a hanging indent; a wider label
/// gets `text` on the lines below it.
fn hanging(label: &str, width: usize, text: &str) -> String {
    const COLUMNS: usize = 92;
    let pad = 2 + width + 1;
    let mut out = format!("  {label}");
    let mut col = out.len();
    if col >= pad {
        out.push('\n');
        col = 0;
    }
    for word in text.split_whitespace() {
        if col > pad && col + 1 + word.len() > COLUMNS {
            out.push('\n');
            col = 0;
        }
        if col < pad {
            out.push_str(&" ".repeat(pad - col));
            col = pad;
        } else {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += word.len();
    }
    out.push('\n');
    out
}

/// flock(1) across machines: run a command while holding a named lock on a lockd server.
///
/// `lockctl run deploy -- ./deploy.sh` waits its turn for the lock `deploy`, runs the command
/// with the fencing token in $LOCKD_TOKEN, renews the lease while it runs and releases it when
/// it exits. If the lease is lost, the command is stopped before anyone else can get the lock.
#[derive(Parser, Debug)]
#[command(
    name = "lockctl",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("LOCKD_COMMIT"), ")"),
    after_help = after_help(),
    subcommand_required = false,
    arg_required_else_help = true
)]
pub struct Cli {
    /// lockd address as host:port (an IPv6 address in brackets, as [::1]:5001), or several,
    /// comma-separated without spaces (a:5001,b:5001,c:5001), the front-ends of one lockd
    /// cluster: lockctl connects to the first that answers, trying them in turn, and after a
    /// lost connection reconnects to the next one (the one it lost is tried last); a request
    /// answered ERR UNAVAILABLE is sent again through the next one, with backoff, for the
    /// rest of the wait (exit 5 if none could serve it). Not for
    /// separate lockd servers: they do not know each other's locks. It has no short form: -s
    /// is --shared, as in flock(1).
    #[arg(long, global = true, env = "LOCKD_ADDR", default_value = lockd::DEFAULT_LISTEN,
          value_parser = addresses, value_name = "HOST:PORT[,HOST:PORT...]")]
    pub server: Addrs,

    /// How long to keep trying to reach the server (with backoff) before exit code 3
    /// [default: 10s for run, acquire and watch, which wait anyway; 2s for status, release,
    /// renew, run -n and acquire -n, so that a script learns at once that the server is down].
    #[arg(long, global = true, value_parser = duration)]
    pub connect_timeout: Option<Duration>,

    /// This client's id on the server [default: <hostname>:<pid>]: one holder per lockctl
    /// process, kept across its retries and failovers. Two holders given one id are one
    /// client to lockd (a LOCK again is a retry and gets the same grant).
    #[arg(long, global = true)]
    pub id: Option<String>,

    /// Say what is happening on stderr: waiting (and behind whom), acquired (with the token),
    /// each renewal, released; when -n or -w gives up, lockd's own answer too (who holds the
    /// lock, for how long, with what note, how many wait).
    #[arg(short, long, global = true)]
    pub verbose: bool,

    #[command(flatten)]
    pub auth: AuthArgs,

    #[command(flatten)]
    pub tls: TlsArgs,

    /// Print shell completions for SHELL (bash, zsh, fish, ...) and exit.
    #[arg(long, value_name = "SHELL", group = "docs")]
    pub completions: Option<clap_complete::Shell>,

    /// Print a man page (roff) and exit: lockctl(1), or with COMMAND that command's page, as
    /// `lockctl --man run` for lockctl-run(1).
    #[arg(long, value_name = "COMMAND", num_args = 0..=1, default_missing_value = "lockctl",
          group = "docs")]
    pub man: Option<String>,

    /// Write every man page (lockctl.1 and lockctl-<command>.1) into DIR and exit.
    #[arg(long, value_name = "DIR", group = "docs")]
    pub man_dir: Option<std::path::PathBuf>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Who lockctl logs in as, on a lockd started with --auth-file (proto.md, "Authentication and
/// rights"). There is no flag for the secret itself: a command line is visible to every user of
/// the machine.
#[derive(Args, Debug, Clone, Default)]
pub struct AuthArgs {
    /// Log in as NAME on a lockd started with --auth-file: every connection (reconnects
    /// too) starts with AUTH. Needs a secret, from LOCKD_SECRET or --secret-file. A wrong user
    /// or secret exits 2 at once. Against a lockd without --auth-file it does nothing.
    #[arg(
        long,
        global = true,
        env = "LOCKD_USER",
        value_name = "NAME",
        help_heading = "Authentication"
    )]
    pub user: Option<String>,

    /// Read --user's secret from the first line of FILE (its line ending stripped), instead
    /// of from LOCKD_SECRET. Keep the file readable by its user only.
    #[arg(
        long,
        global = true,
        env = "LOCKD_SECRET_FILE",
        value_name = "FILE",
        help_heading = "Authentication"
    )]
    pub secret_file: Option<PathBuf>,
}

/// How lockctl speaks TLS to a lockd started with --tls-cert (proto.md, "TLS").
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Speak TLS to lockd, trusting the system's CA bundle unless --tls-ca is given. Every
    /// connection (reconnects too) is checked: the server's certificate must be valid for the
    /// host of the --server address connected to (each front-end's for its own name) and
    /// signed by a trusted CA, or lockctl exits 3 at once, saying why.
    /// LOCKD_TLS=1 (or true, yes, on) turns it on; 0, false, no or off leave it off.
    #[arg(long, global = true, env = "LOCKD_TLS", help_heading = "TLS",
          value_parser = clap::builder::BoolishValueParser::new(),
          num_args = 0, default_missing_value = "true")]
    pub tls: bool,

    /// The CA certificate(s) (PEM) that signed lockd's certificate, trusted instead of the
    /// system's bundle. Implies --tls.
    #[arg(
        long,
        global = true,
        env = "LOCKD_TLS_CA",
        value_name = "PEM",
        help_heading = "TLS"
    )]
    pub tls_ca: Option<PathBuf>,

    /// A client certificate (PEM) to present, for a lockd that requires one (mutual TLS,
    /// lockd --tls-client-ca): its subject's common name (CN) names this client. Needs
    /// --client-key; implies --tls. Also spelled --tls-cert (its variable stays
    /// LOCKD_CLIENT_CERT: LOCKD_TLS_CERT is lockd's own certificate).
    #[arg(
        long,
        visible_alias = "tls-cert",
        global = true,
        env = "LOCKD_CLIENT_CERT",
        value_name = "PEM",
        requires = "client_key",
        help_heading = "TLS"
    )]
    pub client_cert: Option<PathBuf>,

    /// The private key (PEM) of --client-cert. Also spelled --tls-key.
    #[arg(
        long,
        visible_alias = "tls-key",
        global = true,
        env = "LOCKD_CLIENT_KEY",
        value_name = "PEM",
        requires = "client_cert",
        help_heading = "TLS"
    )]
    pub client_key: Option<PathBuf>,
}

impl TlsArgs {
    /// Whether to speak TLS: asked for, or implied by a CA or a client certificate.
    pub fn wanted(&self) -> bool {
        self.tls || self.tls_ca.is_some() || self.client_cert.is_some()
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hold <name> (or several at once) while a command runs: wait, run it, renew, release,
    /// exit with its code.
    ///
    /// lockctl waits its turn for the lock (first come, first served; -w and -n limit the
    /// wait), runs the command with LOCKD_NAME, LOCKD_TOKEN (the fencing token) and LOCKD_ADDR
    /// in its environment, renews the lease while it runs, releases the lock when the command
    /// and every process it started have exited (as flock holds it while any process that
    /// inherited it lives), and exits with the command's exit code.
    ///
    /// Several names (`lockctl run db-migrate cache-flush -- ./migrate.sh`) are one set: the
    /// command starts once it holds all of them, as one lease (one renewal renews them all,
    /// a lost lease loses them all), and they are released together. The command gets each
    /// name's token in LOCKD_TOKEN_<NAME> and the names in LOCKD_NAMES.
    ///
    /// The job is the command and every process it starts: children, grandchildren,
    /// background jobs, double-forked daemons and setsid'd processes (on Linux, through a
    /// supervisor process, lockctl-job, that is their subreaper; elsewhere only the command's
    /// process group, held until the command itself exits). Processes started through another
    /// service (systemd-run, at, cron, ssh, a container runtime) are not part of it.
    ///
    /// The job never outlives the lease: if the server says the lease is gone, or renewals
    /// keep failing, lockctl stops every process of the job (SIGTERM, then SIGKILL after
    /// --kill-grace, also to what ignores SIGTERM) before the lease can end on the server, and
    /// exits 4. SIGINT, SIGTERM and SIGHUP sent to lockctl go to every process of the job too,
    /// and what is left after --kill-grace is killed.
    ///
    /// The lease is a session lease with a grace (--session-grace): if the connection drops,
    /// lockctl reconnects (to the next address, if --server lists several) and renews within
    /// the grace, and the job runs on; if lockctl is killed, even with SIGKILL, the whole job
    /// is killed at once (on Linux) and the server frees the lock when the grace ends.
    #[command(after_help = after_help())]
    Run(RunArgs),
    /// Wait for <name> (or several at once; unless -n or -w), take it with a plain lease and
    /// print its token.
    ///
    /// The lease outlives lockctl and nothing renews it: release it with `lockctl release
    /// <name> <token>`, extend it with `lockctl renew`, or it ends at its ttl. Several names
    /// are one set, taken all at once as one lease: one token per line, in the order given;
    /// release or renew of any one of the names, with its token, applies to the whole set. The wait does
    /// not outlive lockctl: killed while it waits (a cancelled CI job), lockctl leaves the
    /// queue and is never granted the lock.
    #[command(
        after_help = after_help(),
        override_usage = "lockctl acquire [OPTIONS] <NAME>...            waits for the lock\n       \
                          lockctl acquire -w <WAIT> [OPTIONS] <NAME>...  waits at most WAIT\n       \
                          lockctl acquire -n [OPTIONS] <NAME>...         does not wait"
    )]
    Acquire(AcquireArgs),
    /// Release <name> held with <token>.
    #[command(after_help = after_help())]
    Release(TokenArgs),
    /// Extend the lease of <name> held with <token>.
    #[command(after_help = after_help())]
    Renew(RenewArgs),
    /// Show who holds <name> and who waits for it, or every held lock.
    ///
    /// With a name: every holder (id, token, how long it has held the lock, the ttl left,
    /// whether it is a session lease) and the queue in the order it will be granted (how long
    /// each has waited): why am I waiting? Without one: one line per held lock.
    #[command(after_help = after_help())]
    Status(StatusArgs),
    /// A live view of the held locks, longest queue first, refreshed every --interval.
    ///
    /// One line per held lock (or per NAME given): its mode, holder, age (how long it has been
    /// held), ttl left and queue length, sorted by queue length, then name. The age needs one
    /// more request per lock, so it is shown for the first --detail locks (and for every NAME
    /// given). At a terminal the screen is redrawn; otherwise one snapshot is printed per
    /// interval, a blank line between two. If lockd cannot be reached the view says so and
    /// tries again. SIGINT (Ctrl-C) or SIGTERM ends it with exit code 0.
    #[command(after_help = after_help())]
    Top(TopArgs),
    /// Print lock events (acquired, released, expired, dropped, broken) as they happen.
    ///
    /// One line per event: its time, kind, lock, holder id and token; with --json, one JSON
    /// object per line. SIGINT or SIGTERM ends the watch with exit code 0.
    #[command(after_help = after_help())]
    Watch(WatchArgs),
    /// Force-release <name>: end its holder's lease now (every holder's, or --token's only).
    ///
    /// For an operator freeing a lock whose holder is stuck but still renewing: the lease
    /// ends at once (no waiting for its ttl), the next waiter is granted with a higher token
    /// (so fencing still refuses the old holder), and the broken holder's next renewal is
    /// refused with who broke it (a `lockctl run` holding it stops its command, exit 4). With
    /// --auth-file on the server it needs the admin right on the name. At a terminal it shows
    /// the holder and asks first, unless -y; elsewhere -y is required. Exit 0 once broken, 1
    /// if the answer at the terminal was not yes, 4 if nothing (or no lease with --token) held
    /// the name. It is sent once: after a lost answer, look with `lockctl status` before
    /// breaking again (a BREAK that was carried out, sent again, breaks the next holder).
    #[command(after_help = after_help())]
    Break(BreakArgs),
    /// Leader election: run <service> while this process leads <name>; stand by otherwise.
    ///
    /// Every candidate runs the same `lockctl elect <name> -- <service>`: the first one leads
    /// and runs the service; the others wait as standbys, in the order they came (first come,
    /// first served), and the next one takes over when the leader's service exits, its
    /// lockctl is killed (after --session-grace) or its host goes quiet. The leader is the
    /// holder of the lock <name>, and the service runs exactly as under `lockctl run` (it is
    /// `lockctl run <name>` with a name for the purpose): with LOCKD_TOKEN, the leadership's
    /// fencing token (it rises with every new leader: a term number), and the same guarantee:
    /// no process of an old leader's service still runs when a new leader starts its own.
    /// --note is what `lockctl leader` prints with the leader's id (an address its clients
    /// use, say). Exits with the service's exit code once it has run (to stand again, run it
    /// again: `Restart=always` in a systemd unit); 4 if leadership was lost while it ran.
    #[command(after_help = after_help())]
    Elect(ElectArgs),
    /// Print the leader of <name>: its id and note, on one line (exit 1 when there is none).
    ///
    /// The leader is the holder of the lock <name> (see `lockctl elect`); a holder whose
    /// lease is over (broken, or in its lock-delay) leads no longer. With --watch, the leader
    /// now and then one line per change, until interrupted: `<id> <note>` for a new leader,
    /// `-` while there is none.
    #[command(after_help = after_help())]
    Leader(LeaderArgs),
    /// Serve lockd's locks to an AI agent as tools, over the Model Context Protocol (stdio).
    ///
    /// An MCP host (an agent, an IDE) starts `lockctl mcp` and speaks JSON-RPC on its stdin
    /// and stdout. The tools: lock (name, wait, ttl, note; returns the token), renew, unlock,
    /// and status (who holds a name, who waits). Locks are taken as this process's --id, each
    /// a session lease of its own connection to lockd: they end at their ttl unless renewed,
    /// and --session-grace after this process ends (the host stopped or died). --server,
    /// --tls and --user/--secret-file apply as for every command. Exits 0 when stdin ends.
    #[command(after_help = after_help())]
    Mcp(McpArgs),
    /// Print shell completions (the same as --completions SHELL).
    #[command(hide = true)]
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the man page (the same as --man).
    #[command(hide = true)]
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

    /// Newest wins: if the lock is held, take the whole queue (every request waiting for it is
    /// refused as superseded, the holder keeps it) and wait first in line. A lockctl whose
    /// request is superseded by a newer one exits 6. One name only (with several: exit 2).
    #[arg(long)]
    pub supersede: bool,
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

/// How the lock is held: flock's -s and -x, and semaphores.
#[derive(Args, Debug, Clone, Copy, Default)]
#[group(id = "mode", multiple = false)]
pub struct ModeArgs {
    /// Hold the lock shared (as flock -s): any number of shared holders at once, never beside
    /// an exclusive one. A shared request waits behind an exclusive one queued before it.
    #[arg(short = 's', long)]
    pub shared: bool,

    /// Hold the lock exclusively (as flock -x; the default): alone.
    #[arg(short = 'x', long, short_alias = 'e')]
    pub exclusive: bool,

    /// Hold one of N slots (1 to 100000): up to N holders at once, a semaphore. Every holder
    /// of the name must give the same N while it is held (else the server refuses: exit 2).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIMIT)))]
    pub limit: Option<u32>,
}

/// What to do when the lease is lost while the command runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLost {
    /// Stop every process of the job (SIGTERM, then SIGKILL) before the lease can end; exit 4.
    Kill,
    /// Only print a warning; the job runs on and the command's exit code is passed through.
    Warn,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Lock name, or several (`lockctl run db-migrate cache-flush -- ./migrate.sh`): a set,
    /// granted all at once or not at all, held as one lease and released together. Each name
    /// waits its turn in its own queue; two runs that give the same names in opposite orders
    /// cannot deadlock. The command gets every name's token (LOCKD_NAMES,
    /// LOCKD_TOKEN_<NAME>); at most the server's --max-names (16 unless configured). Every
    /// word before `--` (or -c) that is not an option is a name.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,

    #[command(flatten)]
    pub wait: WaitArgs,

    #[command(flatten)]
    pub mode: ModeArgs,

    /// Run this through /bin/sh -c instead of a command after `--` (as flock -c).
    #[arg(short = 'c', long = "command", value_name = "SHELL_COMMAND")]
    pub shell: Option<String>,

    /// Lease length, at least 1s. lockctl renews about every third of it (or of
    /// --session-grace, if shorter); if renewals keep failing, the command is stopped before
    /// the lease can end.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub ttl: Duration,

    /// How long the lock outlives a dropped connection: lockctl reconnects and renews within
    /// it, so the command runs on; a killed lockctl frees the lock within it. 0 frees the lock
    /// the moment the server sees the connection close [default: 10s, at most --ttl].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub session_grace: Option<Duration>,

    /// What to do if the lease is lost while the command runs.
    #[arg(long, value_enum, default_value_t = OnLost::Kill)]
    pub on_lost: OnLost,

    /// Time between SIGTERM and SIGKILL when the job must be stopped (capped at a quarter
    /// of the shorter of --ttl and --session-grace, so that the SIGKILL still lands before the
    /// lease can end).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub kill_grace: Duration,

    /// After the command exits 0, keep holding the lock and run this shell test every --poll
    /// until it exits 0; then release. For work that finishes asynchronously.
    #[arg(long, value_name = "SHELL_COMMAND")]
    pub until: Option<String>,

    /// Time between two runs of the --until test.
    #[arg(long, default_value = "5s", value_parser = duration, requires = "until")]
    pub poll: Duration,

    /// Longest time the --until test may keep failing (counted from the command's exit): then
    /// a running test is stopped, the lock released, and lockctl exits 124.
    #[arg(long, default_value = "1h", value_parser = duration, requires = "until")]
    pub until_timeout: Duration,

    /// The command and its arguments (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,

    /// A note for people, shown with the holder by status, top, watch and a refused LOCK
    /// ("release 1.4.2 by ci job 8812"): printable text, at most the server's --max-note
    /// (256 bytes unless configured). '' sends none [default: the program's name, as
    /// `deploy.sh`: never its arguments, which anyone who may read the lock would see, and
    /// which may hold a secret].
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,

    /// The note is the whole command line (cut to 256 bytes): everyone who may read the
    /// lock sees it, so only for commands without a secret in their arguments.
    #[arg(long, conflicts_with = "note")]
    pub note_command: bool,
    /// Hold the lock at least this long from its grant (e.g. 50m): if the job ends sooner, the
    /// lock is not released but stays held until then (lockd ends it; nobody renews it), so
    /// that a late host's `run -n` finds it held and skips: once per window. lockctl still
    /// exits with the command's code. Only after a normal end of the job; at most the
    /// server's --max-ttl (else it is released, with a warning).
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub at_least: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election's name: a lock name, held by the leader.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// What `lockctl leader` prints with the leader's id (its address, say): printable text,
    /// at most the server's --max-note (256 bytes unless configured) [default: the service's
    /// program name, as `lockctl run`].
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,

    /// Run this through /bin/sh -c instead of a service after `--`.
    #[arg(short = 'c', long = "command", value_name = "SHELL_COMMAND")]
    pub shell: Option<String>,

    /// Lease length, at least 1s: how long a leader that went quiet (a frozen host, a cut
    /// network) keeps leadership at most. lockctl renews about every third of it.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub ttl: Duration,

    /// How long leadership outlives a dropped connection (lockctl reconnects within it); a
    /// killed lockctl's leadership passes on when it ends [default: 10s, at most --ttl].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub session_grace: Option<Duration>,

    /// Time between SIGTERM and SIGKILL when the service must be stopped (leadership lost).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub kill_grace: Duration,

    /// The service and its arguments (after `--`).
    #[arg(last = true, value_name = "SERVICE")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct McpArgs {
    /// How long the agent's locks outlive this process (its connection to lockd): a host
    /// that restarts it within the grace, and renews, keeps them.
    #[arg(long, default_value = "30s", value_parser = duration, value_name = "DURATION")]
    pub session_grace: Duration,
}

#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// The election's name.
    pub name: String,

    /// Go on: one line per change of leader (`-` while there is none), until interrupted.
    #[arg(long)]
    pub watch: bool,
}

#[derive(Args, Debug)]
pub struct AcquireArgs {
    /// Lock name, or several: a set, granted all at once or not at all as one lease (see
    /// `lockctl run`). Prints one token per line, in the order the names were given; `release`
    /// or `renew` of any one name with its token applies to the whole set.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,

    #[command(flatten)]
    pub wait: WaitArgs,

    #[command(flatten)]
    pub mode: ModeArgs,

    /// Lease length [default: the server's, 30s unless configured]. Nothing renews it: renew
    /// it with `lockctl renew` or release it with `lockctl release`.
    #[arg(long, value_parser = duration)]
    pub ttl: Option<Duration>,

    /// A note for people, shown with the holder by status, top, watch and a refused LOCK:
    /// printable text, at most the server's --max-note (256 bytes unless configured)
    /// [default: none].
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
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
pub struct BreakArgs {
    /// Lock name.
    pub name: String,

    /// Break only the lease with this token (as STATUS shows it), not every holder's.
    #[arg(long, value_parser = token)]
    pub token: Option<u64>,

    /// Do not ask: break it (required when stdin is not a terminal).
    #[arg(short = 'y', long)]
    pub yes: bool,

    /// Hand the lock on now, without waiting for the broken holder to let go (its job may
    /// still be running). Without it, the next holder is granted once the broken holder has
    /// released the lock (lockctl run does once its job is gone) or its lease has run out.
    #[arg(long)]
    pub force: bool,
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
    /// Lock name; without it, every held lock; `<prefix>*` (quoted for the shell, as
    /// 'deploy/*'), every held lock whose name starts with <prefix>, listed as without a name.
    pub name: Option<String>,

    /// Print JSON for scripts. Without a name, an array of held locks: {"name","held":true,
    /// "id","token","ttl_ms","session" (of the first holder),"waiters" (queue length),
    /// "holder_count","mode" ("exclusive", "shared" or "limit:N", with "limit":N)}. With a
    /// name, one such object (or {"name","held":false}) with two arrays more: "holders"
    /// [{"id","token","held_ms","ttl_ms","session","mode"}] and "queue"
    /// [{"position","id","waited_ms","session","mode"}] in the order it will be granted (at
    /// most the first 1000; "waiters" counts them all). A holder that gave a note (LOCK ...
    /// note=, lockctl --note) has "note" too, in the lock's object and in its holder's; a
    /// holder or waiter that is a set of names has "and", the set's other names.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Show only these locks (free ones too), each with its age; without any, every held lock.
    /// `<prefix>*` (quoted: 'deploy/*') shows the held locks whose names start with <prefix>.
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,

    /// Time between two refreshes (at least 100ms).
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub interval: Duration,

    /// How many locks (those with the longest queues) get their age shown: each costs one
    /// more request per refresh.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub detail: usize,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Lock name; without it, every lock; `<prefix>*` (quoted: 'deploy/*'), every lock whose
    /// name starts with <prefix>.
    pub name: Option<String>,

    /// Print one JSON object per event, for scripts: {"event":"acquired","name":..,"id":..,
    /// "token":..,"unix_ms":..,"time":"<RFC 3339>"}.
    #[arg(long)]
    pub json: bool,
}

/// Checks every `host:port` of a comma-separated list before anything connects, so that a
/// typo is a usage error at once and not a connect timeout's worth of retries. A list is
/// strict (no spaces, no empty entries): it is the same string LOCKD_ADDR hands on to the
/// command of `run`, and to the Python and bash clients, which read it the same way.
fn addresses(s: &str) -> Result<Addrs, String> {
    if !s.contains(',') {
        return Ok(Addrs::one(address(s)?));
    }
    let mut list = Vec::new();
    for part in s.split(',') {
        if part.is_empty() {
            return Err(format!(
                "{s:?} has an empty entry: give host:port,host:port,... (commas between \
                 addresses only)"
            ));
        }
        if part.trim() != part {
            return Err(format!(
                "{part:?} in {s:?}: no spaces around the commas (a:5001,b:5001)"
            ));
        }
        list.push(address(part).map_err(|e| format!("{part:?} in {s:?}: {e}"))?);
    }
    Addrs::new(list).ok_or_else(|| format!("{s:?} has no address"))
}

/// Checks one `host:port`.
fn address(s: &str) -> Result<String, String> {
    let example = lockd::DEFAULT_LISTEN;
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("no port: give host:port, as {example}"));
    };
    if !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
        return Err(format!(
            "{port:?} is not a port (1 to 65535); give host:port, as {example}"
        ));
    }
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        }
    };
    if !host_ok {
        return Err(format!(
            "{host:?} is not a host name or IP address (an IPv6 address goes in brackets, \
             as [::1]:5001)"
        ));
    }
    Ok(s.to_owned())
}

/// lockctl's old `-s host:port`: `-s` is `--shared` now, as in flock(1). Without this check
/// the address would be taken for a lock name or a command, and fail far from the cause (or,
/// worse, succeed against the default server). Returns the message that says what to write
/// instead: the same command line with `--server`. Only the words before `--` are looked at.
pub fn old_server_flag(args: &[String]) -> Option<String> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    for i in 1..end {
        let word = &args[i];
        let Some(flags) = word.strip_prefix('-').filter(|f| !f.starts_with('-')) else {
            continue;
        };
        // `-s ADDR` (also at the end of a cluster, as `-vs ADDR`), `-sADDR` or `-s=ADDR`.
        let (kept, value, next) =
            if flags.ends_with('s') && flags.chars().all(|c| c.is_ascii_alphabetic()) {
                let Some(value) = args.get(i + 1).filter(|_| i + 1 < end) else {
                    continue;
                };
                (&flags[..flags.len() - 1], value.as_str(), i + 2)
            } else if let Some(value) = flags.strip_prefix('s') {
                ("", value.strip_prefix('=').unwrap_or(value), i + 1)
            } else {
                continue;
            };
        if addresses(value).is_err() {
            continue;
        }
        let mut fixed: Vec<String> = vec!["lockctl".into()];
        fixed.extend(args[1..i].iter().cloned());
        if !kept.is_empty() {
            fixed.push(format!("-{kept}"));
        }
        fixed.extend(["--server".to_owned(), value.to_owned()]);
        fixed.extend(args[next..].iter().cloned());
        let fixed: Vec<String> = fixed.iter().map(|w| shell_word(w)).collect();
        return Some(format!(
            "-s is --shared now, as in flock(1); give the server with --server host:port \
             (or LOCKD_ADDR):\n  {}\n(for a shared lock named {value}, write --shared {value})",
            fixed.join(" ")
        ));
    }
    None
}

/// `word` as a shell would need it: as it is if it is plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,[]".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    lockd::proto::parse_duration("duration", s).map_err(|e| e.message)
}

fn token(s: &str) -> Result<u64, String> {
    lockd::proto::parse_token(s).map_err(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::old_server_flag;

    fn check(line: &str) -> Option<String> {
        let args: Vec<String> = line.split(' ').map(str::to_owned).collect();
        old_server_flag(&args)
    }

    #[test]
    fn the_old_server_flag_is_caught_and_rewritten() {
        for (line, fixed) in [
            (
                "lockctl -s 10.0.0.1:5001 status",
                "lockctl --server 10.0.0.1:5001 status",
            ),
            (
                "lockctl run x -s locks:5001 -- true",
                "lockctl run x --server locks:5001 -- true",
            ),
            (
                "lockctl run x -vs [::1]:5001 -c true",
                "lockctl run x -v --server [::1]:5001 -c true",
            ),
            (
                "lockctl -slocks:5001 acquire x",
                "lockctl --server locks:5001 acquire x",
            ),
            (
                "lockctl -s=locks:5001 acquire x",
                "lockctl --server locks:5001 acquire x",
            ),
        ] {
            let message = check(line).unwrap_or_else(|| panic!("{line}"));
            assert!(message.contains(&format!("\n  {fixed}\n")), "{message}");
        }
        for line in [
            "lockctl run x -s -- true",
            "lockctl run -s deploy -- true",
            "lockctl acquire x -s",
            "lockctl run x -- ssh -s host:22",
            "lockctl --shared run x:1 -- true",
        ] {
            assert_eq!(check(line), None, "{line}");
        }
    }

    #[test]
    fn a_list_of_addresses_is_checked_whole() {
        let list = super::addresses("a:5001,[::1]:5002,10.0.0.3:5003").expect("three");
        assert_eq!(list.to_string(), "a:5001,[::1]:5002,10.0.0.3:5003");
        assert_eq!(list.len(), 3);
        assert_eq!(super::addresses("a:5001").expect("one").len(), 1);
        for (bad, says) in [
            ("a:5001,", "empty entry"),
            (",a:5001", "empty entry"),
            ("a:5001,,b:5001", "empty entry"),
            ("a:5001, b:5001", "no spaces"),
            ("a:5001,b", "\"b\" in \"a:5001,b\": no port"),
            ("a:5001,b:0", "is not a port"),
        ] {
            let e = super::addresses(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        // The old -s with a list is caught too.
        let message = check("lockctl -s a:5001,b:5001 status").expect("caught");
        assert!(
            message.contains("\n  lockctl --server a:5001,b:5001 status\n"),
            "{message}"
        );
    }

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(super::shell_word("a:1"), "a:1");
        assert_eq!(super::shell_word("it's x"), r"'it'\''s x'");
        assert_eq!(super::shell_word(""), "''");
    }
}
