//! The job's supervisor (Linux): lockctl re-executed as `lockctl-job`, between lockctl and the
//! command, so that lockctl holds the lock until every process of the job is gone, as flock(1)
//! holds it while any process that inherited it lives.
//!
//! It is the child subreaper (`PR_SET_CHILD_SUBREAPER`) of the command: every process the
//! command starts that loses its parent (a background job, a double-forked daemon, a setsid'd
//! one) becomes its child, so that it reaps them all, and when it has no child left, none is
//! left anywhere in the job. Over the control socket (the descriptor named in
//! [`CONTROL_ENV`]) it tells lockctl when the command exits and when the last process is
//! gone, and lockctl tells it to signal the job. If the socket closes before the job is gone,
//! lockctl died (SIGKILL, the OOM killer): then it kills every process of the job at once,
//! reaps them and exits, well within the session grace that keeps the lock held on the
//! server.
//!
//! One thread, no runtime, blocking system calls: it forks the command from a process with no
//! other threads, and the command's death signal (`PR_SET_PDEATHSIG`) is tied to it.
//!
//! The words on the socket, one per line: from the supervisor `started <pid>` or `failed
//! <exit code> <message>`, then `exited <wait status> <processes still running>`, then `gone`;
//! from lockctl `signal <n>`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

use super::group::in_child;
use crate::fail::{CANNOT_EXEC, NOT_FOUND, USAGE};

/// argv[0] that makes lockctl the job's supervisor instead of a client (checked before
/// anything else in `main`, together with [`CONTROL_ENV`]).
pub const JOB_ARGV0: &str = "lockctl-job";
/// Set to the number of the supervisor's end of the control socket in its environment (never
/// in the command's): a stray argv[0] alone does not make a supervisor. The number is one that
/// was free in lockctl, so that every descriptor lockctl was given (its stdio, and a `3>file`
/// of the caller's) reaches the command as before.
pub const CONTROL_ENV: &str = "LOCKCTL_JOB_CONTROL";
/// The lowest number the control descriptor may have: 0-2 are the command's stdio.
pub const CONTROL_FD_MIN: libc::c_int = 3;

/// Signals that would kill the supervisor if lockctl's whole process group got them (a shell
/// killing the job, a hangup): lockctl passes them on itself, and a supervisor that died
/// would leave the command's children behind. The command gets back what lockctl had.
const IGNORED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// How often the job is swept again while it is being killed: a process may fork while it is
/// being killed, and its child must not survive it.
const KILL_SWEEP_MS: libc::c_int = 10;

/// `Some` when this process was started as the job's supervisor: then it supervises and
/// exits with the code returned. Checked in `main` before anything else (no runtime, no
/// threads yet).
pub fn entry() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    if args.next()? != JOB_ARGV0 {
        return None;
    }
    let control = std::env::var_os(CONTROL_ENV)?
        .to_str()?
        .parse::<libc::c_int>()
        .ok()
        .filter(|fd| *fd >= CONTROL_FD_MIN)?;
    let args: Vec<OsString> = args.collect();
    Some(match supervise(control, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("lockctl: job supervisor: {message}");
            ExitCode::from(USAGE)
        }
    })
}

fn supervise(control: libc::c_int, args: &[OsString]) -> Result<(), String> {
    let (terminal, argv) = match args {
        [flag, dashes, argv @ ..] if dashes == "--" && !argv.is_empty() => {
            (flag == "--terminal", argv)
        }
        _ => return Err("started without a command".into()),
    };
    let control = Control::take(control)?;
    // SAFETY: a NUL-terminated name of at most 16 bytes. (Seen in ps, instead of `exe`.)
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"lockctl-job".as_ptr(), 0, 0, 0);
    }
    // SAFETY: plain prctl on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "cannot become the job's subreaper: {}",
            io::Error::last_os_error()
        ));
    }
    let mut restore = [libc::SIG_DFL; IGNORED.len()];
    for (sig, old) in IGNORED.iter().zip(restore.iter_mut()) {
        // SAFETY: setting a disposition; no handler runs.
        *old = unsafe { libc::signal(*sig, libc::SIG_IGN) };
    }
    let children = ChildSignals::block()?;
    let leader = match spawn(argv, terminal, restore) {
        Ok(pid) => pid,
        Err((code, message)) => {
            control.tell(&format!("failed {code} {message}"));
            return Ok(());
        }
    };
    control.tell(&format!("started {leader}"));
    Job {
        leader,
        control,
        children,
        leader_status: None,
        reported: false,
        killing: false,
        orphaned: false,
    }
    .run();
    Ok(())
}

