//! The `lockd` daemon put together from its flags: the users of `--auth-file` and
//! their reload on SIGHUP, the open-files limit, the listeners, the metrics endpoint, the
//! shutdown signals, then [`server::run`] (which picks the backend). The binary only parses
//! its flags and calls [`run`], so every step here is reachable from tests and other
//! programs, and the binary holds no `unsafe` and spawns no task.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Gate;
use crate::backend::EtcdRefused;
use crate::http::{Endpoint, Web};
use crate::server;

mod fd_limit;
pub use fd_limit::raise_open_files;
mod flags;
mod signals;

pub use crate::proto::HumanDuration;
pub use flags::Flags;

/// Why `lockd` did not start, or stopped with an error: the message it prints (after
/// `lockd: `) and which exit status it is, as the man page's EXIT STATUS lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// A bad flag combination or a file a flag names that can't be used (`--auth-file`,
    /// the TLS files): exit status 2, as clap's own usage errors.
    Usage(String),
    /// Cannot listen on an address, or the server failed: exit status 1.
    Run(String),
}

impl RunError {
    /// The process's exit status for this failure.
    pub fn exit_status(&self) -> u8 {
        match self {
            RunError::Usage(_) => 2,
            RunError::Run(_) => 1,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Usage(message) | RunError::Run(message) => f.write_str(message),
        }
    }
}

/// Runs the server `flags` describe until SIGINT or SIGTERM (then shuts down gracefully).
/// Logging should be set up first: the start logs what it loaded and what it warns about.
pub async fn run(flags: Flags) -> Result<(), RunError> {
    if let (false, Some(dir)) = (flags.etcd.is_empty(), &flags.data_dir) {
        tracing::warn!(dir = %dir.display(), "cluster mode: --data-dir is not used (etcd keeps the locks)");
    }
    let (mut config, reloadable) = configure(&flags)?;
    // Registered before the server accepts anything: a SIGHUP never kills it.
    tokio::spawn(signals::reload_on_hangup(reloadable, config.tls.clone()));
    let listen = flags.listen();
    fd_limit::raise(config.max_connections);
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| RunError::Run(format!("cannot listen on {listen}: {e}")))?;
    let open = check_open(&flags, &listener).await?;
    let shutdown = CancellationToken::new();
    if let Some(addr) = &flags.metrics_listen {
        let metrics_listener = TcpListener::bind(addr)
            .await
            .map_err(|e| RunError::Run(format!("cannot listen for metrics on {addr}: {e}")))?;
        let mut endpoint = Endpoint::new(flags.metrics_names.clone()).open_without_auth(open);
        if flags.web {
            check_web(&flags, &metrics_listener, config.auth.is_some())?;
            let web = Web::new(config.auth.clone(), flags.web_locks, flags.web_viewers);
            endpoint = endpoint.web(web);
        }
        config.endpoint = Some(endpoint.clone());
        let stop = shutdown.clone();
        let tls = match (&config.tls, flags.metrics_tls) {
            (Some(tls), true) => Some((tls.clone(), config.tls_handshake_timeout)),
            _ => None,
        };
        tokio::spawn(async move {
            if let Err(e) = endpoint.run(metrics_listener, tls, stop).await {
                tracing::error!(error = %e, "the metrics endpoint failed");
            }
        });
    }
    tokio::spawn(signals::cancel_on_signal(shutdown.clone()));
    server::run(config, listener, shutdown)
        .await
        .map_err(server_failure)
}

/// What a SIGHUP reloads: the users' gate of `--auth-file`, and its file.
type Reloadable = Option<(Arc<Gate>, PathBuf)>;

