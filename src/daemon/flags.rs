//! lockd's server flags ([`Flags`]): what each means (their doc comments are `--help`), their
//! defaults (the crate's `DEFAULT_*` constants, and nowhere else), the checks a start makes
//! before it touches the network ([`Flags::validate`]) and the [`server::Config`] they make.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::Args;

use crate::backend::{EtcdConfig, EtcdSecurity, ETCD_PASSWORD_ENV};
use crate::compat::CompatArgs;
use crate::locks::Limits;
use crate::proto::HumanDuration;
use crate::server;

/// Most names `--metrics-names` may list: each adds series to every scrape.
const MAX_METRICS_NAMES: usize = 100;
/// `--web-locks`: the default, and the most (each shown lock costs a STATUS detail a board).
const DEFAULT_WEB_LOCKS: usize = 200;
const MAX_WEB_LOCKS: usize = 10_000;
/// `--web-viewers`: the default, and the most.
const DEFAULT_WEB_VIEWERS: usize = 32;
const MAX_WEB_VIEWERS: usize = 10_000;
/// Longest --max-note: the journal keeps a note with a 16-bit length.
const MAX_MAX_NOTE: usize = 65_535;
/// Largest --max-names: a set is granted in one etcd transaction, and etcd bounds the
/// operations of one (128 by default); a set takes a few per name.
const MAX_MAX_NAMES: usize = 32;

/// The shortest `--etcd-lease-ttl`: etcd leases are granted in whole seconds.
const MIN_ETCD_LEASE_TTL: Duration = Duration::from_secs(1);

/// Every flag of the server itself, as `lockd` parses them (its binary adds only the flags
/// that print something and exit, and the logging ones). A library type, so that the checks
/// and the defaults are unit-tested where they are written, and `lockd`'s `main` stays a
/// parser that calls [`crate::daemon::run`].
#[derive(Args, Clone, Debug)]
pub struct Flags {
    /// Address to listen on [default: 127.0.0.1:5001; with --compat, 127.0.0.1:5003].
    #[arg(long, env = "LOCKD_LISTEN")]
    pub listen: Option<String>,

    /// Lease length of a LOCK without ttl= (e.g. 30s, 5m).
    #[arg(long, env = "LOCKD_DEFAULT_TTL", default_value_t = HumanDuration(crate::DEFAULT_TTL))]
    pub default_ttl: HumanDuration,

    /// Longest lease a LOCK or RENEW may ask for; longer is refused with ERR BADARG.
    #[arg(long, env = "LOCKD_MAX_TTL", default_value_t = HumanDuration(crate::DEFAULT_MAX_TTL))]
    pub max_ttl: HumanDuration,

    /// Most client connections at once; more get ERR LIMIT and are closed.
    #[arg(long, env = "LOCKD_MAX_CONNECTIONS", default_value_t = crate::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub max_connections: usize,

    /// Most client connections at once from one address (never more than --max-connections);
    /// more from it get ERR LIMIT and are closed, other addresses are unaffected.
    #[arg(long, env = "LOCKD_MAX_CONNECTIONS_PER_IP",
          default_value_t = crate::DEFAULT_MAX_CONNECTIONS_PER_IP,
          value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub max_connections_per_ip: usize,