/// Starts the command as the leader of its own process group; its pid, or the exit code and
/// message to give lockctl.
fn spawn(
    argv: &[OsString],
    terminal: bool,
    restore: [libc::sighandler_t; IGNORED.len()],
) -> Result<libc::pid_t, (u8, String)> {
    let (first, rest) = argv.split_first().ok_or((USAGE, "no command".to_owned()))?;
    let mut cmd = std::process::Command::new(first);
    cmd.args(rest).env_remove(CONTROL_ENV);
    let parent = std::process::id();
    // SAFETY: runs in the forked child before exec: signal() and in_child's calls are
    // async-signal-safe, and nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            for (sig, old) in IGNORED.iter().zip(restore) {
                libc::signal(*sig, old);
            }
            in_child(parent, terminal)
        });
    }
    let child = cmd.spawn().map_err(|e| {
        let code = if e.kind() == io::ErrorKind::NotFound {
            NOT_FOUND
        } else {
            CANNOT_EXEC
        };
        (code, format!("cannot run {}: {e}", first.to_string_lossy()))
    })?;
    // Reaped by `Job`'s waitpid, never through `child`.
    libc::pid_t::try_from(child.id()).map_err(|e| (CANNOT_EXEC, e.to_string()))
}

/// The socket to lockctl.
struct Control {
    fd: libc::c_int,
    /// A partial line from lockctl.
    pending: Vec<u8>,
}

impl Control {
    /// The descriptor lockctl passed, kept from the command (close-on-exec).
    fn take(fd: libc::c_int) -> Result<Control, String> {
        // SAFETY: fcntl on a descriptor number; a closed one only fails.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(format!("no control socket: {}", io::Error::last_os_error()));
        }
        Ok(Control {
            fd,
            pending: Vec::new(),
        })
    }

    /// Writes one line; a lockctl that is gone is not an error (SIGPIPE is not raised).
    fn tell(&self, line: &str) {
        let line = format!("{line}\n");
        let mut rest = line.as_bytes();
        while !rest.is_empty() {
            // SAFETY: the buffer is valid for its length.
            let n = unsafe {
                libc::send(
                    self.fd,
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            match usize::try_from(n) {
                Ok(n) if n > 0 => rest = &rest[n..],
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                _ => return,
            }
        }
    }

    /// Reads what lockctl sent: the signals it asks for, or `None` once it is gone.
    fn read(&mut self) -> Option<Vec<libc::c_int>> {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
        let n = match usize::try_from(n) {
            Ok(0) => return None,
            Ok(n) => n,
            Err(_) => {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Some(Vec::new()),
                    _ => None,
                };
            }
        };
        self.pending.extend_from_slice(&buf[..n]);
        let mut signals = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(sig) = line
                .trim_end()
                .strip_prefix("signal ")
                .and_then(|n| n.parse::<libc::c_int>().ok())
                .filter(|n| (1..=64).contains(n))
            {
                signals.push(sig);
            }
        }
        if self.pending.len() > 1024 {
            // Not lockctl's words: drop them rather than grow.
            self.pending.clear();
        }
        Some(signals)
    }
}

/// SIGCHLD as a descriptor to poll beside the socket (blocked as a signal; the command starts
/// with an empty mask, as std resets it before exec).
struct ChildSignals {
    fd: libc::c_int,
}

impl ChildSignals {
    fn block() -> Result<ChildSignals, String> {
        // SAFETY: sigset operations on a local set; the process has one thread.
        unsafe {
            // An ignored SIGCHLD (inherited) would reap children unseen and never be read.
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(format!(
                    "cannot block SIGCHLD: {}",
                    io::Error::last_os_error()
                ));
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                return Err(format!("signalfd: {}", io::Error::last_os_error()));
            }
            Ok(ChildSignals { fd })
        }
    }

    fn drain(&self) {
        let mut info = std::mem::MaybeUninit::<libc::signalfd_siginfo>::uninit();
        // SAFETY: reads at most one siginfo into a buffer of that size.
        while unsafe {
            libc::read(
                self.fd,
                info.as_mut_ptr().cast(),
                std::mem::size_of::<libc::signalfd_siginfo>(),
            )
        } > 0
        {}
    }
}

struct Job {
    leader: libc::pid_t,
    control: Control,
    children: ChildSignals,
    /// The leader's wait status, once reaped.
    leader_status: Option<libc::c_int>,
    /// lockctl was told of the leader's exit.
    reported: bool,
    /// Every process is being SIGKILLed until none is left.
    killing: bool,
    /// lockctl is gone.
    orphaned: bool,
}

impl Job {
    fn run(mut self) {
        loop {
            let none_left = self.reap();
            if let (Some(status), false) = (self.leader_status, self.reported) {
                let running = if none_left {
                    0
                } else {
                    live(&descendants()).count()
                };
                self.control.tell(&format!("exited {status} {running}"));
                self.reported = true;
            }
            if none_left {
                self.control.tell("gone");
                return;
            }
            if self.killing {
                self.signal(libc::SIGKILL);
            }
            self.wait_for_news();
        }
    }