/// The server's settings `flags` give, with the users of `--auth-file` loaded, and what a
/// SIGHUP reloads.
fn configure(flags: &Flags) -> Result<(server::Config, Reloadable), RunError> {
    let mut config = flags.server_config().map_err(RunError::Usage)?;
    let mut reloadable = None;
    if let Some(path) = &flags.auth_file {
        let gate = load_users(path).map_err(RunError::Usage)?;
        reloadable = Some((Arc::clone(&gate), path.clone()));
        config.auth = Some(gate);
    }
    Ok((config, reloadable))
}

/// The server's failure as [`run`] returns it: etcd refusing this front-end's certificates,
/// user or rights is a configuration to fix, like a bad flag (exit 2); the rest exit 1.
fn server_failure(e: std::io::Error) -> RunError {
    let refused = e.get_ref().and_then(|e| e.downcast_ref::<EtcdRefused>());
    match refused {
        Some(refused) => RunError::Usage(refused.to_string()),
        None => RunError::Run(e.to_string()),
    }
}

/// [`run`] as front-end number `fe` of a simulated etcd (`lockd_etcd::sim`), for the protocol
/// scripts' simulated cluster (`tests/scripts.rs`, `scripts_on_simulated_cluster`): the same
/// flags, checks, users and server, with the signals and the listener handed in. `flags` must
/// be cluster mode (`--etcd`, any URL: only its `--etcd-prefix`, timeouts and lease are
/// used); `stop` is SIGTERM, and each message on `hangups` is a SIGHUP. Not served: the
/// metrics endpoint and the web view (`--metrics-listen`), and `--data-dir` (unused in
/// cluster mode anyway). Not for production use: the simulated etcd is in memory.
#[doc(hidden)]
#[cfg(feature = "etcd")]
pub async fn run_simulated(
    flags: Flags,
    net: &lockd_etcd::sim::Net,
    fe: usize,
    listener: TcpListener,
    stop: CancellationToken,
    mut hangups: tokio::sync::mpsc::Receiver<()>,
) -> Result<(), RunError> {
    let (config, reloadable) = configure(&flags)?;
    let Some(etcd) = config.etcd.clone() else {
        return Err(RunError::Usage(
            "a simulated front-end is cluster mode: give --etcd".into(),
        ));
    };
    check_open(&flags, &listener).await?;
    let tls = config.tls.clone();
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            signals::reload(&reloadable, &tls);
        }
    });
    let backend = crate::backend::etcd::sim::front_end_of(net, fe, etcd, &config)
        .await
        .map_err(|e| RunError::Run(e.to_string()))?;
    server::serve(config, backend, listener, stop)
        .await
        .map_err(server_failure)
}

/// The web view shows every lock's holders, notes and addresses: on a port others can reach,
/// only to users of `--auth-file`, unless `--insecure-open` says the network is trusted.
///
/// Its logins (HTTP Basic, the secret in every request) cross the network only over TLS.
fn check_web(flags: &Flags, listener: &TcpListener, auth: bool) -> Result<(), RunError> {
    let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    if loopback || (auth && flags.metrics_tls) {
        return Ok(());
    }
    if auth {
        return Err(RunError::Usage(
            "--web with --auth-file on a --metrics-listen address that is not loopback would \
             send users' secrets across the network in clear: add --metrics-tls (with \
             --tls-cert and --tls-key), or listen on loopback behind a TLS proxy"
                .into(),
        ));
    }
    if flags.insecure_open {
        return Ok(());
    }
    Err(RunError::Usage(
        "--web on a --metrics-listen address that is not loopback would show every lock, \
         holder and note to anyone who reaches it: add --auth-file (the page then asks for a \
         user's secret and shows what its read= rights cover), or --insecure-open for a \
         trusted network"
            .into(),
    ))
}

