//! The command lockctl runs: started in a process group of its own, so that lockctl can signal
//! everything it started at once, and (on Linux) killed by the kernel if lockctl dies.

use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

use tokio::process::Command;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::fail::{signal_code, Failure, CANNOT_EXEC, NOT_FOUND};

/// What to run: a program with arguments, or a line for `/bin/sh -c`.
#[derive(Clone, Debug)]
pub enum Program {
    Argv(Vec<String>),
    Shell(String),
}

impl Program {
    fn command(&self) -> Option<Command> {
        match self {
            Program::Argv(argv) => {
                let (first, rest) = argv.split_first()?;
                let mut cmd = Command::new(first);
                cmd.args(rest);
                Some(cmd)
            }
            Program::Shell(line) => {
                let mut cmd = Command::new("/bin/sh");
                cmd.arg("-c").arg(line);
                Some(cmd)
            }
        }
    }

    fn label(&self) -> &str {
        match self {
            Program::Argv(argv) => argv.first().map_or("", String::as_str),
            Program::Shell(_) => "/bin/sh",
        }
    }
}

/// A running command and its process group.
pub struct Child {
    inner: tokio::process::Child,
    pgid: libc::pid_t,
    /// The command's group was given the terminal (lockctl had it): take it back at the end.
    terminal: bool,
}

impl Child {
    /// Starts `program` with `env` added, as the leader of a new process group.
    pub fn spawn(program: &Program, env: &[(&str, String)]) -> Result<Child, Failure> {
        let Some(mut cmd) = program.command() else {
            return Err(Failure::usage("no command to run"));
        };
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let parent = std::process::id();
        let terminal = owns_terminal();
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || in_child(parent, terminal));
        }
        let inner = cmd.spawn().map_err(|e| {
            let code = if e.kind() == io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_EXEC
            };
            Failure::new(code, format!("cannot run {}: {e}", program.label()))
        })?;
        // std's spawn returns after the exec, so setpgid in the child has happened.
        let pgid = inner
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .unwrap_or(0);
        Ok(Child {
            inner,
            pgid,
            terminal,
        })
    }

    /// Waits for the command itself (the group leader) to exit. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.inner.wait().await
    }

    /// Sends `signal` to the whole process group; a group that is gone already is fine.
    pub fn signal_group(&self, signal: i32) {
        if self.pgid > 0 {
            // SAFETY: plain system call on a process group id we created.
            unsafe {
                libc::killpg(self.pgid, signal);
            }
        }
    }

    /// Whether any process of the group is still alive (or not yet reaped).
    pub fn group_alive(&self) -> bool {
        if self.pgid <= 0 {
            return false;
        }
        // SAFETY: signal 0 only checks for existence.
        let r = unsafe { libc::killpg(self.pgid, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.terminal {
            // SAFETY: plain system calls on our own terminal and process group.
            unsafe { give_terminal_to(libc::getpgrp()) };
        }
    }
}

/// Whether lockctl runs in the foreground of a terminal on its stdin, as when a person typed
/// the command: then the command gets the terminal, so that it can read from it (a prompt, an
/// editor) and Ctrl-C reaches it. A group of its own that is not the terminal's foreground
/// group would be stopped by the first read.
fn owns_terminal() -> bool {
    // SAFETY: plain system calls on stdin.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes `pgid` the terminal's foreground group. A process that is not in the foreground is
/// sent SIGTTOU for this, so it is ignored meanwhile. Async-signal-safe.
unsafe fn give_terminal_to(pgid: libc::pid_t) {
    let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    libc::tcsetpgrp(0, pgid);
    libc::signal(libc::SIGTTOU, old);
}

/// Runs in the forked child: own process group (in the terminal's foreground if lockctl was),
/// and die with lockctl.
fn in_child(parent: u32, terminal: bool) -> io::Result<()> {
    // SAFETY: async-signal-safe system calls only.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if terminal {
            give_terminal_to(libc::getpgrp());
            // Ctrl-Z would stop the command while lockctl keeps its lock: not offered.
            libc::signal(libc::SIGTSTP, libc::SIG_IGN);
        }
        #[cfg(target_os = "linux")]
        {
            // lockctl spawns from its main thread (a current-thread runtime), which lives as
            // long as the process, so "parent thread died" means lockctl died.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // lockctl may have died before prctl: then the signal would never come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = parent;
    }
    Ok(())
}

/// The shell's view of an exit status: the code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(sig)) => signal_code(sig),
        (None, None) => u8::MAX,
    }
}

/// SIGINT, SIGTERM and SIGHUP sent to lockctl, to pass on to the command.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub fn new() -> Result<Signals, Failure> {
        let listen =
            |kind| signal(kind).map_err(|e| Failure::usage(format!("cannot handle signals: {e}")));
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next signal's number. Cancel-safe.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            Some(()) = self.int.recv() => libc::SIGINT,
            Some(()) = self.term.recv() => libc::SIGTERM,
            Some(()) = self.hup.recv() => libc::SIGHUP,
            else => std::future::pending().await,
        }
    }
}