    /// Longest request line in bytes; a longer one gets ERR TOOLONG and the connection is closed.
    #[arg(long, env = "LOCKD_MAX_LINE", default_value_t = crate::DEFAULT_MAX_LINE,
          value_parser = clap::value_parser!(u32).range(64..=1_048_576).map(|v| v as usize))]
    pub max_line: usize,

    /// Longest lock name or client id in bytes; longer ones get ERR BADARG.
    #[arg(long, env = "LOCKD_MAX_NAME", default_value_t = crate::proto::MAX_NAME_LEN,
          value_parser = clap::value_parser!(u32).range(1..=255).map(|v| v as usize))]
    pub max_name: usize,

    /// Most leases held at once (each holder of a shared lock or semaphore counts one); a LOCK
    /// granted at once past it gets ERR LIMIT.
    #[arg(long, env = "LOCKD_MAX_LOCKS", default_value_t = crate::DEFAULT_MAX_LOCKS,
          value_parser = clap::value_parser!(u64).range(1..).map(|v| v as usize))]
    pub max_locks: usize,

    /// Most waiters one lock may have; a LOCK that would queue past it gets ERR LIMIT.
    #[arg(long, env = "LOCKD_MAX_WAITERS", default_value_t = crate::DEFAULT_MAX_WAITERS,
          value_parser = clap::value_parser!(u64).range(1..).map(|v| v as usize))]
    pub max_waiters: usize,

    /// Lock-delay of a LOCK without delay=: after a lease ends other than by a release (its
    /// ttl ran out, its session ended, a BREAK's lease reached its deadline), the name stays
    /// held this long before the next holder is granted, for a holder that stopped renewing
    /// but may still be running. 0: hand over at once.
    #[arg(long, env = "LOCKD_LOCK_DELAY", default_value_t = HumanDuration(crate::DEFAULT_LOCK_DELAY))]
    pub lock_delay: HumanDuration,

    /// Longest delay= a LOCK may ask for; longer is refused with ERR BADARG.
    #[arg(long, env = "LOCKD_MAX_LOCK_DELAY",
          default_value_t = HumanDuration(crate::DEFAULT_MAX_LOCK_DELAY))]
    pub max_lock_delay: HumanDuration,

    /// Events a watcher may fall behind before it gets ERR LAGGED and is disconnected.
    #[arg(long, env = "LOCKD_WATCH_BUFFER", default_value_t = crate::DEFAULT_WATCH_BUFFER,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576).map(|v| v as usize))]
    pub watch_buffer: usize,

    /// How long a client may leave replies unread before it is disconnected: each 16 KiB
    /// of a reply, event stream or STATUS answer must be taken within it.
    #[arg(long, env = "LOCKD_WRITE_TIMEOUT",
          default_value_t = HumanDuration(crate::DEFAULT_WRITE_TIMEOUT))]
    pub write_timeout: HumanDuration,

    /// How long a connection that holds no session lease, waits for nothing and watches
    /// nothing may send no request line before it gets ERR LIMIT and is closed; 0 turns it off.
    #[arg(long, env = "LOCKD_IDLE_TIMEOUT",
          default_value_t = HumanDuration(crate::DEFAULT_IDLE_TIMEOUT))]
    pub idle_timeout: HumanDuration,

    /// How long the start of a request line may wait for its newline before the connection
    /// gets ERR LIMIT and is closed (a client that trickles bytes); 0 turns it off.
    #[arg(long, env = "LOCKD_LINE_TIMEOUT",
          default_value_t = HumanDuration(crate::DEFAULT_LINE_TIMEOUT))]
    pub line_timeout: HumanDuration,

    /// Most copies of the lock table that STATUS answers being sent may hold at once (every
    /// STATUS made while the table does not change shares one); a STATUS that needs another
    /// waits until one is done.
    #[arg(long, env = "LOCKD_STATUS_COPIES", default_value_t = crate::DEFAULT_STATUS_COPIES,
          value_parser = clap::value_parser!(u32).range(1..=1024).map(|v| v as usize))]
    pub status_copies: usize,

    /// How long shutdown (SIGINT/SIGTERM) lets connections finish before closing them.
    #[arg(long, env = "LOCKD_SHUTDOWN_GRACE",
          default_value_t = HumanDuration(crate::DEFAULT_SHUTDOWN_GRACE))]
    pub shutdown_grace: HumanDuration,

    /// How long a grant to a waiter that had half-closed is watched for a reset (its client
    /// was gone); a reset takes the grant back and grants the next waiter. Must exceed the
    /// network's round trip; 0 turns the check off.
    #[arg(long, env = "LOCKD_HALF_CLOSE_PROBE",
          default_value_t = HumanDuration(crate::DEFAULT_HALF_CLOSE_PROBE))]
    pub half_close_probe: HumanDuration,

    /// How long one worker keeps polling the sockets after a request before it sleeps, so the
    /// next request finds it awake: far lower latency where waking a sleeping core is dear
    /// (virtual machines above all), for up to one core's CPU while requests keep coming and
    /// none when they don't. Polling rests by itself (from 10ms, doubling, up to 1s) when it
    /// catches fewer than one request per window it spins idle: clients that pause longer
    /// than the window between requests, or so many that a worker is busy anyway. 0 sleeps at
    /// once (a small machine whose cores the jobs need); at most 10ms.
    #[arg(long, env = "LOCKD_BUSY_POLL",
          default_value_t = HumanDuration(crate::DEFAULT_BUSY_POLL))]
    pub busy_poll: HumanDuration,

    /// Keep locks durably in this directory (created if missing): a grant, renew or release is
    /// on disk before its OK, and a restart restores every lease that has not ended.
    /// Without it, locks live in memory only and a restart forgets every holder.
    /// Not used in cluster mode (--etcd), where etcd keeps the locks.
    #[arg(long, env = "LOCKD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Cluster mode: keep every lock in this etcd cluster (client URLs, comma separated, e.g.
    /// http://10.0.0.1:2379,http://10.0.0.2:2379), so that any number of lockd front-ends
    /// serve the same locks and losing one machine loses no lock (the `etcd` cargo feature,
    /// on by default). Give every member: reads and transactions go straight to the leader
    /// among them (a follower would forward each, a hop slower). Without it, locks live in
    /// this process (see --data-dir).
    #[arg(long, env = "LOCKD_ETCD", value_name = "URLS", value_delimiter = ',')]
    pub etcd: Vec<String>,

    /// The etcd key prefix of this deployment: front-ends with the same --etcd and prefix
    /// share their locks; another prefix is another, separate set of locks.
    #[arg(long, env = "LOCKD_ETCD_PREFIX", default_value = crate::DEFAULT_ETCD_PREFIX)]
    pub etcd_prefix: String,

    /// How long one etcd request may take; past it the client is answered ERR UNAVAILABLE
    /// (etcd unreachable or without quorum) and may try again (a LOCK tried again with the
    /// same id gets the grant if the first one was made after all).
    #[arg(long, env = "LOCKD_ETCD_REQUEST_TIMEOUT",
          default_value_t = HumanDuration(crate::DEFAULT_ETCD_REQUEST_TIMEOUT))]
    pub etcd_request_timeout: HumanDuration,

    /// How long to keep trying to reach etcd at start before giving up.
    #[arg(long, env = "LOCKD_ETCD_CONNECT_TIMEOUT",
          default_value_t = HumanDuration(crate::DEFAULT_ETCD_CONNECT_TIMEOUT))]
    pub etcd_connect_timeout: HumanDuration,

    /// This front-end's etcd lease, in whole seconds (at least 1s; etcd may round it up to
    /// 1.5 election timeouts): its session leases and waiters end within about this long
    /// after it dies, and it keeps them only while etcd hears from it within this long.
    #[arg(long, env = "LOCKD_ETCD_LEASE_TTL",
          default_value_t = HumanDuration(crate::DEFAULT_ETCD_LEASE_TTL))]
    pub etcd_lease_ttl: HumanDuration,

    /// Group commit: requests that come while this front-end's transactions are in flight
    /// go to etcd together, at most this many in one transaction (1 to 126; 1: each alone).
    /// A lone request goes at once.
    #[arg(long, env = "LOCKD_ETCD_BATCH", default_value_t = crate::DEFAULT_ETCD_BATCH)]
    pub etcd_batch: usize,

    /// Group commit: how long a request waits at most for this front-end's transactions in
    /// flight before it goes with the next batch anyway, so that one slow or lost answer
    /// holds up the others this long at most (more than 0, at most --etcd-request-timeout).
    #[arg(long, env = "LOCKD_ETCD_BATCH_WAIT",
          default_value_t = HumanDuration(crate::DEFAULT_ETCD_BATCH_WAIT))]
    pub etcd_batch_wait: HumanDuration,

    /// Group commit: how long a LOCK that waits behind a holder of this front-end holds its
    /// queue write back at most (while nothing else goes), so that it reaches etcd in one
    /// transaction with that holder's release, a hand-over then costing etcd one transaction,
    /// not two. Only the waiter's entry into the queue waits, never a reply (0: never; at
    /// most --etcd-batch-wait).
    #[arg(long, env = "LOCKD_ETCD_JOIN_WAIT",
          default_value_t = HumanDuration(crate::DEFAULT_ETCD_JOIN_WAIT))]
    pub etcd_join_wait: HumanDuration,

    /// Talk to etcd over TLS, checking its certificate against this CA (PEM): --etcd URLs
    /// are then https:// (or bare host:port). Needed for https:// URLs: lockd does not trust
    /// the system's CAs for etcd.
    #[arg(long, env = "LOCKD_ETCD_CA", value_name = "PEM")]
    pub etcd_ca: Option<PathBuf>,

    /// A client certificate for etcd's --client-cert-auth (PEM; the chain, leaf first).
    /// Needs --etcd-key and --etcd-ca. With etcd's authentication on, its common name (CN) is
    /// the etcd user this front-end acts as (unless --etcd-user).
    #[arg(long, env = "LOCKD_ETCD_CERT", value_name = "PEM")]
    pub etcd_cert: Option<PathBuf>,

    /// The private key of --etcd-cert (PEM).
    #[arg(long, env = "LOCKD_ETCD_KEY", value_name = "PEM")]
    pub etcd_key: Option<PathBuf>,

    /// Log in to etcd as this user (etcd's own authentication: etcdctl auth enable); its role
    /// needs readwrite on --etcd-prefix. The password is the environment variable
    /// LOCKD_ETCD_PASSWORD or the first line of --etcd-password-file. There is no password
    /// flag on purpose: a process's flags show in ps to every user of the machine.
    #[arg(long, env = "LOCKD_ETCD_USER", value_name = "NAME")]
    pub etcd_user: Option<String>,

    /// The password of --etcd-user is the first line of this file (readable by lockd
    /// alone). Not together with LOCKD_ETCD_PASSWORD.
    #[arg(long, env = "LOCKD_ETCD_PASSWORD_FILE", value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,

    /// Serve the line protocol over TLS with this certificate (PEM; the chain, leaf first).
    /// Needs --tls-key. The --compat ports stay plain.
    #[arg(long, env = "LOCKD_TLS_CERT", value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "LOCKD_TLS_KEY", value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Mutual TLS: clients must present a certificate signed by this CA (PEM). With
    /// --auth-file, a certificate whose common name (CN) is a user logs its connection in as
    /// that user (no AUTH).
    #[arg(
        long,
        env = "LOCKD_TLS_CLIENT_CA",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    pub tls_client_ca: Option<PathBuf>,

    /// How long a TLS client may take to complete its handshake before it is closed.
    #[arg(long, env = "LOCKD_TLS_HANDSHAKE_TIMEOUT",
          default_value_t = HumanDuration(crate::DEFAULT_TLS_HANDSHAKE_TIMEOUT))]
    pub tls_handshake_timeout: HumanDuration,

    /// Serve Prometheus metrics at http://ADDR/metrics, with /healthz (the process is up)
    /// and /readyz (ready to grant: state recovered, data directory writable). Off by default.
    #[arg(long, env = "LOCKD_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,

    /// Lock names that get series of their own in /metrics (lockd_lock_holders,
    /// lockd_lock_waiters, lockd_lock_held_seconds), comma-separated; at most 100.
    #[arg(
        long,
        env = "LOCKD_METRICS_NAMES",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    pub metrics_names: Vec<String>,

    /// Serve the --metrics-listen port (metrics, health, the web view) over TLS, with the
    /// certificate and key of --tls-cert and --tls-key (reloaded with them by SIGHUP). No
    /// client certificate is asked for there, even with --tls-client-ca: scrapers and
    /// browsers prove who they are their own way. Needed for --web with --auth-file on an
    /// address other than loopback, whose logins would otherwise cross the network in clear.
    #[arg(long, env = "LOCKD_METRICS_TLS", requires_all = ["metrics_listen", "tls_cert"],
          value_parser = clap::builder::BoolishValueParser::new())]
    pub metrics_tls: bool,

    /// Serve the web view on the --metrics-listen port: a live, read-only page of every held
    /// lock, its holders and its queue, and recent events (/, with /events and /locks). With
    /// --auth-file it asks for a user and secret of that file (HTTP Basic) and shows only the
    /// names the user may read. Off by default.
    #[arg(long, env = "LOCKD_WEB", requires = "metrics_listen",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub web: bool,

    /// Most locks the web view shows at once (in name order; the rest are counted), each with
    /// its holders and the first 1000 of its queue.
    #[arg(long, env = "LOCKD_WEB_LOCKS", value_name = "N", default_value_t = DEFAULT_WEB_LOCKS)]
    pub web_locks: usize,

    /// Most web view pages open at once (each keeps an event stream); one more is answered
    /// 503 until one closes.
    #[arg(long, env = "LOCKD_WEB_VIEWERS", value_name = "N", default_value_t = DEFAULT_WEB_VIEWERS)]
    pub web_viewers: usize,

    /// Require clients to authenticate: the users, their hashed secrets and their rights, one
    /// `user <name> <hash> [lock=<patterns>] [read=<patterns>]` line each (see proto.md).
    /// Before AUTH only PING, HELP and QUIT work. SIGHUP reloads the file. A file its group
    /// or others may write is refused; one others may read is warned about. Without it, every
    /// client may do everything: for trusted networks only (see --insecure-open).
    #[arg(long, env = "LOCKD_AUTH_FILE", value_name = "FILE")]
    pub auth_file: Option<PathBuf>,

    /// Serve the network without authentication: without it, lockd refuses to start when
    /// --listen (or --compat-addr) is not a loopback address and neither --auth-file nor
    /// --tls-client-ca makes clients prove who they are, since anyone who reaches the port
    /// could then take and release any lock (for the --compat ports, --compat-no-auth says
    /// so too). For trusted, firewalled networks: logged as a warning at start, and shown as
    /// lockd_open_without_auth 1 in /metrics. The metrics endpoint is not checked.
    #[arg(long, env = "LOCKD_INSECURE_OPEN", value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure_open: bool,

    /// The old two-port protocol (`--compat` and its flags, under a heading of their own).
    #[command(flatten)]
    pub compat: CompatArgs,

    /// Longest note a LOCK may carry (note=<text>), in bytes (1 to 65535); a longer one gets
    /// ERR BADARG. A note travels in a LOCK line, so --max-line bounds it too.
    #[arg(long, env = "LOCKD_MAX_NOTE", default_value_t = crate::DEFAULT_MAX_NOTE,
          value_parser = clap::value_parser!(u32).range(1..=MAX_MAX_NOTE as i64).map(|v| v as usize))]
    pub max_note: usize,

    /// Most names one LOCK may ask for at once, its own and its and= names (1 to 32); more
    /// get ERR LIMIT. 1 serves no sets.
    #[arg(long, env = "LOCKD_MAX_NAMES", default_value_t = crate::DEFAULT_MAX_NAMES,
          value_parser = clap::value_parser!(u32).range(1..=MAX_MAX_NAMES as i64).map(|v| v as usize))]
    pub max_names: usize,
}

