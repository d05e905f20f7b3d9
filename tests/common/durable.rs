//! Runs the real `lockd` binary as a child process on a data directory, so a test can kill it
//! (SIGKILL: no chance to flush anything) and start it again on the same files.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockd::client::Client;

/// Failure guard for anything that should take a moment.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(test: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "lockd-durability-{test}-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    /// The lockd data directory inside it.
    pub fn data(&self) -> PathBuf {
        self.0.join("data")
    }

    /// The current log file of the data directory (there is exactly one).
    pub fn log_file(&self) -> PathBuf {
        let mut logs: Vec<PathBuf> = fs::read_dir(self.data())
            .expect("read data dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        assert_eq!(logs.len(), 1, "one log file in {logs:?}");
        logs.remove(0)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One running lockd on a data directory ([`super::Lockd::command`]), on a port of the
/// test's choosing (it comes back on it after a crash), its stderr in a file that outlives it.
pub struct DurableLockd {
    child: Child,
    pub addr: String,
    stderr: PathBuf,
}

/// `lockd --listen 127.0.0.1:<port> --data-dir <data>`, from the one builder.
fn command(data: &Path, port: u16) -> Command {
    super::Lockd::new()
        .listen(format!("127.0.0.1:{port}"))
        .data_dir(data)
        .command()
}

impl DurableLockd {
    /// Starts lockd on `dir`'s data directory and waits until it answers PING.
    pub async fn start(dir: &TempDir, port: u16) -> DurableLockd {
        let stderr = dir.0.join(format!("lockd-{port}.stderr"));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stderr)
            .expect("stderr file");
        let child = command(&dir.data(), port)
            .stderr(log)
            .spawn()
            .expect("spawn lockd");
        let mut lockd = DurableLockd {
            child,
            addr: format!("127.0.0.1:{port}"),
            stderr,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = lockd.child.try_wait() {
                panic!("lockd exited at start ({status}): {}", lockd.stderr_text());
            }
            if let Ok(mut c) = Client::connect(&lockd.addr).await {
                if c.ping().await.is_ok() {
                    return lockd;
                }
            }
            assert!(
                started.elapsed() < PATIENCE,
                "lockd did not come up: {}",
                lockd.stderr_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.addr).await.expect("connect to lockd")
    }

    /// SIGKILL: the process gets no chance to write anything more.
    pub fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and wait for it to exit.
    pub fn stop(mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        wait_bounded(&mut self.child).expect("lockd did not stop on SIGTERM")
    }

    pub fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for DurableLockd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_bounded(child: &mut Child) -> Option<ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Runs lockd on `dir`'s data directory expecting it to refuse to start: returns its exit
/// status and stderr. Panics if it is still running after [`PATIENCE`].
pub fn start_expecting_failure(dir: &TempDir, port: u16) -> (ExitStatus, String) {
    let mut child = command(&dir.data(), port)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockd");
    let status = wait_bounded(&mut child).expect("lockd kept running; expected it to refuse");
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status, stderr)
}

/// Appends `bytes` to the file at `path`.
pub fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open log");
    f.write_all(bytes).expect("append to log");
    f.sync_all().expect("sync log");
}

/// The byte ranges of the log's frames (`[len u32][crc u32][payload]`).
pub fn frames(path: &Path) -> Vec<(usize, usize)> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .expect("read log");
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        out.push((at, at + 8 + len));
        at += 8 + len;
    }
    assert_eq!(at, bytes.len(), "log is whole frames");
    out
}

/// A small deterministic PRNG (xorshift64*), so the test needs no crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}
