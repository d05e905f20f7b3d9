//! The command lockctl runs, and every process it starts: the job.
//!
//! On Linux the command runs under a supervisor process ([`super::supervisor`]): lockctl re-executes
//! itself as `lockctl-job`, which becomes the child subreaper of everything the command
//! starts, so that it sees each of them exit (double-forked daemons and setsid'd processes
//! included), signals all of them when told to, and kills all of them if lockctl dies. Here is
//! lockctl's side of that: it starts the supervisor, learns from it when the command (the
//! leader) exits and when the last process of the job is gone, and asks it to signal the job.
//!
//! Elsewhere the command is lockctl's own child in a process group of its own, and the job is
//! that group.

use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

use super::group::give_terminal_to;
#[cfg(not(target_os = "linux"))]
use super::group::in_child;
#[cfg(target_os = "linux")]
use super::supervisor::kill_descendants;
use crate::fail::{signal_code, Failure};
#[cfg(not(target_os = "linux"))]
use crate::fail::{CANNOT_EXEC, NOT_FOUND};

/// What to run: a program with arguments, or a line for `/bin/sh -c`.
#[derive(Clone, Debug)]
pub enum Program {
    Argv(Vec<String>),
    Shell(String),
}

impl Program {
    /// The program and its arguments, as exec sees them.
    fn argv(&self) -> Vec<String> {
        match self {
            Program::Argv(argv) => argv.clone(),
            Program::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        }
    }
}

/// What the job did.
#[derive(Debug)]
pub enum Event {
    /// The command itself (the leader) exited; `running` processes it started still run.
    Exited { status: ExitStatus, running: usize },
    /// The last process of the job is gone (comes after `Exited`).
    Gone,
}

/// A running job: the command and everything it started.
pub struct Child {
    #[cfg(target_os = "linux")]
    supervised: linux::Supervised,
    #[cfg(not(target_os = "linux"))]
    inner: tokio::process::Child,
    #[cfg(not(target_os = "linux"))]
    exited: bool,
    /// The command's process group (its pid).
    pgid: libc::pid_t,
    /// The command's group was given the terminal (lockctl had it): take it back at the end.
    terminal: bool,
}

#[cfg(target_os = "linux")]
impl Child {
    /// Starts `program` with `env` added under a supervisor, as the leader of a new process
    /// group (given the terminal if lockctl has it).
    pub async fn spawn(program: &Program, env: &[(&str, String)]) -> Result<Child, Failure> {
        let argv = program.argv();
        if argv.is_empty() {
            return Err(Failure::usage("no command to run"));
        }
        let terminal = owns_terminal();
        let (supervised, pgid) = linux::Supervised::start(&argv, env, terminal).await?;
        Ok(Child {
            supervised,
            pgid,
            terminal,
        })
    }

