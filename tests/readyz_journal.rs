//! `/readyz` reflects a journal that can no longer be written: lockd's data directory on a
//! tiny tmpfs that is then filled up. Needs root and permission to mount (CI and development
//! machines have both); where mounting is refused the test says so and checks nothing.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{http_get, spawn_lockd, GUARD};

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
    let data = disk.0.join("data");
    let lockd = spawn_lockd(&[
        "--data-dir",
        data.to_str().expect("utf-8 path"),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    // The endpoint logs its address from its own task, maybe after "listening".
    let deadline = Instant::now() + GUARD;
    let metrics: std::net::SocketAddr = loop {
        let found = lockd
            .log()
            .iter()
            .find(|l| l.contains("serving metrics"))
            .and_then(|l| common::field(l, "addr"))
            .and_then(|a| a.parse().ok());
        if let Some(addr) = found {
            break addr;
        }
        assert!(
            Instant::now() < deadline,
            "lockd never logged its metrics address"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut c = lockd.raw().await;
    assert_eq!(
        c.req("LOCK before me ttl=1m").await.split(' ').next(),
        Some("OK")
    );
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
    // From then until it exits, it is not ready.
    let deadline = Instant::now() + GUARD;
    let mut answers = Vec::new();
    while tokio::net::TcpStream::connect(metrics).await.is_ok() {
        answers.push(http_get(metrics, "/readyz").await.0);
        assert!(
            Instant::now() < deadline,
            "lockd never stopped after the journal failed"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(answers.iter().all(|s| *s == 503), "{answers:?}");
    let log = lockd.log().join("\n");
    assert!(log.contains("cannot write the lock log"), "{log}");
    eprintln!(
        "/readyz answered 503 {} times before lockd exited",
        answers.len()
    );
}