impl Default for Flags {
    /// What `lockd` runs with when given no flag (a unit test holds it to clap's defaults).
    fn default() -> Self {
        use crate::compat;
        Flags {
            listen: None,
            default_ttl: HumanDuration(crate::DEFAULT_TTL),
            max_ttl: HumanDuration(crate::DEFAULT_MAX_TTL),
            max_connections: crate::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: crate::DEFAULT_MAX_CONNECTIONS_PER_IP,
            max_line: crate::DEFAULT_MAX_LINE,
            max_name: crate::proto::MAX_NAME_LEN,
            max_locks: crate::DEFAULT_MAX_LOCKS,
            max_waiters: crate::DEFAULT_MAX_WAITERS,
            lock_delay: HumanDuration(crate::DEFAULT_LOCK_DELAY),
            max_lock_delay: HumanDuration(crate::DEFAULT_MAX_LOCK_DELAY),
            watch_buffer: crate::DEFAULT_WATCH_BUFFER,
            write_timeout: HumanDuration(crate::DEFAULT_WRITE_TIMEOUT),
            idle_timeout: HumanDuration(crate::DEFAULT_IDLE_TIMEOUT),
            line_timeout: HumanDuration(crate::DEFAULT_LINE_TIMEOUT),
            status_copies: crate::DEFAULT_STATUS_COPIES,
            shutdown_grace: HumanDuration(crate::DEFAULT_SHUTDOWN_GRACE),
            half_close_probe: HumanDuration(crate::DEFAULT_HALF_CLOSE_PROBE),
            busy_poll: HumanDuration(crate::DEFAULT_BUSY_POLL),
            data_dir: None,
            etcd: Vec::new(),
            etcd_prefix: crate::DEFAULT_ETCD_PREFIX.into(),
            etcd_request_timeout: HumanDuration(crate::DEFAULT_ETCD_REQUEST_TIMEOUT),
            etcd_connect_timeout: HumanDuration(crate::DEFAULT_ETCD_CONNECT_TIMEOUT),
            etcd_lease_ttl: HumanDuration(crate::DEFAULT_ETCD_LEASE_TTL),
            etcd_batch: crate::DEFAULT_ETCD_BATCH,
            etcd_batch_wait: HumanDuration(crate::DEFAULT_ETCD_BATCH_WAIT),
            etcd_join_wait: HumanDuration(crate::DEFAULT_ETCD_JOIN_WAIT),
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            etcd_user: None,
            etcd_password_file: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_handshake_timeout: HumanDuration(crate::DEFAULT_TLS_HANDSHAKE_TIMEOUT),
            metrics_listen: None,
            metrics_names: Vec::new(),
            metrics_tls: false,
            web: false,
            web_locks: DEFAULT_WEB_LOCKS,
            web_viewers: DEFAULT_WEB_VIEWERS,
            auth_file: None,
            insecure_open: false,
            compat: CompatArgs {
                compat: false,
                host: compat::DEFAULT_HOST.into(),
                lock_port: compat::DEFAULT_LOCK_PORT,
                unlock_port: compat::DEFAULT_UNLOCK_PORT,
                unlock_timeout: HumanDuration(compat::DEFAULT_UNLOCK_TIMEOUT),
                compat_name: compat::DEFAULT_NAME.into(),
                compat_no_auth: false,
                compat_read_timeout: HumanDuration(compat::DEFAULT_READ_TIMEOUT),
            },
            max_note: crate::DEFAULT_MAX_NOTE,
            max_names: crate::DEFAULT_MAX_NAMES,
        }
    }
}