    /// The next thing the job did. Cancel-safe; not to be called after [`Event::Gone`].
    pub async fn next(&mut self) -> io::Result<Event> {
        let event = self.supervised.next().await;
        if event.is_err() {
            // The supervisor is gone without a word: whatever is left of the command's
            // group goes, and so does every other process of the job, which came to lockctl
            // (its subreaper) when the supervisor died. Only then is the lock released.
            self.kill_group_now();
            while kill_descendants() > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        event
    }

    /// Sends `signal` to every process of the job (the supervisor walks them all, and keeps
    /// at it for SIGKILL until none is left).
    pub fn signal_job(&mut self, signal: i32) {
        if signal == libc::SIGKILL {
            // At once, without waiting for the supervisor to be scheduled.
            self.kill_group_now();
        }
        if !self.supervised.signal(signal) {
            self.signal_group(signal);
        }
    }

    /// After [`Event::Gone`]: the supervisor, which exits right after, is reaped (not left
    /// to init as a zombie when lockctl exits first).
    pub async fn finish(&mut self, _stopped_by: Option<tokio::time::Instant>) {
        self.supervised.reap().await;
    }

    fn kill_group_now(&self) {
        if !self.supervised.is_gone() {
            self.signal_group(libc::SIGKILL);
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Child {
    /// Starts `program` with `env` added, as the leader of a new process group. (No
    /// supervisor outside Linux: the job is the command's process group.)
    pub async fn spawn(program: &Program, env: &[(&str, String)]) -> Result<Child, Failure> {
        let argv = program.argv();
        let Some((first, rest)) = argv.split_first() else {
            return Err(Failure::usage("no command to run"));
        };
        let mut cmd = tokio::process::Command::new(first);
        cmd.args(rest);
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
            Failure::new(code, format!("cannot run {first}: {e}"))
        })?;
        // std's spawn returns after the exec, so setpgid in the child has happened.
        let pgid = inner
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .unwrap_or(0);
        Ok(Child {
            inner,
            exited: false,
            pgid,
            terminal,
        })
    }

    /// The leader's exit, then at once `Gone` (what else is left in the group is not
    /// waited for). Cancel-safe.
    pub async fn next(&mut self) -> io::Result<Event> {
        if self.exited {
            return Ok(Event::Gone);
        }
        let status = self.inner.wait().await?;
        self.exited = true;
        Ok(Event::Exited { status, running: 0 })
    }

    /// Sends `signal` to the command's process group.
    pub fn signal_job(&mut self, signal: i32) {
        self.signal_group(signal);
    }

    /// After [`Event::Gone`]. If the job was stopped with a deadline, whatever is left in
    /// the leader's group must be gone by then too.
    pub async fn finish(&mut self, stopped_by: Option<tokio::time::Instant>) {
        const GROUP_POLL: std::time::Duration = std::time::Duration::from_millis(20);
        let Some(until) = stopped_by else {
            return;
        };
        while self.group_alive() && tokio::time::Instant::now() < until {
            tokio::time::sleep(GROUP_POLL).await;
        }
        self.signal_group(libc::SIGKILL);
    }

    /// Whether any process of the group is still alive (or not yet reaped).
    fn group_alive(&self) -> bool {
        if self.pgid <= 0 {
            return false;
        }
        // SAFETY: signal 0 only checks for existence.
        let r = unsafe { libc::killpg(self.pgid, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
}

impl Child {
    /// Sends `signal` to the command's process group; a group that is gone already is fine.
    fn signal_group(&self, signal: i32) {
        if self.pgid > 0 {
            // SAFETY: plain system call on a process group id we created.
            unsafe {
                libc::killpg(self.pgid, signal);
            }
        }
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

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::ExitStatus;

    use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
    use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

    use super::Event;
    use crate::fail::{Failure, CANNOT_EXEC};
    use crate::job::supervisor::{become_subreaper, CONTROL_ENV, CONTROL_FD_MIN, JOB_ARGV0};

    /// lockctl's end of the control socket to the job's supervisor.
    pub struct Supervised {
        /// Never killed with `Child` (it must clean up first); reaped by [`Self::reap`], or
        /// by tokio once dropped.
        process: tokio::process::Child,
        from: Lines<BufReader<OwnedReadHalf>>,
        to: OwnedWriteHalf,
        gone: bool,
    }

    impl Supervised {
        /// Starts the supervisor and waits for its word that the command runs: its pid, which
        /// is its process group.
        pub async fn start(
            argv: &[String],
            env: &[(&str, String)],
            terminal: bool,
        ) -> Result<(Supervised, libc::pid_t), Failure> {
            let cannot = |e: io::Error| {
                Failure::new(
                    CANNOT_EXEC,
                    format!("cannot start the job's supervisor: {e}"),
                )
            };
            become_subreaper().map_err(cannot)?;
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(cannot)?;
            let theirs = above_stdio(theirs.into()).map_err(cannot)?;
            let theirs_fd = theirs.as_raw_fd();
            // Itself, even if the file was replaced or removed since it started.
            let mut cmd = tokio::process::Command::new("/proc/self/exe");
            cmd.arg0(JOB_ARGV0)
                .arg(if terminal {
                    "--terminal"
                } else {
                    "--no-terminal"
                })
                .arg("--")
                .args(argv)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env(CONTROL_ENV, theirs_fd.to_string());
            // SAFETY: runs in the forked child before exec; fcntl is async-signal-safe, and
            // nothing is allocated.
            unsafe {
                cmd.pre_exec(move || pass_control(theirs_fd));
            }
            let process = cmd.spawn().map_err(cannot)?;
            drop(theirs);
            ours.set_nonblocking(true).map_err(cannot)?;
            let (from, to) = tokio::net::UnixStream::from_std(ours)
                .map_err(cannot)?
                .into_split();
            let mut from = BufReader::new(from).lines();
            let first = from.next_line().await.map_err(cannot)?;
            let first = first.unwrap_or_default();
            let mut words = first.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("started"), Some(pid), None) => match pid.parse::<libc::pid_t>() {
                    Ok(pid) if pid > 0 => Ok((
                        Supervised {
                            process,
                            from,
                            to,
                            gone: false,
                        },
                        pid,
                    )),
                    _ => Err(cannot(io::Error::other(format!("it said {first:?}")))),
                },
                (Some("failed"), Some(code), Some(message)) => {
                    let code = code.parse().unwrap_or(CANNOT_EXEC);
                    Err(Failure::new(code, message))
                }
                _ => Err(cannot(io::Error::other(if first.is_empty() {
                    "it exited at once".to_owned()
                } else {
                    format!("it said {first:?}")
                }))),
            }
        }

        /// Cancel-safe (`Lines::next_line` is).
        pub async fn next(&mut self) -> io::Result<Event> {
            loop {
                let Some(line) = self.from.next_line().await? else {
                    return Err(io::Error::other("the job's supervisor died"));
                };
                let words: Vec<&str> = line.split(' ').collect();
                match words.as_slice() {
                    ["exited", raw, running] => {
                        let (Ok(raw), Ok(running)) = (raw.parse(), running.parse()) else {
                            continue;
                        };
                        return Ok(Event::Exited {
                            status: ExitStatus::from_raw(raw),
                            running,
                        });
                    }
                    ["gone"] => {
                        self.gone = true;
                        return Ok(Event::Gone);
                    }
                    _ => {}
                }
            }
        }

        /// Waits for the supervisor to exit, which it does right after `gone`.
        pub async fn reap(&mut self) {
            const EXIT: std::time::Duration = std::time::Duration::from_secs(5);
            let _ = tokio::time::timeout(EXIT, self.process.wait()).await;
        }

        pub fn is_gone(&self) -> bool {
            self.gone
        }

        /// Asks the supervisor to signal the job; false if it could not be told. A line of a
        /// few bytes into an idle socket's buffer: it does not block, so it is never waited for.
        pub fn signal(&mut self, signal: i32) -> bool {
            let line = format!("signal {signal}\n");
            let mut rest = line.as_bytes();
            while !rest.is_empty() {
                match self.to.try_write(rest) {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => rest = &rest[n..],
                }
            }
            true
        }
    }

    /// A copy of `fd` numbered [`CONTROL_FD_MIN`] or more (a lockctl started with stdin
    /// closed could have been given 0 for it), close-on-exec like the original.
    fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
        // SAFETY: fcntl on a descriptor we own; the copy is owned by the OwnedFd made of it.
        unsafe {
            let copy = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, CONTROL_FD_MIN);
            if copy < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(OwnedFd::from_raw_fd(copy))
        }
    }

    /// In the forked supervisor: its end of the socket kept across exec (the number stays).
    fn pass_control(fd: libc::c_int) -> io::Result<()> {
        // SAFETY: an async-signal-safe system call on a descriptor of this process.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
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

/// The shell's view of an exit status: the code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(sig)) => signal_code(sig),
        (None, None) => u8::MAX,
    }
}
