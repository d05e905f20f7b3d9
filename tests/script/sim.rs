//! The scripts' simulated cluster (`scripts_on_simulated_cluster`): [`FRONT_ENDS`] lockd
//! front-ends in this process, over one in-memory etcd behind the cluster simulator's network
//! (`lockd_etcd::sim`) with its faults off and no delay ([`delay`]): no request is lost,
//! refused or late, and each front-end's watch looks for new revisions every millisecond (as
//! a watch of a real etcd on loopback delivers them within about one). Each front-end is
//! lockd's own daemon,
//! `lockd::daemon::run_simulated`: the script's flags parsed by lockd's flag parser, its
//! users loaded and its server and connection code serving a loopback port, with only the
//! etcd client swapped for the simulated one. A script's connections are spread over the
//! front-ends (see `Run`), so a release on one hands the lock to a waiter on the other.
//!
//! Each script runs on a current-thread runtime of its own, so the front-ends' log (the
//! binary's default filter) is captured by a subscriber of that thread alone.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockd::daemon::{Flags, RunError};
use lockd_etcd::sim::{Faults, Net};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::run::ServerControl;

/// How many front-ends serve a script.
pub const FRONT_ENDS: usize = 2;

/// Each way's travel time between a front-end and etcd, at most: by default none, an instant
/// network (a delay of a millisecond or two, each waited for on the real clock, makes the
/// script of 8000 LOCKs, `lagged`, ten times slower: 40s; the real etcd target has its
/// latency). `LOCKD_TEST_SIM_DELAY_MS=2` runs the scripts with up to 2ms each way instead,
/// for the races a latency shows.
fn delay() -> Duration {
    std::env::var("LOCKD_TEST_SIM_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}

/// The log filter of `lockd` without `-v` (its `main.rs`).
const LOG_FILTER: &str =
    "warn,lockd::server=info,lockd::compat=info,lockd::http=info,lockd::auth=info";

/// The front-ends' log lines, as written.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl io::Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The front-ends of one script, serving on the runtime that started them.
pub struct SimCluster {
    pub addrs: Vec<SocketAddr>,
    net: Net,
    stops: Vec<CancellationToken>,
    hangups: Vec<mpsc::Sender<()>>,
    runs: Vec<JoinHandle<Result<(), RunError>>>,
    log: LogBuf,
    _capture: tracing::subscriber::DefaultGuard,
}

impl SimCluster {
    /// Starts the front-ends of `args` (lockd's flags, `--etcd` and its prefix included) on
    /// the current runtime and this thread, and waits until each serves its port.
    pub async fn start(args: Vec<String>, seed: u64) -> Result<SimCluster, String> {
        let log = LogBuf::default();
        let subscriber = {
            let log = log.clone();
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(LOG_FILTER))
                .with_writer(move || log.clone())
                .with_ansi(false)
                .finish()
        };
        let capture = tracing::subscriber::set_default(subscriber);
        let flags = Flags::parse_args(&args).map_err(|e| format!("lockd's flags {args:?}: {e}"))?;
        let faults = Faults {
            delay: delay(),
            ..Faults::default()
        };
        // Faults stay off: `Net::faults(true)` is never called.
        let net = Net::new(seed, faults, flags.etcd_request_timeout.0);
        let mut cluster = SimCluster {
            addrs: Vec::new(),
            net: net.clone(),
            stops: Vec::new(),
            hangups: Vec::new(),
            runs: Vec::new(),
            log,
            _capture: capture,
        };
        for fe in 0..FRONT_ENDS {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("bind: {e}"))?;
            cluster
                .addrs
                .push(listener.local_addr().map_err(|e| e.to_string())?);
            let stop = CancellationToken::new();
            let (hangup, hangups) = mpsc::channel(4);
            let (flags, net, stopped) = (flags.clone(), net.clone(), stop.clone());
            cluster.runs.push(tokio::spawn(async move {
                lockd::daemon::run_simulated(flags, &net, fe, listener, stopped, hangups).await
            }));
            cluster.stops.push(stop);
            cluster.hangups.push(hangup);
        }
        // Serving once each has logged its "listening" (as the harness waits for the
        // binary's), or failed to start.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let listening = cluster
                .log()
                .iter()
                .filter(|l| l.contains(" listening "))
                .count();
            if listening >= FRONT_ENDS {
                return Ok(cluster);
            }
            if cluster.runs.iter().any(JoinHandle::is_finished)
                || tokio::time::Instant::now() > deadline
            {
                let mut why = Vec::new();
                for (fe, run) in cluster.runs.iter_mut().enumerate() {
                    if run.is_finished() {
                        why.push(format!("fe{fe}: {:?}", run.await));
                    }
                }
                return Err(format!(
                    "the front-ends did not start: {why:?}; their log: {:#?}",
                    cluster.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// What `server:` steps do to the front-ends: all of them, as to one deployment.
    pub fn control(&self, users: PathBuf) -> Box<dyn ServerControl> {
        Box::new(Control {
            stops: self.stops.clone(),
            hangups: self.hangups.clone(),
            users,
        })
    }

    /// The front-ends' log, how any of them ended, and the simulated etcd's trace.
    pub fn log(&self) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.log.0.lock().unwrap()).into_owned();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        for (fe, run) in self.runs.iter().enumerate() {
            if run.is_finished() {
                lines.push(format!("(fe{fe} has stopped)"));
            }
        }
        lines
    }

    /// The latest lines of the simulated etcd's trace (requests that changed something,
    /// watch deliveries, lease expiries).
    pub fn trace(&self) -> Vec<String> {
        self.net.trace()
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        for stop in &self.stops {
            stop.cancel();
        }
        for run in &self.runs {
            run.abort();
        }
    }
}

/// `server: stop` cancels every front-end's shutdown token (their SIGTERM); `server: users`
/// rewrites the auth file they share and asks each to reload it (their SIGHUP).
struct Control {
    stops: Vec<CancellationToken>,
    hangups: Vec<mpsc::Sender<()>>,
    users: PathBuf,
}

impl ServerControl for Control {
    fn stop(&mut self) {
        for stop in &self.stops {
            stop.cancel();
        }
    }

    fn reload_users(&mut self, specs: &[String]) -> Result<(), String> {
        super::write_users(&self.users, specs)?;
        for hangup in &self.hangups {
            let _ = hangup.try_send(());
        }
        Ok(())
    }
}
