//! Durable lock state for `--data-dir`: a log of lease changes with snapshots, and one writer
//! thread that makes them durable in groups.
//!
//! Changes are appended under the table's mutex (so the log's order is the table's order)
//! to an in-memory queue, each with a sequence number. The writer takes everything queued,
//! writes it as one frame, fdatasyncs, and publishes the highest durable sequence number;
//! a session replies `OK` only once its change's number is durable. Many concurrent changes
//! share one flush (group commit).
//!
//! If a write fails the store stops for good (fail-stop): nothing queued after the failure is
//! ever reported durable, so no `OK` is sent for it, and the server shuts down. A server
//! that can't record its grants must not go on granting.
//!
//! - [`format`]: records, frames, snapshot, CRC-32.
//! - [`files`]: the directory: lock, recovery, append, compaction.

mod files;
mod format;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::locks::{BrokenLease, Change, Mode, Origin, RestoredLease, Token, UserId, NO_USER};
use crate::metrics::Metrics;
use files::{unix_ms, DataDir};
use format::{Lease, Record};

/// The number of a queued change; 0 is before the first.
pub type Seq = u64;

/// The store stopped (a write failed, or the server is closing) before a change was durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// Every change up to this number is on disk.
    durable: Seq,
    /// No more changes will become durable.
    stopped: bool,
}

#[derive(Default)]
struct CommitQueue {
    records: Vec<Record>,
    /// The number of the last change queued.
    seq: Seq,
    /// Flush what is queued, then end.
    closing: bool,
    /// Accept no more changes: they would never be written.
    stopped: bool,
    /// When the oldest change in `records` was queued.
    oldest: Option<std::time::Instant>,
    /// When the oldest change the writer is writing now was queued.
    syncing_since: Option<std::time::Instant>,
}

struct WriterState {
    queue: Mutex<CommitQueue>,
    wake: Condvar,
    progress: watch::Sender<Progress>,
    /// The same as `queue.seq`, readable without the lock.
    appended: AtomicU64,
    /// Why the writer stopped, if it failed.
    failure: Mutex<Option<String>>,
}

impl WriterState {
    fn queue(&self) -> MutexGuard<'_, CommitQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stop(&self) {
        self.queue().stopped = true;
        self.progress.send_modify(|p| p.stopped = true);
    }
}

/// The handle the lock table's shell appends changes through.
#[derive(Clone)]
pub struct Journal(Arc<WriterState>);

/// What a data directory held when it was opened.
#[derive(Debug)]
pub struct Recovered {
    leases: Vec<Lease>,
    /// The broken leases the previous run still remembered.
    breaks: Vec<format::Broken>,
    /// The sets of names among `leases`: token, names in the request's order.
    sets: Vec<(Token, Vec<String>)>,
    /// Above every token ever recorded.
    pub next_token: Token,
}

impl Recovered {
    /// The sets of names among the leases (a LOCK with `and=`): each token's names, in the
    /// request's order, for the table's [`crate::locks::Locks::restore_set`] once their
    /// leases are restored.
    pub fn sets(&self) -> &[(Token, Vec<String>)] {
        &self.sets
    }

    /// The broken leases still remembered (until the deadline each had when it was
    /// broken), for the table's [`crate::locks::Locks::restore_break`].
    pub fn breaks(&self, now: Instant) -> Vec<BrokenLease> {
        let now_ms = unix_ms();
        self.breaks
            .iter()
            .filter(|b| b.deadline_ms > now_ms)
            .filter_map(|b| {
                Some(BrokenLease {
                    name: b.name.as_str().into(),
                    token: b.token,
                    by: b.by.as_str().into(),
                    at_unix_ms: b.at_ms,
                    deadline: now.checked_add(Duration::from_millis(b.deadline_ms - now_ms))?,
                })
            })
            .collect()
    }

