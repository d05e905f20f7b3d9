//! The open-files limit: each client connection is a file descriptor, and the usual soft
//! limit (1024) is far below `--max-connections`' default.

/// Raises the open-files limit towards what `--max-connections` needs, as far as the hard
/// limit allows, and warns if that is not enough.
pub(super) fn raise(max_connections: usize) {
    // Connections, plus listeners, the data files and some slack.
    let want = max_connections.saturating_add(64);
    let have = raise_open_files(want);
    if have < want {
        tracing::warn!(
            open_files = have,
            max_connections,
            "the open-files limit is below --max-connections; connections past it will fail to be accepted"
        );
    }
}

/// Raises this process's soft open-files limit to `want`, as far as the hard limit allows;
/// answers the soft limit it has then. (Tests that open thousands of connections use it too.)
#[cfg(unix)]
pub fn raise_open_files(want: usize) -> usize {
    let want = want as libc::rlim_t;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
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
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

/// Elsewhere the limit is the system's: nothing to raise, nothing known.
#[cfg(not(unix))]
pub fn raise_open_files(want: usize) -> usize {
    want
}