impl Flags {
    /// The server flags `args` (no program name first) as `lockd` parses them, except that no
    /// `LOCKD_*` environment variable is read: for a program that starts lockd's server
    /// itself with the flags a user wrote (the protocol scripts' simulated cluster,
    /// [`crate::daemon::run_simulated`]). An error is clap's message.
    #[doc(hidden)]
    pub fn parse_args<I, T>(args: I) -> Result<Flags, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::FromArgMatches as _;
        let command =
            Flags::augment_args(clap::Command::new("lockd")).mut_args(|arg| arg.env(None::<&str>));
        let mut all = vec![std::ffi::OsString::from("lockd")];
        all.extend(args.into_iter().map(Into::into));
        command
            .try_get_matches_from(all)
            .and_then(|m| Flags::from_arg_matches(&m))
            .map_err(|e| e.to_string())
    }

    /// Refuses a combination of flags the server could not run with, with the message
    /// `lockd` prints before it exits with status 2: every check that needs no file and no
    /// network, so a bad start fails before it binds a port.
    pub fn validate(&self) -> Result<(), String> {
        let (default_ttl, max_ttl) = (self.default_ttl.0, self.max_ttl.0);
        if default_ttl < crate::MIN_TTL || max_ttl < crate::MIN_TTL {
            return Err(format!(
                "--default-ttl and --max-ttl must be at least {}",
                humantime::format_duration(crate::MIN_TTL)
            ));
        }
        if self.write_timeout.0.is_zero() {
            return Err("--write-timeout must be more than 0".into());
        }
        if self.busy_poll.0 > crate::busy_poll::MAX_WINDOW {
            return Err(format!(
                "--busy-poll must be at most {}",
                humantime::format_duration(crate::busy_poll::MAX_WINDOW)
            ));
        }
        if default_ttl > max_ttl {
            return Err("--default-ttl must not exceed --max-ttl".into());
        }
        if self.lock_delay.0 > self.max_lock_delay.0 {
            return Err("--lock-delay must not exceed --max-lock-delay".into());
        }
        if self.tls_handshake_timeout.0.is_zero() {
            return Err("--tls-handshake-timeout must be more than 0".into());
        }
        // A note is journaled with a 16-bit length (`store/format.rs`). (Above --max-line is
        // allowed, as with the default 256 and --max-line 64: no line can carry such a note.)
        if !(1..=MAX_MAX_NOTE).contains(&self.max_note) {
            return Err(format!(
                "--max-note must be from 1 to {MAX_MAX_NOTE} bytes, not {}",
                self.max_note
            ));
        }
        if !(1..=MAX_MAX_NAMES).contains(&self.max_names) {
            return Err(format!(
                "--max-names must be from 1 to {MAX_MAX_NAMES}, not {}",
                self.max_names
            ));
        }
        if !(1..=MAX_WEB_LOCKS).contains(&self.web_locks) {
            return Err(format!(
                "--web-locks must be from 1 to {MAX_WEB_LOCKS}, not {}",
                self.web_locks
            ));
        }
        if !(1..=MAX_WEB_VIEWERS).contains(&self.web_viewers) {
            return Err(format!(
                "--web-viewers must be from 1 to {MAX_WEB_VIEWERS}, not {}",
                self.web_viewers
            ));
        }
        if self.metrics_names.len() > MAX_METRICS_NAMES {
            return Err(format!(
                "--metrics-names lists {} names; at most {MAX_METRICS_NAMES}",
                self.metrics_names.len()
            ));
        }
        for name in &self.metrics_names {
            crate::proto::validate_name("--metrics-names entry", name).map_err(|e| e.message)?;
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
                            (a default build has it: cargo build --release)"
                    .into());
            }
            if self.etcd_request_timeout.0.is_zero() || self.etcd_connect_timeout.0.is_zero() {
                return Err(
                    "--etcd-request-timeout and --etcd-connect-timeout must be more than 0".into(),
                );
            }
            if self.etcd_lease_ttl.0 < MIN_ETCD_LEASE_TTL {
                return Err("--etcd-lease-ttl must be at least 1s".into());
            }
            if !(1..=crate::MAX_ETCD_BATCH).contains(&self.etcd_batch) {
                return Err(format!(
                    "--etcd-batch must be 1 to {}",
                    crate::MAX_ETCD_BATCH
                ));
            }
            if self.etcd_batch_wait.0.is_zero()
                || self.etcd_batch_wait.0 > self.etcd_request_timeout.0
            {
                return Err(
                    "--etcd-batch-wait must be more than 0 and at most --etcd-request-timeout"
                        .into(),
                );
            }
            if self.etcd_join_wait.0 > self.etcd_batch_wait.0 {
                return Err("--etcd-join-wait must be at most --etcd-batch-wait".into());
            }
            if self.etcd_prefix.is_empty() {
                return Err("--etcd-prefix must not be empty".into());
            }
            let password_in_env = std::env::var_os(ETCD_PASSWORD_ENV).is_some();
            self.validate_etcd_security(password_in_env)?;
        }
        self.compat.config(max_ttl).map(drop)?;
        let listen = literal_ip(self.listen());
        let compat = literal_ip(&self.compat.host).filter(|_| self.compat.compat);
        self.open_to_the_network(listen.as_slice(), compat.as_slice())
            .map(drop)
    }

    /// Whether clients must prove who they are before they may touch a lock: `--auth-file`,
    /// or mutual TLS (a certificate the client CA signed is needed to send a single line).
    pub fn authenticates(&self) -> bool {
        self.auth_file.is_some() || self.tls_client_ca.is_some()
    }

    /// Refuses to serve the network without authentication unless told to: `listen` are the
    /// addresses the line protocol listens on, `compat` those of the `--compat` ports (which
    /// never authenticate). A loopback address is this machine's own business. Given the
    /// addresses known before any lookup by [`Flags::validate`], and the bound and resolved
    /// ones by the daemon (a host name is only known then). `Ok`: the warnings to log, one
    /// per listener served open because `--insecure-open` (or `--compat-no-auth`) said so.
    pub fn open_to_the_network(
        &self,
        listen: &[IpAddr],
        compat: &[IpAddr],
    ) -> Result<Vec<String>, String> {
        let mut warnings = Vec::new();
        if let Some(ip) = listen.iter().find(|ip| !is_loopback(ip)) {
            if !self.authenticates() {
                if !self.insecure_open {
                    return Err(format!(
                        "--listen {} is reachable from the network ({ip}) and nothing \
                         authenticates its clients: anyone who reaches it could take and \
                         release any lock. Add --auth-file (or --tls-client-ca), listen on \
                         127.0.0.1, or add --insecure-open (LOCKD_INSECURE_OPEN=1) on a \
                         trusted network",
                        self.listen()
                    ));
                }
                warnings.push(format!(
                    "--insecure-open: serving {} ({ip}) without authentication; anyone who \
                     reaches it may take and release any lock",
                    self.listen()
                ));
            }
        }
        if let Some(ip) = compat.iter().find(|ip| !is_loopback(ip)) {
            if !self.insecure_open && !self.compat.compat_no_auth {
                return Err(format!(
                    "--compat-addr {} is reachable from the network ({ip}), and the old \
                     two-port protocol has no authentication: anyone who reaches its ports \
                     could take and release the lock --compat-name. Use --compat-addr \
                     127.0.0.1, or add --compat-no-auth (LOCKD_COMPAT_NO_AUTH=1) or \
                     --insecure-open with the ports firewalled to trusted clients",
                    self.compat.host
                ));
            }
            warnings.push(format!(
                "serving the --compat ports on {} ({ip}) without authentication; anyone who \
                 reaches them may take and release the lock {}",
                self.compat.host, self.compat.compat_name
            ));
        }
        Ok(warnings)
    }

    /// The TLS and authentication flags toward etcd, with the endpoints they must agree
    /// with; `password_in_env`: whether [`ETCD_PASSWORD_ENV`] is set.
    fn validate_etcd_security(&self, password_in_env: bool) -> Result<(), String> {
        let (mut http, mut https) = (false, false);
        for endpoint in &self.etcd {
            let (scheme, rest) = match endpoint.split_once("://") {
                Some((scheme, rest)) => (Some(scheme), rest),
                None => (None, endpoint.as_str()),
            };
            let authority = rest.split('/').next().unwrap_or("");
            if let Some((_, host)) = authority.rsplit_once('@') {
                // Never the user or the password themselves: this line is logged.
                let shown = scheme.map_or(host.to_owned(), |s| format!("{s}://{host}"));
                return Err(format!(
                    "--etcd {shown}: a user or password in the URL is not used; give \
                     --etcd-user, with the password in {ETCD_PASSWORD_ENV} or \
                     --etcd-password-file"
                ));
            }
            match scheme {
                Some("http") => http = true,
                Some("https") => https = true,
                _ => {}
            }
        }
        if http && https {
            return Err(
                "--etcd mixes http:// and https:// URLs: reach every member the same way".into(),
            );
        }
        if https && self.etcd_ca.is_none() {
            return Err(
                "https:// URLs in --etcd need --etcd-ca, the CA that signed etcd's \
                        certificates (lockd does not trust the system's CAs for etcd)"
                    .into(),
            );
        }
        if http && (self.etcd_ca.is_some() || self.etcd_cert.is_some()) {
            return Err(
                "--etcd-ca and --etcd-cert are for https:// URLs, and --etcd has \
                        http:// ones: write https://, or drop the TLS flags"
                    .into(),
            );
        }
        if self.etcd_cert.is_some() != self.etcd_key.is_some() {
            return Err("--etcd-cert and --etcd-key go together: give both or neither".into());
        }
        if self.etcd_cert.is_some() && self.etcd_ca.is_none() {
            return Err(
                "--etcd-cert needs --etcd-ca, the CA etcd's certificate is checked against".into(),
            );
        }
        match (&self.etcd_user, &self.etcd_password_file, password_in_env) {
            (Some(user), _, _) if user.is_empty() => Err("--etcd-user must not be empty".into()),
            (Some(_), None, false) => Err(format!(
                "--etcd-user needs its password: in {ETCD_PASSWORD_ENV} or the first line of \
                 --etcd-password-file (there is no password flag: flags show in ps)"
            )),
            (Some(_), Some(_), true) => Err(format!(
                "the etcd password is given twice: {ETCD_PASSWORD_ENV} and \
                 --etcd-password-file; keep one"
            )),
            (None, Some(_), _) => Err("--etcd-password-file needs --etcd-user".into()),
            (None, None, true) => Err(format!(
                "{ETCD_PASSWORD_ENV} is set but --etcd-user is not: give the user too, or \
                 unset it"
            )),
            _ => Ok(()),
        }
    }

    /// The TLS and authentication flags toward etcd, as the backend takes them.
    fn etcd_security(&self) -> EtcdSecurity {
        EtcdSecurity {
            ca: self.etcd_ca.clone(),
            identity: self.etcd_cert.clone().zip(self.etcd_key.clone()),
            user: self.etcd_user.clone(),
            password_file: self.etcd_password_file.clone(),
        }
    }

    /// The server's settings: [`Flags::validate`], then the TLS files read (an error names
    /// the file). The users of `--auth-file` and the metrics endpoint are the daemon's to add
    /// ([`crate::daemon::run`]): they outlive a check.
    pub fn server_config(&self) -> Result<server::Config, String> {
        self.validate()?;
        Ok(server::Config {
            limits: Limits {
                default_ttl: self.default_ttl.0,
                max_ttl: self.max_ttl.0,
                max_locks: self.max_locks,
                max_waiters: self.max_waiters,
                lock_delay: self.lock_delay.0,
                max_lock_delay: self.max_lock_delay.0,
            },
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            max_line: self.max_line,
            max_name: self.max_name,
            watch_buffer: self.watch_buffer,
            write_timeout: self.write_timeout.0,
            idle_timeout: self.idle_timeout.0,
            line_timeout: self.line_timeout.0,
            status_copies: self.status_copies,
            shutdown_grace: self.shutdown_grace.0,
            half_close_probe: self.half_close_probe.0,
            busy_poll: self.busy_poll.0,
            max_note: self.max_note,
            max_names: self.max_names,
            compat: self.compat.config(self.max_ttl.0)?,
            // In cluster mode etcd is the durable store (warned about in `daemon::run`).
            data_dir: self.data_dir.clone().filter(|_| self.etcd.is_empty()),
            etcd: (!self.etcd.is_empty()).then(|| EtcdConfig {
                endpoints: self.etcd.clone(),
                prefix: self.etcd_prefix.clone(),
                request_timeout: self.etcd_request_timeout.0,
                connect_timeout: self.etcd_connect_timeout.0,
                lease_ttl: self.etcd_lease_ttl.0,
                batch: self.etcd_batch,
                batch_wait: self.etcd_batch_wait.0,
                join_wait: self.etcd_join_wait.0,
                security: self.etcd_security(),
            }),
            endpoint: None,
            auth: None,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(crate::tls::server(
                    cert,
                    key,
                    self.tls_client_ca.as_deref(),
                )?),
                _ => None,
            },
            tls_handshake_timeout: self.tls_handshake_timeout.0,
        })
    }

    /// Where the line protocol listens: `--listen`, or the default of the mode.
    pub fn listen(&self) -> &str {
        self.listen
            .as_deref()
            .unwrap_or(self.compat.default_listen())
    }
}

