//! The data directory: locking it, recovering its state, appending to the log, compacting.
//!
//! Layout: `lockd.lock` (held with `flock` while a lockd uses the directory),
//! `leases.snapshot` (the live leases and the token high-water mark, naming the log that
//! follows it) and `leases.<generation>.log`. Only this module touches these files, and only
//! from the writer thread once the server runs.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::format::{self, Broken, Lease, LogFrame, Record, Snapshot};

/// Records in the log before compaction is considered...
const COMPACT_AFTER: u64 = 64 * 1024;
/// ...and it happens when the log holds this many times more records than live leases.
const COMPACT_RATIO: u64 = 4;

const LOCK_FILE: &str = "lockd.lock";
const SNAPSHOT: &str = "leases.snapshot";
const SNAPSHOT_TMP: &str = "leases.snapshot.tmp";

/// The wall clock in milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The leases as the log says they are, by token and name (a semaphore's name has several
/// tokens, a set's token several names), and the highest token ever granted.
#[derive(Debug, Default)]
pub struct LogState {
    pub leases: HashMap<(u64, String), Lease>,
    pub high_token: u64,
    /// The broken leases still remembered, by token and name.
    pub breaks: HashMap<(u64, String), Broken>,
    /// The sets of names, by token, while any of their leases lives.
    pub sets: HashMap<u64, Vec<String>>,
}

impl LogState {
    fn apply(&mut self, record: Record) {
        match record {
            Record::Grant(lease) => {
                self.high_token = self.high_token.max(lease.token);
                self.leases.insert((lease.token, lease.name.clone()), lease);
            }
            Record::Renew {
                name,
                token,
                ttl_ms,
                deadline_ms,
            } => {
                if let Some(lease) = self.leases.get_mut(&(token, name)) {
                    lease.ttl_ms = ttl_ms;
                    lease.deadline_ms = deadline_ms;
                }
            }
            Record::Release { name, token } => {
                self.leases.remove(&(token, name));
                let ended = self.sets.get(&token).is_some_and(|names| {
                    !names
                        .iter()
                        .any(|n| self.leases.contains_key(&(token, n.clone())))
                });
                if ended {
                    self.sets.remove(&token);
                }
            }
            Record::Break(broken) => {
                self.high_token = self.high_token.max(broken.token);
                self.breaks
                    .insert((broken.token, broken.name.clone()), broken);
            }
            Record::Set { token, names } => {
                self.sets.insert(token, names);
            }
        }
    }

    /// Forgets leases that ended by `now_ms`: they need no record of their end.
    fn prune(&mut self, now_ms: u64) {
        self.leases.retain(|_, l| l.deadline_ms > now_ms);
        self.breaks.retain(|_, b| b.deadline_ms > now_ms);
        let leases = &self.leases;
        self.sets.retain(|&token, names| {
            names
                .iter()
                .any(|n| leases.contains_key(&(token, n.clone())))
        });
    }
}

/// An open, locked data directory.
pub struct DataDir {
    dir: PathBuf,
    /// Holds the directory's lock for as long as this lives.
    _lock: File,
    generation: u64,
    log: File,
    log_path: PathBuf,
    state: LogState,
    records_in_log: u64,
    next_check: u64,
    frame: Vec<u8>,
}

fn err(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

fn log_name(generation: u64) -> String {
    format!("leases.{generation}.log")
}

fn log_generation(file_name: &str) -> Option<u64> {
    file_name
        .strip_prefix("leases.")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Takes an exclusive `flock` on the directory's lock file without waiting.
fn lock_dir(dir: &Path) -> io::Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| err(e.kind(), format!("cannot open {}: {e}", path.display())))?;
    try_lock(&file).map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock {
            err(
                e.kind(),
                format!(
                    "data directory {} is in use by another lockd (lock held on {})",
                    dir.display(),
                    path.display()
                ),
            )
        } else {
            err(e.kind(), format!("cannot lock {}: {e}", path.display()))
        }
    })?;
    Ok(file)
}

#[cfg(unix)]
fn try_lock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock only reads the descriptor, which `file` keeps open for the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    Err(e)
}

#[cfg(not(unix))]
fn try_lock(_file: &File) -> io::Result<()> {
    Ok(())
}

