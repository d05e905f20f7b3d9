//! Client ids a program need not choose: one per holder. The same id is the same client to
//! lockd (its LOCK again is a retry and gets the same grant back), so two holders in one
//! process (threads, tasks, objects) must never share one by default, or both would "hold"
//! the lock at once. `<host>:<pid>` says where a holder runs; a per-process counter tells a
//! process's holders apart.

use std::sync::atomic::{AtomicU64, Ordering};

/// `<host>:<pid>:<n>`, `n` counting from 1 in this process: a new holder's id. A request
/// keeps the id it was given across its own resends (that is what makes a resend a retry).
pub fn default_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}:{n}", process_id())
}

/// `<host>:<pid>`: this process, as a holder's id starts (lockctl's own id, one per process).
pub fn process_id() -> String {
    format!("{}:{}", hostname(), std::process::id())
}

/// This machine's name, as an id may carry it (`localhost` when it has none that fits).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let from_libc = (r == 0)
        .then(|| {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).into_owned()
        })
        .filter(|h| usable(h));
    from_libc
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| usable(h))
        })
        .unwrap_or_else(|| "localhost".into())
}

fn usable(host: &str) -> bool {
    !host.is_empty() && host.len() < 200 && crate::proto::validate_name("host", host).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_default_ids_of_one_process_differ_and_name_it() {
        let (a, b) = (default_id(), default_id());
        assert_ne!(a, b);
        let me = process_id();
        assert!(a.starts_with(&format!("{me}:")), "{a} of {me}");
        assert!(crate::proto::validate_name("id", &a).is_ok(), "{a}");
    }
}