/// [`Flags::open_to_the_network`] for the addresses as bound and resolved (`--listen` or
/// `--compat-addr` may be a host name), before anything is served: a refusal is a usage
/// failure, and each listener served open anyway is a warning. Whether any is.
async fn check_open(flags: &Flags, listener: &TcpListener) -> Result<bool, RunError> {
    let listen: Vec<_> = listener.local_addr().map(|a| a.ip()).into_iter().collect();
    let mut compat = Vec::new();
    if flags.compat.compat {
        // A host that does not resolve fails where the compat ports are bound, saying so.
        let host = (flags.compat.host.as_str(), flags.compat.lock_port);
        if let Ok(addrs) = tokio::net::lookup_host(host).await {
            compat.extend(addrs.map(|a| a.ip()));
        }
    }
    let warnings = flags
        .open_to_the_network(&listen, &compat)
        .map_err(RunError::Usage)?;
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    Ok(!warnings.is_empty())
}

/// Loads `--auth-file`, for the start: its users, or why not.
fn load_users(path: &Path) -> Result<Arc<Gate>, String> {
    let users = crate::auth::load(path, None).map_err(|e| format!("--auth-file {e}"))?;
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

/// `--auth-hash` (`new` `None`: the secret is read from standard input) and `--auth-hash-new`
/// (`new`: a strong random secret is made, and shown once on standard error, or written alone
/// to the file `--auth-secret-out` names): prints the `--auth-file` line of `spec` (a user and
/// its rights) on standard output.
pub fn print_auth_line(spec: &str, new: Option<Option<&std::path::Path>>) -> Result<(), String> {
    let secret = if new.is_some() {
        crate::auth::hex(&random_bytes::<32>()?)
    } else {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|e| format!("cannot read the secret from standard input: {e}"))?;
        line.trim_end_matches(['\n', '\r']).to_owned()
    };
    let line = crate::auth::user_line(spec, &secret, random_bytes()?)?;
    let user = spec.split_whitespace().next().unwrap_or_default();
    match new {
        None => {}
        Some(None) => {
            eprintln!("secret of {user} (shown only now; give it to its clients): {secret}")
        }
        Some(Some(path)) => write_secret(path, &secret)?,
    }
    println!("{line}");
    Ok(())
}

/// Writes `secret` alone to a new file at `path` that only its owner may read or write.
fn write_secret(path: &std::path::Path, secret: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot create the secret file {}: {e}", path.display()))?;
    writeln!(file, "{secret}")
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write the secret file {}: {e}", path.display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_have_the_exit_status_of_the_man_page() {
        assert_eq!(RunError::Usage("bad".into()).exit_status(), 2);
        assert_eq!(RunError::Run("no".into()).exit_status(), 1);
        assert_eq!(
            RunError::Run("cannot listen".into()).to_string(),
            "cannot listen"
        );
    }

    /// An address already in use: were it bound, the failure would be `Run`.
    fn busy() -> (std::net::TcpListener, String) {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let addr = taken.local_addr().expect("its address").to_string();
        (taken, addr)
    }

    #[tokio::test]
    async fn a_refused_flag_is_a_usage_failure_before_any_port_is_bound() {
        let (_taken, addr) = busy();
        let flags = Flags {
            write_timeout: HumanDuration(std::time::Duration::ZERO),
            listen: Some(addr),
            ..Flags::default()
        };
        assert_eq!(
            run(flags).await,
            Err(RunError::Usage(
                "--write-timeout must be more than 0".into()
            ))
        );
    }

    #[tokio::test]
    async fn an_auth_file_that_cannot_be_read_is_a_usage_failure() {
        let (_taken, addr) = busy();
        let flags = Flags {
            auth_file: Some("no-such-dir/users".into()),
            listen: Some(addr),
            ..Flags::default()
        };
        match run(flags).await {
            Err(RunError::Usage(e)) => assert!(e.starts_with("--auth-file"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_address_that_cannot_be_bound_is_a_run_failure() {
        let (_taken, addr) = busy();
        let flags = Flags {
            listen: Some(addr.clone()),
            ..Flags::default()
        };
        match run(flags).await {
            Err(RunError::Run(e)) => {
                assert!(e.starts_with(&format!("cannot listen on {addr}: ")), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
}