impl DataDir {
    /// Locks `dir` (creating it if needed) and reads its state. A torn last frame of the log
    /// is cut off with a warning; any other damage is an error naming the file.
    pub fn open(dir: &Path) -> io::Result<DataDir> {
        fs::create_dir_all(dir)
            .map_err(|e| err(e.kind(), format!("cannot create {}: {e}", dir.display())))?;
        let lock = lock_dir(dir)?;
        let tmp = dir.join(SNAPSHOT_TMP);
        if tmp.exists() {
            // A compaction that did not finish: the old snapshot and log are still in force.
            fs::remove_file(&tmp)?;
        }

        let snapshot_path = dir.join(SNAPSHOT);
        let mut state = LogState::default();
        let mut generation = 0;
        match fs::read(&snapshot_path) {
            Ok(bytes) => {
                let snap = Snapshot::decode(&bytes).map_err(|d| {
                    err(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: damaged snapshot ({d}); refusing to start without it \
                             (restore it from a backup, or move the data directory away \
                             to start empty)",
                            snapshot_path.display()
                        ),
                    )
                })?;
                generation = snap.generation;
                state.high_token = snap.high_token;
                for lease in snap.leases {
                    state
                        .leases
                        .insert((lease.token, lease.name.clone()), lease);
                }
                for broken in snap.breaks {
                    state
                        .breaks
                        .insert((broken.token, broken.name.clone()), broken);
                }
                state.sets.extend(snap.sets);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(err(
                    e.kind(),
                    format!("cannot read {}: {e}", snapshot_path.display()),
                ))
            }
        }

        remove_other_logs(dir, generation)?;
        let log_path = dir.join(log_name(generation));
        let records_in_log = read_log(&log_path, &mut state)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| err(e.kind(), format!("cannot open {}: {e}", log_path.display())))?;
        sync_dir(dir)?;
        Ok(DataDir {
            dir: dir.to_path_buf(),
            _lock: lock,
            generation,
            log,
            log_path,
            state,
            records_in_log,
            next_check: records_in_log.max(COMPACT_AFTER),
            frame: Vec::new(),
        })
    }

    pub fn state(&self) -> &LogState {
        &self.state
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Appends `records` (leaving the vector empty) and syncs them: when this returns Ok they
    /// survive a crash. One frame (one write, one fdatasync) unless the batch is huge.
    pub fn append(&mut self, records: &mut Vec<Record>) -> io::Result<()> {
        let mut rest = &records[..];
        while !rest.is_empty() {
            self.frame.clear();
            let taken = format::encode_frame(rest, format::SPLIT_FRAME_AT, &mut self.frame);
            self.log.write_all(&self.frame)?;
            self.log.sync_data()?;
            rest = &rest[taken..];
        }
        self.records_in_log += records.len() as u64;
        for record in records.drain(..) {
            self.state.apply(record);
        }
        self.maybe_compact()
    }

    fn maybe_compact(&mut self) -> io::Result<()> {
        if self.records_in_log < self.next_check {
            return Ok(());
        }
        self.state.prune(unix_ms());
        if self.records_in_log > COMPACT_RATIO * self.state.leases.len() as u64 {
            self.compact()
        } else {
            self.next_check = self.records_in_log + COMPACT_AFTER;
            Ok(())
        }
    }

    /// Writes the live state as a new snapshot and starts an empty log. Crash-safe at every
    /// step: until the rename, the old snapshot and log are in force; after it, the new ones.
    fn compact(&mut self) -> io::Result<()> {
        let generation = self.generation + 1;
        let snap = Snapshot {
            generation,
            high_token: self.state.high_token,
            leases: self.state.leases.values().cloned().collect(),
            breaks: self.state.breaks.values().cloned().collect(),
            sets: self
                .state
                .sets
                .iter()
                .map(|(token, names)| (*token, names.clone()))
                .collect(),
        };
        let tmp = self.dir.join(SNAPSHOT_TMP);
        let mut file = File::create(&tmp)?;
        file.write_all(&snap.encode())?;
        file.sync_all()?;
        drop(file);
        let log_path = self.dir.join(log_name(generation));
        let log = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&log_path)?;
        log.sync_all()?;
        sync_dir(&self.dir)?;
        fs::rename(&tmp, self.dir.join(SNAPSHOT))?;
        sync_dir(&self.dir)?;
        let old = std::mem::replace(&mut self.log_path, log_path);
        self.log = OpenOptions::new().append(true).open(&self.log_path)?;
        self.generation = generation;
        if let Err(e) = fs::remove_file(&old) {
            tracing::warn!(file = %old.display(), error = %e, "cannot remove the old log");
        }
        tracing::debug!(
            leases = snap.leases.len(),
            records = self.records_in_log,
            "compacted the log into a snapshot"
        );
        self.records_in_log = 0;
        self.next_check = COMPACT_AFTER;
        Ok(())
    }
}