    /// Reaps every child that has exited; true once none is left (every process of the job is
    /// gone: one whose parent died was re-parented here).
    fn reap(&mut self) -> bool {
        loop {
            let mut status = 0;
            // SAFETY: plain waitpid.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            match pid {
                0 => return false,
                p if p > 0 => {
                    if p == self.leader {
                        self.leader_status = Some(status);
                    }
                }
                _ => match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => {}
                    // ECHILD (or nothing else it could be).
                    _ => return true,
                },
            }
        }
    }

    /// Blocks until a child exits or lockctl says something (or, while killing, the next
    /// sweep is due).
    fn wait_for_news(&mut self) {
        let mut fds = [
            libc::pollfd {
                fd: self.children.fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative fd is skipped: lockctl is gone, nothing more will come.
                fd: if self.orphaned { -1 } else { self.control.fd },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let wait = if self.killing { KILL_SWEEP_MS } else { -1 };
        // SAFETY: the array is valid for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, wait) };
        if n <= 0 {
            return;
        }
        if fds[0].revents != 0 {
            self.children.drain();
        }
        if fds[1].revents != 0 {
            match self.control.read() {
                Some(signals) => {
                    for sig in signals {
                        if sig == libc::SIGKILL {
                            self.killing = true;
                        }
                        self.signal(sig);
                    }
                }
                None => {
                    // lockctl died with the job still running: nobody holds the lock for it
                    // much longer, so the job must go now.
                    self.orphaned = true;
                    self.killing = true;
                    self.signal(libc::SIGKILL);
                }
            }
        }
    }

    /// Sends `sig` to the command's process group, then to every other live process of the
    /// job (each once: a trap would run twice for a signal sent twice). Once the leader is
    /// reaped its pid is free, and with its group empty the number could be taken by an
    /// unrelated process group: from then on every process of the job is signalled by its own
    /// pid, as found below this one, and the group never again.
    fn signal(&self, sig: libc::c_int) {
        let group_held = self.leader_status.is_none();
        if group_held {
            // SAFETY: plain system call; the leader, alive or a zombie not yet reaped, holds
            // its pid and so its group's number.
            unsafe {
                libc::killpg(self.leader, sig);
            }
        }
        for p in live(&descendants()).filter(|p| !group_held || p.pgrp != self.leader) {
            // SAFETY: plain kill of a process below this one (one that exits meanwhile only
            // makes it fail).
            unsafe {
                libc::kill(p.pid, sig);
            }
        }
    }
}

/// lockctl's last line of defence, should its job's supervisor die without a word (killed
/// with -9 itself): lockctl is the subreaper above it ([`become_subreaper`]), so what the job
/// left running is re-parented to lockctl. SIGKILLs every live process below this one and
/// says how many there were; called until it says none, before the lock is released.
pub fn kill_descendants() -> usize {
    let live: Vec<Proc> = live(&descendants()).copied().collect();
    for p in &live {
        // SAFETY: plain kill of a process below this one.
        unsafe {
            libc::kill(p.pid, libc::SIGKILL);
        }
    }
    live.len()
}

/// Makes this process (lockctl) the subreaper of what it starts: if the job's supervisor dies,
/// the job's orphans come to lockctl rather than to init, within [`kill_descendants`]' reach.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: plain prctl on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One process, from /proc/<pid>/stat.
#[derive(Clone, Copy, Debug)]
struct Proc {
    pid: libc::pid_t,
    ppid: libc::pid_t,
    pgrp: libc::pid_t,
    zombie: bool,
}

fn live(procs: &[Proc]) -> impl Iterator<Item = &Proc> {
    procs.iter().filter(|p| !p.zombie)
}

/// Every process below this one, found through the parent links in /proc (a process that
/// appears or goes meanwhile is caught by the next sweep).
fn descendants() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut by_parent: HashMap<libc::pid_t, Vec<Proc>> = HashMap::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if let Some(p) = stat(pid) {
            by_parent.entry(p.ppid).or_default().push(p);
        }
    }
    let mut found = Vec::new();
    // SAFETY: plain getpid.
    let mut todo = vec![unsafe { libc::getpid() }];
    while let Some(parent) = todo.pop() {
        for p in by_parent.remove(&parent).unwrap_or_default() {
            todo.push(p.pid);
            found.push(p);
        }
    }
    found
}

/// `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses, so the fields are
/// counted from its last `)`.
fn stat(pid: libc::pid_t) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

fn parse_stat(pid: libc::pid_t, text: &str) -> Option<Proc> {
    let (_, rest) = text.rsplit_once(") ")?;
    let mut fields = rest.split(' ');
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        pgrp,
        zombie: state.starts_with('Z') || state.starts_with('X'),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_found_in_proc() {
        let me = stat(std::process::id() as libc::pid_t).unwrap();
        // SAFETY: plain getppid.
        assert_eq!(me.ppid, unsafe { libc::getppid() });
        assert!(!me.zombie);
    }

    #[test]
    fn a_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let p = parse_stat(42, "42 (a) b (c)) Z 7 9 9 0 -1").unwrap();
        assert_eq!((p.pid, p.ppid, p.pgrp, p.zombie), (42, 7, 9, true));
        assert!(parse_stat(42, "42 (cut").is_none());
        assert!(parse_stat(42, "42 (x) S notapid 1").is_none());
    }
}