    /// The leases that have not ended, as the table restores them: each keeps its wall-clock
    /// deadline, turned into an `Instant` on the table's clock (`now`).
    ///
    /// `user` turns a stored user name into the user's number now (see
    /// [`crate::locks::GONE_USER`] for a
    /// name the auth file no longer has); leases stored without a user get [`NO_USER`].
    pub fn leases(&self, now: Instant, user: impl Fn(&str) -> UserId) -> Vec<RestoredLease> {
        let now_ms = unix_ms();
        let mut leases: Vec<RestoredLease> = self
            .leases
            .iter()
            .filter(|l| l.deadline_ms > now_ms)
            .filter_map(|l| {
                Some(RestoredLease {
                    name: l.name.clone(),
                    id: l.id.clone(),
                    token: l.token,
                    ttl: Duration::from_millis(l.ttl_ms.max(1)),
                    deadline: now.checked_add(Duration::from_millis(l.deadline_ms - now_ms))?,
                    mode: match l.mode {
                        0 => Mode::Shared,
                        n => Mode::limit(u32::try_from(n).unwrap_or(u32::MAX)),
                    },
                    user: l.user.as_deref().map_or(NO_USER, &user),
                    // The name as it was stored, even of a user the file no longer has:
                    // the audit trail says who took it.
                    origin: Origin::new(
                        l.user.as_deref(),
                        l.peer.as_deref().and_then(|p| p.parse().ok()),
                    ),
                    granted_unix_ms: l.granted_ms,
                    note: l.note.as_deref().map(Into::into),
                })
            })
            .collect();
        // In grant order, so a shared lock's or semaphore's holders come back in their order.
        // A clock that stepped back can make an old lease look live beside a newer one of the
        // same name: the newest lease of a name decides its shape, and only leases of that
        // shape come back (for an exclusive lock, the newest alone).
        leases.sort_unstable_by_key(|l| l.token);
        let newest: HashMap<String, (Token, Mode)> = leases
            .iter()
            .map(|l| (l.name.clone(), (l.token, l.mode)))
            .collect();
        leases.retain(|l| match newest.get(&l.name) {
            Some((token, Mode::Exclusive)) => *token == l.token,
            Some((_, mode)) => *mode == l.mode,
            None => false,
        });
        leases
    }
}

/// An open data directory and its writer thread.
pub struct Store {
    inner: Arc<WriterState>,
    writer: Option<JoinHandle<()>>,
    dir: PathBuf,
}

