//! lockctl: the lockd client, flock(1) across machines: commands over [`lockd::client`].
//!
//! - [`cli`]: flags and `--help`, with every exit code; [`fail`]: the exit codes and failures.
//! - [`request`]: the LOCK request `run` and `acquire` send.
//! - [`job`]: running a job under a lock: `lockctl run` (the LOCK, the job held under it, the
//!   library's renewal loop with lockctl's kill schedule, the job's supervisor process) and
//!   `lockctl elect` (a `run` by another name) and `leader`.
//! - [`view`]: viewing the locks: `lockctl status`, `top` and `watch`.
//! - [`mcp`]: `lockctl mcp`, the locks as an AI agent's tools (Model Context Protocol).
//! - [`ops`] (acquire, release, renew) and [`breaking`] (break): the one-request commands, with
//!   [`out`] (tables, JSON); [`holder`] says who holds a lock, for -v.
//! - [`net`]: lockctl's settings for the library's `Connector` (addresses, failover, TLS,
//!   AUTH), built from the flags by [`tls`] and [`auth`]. [`signals`]: SIGINT, SIGTERM and
//!   SIGHUP, passed on to a job or ending a view.
//! - [`docs`]: completions and man pages.
//!
//! It speaks the protocol through `lockd::client` and `lockd::proto` only: every reply is read
//! as `proto`'s types, and no module here parses a line.
//!
//! Its modules import each other in one direction (no cycle): `cli`, `fail` and `out` import
//! none of them; `signals` -> `fail`; `auth`, `tls`, `docs` -> `cli`, `fail`; `net` -> `auth`,
//! `fail`; `holder` -> `cli`, `net`, `out`; `request` -> `cli`, `fail`, `holder`, `net`;
//! `view` -> `cli`, `fail`, `net`, `out`, `signals`; `ops`, `breaking`, `mcp` -> those below
//! them; `job` -> those below it and `view` (`leader` reads STATUS as `status` does). Inside
//! `job` and `view`, see their own pages.

mod auth;
mod breaking;
mod cli;
mod docs;
mod fail;
mod holder;
mod job;
mod mcp;
mod net;
mod ops;
mod out;
mod request;
mod signals;
mod tls;
mod view;

use std::process::ExitCode;

use clap::Parser as _;

use cli::{Cli, Command};
use fail::{Failure, USAGE};
use net::{Server, ONE_SHOT_CONNECT, PATIENT_CONNECT};

fn main() -> ExitCode {
    // lockctl re-executed as the supervisor of a `run` job: before any runtime or thread.
    #[cfg(target_os = "linux")]
    if let Some(code) = job::supervisor::entry() {
        return code;
    }
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(message) = cli::old_server_flag(&args) {
        eprintln!("lockctl: {message}");
        return ExitCode::from(USAGE);
    }
    let cli = Cli::parse();
    // One thread: the command (outside Linux; there, its supervisor) is spawned from the main
    // thread, so no worker thread that comes and goes is anyone's parent.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockctl: cannot start: {e}");
            return ExitCode::from(USAGE);
        }
    };
    let code = match runtime.block_on(dispatch(&cli)) {
        Ok(code) => code,
        Err(Failure { code, message, .. }) => {
            if let Some(m) = message {
                eprintln!("lockctl: {m}");
            }
            code
        }
    };
    ExitCode::from(code)
}

async fn dispatch(cli: &Cli) -> Result<u8, Failure> {
    if let Some(done) = docs::requested(cli) {
        return done;
    }
    let Some(command) = &cli.command else {
        return Err(Failure::usage("no command given; see lockctl --help"));
    };
    let server = Server::new(
        cli.server.clone(),
        cli.connect_timeout
            .unwrap_or_else(|| default_connect_timeout(command)),
        cli.verbose,
        tls::from_args(&cli.tls)?,
        auth::Login::from_args(&cli.auth)?,
    );
    let id = match &cli.id {
        Some(id) => id.clone(),
        None => default_id(),
    };
    lockd::proto::validate_name("--id", &id).map_err(|e| Failure::usage(e.message))?;
    // A command given without `--` would otherwise be taken for names.
    if let Command::Run(args) = command {
        job::run::program(args)?;
    }
    if let Command::Elect(args) = command {
        job::elect::check(args)?;
    }
    let for_job = matches!(command, Command::Run(_) | Command::Elect(_));
    job::set_env::check_names(&lock_names(command), for_job).map_err(Failure::usage)?;
    match command {
        Command::Run(args) => job::run::run(&server, &id, args).await,
        Command::Elect(args) => job::elect::elect(&server, &id, args).await,
        Command::Leader(args) => job::elect::leader(&server, args).await,
        Command::Mcp(args) => mcp::serve(&server, &id, args).await,
        Command::Acquire(args) => ops::acquire(&server, &id, args).await,
        Command::Release(args) => ops::release(&server, args).await,
        Command::Renew(args) => ops::renew(&server, args).await,
        Command::Status(args) => view::status::status(&server, args).await,
        Command::Top(args) => view::top::top(&server, args).await,
        Command::Watch(args) => view::watch::watch(&server, args).await,
        Command::Break(args) => breaking::break_lock(&server, args).await,
        Command::Completions { .. } | Command::Man => Ok(0),
    }
}

/// Commands that wait anyway are patient with the server; a one-shot question is not.
fn default_connect_timeout(command: &Command) -> std::time::Duration {
    match command {
        // -n answers at once, even when the server is down.
        Command::Run(a) if !a.wait.nonblock => PATIENT_CONNECT,
        Command::Elect(_) => PATIENT_CONNECT,
        Command::Leader(a) if a.watch => PATIENT_CONNECT,
        Command::Watch(_) => PATIENT_CONNECT,
        Command::Acquire(a) if !a.wait.nonblock => PATIENT_CONNECT,
        _ => ONE_SHOT_CONNECT,
    }
}

fn lock_names(command: &Command) -> Vec<String> {
    let one = |name: &String| vec![name.clone()];
    match command {
        Command::Run(a) => a.names.clone(),
        Command::Elect(a) => one(&a.name),
        Command::Leader(a) => one(&a.name),
        Command::Acquire(a) => a.names.clone(),
        Command::Release(a) => one(&a.name),
        Command::Renew(a) => one(&a.lock.name),
        Command::Status(a) => a.name.iter().cloned().collect(),
        Command::Watch(a) => a.name.iter().cloned().collect(),
        Command::Break(a) => one(&a.name),
        Command::Top(_) | Command::Mcp(_) | Command::Completions { .. } | Command::Man => {
            Vec::new()
        }
    }
}

/// `<hostname>:<pid>`: lockctl is one holder per process (it runs one job), and the id says
/// where that holder runs.
fn default_id() -> String {
    lockd::client::id::process_id()
}
