//! `/readyz` reflects a journal that can no longer be written: lockd's data directory on a
//! tiny tmpfs that is then filled up. Needs root and permission to mount (CI and development
//! machines have both); where mounting is refused the test says so and checks nothing.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::{config, http_get, Lockd};
use lockd::http::Endpoint;
use lockd::server::Config;
use tokio_util::sync::CancellationToken;

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(test: &str) -> Option<SmallDisk> {
        let dir = std::env::temp_dir().join(format!("lockd-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(SmallDisk(dir))
    }

    /// Writes a file until the disk is full.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).expect("filler");
        let chunk = vec![b'x'; 4096];
        while f.write_all(&chunk).is_ok() {}
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_when_the_journal_cannot_be_written() {
    let Some(disk) = SmallDisk::mount("readyz") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)");
        return;
    };
    // The endpoint runs beside the server, as lockd's main runs it, and outlives it here,
    // so what it says after the failure can be asked at leisure.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = listener.local_addr().unwrap();
    let endpoint = Endpoint::new(Vec::new());
    tokio::spawn(
        endpoint
            .clone()
            .run(listener, None, CancellationToken::new()),
    );
    let server = Lockd::new()
        .config(Config {
            data_dir: Some(disk.0.join("data")),
            endpoint: Some(endpoint),
            ..config()
        })
        .serve()
        .await;
    let mut c = server.raw().await;
    assert!(c.req("LOCK before me ttl=1m").await.starts_with("OK "));
    assert_eq!(http_get(metrics, "/readyz").await, (200, "ready\n".into()));

    disk.fill();
    // The next change can't be written: lockd refuses to answer OK for it and stops.
    // (A change may still fit in a page the log file already has: write until one doesn't.)
    let id = "x".repeat(200);
    let mut n = 0;
    loop {
        let reply = c.req(&format!("LOCK after-{n} {id} ttl=1m")).await;
        if reply.starts_with("ERR SHUTDOWN") {
            break;
        }
        assert!(reply.starts_with("OK "), "{reply}");
        n += 1;
        assert!(n < 10_000, "the journal never failed on a full disk");
    }
    let (status, body) = http_get(metrics, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    // And the server stops (fail-stop), with the error, rather than go on without a journal.
    let result = server.join().await;
    let err = result.expect_err("lockd stops with the journal's error");
    assert!(
        err.to_string().contains("No space left") || err.raw_os_error().is_some(),
        "{err}"
    );
    assert_eq!(http_get(metrics, "/readyz").await.0, 503);
}