impl Store {
    /// Locks and recovers `dir` and starts the writer. Blocking: call it before serving (or
    /// from `spawn_blocking`). Errors name the file at fault.
    /// Each sync's time and batch size go to `metrics`.
    pub fn open(dir: &Path, metrics: Arc<Metrics>) -> io::Result<(Store, Recovered)> {
        let data = DataDir::open(dir)?;
        let recovered = Recovered {
            leases: data.state().leases.values().cloned().collect(),
            breaks: data.state().breaks.values().cloned().collect(),
            sets: data
                .state()
                .sets
                .iter()
                .map(|(token, names)| (*token, names.clone()))
                .collect(),
            next_token: data.state().high_token.saturating_add(1),
        };
        let (progress, _) = watch::channel(Progress::default());
        let inner = Arc::new(WriterState {
            queue: Mutex::new(CommitQueue::default()),
            wake: Condvar::new(),
            progress,
            appended: AtomicU64::new(0),
            failure: Mutex::new(None),
        });
        let writer = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("lockd-store".into())
                .spawn(move || write_loop(&inner, data, &metrics))?
        };
        Ok((
            Store {
                inner,
                writer: Some(writer),
                dir: dir.to_path_buf(),
            },
            recovered,
        ))
    }

    /// A handle for the lock table to append its changes through.
    pub fn journal(&self) -> Journal {
        Journal(Arc::clone(&self.inner))
    }

    /// Writes what is queued, stops the writer and releases the directory. Returns the
    /// writer's error if it failed.
    pub fn close(&mut self) -> io::Result<()> {
        if let Some(writer) = self.writer.take() {
            self.inner.queue().closing = true;
            self.inner.wake.notify_one();
            if writer.join().is_err() {
                tracing::error!("the store's writer thread panicked");
            }
            self.inner.stop();
        }
        match &*self.inner.failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(why) => Err(io::Error::other(format!(
                "stopped because {} could not be written: {why}",
                self.dir.display()
            ))),
            None => Ok(()),
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Journal {
    /// Queues `changes` (leaving the vector empty), made at `now` on the table's clock; returns
    /// the number of the last one. Call it under the table's lock, so the queue keeps the
    /// table's order.
    /// `user_name` names the users of grants, so that a restart gives their leases back to
    /// them (`None`: the lease is nobody's).
    pub fn append(
        &self,
        changes: &mut Vec<Change>,
        now: Instant,
        user_name: impl Fn(UserId) -> Option<String>,
    ) -> Seq {
        let wall = unix_ms();
        let until = |deadline: Instant| {
            wall.saturating_add(ceil_ms(deadline.saturating_duration_since(now)))
        };
        let mut q = self.0.queue();
        let was_empty = q.records.is_empty();
        for change in changes.drain(..) {
            q.seq += 1;
            if q.stopped {
                continue;
            }
            let record = match change {
                Change::Grant {
                    name,
                    id,
                    token,
                    ttl,
                    deadline,
                    mode,
                    user,
                    origin,
                    granted_unix_ms,
                    note,
                } => Record::Grant(Lease {
                    name: name.to_string(),
                    id: id.to_string(),
                    token,
                    ttl_ms: ceil_ms(ttl),
                    deadline_ms: until(deadline),
                    mode: match mode {
                        Mode::Exclusive => format::EXCLUSIVE,
                        Mode::Shared => 0,
                        Mode::Limit(n) => u64::from(n),
                    },
                    user: (user != NO_USER).then(|| user_name(user)).flatten(),
                    granted_ms: granted_unix_ms,
                    peer: origin.peer().map(|p| p.to_string()),
                    note: note.map(|n| n.to_string()),
                }),
                Change::Renew {
                    name,
                    token,
                    ttl,
                    deadline,
                } => Record::Renew {
                    name: name.to_string(),
                    token,
                    ttl_ms: ceil_ms(ttl),
                    deadline_ms: until(deadline),
                },
                Change::Release { name, token } => Record::Release {
                    name: name.to_string(),
                    token,
                },
                Change::Break {
                    name,
                    token,
                    by,
                    at_unix_ms,
                    deadline,
                } => Record::Break(format::Broken {
                    name: name.to_string(),
                    token,
                    by: by.to_string(),
                    at_ms: at_unix_ms,
                    deadline_ms: until(deadline),
                }),
                Change::Set { token, names } => Record::Set {
                    token,
                    names: names.iter().map(|n| n.to_string()).collect(),
                },
            };
            q.records.push(record);
        }
        if was_empty && !q.records.is_empty() {
            q.oldest = Some(std::time::Instant::now());
        }
        let seq = q.seq;
        self.0.appended.store(seq, Ordering::Release);
        drop(q);
        // The writer only sleeps on an empty queue.
        if was_empty {
            self.0.wake.notify_one();
        }
        seq
    }

    /// How long the oldest change not yet on disk has waited (`None`: none waits). A disk
    /// that hangs shows here, while no flush completes to show in the flush latency.
    pub fn oldest_pending(&self) -> Option<Duration> {
        let q = self.0.queue();
        let since = match (q.syncing_since, q.oldest) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(since.elapsed())
    }

    /// The number of the last change queued.
    pub fn appended(&self) -> Seq {
        self.0.appended.load(Ordering::Acquire)
    }

    /// Waits until every change up to `seq` is on disk.
    pub async fn durable(&self, seq: Seq) -> Result<(), Stopped> {
        let mut rx = self.0.progress.subscribe();
        let durable = match rx.wait_for(|p| p.durable >= seq || p.stopped).await {
            Ok(p) => p.durable >= seq,
            Err(_) => false,
        };
        if durable {
            Ok(())
        } else {
            Err(Stopped)
        }
    }

    /// Whether a write has failed (the server is stopping).
    pub fn is_failed(&self) -> bool {
        self.0
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Resolves once a write has failed: the server must stop.
    pub async fn failed(&self) {
        let mut rx = self.0.progress.subscribe();
        let _ = rx.wait_for(|p| p.stopped).await;
        let failed = self
            .0
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !failed {
            std::future::pending::<()>().await;
        }
    }
}

/// Milliseconds, rounded up: a stored lease never ends before the one granted.
fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if !d.subsec_nanos().is_multiple_of(1_000_000) {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The writer: take everything queued, write it in one go, sync, publish; until closed or a
/// write fails.
fn write_loop(inner: &WriterState, mut data: DataDir, metrics: &Metrics) {
    let mut batch = Vec::new();
    loop {
        let upto = {
            let mut q = inner.queue();
            while q.records.is_empty() && !q.closing {
                q = inner.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.records.is_empty() {
                return;
            }
            std::mem::swap(&mut q.records, &mut batch);
            q.syncing_since = q.oldest.take();
            q.seq
        };
        let (records, started) = (batch.len(), Instant::now());
        let written = data.append(&mut batch);
        metrics.journal_flushed(records, started.elapsed());
        if let Err(e) = written {
            tracing::error!(
                file = %data.log_path().display(),
                error = %e,
                "cannot write the lock log; stopping: no more grants without durability"
            );
            *inner.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            inner.stop();
            return;
        }
        inner.queue().syncing_since = None;
        inner
            .progress
            .send_modify(|p| p.durable = p.durable.max(upto));
    }
}