/// The address `addr` names without a lookup (`0.0.0.0:5001`, `[::1]:5001`, `10.0.0.1`), if
/// it names one.
fn literal_ip(addr: &str) -> Option<IpAddr> {
    addr.parse::<SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| addr.trim_start_matches('[').trim_end_matches(']').parse())
        .ok()
}

/// Whether only this machine can reach `ip` (an IPv4 loopback address in IPv6 clothes too).
fn is_loopback(ip: &IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The flags as the binary has them, for parsing in tests.
    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        flags: Flags,
    }

    fn secs(s: u64) -> HumanDuration {
        HumanDuration(Duration::from_secs(s))
    }

    /// `Flags::default()` changed by `change`, checked.
    fn refusal(change: impl FnOnce(&mut Flags)) -> String {
        let mut flags = Flags::default();
        change(&mut flags);
        flags.validate().expect_err("refused")
    }

    #[test]
    fn a_lock_delay_past_its_maximum_is_refused() {
        assert_eq!(
            refusal(|f| f.lock_delay = secs(61)),
            "--lock-delay must not exceed --max-lock-delay"
        );
        let flags = Flags {
            lock_delay: secs(5),
            ..Flags::default()
        };
        flags.validate().expect("a delay within the maximum");
    }

    #[test]
    fn the_defaults_are_clap_defaults_and_valid() {
        // No LOCKD_* variable is read here: every flag with one is given on the line
        // below only if the test's environment sets it, which CI does not.
        let parsed = TestCli::try_parse_from(["lockd"]).expect("parses").flags;
        assert_eq!(format!("{parsed:?}"), format!("{:?}", Flags::default()));
        Flags::default().validate().expect("the defaults are valid");
        let config = Flags::default().server_config().expect("a config");
        assert_eq!(config.limits.default_ttl, crate::DEFAULT_TTL);
        assert_eq!(config.max_connections, crate::DEFAULT_MAX_CONNECTIONS);
        assert!(config.data_dir.is_none() && config.etcd.is_none() && config.tls.is_none());
        assert_eq!(Flags::default().listen(), crate::DEFAULT_LISTEN);
    }

    #[test]
    fn parse_args_parses_as_the_binary_does_without_the_environment() {
        let flags =
            Flags::parse_args(["--max-waiters", "2", "--default-ttl", "5m"]).expect("parses");
        assert_eq!((flags.max_waiters, flags.default_ttl), (2, secs(300)));
        // Whatever LOCKD_* the test's environment has, none is read.
        let defaults = Flags::parse_args(Vec::<String>::new()).expect("parses");
        assert_eq!(format!("{defaults:?}"), format!("{:?}", Flags::default()));
        let e = Flags::parse_args(["--max-waiters", "many"]).expect_err("refused");
        assert!(e.contains("--max-waiters"), "{e}");
    }

    #[test]
    fn durations_read_and_show_as_flags_are_written() {
        for text in ["30s", "24h", "10m", "500ms", "0s", "90s", "1500ms"] {
            let d: HumanDuration = text.parse().expect(text);
            assert_eq!(d.to_string(), text);
        }
        assert_eq!("30".parse::<HumanDuration>(), Ok(secs(30)));
        assert!("soon"
            .parse::<HumanDuration>()
            .unwrap_err()
            .contains("not a duration"));
        let flags = TestCli::try_parse_from(["lockd", "--default-ttl", "5m"])
            .unwrap()
            .flags;
        assert_eq!(flags.default_ttl, secs(300));
    }

    #[test]
    fn refuses_a_ttl_below_the_minimum() {
        let expected = "--default-ttl and --max-ttl must be at least 1ms";
        assert_eq!(refusal(|f| f.default_ttl = secs(0)), expected);
        assert_eq!(refusal(|f| f.max_ttl = secs(0)), expected);
    }

    #[test]
    fn busy_poll_is_a_short_window_or_none() {
        let flags = |args: &[&str]| TestCli::try_parse_from(args).unwrap().flags;
        assert_eq!(
            flags(&["lockd"]).busy_poll.0,
            crate::DEFAULT_BUSY_POLL,
            "on by default"
        );
        assert_eq!(
            flags(&["lockd", "--busy-poll", "0"]).busy_poll.0,
            Duration::ZERO
        );
        let us = flags(&["lockd", "--busy-poll", "200us"]);
        assert_eq!(us.busy_poll.0, Duration::from_micros(200));
        assert!(us.validate().is_ok());
        assert_eq!(
            refusal(|f| f.busy_poll = HumanDuration(Duration::from_millis(11))),
            "--busy-poll must be at most 10ms"
        );
    }

    #[test]
    fn refuses_no_write_timeout() {
        assert_eq!(
            refusal(|f| f.write_timeout = secs(0)),
            "--write-timeout must be more than 0"
        );
    }

    #[test]
    fn refuses_a_default_ttl_past_the_max() {
        assert_eq!(
            refusal(|f| f.default_ttl = HumanDuration(crate::DEFAULT_MAX_TTL + crate::MIN_TTL)),
            "--default-ttl must not exceed --max-ttl"
        );
    }

    #[test]
    fn refuses_a_max_note_out_of_range() {
        for bad in [0, MAX_MAX_NOTE + 1] {
            let flags = Flags {
                max_note: bad,
                ..Flags::default()
            };
            let e = flags.validate().unwrap_err();
            assert!(e.contains("--max-note"), "{e}");
        }
        let flags = Flags {
            max_note: MAX_MAX_NOTE,
            max_line: 64,
            ..Flags::default()
        };
        assert_eq!(flags.validate(), Ok(()));
    }

    #[test]
    fn refuses_a_max_names_out_of_range() {
        for bad in [0, MAX_MAX_NAMES + 1] {
            let e = refusal(|f| f.max_names = bad);
            assert!(e.contains("--max-names"), "{e}");
        }
        let flags = Flags {
            max_names: MAX_MAX_NAMES,
            ..Flags::default()
        };
        assert_eq!(flags.validate(), Ok(()));
    }

    #[test]
    fn refuses_no_tls_handshake_timeout() {
        assert_eq!(
            refusal(|f| f.tls_handshake_timeout = secs(0)),
            "--tls-handshake-timeout must be more than 0"
        );
    }

    #[test]
    fn refuses_too_many_metrics_names() {
        let names = (0..=MAX_METRICS_NAMES).map(|i| format!("n{i}")).collect();
        assert_eq!(
            refusal(|f| f.metrics_names = names),
            "--metrics-names lists 101 names; at most 100"
        );
    }

    #[test]
    fn refuses_a_metrics_name_that_is_no_lock_name() {
        let e = refusal(|f| f.metrics_names = vec!["ok".into(), String::new()]);
        assert!(e.starts_with("--metrics-names entry"), "{e}");
    }

    #[test]
    fn refuses_compat_with_auth_unless_told() {
        let e = refusal(|f| {
            f.compat.compat = true;
            f.auth_file = Some("users".into());
        });
        assert!(
            e.starts_with("--compat serves the old two-port protocol"),
            "{e}"
        );
        let mut told = Flags {
            auth_file: Some("users".into()),
            ..Flags::default()
        };
        (told.compat.compat, told.compat.compat_no_auth) = (true, true);
        told.validate().expect("told so");
    }

    #[test]
    fn refuses_what_compat_refuses() {
        let e = refusal(|f| {
            f.compat.compat = true;
            f.compat.unlock_port = f.compat.lock_port;
        });
        assert!(e.contains("must differ"), "{e}");
        // Checked against --max-ttl, which compat does not know by itself.
        let e = refusal(|f| {
            f.compat.compat = true;
            f.max_ttl = secs(10);
            f.default_ttl = secs(10);
        });
        assert!(e.starts_with("--unlock-timeout"), "{e}");
    }

    fn cluster(change: impl FnOnce(&mut Flags)) -> String {
        refusal(|f| {
            f.etcd = vec!["http://127.0.0.1:2379".into()];
            change(f);
        })
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn refuses_etcd_without_the_feature() {
        assert!(cluster(|_| {}).starts_with("--etcd needs a lockd built with the etcd feature"));
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn refuses_no_etcd_timeouts() {
        let expected = "--etcd-request-timeout and --etcd-connect-timeout must be more than 0";
        assert_eq!(cluster(|f| f.etcd_request_timeout = secs(0)), expected);
        assert_eq!(cluster(|f| f.etcd_connect_timeout = secs(0)), expected);
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn refuses_an_etcd_lease_under_a_second() {
        assert_eq!(
            cluster(|f| f.etcd_lease_ttl = HumanDuration(Duration::from_millis(999))),
            "--etcd-lease-ttl must be at least 1s"
        );
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn refuses_an_etcd_batch_out_of_range() {
        let expected = format!("--etcd-batch must be 1 to {}", crate::MAX_ETCD_BATCH);
        assert_eq!(cluster(|f| f.etcd_batch = 0), expected);
        assert_eq!(
            cluster(|f| f.etcd_batch = crate::MAX_ETCD_BATCH + 1),
            expected
        );
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn refuses_an_etcd_join_wait_past_the_batch_wait() {
        let expected = "--etcd-join-wait must be at most --etcd-batch-wait";
        assert_eq!(cluster(|f| f.etcd_join_wait = secs(1)), expected);
        for ms in [0, 10] {
            let mut flags = Flags {
                etcd: vec!["http://127.0.0.1:2379".into()],
                ..Flags::default()
            };
            flags.etcd_join_wait = HumanDuration(Duration::from_millis(ms));
            assert!(flags.validate().is_ok(), "{ms} ms");
        }
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn refuses_an_etcd_batch_wait_of_zero_or_past_the_request_timeout() {
        let expected = "--etcd-batch-wait must be more than 0 and at most --etcd-request-timeout";
        assert_eq!(cluster(|f| f.etcd_batch_wait = secs(0)), expected);
        assert_eq!(
            cluster(|f| {
                f.etcd_request_timeout = secs(2);
                f.etcd_batch_wait = secs(3);
            }),
            expected
        );
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn refuses_an_empty_etcd_prefix() {
        assert_eq!(
            cluster(|f| f.etcd_prefix.clear()),
            "--etcd-prefix must not be empty"
        );
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn a_cluster_uses_no_data_dir() {
        let flags = Flags {
            etcd: vec!["http://127.0.0.1:2379".into()],
            data_dir: Some("data".into()),
            ..Flags::default()
        };
        let config = flags.server_config().expect("valid");
        assert!(config.data_dir.is_none());
        assert_eq!(
            config.etcd.expect("cluster").prefix,
            crate::DEFAULT_ETCD_PREFIX
        );
    }

    /// The etcd security check of `Flags::default()` with `endpoints` and `change`, the
    /// password in the environment or not.
    fn etcd_security(
        endpoints: &[&str],
        env: bool,
        change: impl FnOnce(&mut Flags),
    ) -> Result<(), String> {
        let mut flags = Flags {
            etcd: endpoints.iter().map(|e| e.to_string()).collect(),
            ..Flags::default()
        };
        change(&mut flags);
        flags.validate_etcd_security(env)
    }

    const HTTPS: &[&str] = &["https://10.0.0.1:2379", "https://10.0.0.2:2379"];
    const HTTP: &[&str] = &["http://10.0.0.1:2379"];

    fn tls(f: &mut Flags) {
        f.etcd_ca = Some("ca.pem".into());
        f.etcd_cert = Some("fe.pem".into());
        f.etcd_key = Some("fe.key".into());
    }

    #[test]
    fn etcd_over_tls_with_a_client_certificate_is_valid() {
        etcd_security(HTTPS, false, tls).expect("mutual TLS");
        etcd_security(HTTPS, false, |f| f.etcd_ca = Some("ca.pem".into())).expect("TLS");
        // Bare host:port with --etcd-ca is TLS too.
        etcd_security(&["10.0.0.1:2379"], false, tls).expect("bare");
        etcd_security(HTTP, false, |_| {}).expect("plain");
        let flags = Flags {
            etcd: HTTPS.iter().map(|e| e.to_string()).collect(),
            ..Flags::default()
        };
        let mut flags = flags;
        tls(&mut flags);
        let security = flags.etcd_security();
        assert_eq!(security.ca, Some("ca.pem".into()));
        assert_eq!(security.identity, Some(("fe.pem".into(), "fe.key".into())));
    }

    #[test]
    fn https_needs_an_etcd_ca() {
        let e = etcd_security(HTTPS, false, |_| {}).expect_err("no CA");
        assert!(
            e.starts_with("https:// URLs in --etcd need --etcd-ca"),
            "{e}"
        );
    }

    #[test]
    fn http_with_tls_flags_is_refused() {
        for change in [
            (|f: &mut Flags| f.etcd_ca = Some("ca.pem".into())) as fn(&mut Flags),
            tls,
        ] {
            let e = etcd_security(HTTP, false, change).expect_err("mixing");
            assert!(
                e.starts_with("--etcd-ca and --etcd-cert are for https:// URLs"),
                "{e}"
            );
        }
        let e = etcd_security(&[HTTP[0], HTTPS[0]], false, tls).expect_err("both schemes");
        assert!(e.starts_with("--etcd mixes http:// and https://"), "{e}");
    }

    #[test]
    fn a_client_certificate_needs_its_key_and_a_ca() {
        let e = etcd_security(HTTPS, false, |f| {
            tls(f);
            f.etcd_key = None;
        })
        .expect_err("no key");
        assert_eq!(
            e,
            "--etcd-cert and --etcd-key go together: give both or neither"
        );
        let e = etcd_security(HTTPS, false, |f| {
            tls(f);
            f.etcd_cert = None;
        })
        .expect_err("no cert");
        assert_eq!(
            e,
            "--etcd-cert and --etcd-key go together: give both or neither"
        );
        let e = etcd_security(&["10.0.0.1:2379"], false, |f| {
            tls(f);
            f.etcd_ca = None;
        })
        .expect_err("no CA");
        assert!(e.starts_with("--etcd-cert needs --etcd-ca"), "{e}");
    }

    #[test]
    fn credentials_in_an_etcd_url_are_refused_without_being_shown() {
        let e = etcd_security(&["http://lockd:hunter2@10.0.0.1:2379"], false, |_| {})
            .expect_err("credentials");
        assert!(
            e.starts_with("--etcd http://10.0.0.1:2379: a user or password in the URL"),
            "{e}"
        );
        assert!(
            e.contains("--etcd-user") && e.contains("LOCKD_ETCD_PASSWORD"),
            "{e}"
        );
        assert!(e.contains("--etcd-password-file"), "{e}");
        assert!(!e.contains("hunter2") && !e.contains("lockd:"), "{e}");
        let e = etcd_security(&["root@10.0.0.1:2379"], false, |_| {}).expect_err("bare");
        assert!(e.starts_with("--etcd 10.0.0.1:2379: a user"), "{e}");
    }

    #[test]
    fn the_etcd_password_comes_from_one_place() {
        let user = |f: &mut Flags| f.etcd_user = Some("lockd".into());
        let file = |f: &mut Flags| {
            f.etcd_user = Some("lockd".into());
            f.etcd_password_file = Some("pw".into());
        };
        etcd_security(HTTP, true, user).expect("from the environment");
        etcd_security(HTTP, false, file).expect("from the file");
        let e = etcd_security(HTTP, false, user).expect_err("no password");
        assert!(e.starts_with("--etcd-user needs its password"), "{e}");
        assert!(e.contains("flags show in ps"), "{e}");
        let e = etcd_security(HTTP, true, file).expect_err("twice");
        assert!(e.starts_with("the etcd password is given twice"), "{e}");
        let e = etcd_security(HTTP, false, |f| f.etcd_password_file = Some("pw".into()))
            .expect_err("no user");
        assert_eq!(e, "--etcd-password-file needs --etcd-user");
        let e = etcd_security(HTTP, true, |_| {}).expect_err("env, no user");
        assert!(
            e.starts_with("LOCKD_ETCD_PASSWORD is set but --etcd-user is not"),
            "{e}"
        );
        let e =
            etcd_security(HTTP, true, |f| f.etcd_user = Some(String::new())).expect_err("empty");
        assert_eq!(e, "--etcd-user must not be empty");
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn validate_checks_the_etcd_security_flags() {
        assert!(cluster(|f| f.etcd_ca = Some("ca.pem".into()))
            .starts_with("--etcd-ca and --etcd-cert are for https:// URLs"));
    }

    #[test]
    fn the_etcd_flags_are_not_checked_without_etcd() {
        let flags = Flags {
            etcd_prefix: String::new(),
            etcd_lease_ttl: secs(0),
            ..Flags::default()
        };
        flags.validate().expect("not cluster mode");
    }

    fn listening(addr: &str, change: impl FnOnce(&mut Flags)) -> Result<(), String> {
        let mut flags = Flags {
            listen: Some(addr.into()),
            ..Flags::default()
        };
        change(&mut flags);
        flags.validate()
    }

    #[test]
    fn refuses_the_network_without_authentication_unless_told() {
        for addr in [
            "0.0.0.0:5001",
            "[::]:5001",
            "10.0.0.1:5001",
            "[::ffff:10.0.0.1]:5001",
        ] {
            let e = listening(addr, |_| {}).expect_err(addr);
            assert!(
                e.starts_with(&format!("--listen {addr} is reachable")),
                "{e}"
            );
            assert!(e.contains("--insecure-open") && !e.contains('\n'), "{e}");
            listening(addr, |f| f.insecure_open = true).expect("told so");
            listening(addr, |f| f.auth_file = Some("users".into())).expect("--auth-file");
            listening(addr, |f| {
                f.tls_cert = Some("c.pem".into());
                f.tls_key = Some("k.pem".into());
                f.tls_client_ca = Some("ca.pem".into());
            })
            .expect("mutual TLS");
        }
        for addr in [
            "127.0.0.1:5001",
            "127.1.2.3:0",
            "[::1]:5001",
            "[::ffff:127.0.0.1]:0",
        ] {
            listening(addr, |_| {}).expect(addr);
        }
        // A host name is judged once it is bound (`daemon::run`).
        listening("lockd.example.com:5001", |_| {}).expect("not known yet");
    }

    #[test]
    fn only_open_listeners_served_anyway_are_warned_about() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        let told = Flags {
            insecure_open: true,
            ..Flags::default()
        };
        assert_eq!(told.open_to_the_network(&[lo], &[]), Ok(vec![]));
        let warnings = told.open_to_the_network(&[any], &[]).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("without authentication"),
            "{warnings:?}"
        );
        let users = Flags {
            auth_file: Some("users".into()),
            ..Flags::default()
        };
        assert_eq!(users.open_to_the_network(&[any], &[]), Ok(vec![]));
    }

    #[test]
    fn refuses_compat_ports_on_the_network_unless_told() {
        let compat = |host: &str, change: fn(&mut Flags)| {
            listening("127.0.0.1:5003", |f| {
                f.compat.compat = true;
                f.compat.host = host.into();
                change(f);
            })
        };
        let e = compat("0.0.0.0", |_| {}).expect_err("open compat ports");
        assert!(e.starts_with("--compat-addr 0.0.0.0 is reachable"), "{e}");
        compat("0.0.0.0", |f| f.insecure_open = true).expect("told so");
        compat("0.0.0.0", |f| f.compat.compat_no_auth = true).expect("told so");
        // --auth-file does not cover the old protocol.
        compat("0.0.0.0", |f| {
            f.auth_file = Some("users".into());
            f.compat.compat_no_auth = true;
        })
        .expect("told so");
        compat("127.0.0.1", |_| {}).expect("loopback");
        compat("localhost", |_| {}).expect("resolved at start");
    }

    #[test]
    fn a_tls_file_that_cannot_be_read_is_named() {
        let flags = Flags {
            tls_cert: Some("no-such-dir/cert.pem".into()),
            tls_key: Some("no-such-dir/key.pem".into()),
            ..Flags::default()
        };
        flags.validate().expect("no file is read by validate");
        let e = flags.server_config().expect_err("no such file");
        assert!(e.contains("no-such-dir"), "{e}");
    }
}