/// Logs of other generations are left from a compaction that stopped half-way: older ones
/// are already in the snapshot, a newer one was created empty before the snapshot that would
/// name it. A newer one with records in it means files from somewhere else: refuse.
fn remove_other_logs(dir: &Path, generation: u64) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(g) = name.to_str().and_then(log_generation) else {
            continue;
        };
        if g == generation {
            continue;
        }
        let path = entry.path();
        if g > generation && entry.metadata()?.len() > 0 {
            return Err(err(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is newer than the snapshot ({}) but not empty; refusing to guess \
                     which is right",
                    path.display(),
                    dir.join(SNAPSHOT).display()
                ),
            ));
        }
        fs::remove_file(&path)?;
    }
    Ok(())
}

/// Applies the log at `path` (if any) to `state`; returns how many records it held.
fn read_log(path: &Path, state: &mut LogState) -> io::Result<u64> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(err(
                e.kind(),
                format!("cannot read {}: {e}", path.display()),
            ))
        }
    };
    let mut at = 0;
    let mut records = Vec::new();
    while at < bytes.len() {
        match format::check_frame(&bytes[at..]) {
            LogFrame::Good { size, payload_at } => {
                let payload = &bytes[at + payload_at..at + size];
                format::decode_records(payload, &mut records).map_err(|d| {
                    err(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: record at byte {at} has a good checksum but cannot be read \
                             ({d}); was it written by another program?",
                            path.display()
                        ),
                    )
                })?;
                at += size;
            }
            LogFrame::Bad => {
                if let Some(good) = (at + 1..bytes.len())
                    .find(|&p| matches!(format::check_frame(&bytes[p..]), LogFrame::Good { .. }))
                {
                    return Err(err(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: damaged record at byte {at}, followed by good records at \
                             byte {good}; refusing to guess what was lost (restore the file \
                             from a backup, or move the data directory away to start empty)",
                            path.display()
                        ),
                    ));
                }
                tracing::warn!(
                    file = %path.display(),
                    at,
                    dropped_bytes = bytes.len() - at,
                    "the log ends in a torn record (a crash during a write); dropping it"
                );
                let file = OpenOptions::new().write(true).open(path)?;
                file.set_len(at as u64)?;
                file.sync_all()?;
                break;
            }
        }
    }
    let count = records.len() as u64;
    for record in records {
        state.apply(record);
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let path = std::env::temp_dir().join(format!(
                "lockd-files-{name}-{}-{}",
                std::process::id(),
                unix_ms()
            ));
            let _ = fs::remove_dir_all(&path);
            TempDir(path)
        }
    }

    /// Opens `dir` again after a `drop`: a process another test spawns meanwhile may hold a
    /// copy of the lock's descriptor for the moment between its fork and its exec (the
    /// descriptor is closed on exec), so a `WouldBlock` is tried again for a while.
    fn open_again(dir: &Path) -> io::Result<DataDir> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match DataDir::open(dir) {
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        && std::time::Instant::now() < until =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn grant(name: &str, token: u64, deadline_ms: u64) -> Record {
        Record::Grant(Lease {
            name: name.into(),
            id: "me".into(),
            token,
            ttl_ms: 60_000,
            deadline_ms,
            mode: super::super::format::EXCLUSIVE,
            user: None,
            granted_ms: 0,
            peer: None,
            note: None,
        })
    }

    #[test]
    fn compaction_keeps_live_leases_and_the_token_high_water_mark() {
        let dir = TempDir::new("compact");
        let later = unix_ms() + 3_600_000;
        let mut data = open_again(&dir.0).unwrap();
        data.append(&mut vec![grant("kept", 1, later)]).unwrap();
        let mut token = 1;
        churn_until_compacted(&mut data, &mut token, later);
        // One more change after the switch goes to the new log.
        data.append(&mut vec![Record::Renew {
            name: "kept".into(),
            token: 1,
            ttl_ms: 5,
            deadline_ms: later + 1,
        }])
        .unwrap();
        drop(data);

        let names: Vec<String> = fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.contains(&"leases.1.log".to_string()), "{names:?}");
        assert!(!names.contains(&"leases.0.log".to_string()), "{names:?}");

        let data = open_again(&dir.0).unwrap();
        assert_eq!(data.state().high_token, token);
        assert_eq!(data.state().leases.len(), 1);
        let kept = &data.state().leases[&(1, "kept".to_string())];
        assert_eq!(kept.name, "kept");
        assert_eq!((kept.token, kept.deadline_ms), (1, later + 1));
    }

    #[test]
    fn a_break_outlives_compaction_and_ends_at_its_deadline() {
        let dir = TempDir::new("compact-break");
        let later = unix_ms() + 3_600_000;
        let mut data = open_again(&dir.0).unwrap();
        let broken = |token, deadline_ms| {
            Record::Break(Broken {
                name: "stuck".into(),
                token,
                by: "ops".into(),
                at_ms: 1,
                deadline_ms,
            })
        };
        data.append(&mut vec![
            grant("stuck", 1, later),
            broken(1, later),
            Record::Release {
                name: "stuck".into(),
                token: 1,
            },
            // Ended already: nothing to keep.
            broken(2, 1),
        ])
        .unwrap();
        let mut token = 2;
        churn_until_compacted(&mut data, &mut token, later);
        drop(data);
        let data = open_again(&dir.0).unwrap();
        assert!(data.state().leases.is_empty());
        let kept: Vec<u64> = data.state().breaks.keys().map(|(t, _)| *t).collect();
        assert_eq!(kept, [1]);
        assert_eq!(data.state().breaks[&(1, "stuck".to_string())].by, "ops");
    }

    /// Grants and releases one name after another (tokens after `token`) until the data dir
    /// compacts once.
    fn churn_until_compacted(data: &mut DataDir, token: &mut u64, later: u64) {
        while data.generation == 0 {
            let mut batch = Vec::new();
            for _ in 0..4096 {
                *token += 1;
                batch.push(grant("churn", *token, later));
                batch.push(Record::Release {
                    name: "churn".into(),
                    token: *token,
                });
            }
            data.append(&mut batch).unwrap();
            assert!(*token < 1_000_000, "never compacted");
        }
    }

    #[test]
    fn a_set_outlives_compaction_and_ends_with_its_leases() {
        let dir = TempDir::new("compact-set");
        let later = unix_ms() + 3_600_000;
        let mut data = open_again(&dir.0).unwrap();
        data.append(&mut vec![
            grant("a", 1, later),
            grant("b", 1, later),
            Record::Set {
                token: 1,
                names: vec!["a".into(), "b".into()],
            },
        ])
        .unwrap();
        let mut token = 1;
        churn_until_compacted(&mut data, &mut token, later);
        drop(data);
        let mut data = open_again(&dir.0).unwrap();
        assert_eq!(data.state().leases.len(), 2);
        assert_eq!(data.state().sets[&1], ["a", "b"]);
        for name in ["a", "b"] {
            data.append(&mut vec![Record::Release {
                name: name.into(),
                token: 1,
            }])
            .unwrap();
        }
        assert!(data.state().sets.is_empty());
    }

    #[test]
    fn a_newer_log_with_records_is_refused() {
        let dir = TempDir::new("newer");
        let mut data = open_again(&dir.0).unwrap();
        data.append(&mut vec![grant("a", 1, unix_ms() + 60_000)])
            .unwrap();
        drop(data);
        fs::copy(dir.0.join("leases.0.log"), dir.0.join("leases.3.log")).unwrap();
        let e = open_again(&dir.0)
            .err()
            .expect("opened with a stray newer log");
        assert!(e.to_string().contains("leases.3.log"), "{e}");
        // An empty newer log is what a compaction that stopped half-way leaves: removed.
        fs::write(dir.0.join("leases.3.log"), b"").unwrap();
        let data = open_again(&dir.0).unwrap();
        assert_eq!(data.state().leases.len(), 1);
    }
}
