//! A Prometheus stand-in: fetches lockd's `/metrics` at a fixed interval while scenarios run,
//! so that a run "with metrics" pays for rendering them as well as for counting.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::Out;

/// A scrape slower than this counts as failed (Prometheus's default scrape timeout).
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read; lockd's is a few KiB.
const MAX_BODY: u64 = 1 << 20;

#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
    slowest: Duration,
    last_error: Option<String>,
}

pub struct Scraper {
    task: JoinHandle<()>,
    tally: Arc<Mutex<Tally>>,
}

impl Scraper {
    /// Scrapes `addr` now and then every `every` until stopped.
    pub fn start(addr: SocketAddr, every: Duration) -> Self {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let mine = Arc::clone(&tally);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let t0 = Instant::now();
                let r = tokio::time::timeout(TIMEOUT, scrape(addr)).await;
                let took = t0.elapsed();
                let mut t = mine.lock().await;
                match r {
                    Ok(Ok(())) => {
                        t.ok += 1;
                        t.slowest = t.slowest.max(took);
                    }
                    Ok(Err(e)) => {
                        t.failed += 1;
                        t.last_error = Some(e.to_string());
                    }
                    Err(_) => {
                        t.failed += 1;
                        t.last_error = Some(format!("no answer within {TIMEOUT:?}"));
                    }
                }
            }
        });
        Scraper { task, tally }
    }

    /// Stops scraping and writes rows: scrapes answered, failed, and the slowest in ms.
    pub async fn stop(self, out: &Out) {
        self.task.abort();
        let _ = self.task.await;
        let t = self.tally.lock().await;
        if let Some(e) = &t.last_error {
            eprintln!("  metrics scrape failed ({} times), last: {e}", t.failed);
        }
        out.row("scrape.ok", t.ok as f64);
        out.row("scrape.failed", t.failed as f64);
        out.row("scrape.max_ms", t.slowest.as_secs_f64() * 1000.0);
    }
}

/// One `GET /metrics`: an answer is good if it is a 200 with lockd's grant counter in it.
async fn scrape(addr: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.take(MAX_BODY).read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        return Err(io::Error::other(format!("/metrics answered {status:?}")));
    }
    if !text.contains("lockd_grants_total") {
        return Err(io::Error::other("/metrics has no lockd_grants_total"));
    }
    Ok(())
}
