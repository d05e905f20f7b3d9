//! The command's own process group, and the terminal: what the forked command does before
//! exec, whether lockctl starts it itself or through the job's supervisor.

use std::io;

/// Makes `pgid` the terminal's foreground group. A process that is not in the foreground is
/// sent SIGTTOU for this, so it is ignored meanwhile. Async-signal-safe.
///
/// # Safety
/// Changes signal dispositions of the whole process for a moment: call it where no other
/// thread may change them meanwhile (the forked child, or a one-thread lockctl).
pub unsafe fn give_terminal_to(pgid: libc::pid_t) {
    let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    libc::tcsetpgrp(0, pgid);
    libc::signal(libc::SIGTTOU, old);
}

/// Runs in the forked command: own process group (in the terminal's foreground if lockctl
/// was), and die with its parent (lockctl, or on Linux the supervisor), whose pid is `parent`.
pub fn in_child(parent: u32, terminal: bool) -> io::Result<()> {
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
            // The parent spawns from its main thread, which lives as long as the process,
            // so "parent thread died" means the parent died.
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
            // The parent may have died before prctl: then the signal would never come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = parent;
    }
    Ok(())
}
