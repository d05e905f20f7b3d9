//! A real etcd cluster for cluster-mode tests: `etcd` members as child processes on loopback
//! ports, each on its own data directory, which a test kills, stops and restarts to see what
//! lockd front-ends do when members or the quorum go away; and [`LockdFrontEnd`], the real
//! lockd binary pointed at such a cluster, which a test kills and restarts on the same port.
//!
//! Blocking (std) API like [`super::durable`], so it works from plain and tokio tests alike.
//! Every wait is bounded by [`ETCD_PATIENCE`]: it turns a hang into a failure with the tail
//! of the member's log; it never asserts how fast etcd is.
//!
//! What this relies on, checked against etcd 3.4.23 (Debian's etcd-server):
//! - `GET <client-url>/health` answers `{"health":"true"}` only when the member has a leader,
//!   no alarm is raised (NOSPACE) and a quorum read succeeds; otherwise 503 and
//!   `{"health":"false"}`, after up to a second's wait for that read.
//! - `GET <client-url>/metrics` has `etcd_server_is_leader 1` on the leader alone.
//! - A member restarted on a data directory it has used before ignores the `--initial-*` flags
//!   (its log says "already initialized as member before"), so restarting with the very
//!   command that bootstrapped it rejoins the cluster.
//! - A member serves its client URL only once it is part of a working cluster: a member
//!   restarted without a quorum accepts connections but answers nothing until one is back.
//!
//! The etcd binary is `etcd` on PATH (Debian: `apt-get install etcd-server`), or the one named
//! by `LOCKD_TEST_ETCD`.

use std::fs::{self, File};
use std::io::{self, BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::line;
use super::link::Link;
use super::{free_ports, Lockd, LockdProcess};

/// Guard for anything the cluster should do in a moment (start, elect, rejoin). Generous: two
/// cores running several test binaries at once can slow etcd's fsyncs a lot.
pub const ETCD_PATIENCE: Duration = Duration::from_secs(30);

/// How long one HTTP exchange with a member may take. /health itself waits up to a second
/// for a quorum read, so this only has to be longer than that.
const HTTP_TIMEOUT: Duration = Duration::from_secs(3);

/// How many times [`EtcdCluster::start`] picks new ports after a member lost its port to
/// someone else between our probe and etcd's bind.
const START_ATTEMPTS: usize = 3;

/// Lines of a member's log quoted in a failure.
const TAIL_LINES: usize = 40;

/// A name no other cluster or test uses: the cluster token (so members of two tests' clusters
/// never join each other, even if a port is reused) and the directory names.
fn unique(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{what}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The etcd binary: `LOCKD_TEST_ETCD`, else `etcd` on PATH.
fn etcd_binary() -> PathBuf {
    std::env::var_os("LOCKD_TEST_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// GET `path` from a front-end's metrics endpoint: status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(super::http_get(addr, path))
}

/// The last `lines` lines of the file at `path`, for a failure message.
fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| format!("(no log: {e})"));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Did this log end with etcd failing to bind one of its ports?
fn lost_a_port(log: &str) -> bool {
    log.contains("address already in use")
}

/// One HTTP/1.0 exchange with `127.0.0.1:port` (1.0 so the answer is never chunked). The
/// status and the body. The body is read by its Content-Length, not to the end of the
/// connection: etcd's peer URL sometimes keeps a 1.0 connection open after answering, until
/// its 5 s read timeout.
fn http(port: u16, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    write!(
        &stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad(&format!("not an HTTP status line: {line:?}")))?;
    let mut length = None;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(bad("end of headers missing"));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            reader.read_exact(&mut body)?;
        }
        None => {
            reader.read_to_end(&mut body)?;
        }
    }
    let body = String::from_utf8(body).map_err(|_| bad("body is not UTF-8"))?;
    Ok((status, body))
}

/// TLS on a cluster's client URLs ([`EtcdCluster::start_tls`]): etcd's own certificate, and
/// the CA whose client certificates it accepts (`--client-cert-auth`). Peer links stay plain
/// http on loopback.
#[derive(Clone)]
pub struct EtcdTls {
    /// etcd's certificate and key (for 127.0.0.1).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates must be signed by this CA.
    pub client_ca: PathBuf,
}

/// One etcd member: its ports and files never change, so it can be restarted as it was.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// With TLS on the client URL: the files, and a plain http port for /health and
    /// /metrics (`--listen-metrics-urls`), which the harness reads without a certificate.
    tls: Option<(EtcdTls, u16)>,
    /// The Unix user it runs as (`None`: the test's own), so packet filters can tell its
    /// connections from the other members' ([`super::netsplit`]).
    uid: Option<u32>,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// Added to a running cluster (`etcdctl member add`): it starts as one joining an
    /// existing cluster.
    joined: bool,
    /// Taken out of the cluster (`etcdctl member remove`): never started again.
    removed: bool,
}

impl Member {
    fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Where /health and /metrics are served over plain http.
    fn http_port(&self) -> u16 {
        self.tls
            .as_ref()
            .map_or(self.client_port, |(_, port)| *port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Starts etcd; its output goes to the end of its log file, which survives restarts.
    fn spawn(&mut self, initial_cluster: &str, token: &str, extra: &[String]) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        assert!(!self.removed, "{} was removed from the cluster", self.name);
        if let Some(uid) = self.uid {
            // Its own data directory, which etcd wants private.
            fs::create_dir_all(&self.data).expect("etcd data dir");
            let path = std::ffi::CString::new(self.data.as_os_str().as_encoded_bytes())
                .expect("data dir path");
            // SAFETY: chown(2) on a path we own, with a NUL-terminated string.
            let chowned = unsafe { libc::chown(path.as_ptr(), uid, uid) };
            assert_eq!(chowned, 0, "chown {:?}", self.data);
            let mut perms = fs::metadata(&self.data).expect("data dir").permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o700);
            fs::set_permissions(&self.data, perms).expect("chmod data dir");
        }
        let uid = self.uid;
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("etcd log file");
        let mut cmd = Command::new(etcd_binary());
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--listen-client-urls")
            .arg(self.client_url())
            .arg("--advertise-client-urls")
            .arg(self.client_url())
            .arg("--listen-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(initial_cluster)
            // Ignored by a member whose data directory is initialized: restart needs no
            // "existing" (checked with 3.4.23). A member added later joins.
            .arg("--initial-cluster-state")
            .arg(if self.joined { "existing" } else { "new" })
            .arg("--initial-cluster-token")
            .arg(token)
            // Elections in about a tenth of a second instead of one or two, so tests that
            // kill leaders stay quick. Loopback keeps 10 ms heartbeats comfortable.
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .args(extra);
        if let Some((tls, metrics_port)) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.client_ca)
                .arg("--client-cert-auth")
                .arg("--listen-metrics-urls")
                .arg(format!("http://127.0.0.1:{metrics_port}"));
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log file"))
            .stderr(log);
        // A test process killed outright (a CI timeout, an abort) runs no Drop: without this
        // its members would run on forever (seen happen). PR_SET_PDEATHSIG fires when the
        // *thread* that spawned the member ends, hence the caveat on EtcdCluster.
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls (setgroups, setgid, setuid, prctl, getppid,
        // _exit) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // Before the parent-death signal: a change of user clears it.
                if let Some(uid) = uid {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(uid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The test died between fork and prctl: nobody would kill us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        // etcd reads ETCD_<FLAG> variables too; the test's environment must not change it.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot run {:?} ({e}): install etcd (Debian: etcd-server) or set LOCKD_TEST_ETCD",
                etcd_binary()
            )
        });
        self.child = Some(child);
    }

    /// If it was started (and not killed or stopped since) but has exited on its own, how.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().expect("wait for etcd")
    }

    fn is_running(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A running etcd cluster on loopback. Dropping it kills every member and removes its
/// directory (a panicking test keeps the members' logs there and says where).
///
/// Members are also killed if the test process dies without dropping it, through the
/// kernel's parent-death signal, which is tied to the thread that started (or restarted) a
/// member: call [`EtcdCluster::start`] and [`EtcdCluster::restart`] from a thread that
/// lives as long as the cluster (the test's own), not from a short-lived helper thread.
pub struct EtcdCluster {
    root: PathBuf,
    token: String,
    extra: Vec<String>,
    members: Vec<Member>,
}

impl EtcdCluster {
    /// `n` members (3 typically), each healthy when this returns.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_with(n, &[])
    }

    /// [`EtcdCluster::start`] with more etcd flags for every member (now and on restarts),
    /// such as `--quota-backend-bytes` or `--auto-compaction-retention`.
    pub fn start_with(n: usize, extra: &[&str]) -> EtcdCluster {
        EtcdCluster::start_as(n, extra, None)
    }

    /// [`EtcdCluster::start`] with member `i` running as Unix user `first_uid + i` (the test
    /// must be root), so that packet filters can cut the links between chosen members.
    pub fn start_as_users(n: usize, first_uid: u32) -> EtcdCluster {
        EtcdCluster::start_as(n, &[], Some(first_uid))
    }

    /// [`EtcdCluster::start`] with TLS on every member's client URL (https, client
    /// certificates required); `/health` and `/metrics` move to a plain http port of their
    /// own, so the harness's waits work as before. [`EtcdCluster::status`] is not served
    /// there: it answers `None` on such a cluster.
    pub fn start_tls(n: usize, tls: &EtcdTls) -> EtcdCluster {
        EtcdCluster::start_full(n, &[], None, Some(tls))
    }

    fn start_as(n: usize, extra: &[&str], first_uid: Option<u32>) -> EtcdCluster {
        EtcdCluster::start_full(n, extra, first_uid, None)
    }

    fn start_full(
        n: usize,
        extra: &[&str],
        first_uid: Option<u32>,
        tls: Option<&EtcdTls>,
    ) -> EtcdCluster {
        assert!(n > 0, "a cluster needs a member");
        let token = unique("lockd-test");
        let root = std::env::temp_dir().join(&token);
        fs::create_dir_all(&root).expect("create etcd test dir");
        let mut cluster = EtcdCluster {
            root,
            token,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            members: Vec::new(),
        };
        for attempt in 1..=START_ATTEMPTS {
            // A third port per member for /health and /metrics under TLS.
            let per = if tls.is_some() { 3 } else { 2 };
            let ports = free_ports(per * n);
            cluster.members = (0..n)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: ports[per * i],
                    peer_port: ports[per * i + 1],
                    tls: tls.map(|tls| (tls.clone(), ports[per * i + 2])),
                    uid: first_uid.map(|u| u + i as u32),
                    data: cluster.root.join(format!("m{i}.data")),
                    log: cluster.root.join(format!("m{i}.log")),
                    child: None,
                    joined: false,
                    removed: false,
                })
                .collect();
            match cluster.bootstrap() {
                Ok(()) => return cluster,
                Err(_) if attempt < START_ATTEMPTS => {
                    // A port was taken between our probe and etcd's bind: start over on
                    // fresh ports, logs kept (appended) so a final failure shows it all.
                    cluster.kill_all_and_wipe();
                }
                Err(i) => panic!(
                    "etcd member {i} could not bind its ports in {START_ATTEMPTS} attempts:\n{}",
                    cluster.log_tail(i)
                ),
            }
        }
        unreachable!("every attempt returns or panics")
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .filter(|m| !m.removed)
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) {
        let initial = self.initial_cluster();
        let (token, extra) = (self.token.clone(), self.extra.clone());
        self.members[i].spawn(&initial, &token, &extra);
    }

    /// Starts every member, one after the other, and waits until all report healthy.
    /// `Err(i)` if member `i` exited because it lost a port race; panics on any other exit
    /// or at the guard.
    ///
    /// One after the other because a new member first asks every peer URL whether it is
    /// already part of the cluster, waiting up to a second for each answer. A peer that has
    /// bound its port but is itself still asking answers nothing, so members started all at
    /// once can each wait out those seconds (measured: 1 to 2 s instead of 0.1 s, whenever
    /// tests start clusters in parallel). A peer not started yet refuses the connection at
    /// once, and one serving its peer URL (`/members`, before any quorum) answers at once.
    fn bootstrap(&mut self) -> Result<(), usize> {
        let deadline = Instant::now() + ETCD_PATIENCE;
        let timed_out = |c: &EtcdCluster, what: &str| -> ! {
            panic!(
                "etcd cluster: {what} not within {ETCD_PATIENCE:?}:\n{}",
                c.all_log_tails()
            )
        };
        for i in 0..self.len() {
            self.spawn(i);
            let peer_port = self.members[i].peer_port;
            while !matches!(http(peer_port, "GET", "/members", ""), Ok((200, _))) {
                self.check_start(i)?;
                if Instant::now() > deadline {
                    timed_out(self, &format!("member {i} serving its peer URL"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        loop {
            for i in 0..self.len() {
                self.check_start(i)?;
            }
            if (0..self.len()).all(|i| self.health(i) == Some(true)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                timed_out(self, "every member healthy");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `Err(i)` if member `i` exited at start because one of its ports was taken; panics if
    /// it exited for another reason.
    fn check_start(&mut self, i: usize) -> Result<(), usize> {
        let Some(status) = self.members[i].exited() else {
            return Ok(());
        };
        if lost_a_port(&tail(&self.members[i].log, TAIL_LINES)) {
            return Err(i);
        }
        panic!(
            "etcd member {i} exited at start ({status}):\n{}",
            self.log_tail(i)
        );
    }

    fn kill_all_and_wipe(&mut self) {
        for m in &mut self.members {
            m.kill();
            let _ = fs::remove_dir_all(&m.data);
        }
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// How many members make a quorum (of those not removed).
    pub fn quorum(&self) -> usize {
        self.members.iter().filter(|m| !m.removed).count() / 2 + 1
    }

    /// Takes member `i` out of the cluster as an operator retiring its machine would
    /// (`etcdctl member remove`), then stops its process. Its index stays, never running
    /// again; front-ends started with its URL keep it in their `--etcd` list, as a dead one.
    pub fn remove_member(&mut self, i: usize) {
        let id = format!("{:x}", self.member_id(i).expect("a member of the cluster"));
        let name = self.members[i].name.clone();
        self.reconfigure(&["member", "remove", &id], |c| {
            c.listed(&name) == Some(false)
        });
        self.members[i].kill();
        self.members[i].removed = true;
    }

    /// Adds a member on fresh ports (`etcdctl member add`, then etcd started to join the
    /// existing cluster) and waits until every running member is healthy; its index. No
    /// front-end knows its URL unless told.
    pub fn add_member(&mut self) -> usize {
        assert!(
            self.members[0].tls.is_none() && self.members[0].uid.is_none(),
            "members are added to plain clusters only"
        );
        let i = self.members.len();
        let ports = free_ports(2);
        let member = Member {
            name: format!("m{i}"),
            client_port: ports[0],
            peer_port: ports[1],
            tls: None,
            uid: None,
            data: self.root.join(format!("m{i}.data")),
            log: self.root.join(format!("m{i}.log")),
            child: None,
            joined: true,
            removed: false,
        };
        let peer = format!("--peer-urls={}", member.peer_url());
        let name = member.name.clone();
        self.members.push(member);
        self.reconfigure(&["member", "add", &name, &peer], |c| {
            c.listed(&name) == Some(true)
        });
        self.spawn(i);
        self.wait_healthy();
        i
    }

    /// `etcdctl member ...` until `done` says it was made. Refused, it is sent again: etcd's
    /// strict reconfiguration check counts a member as active only once it has been connected
    /// to the leader for five seconds, and refuses ("unhealthy cluster") a change that would
    /// leave fewer active members than a quorum (a member just started or added is not active
    /// yet). Its answer may be lost though it was made: a leader that removes itself stops
    /// before it answers ("server stopped").
    fn reconfigure(&self, args: &[&str], done: impl Fn(&EtcdCluster) -> bool) {
        let deadline = Instant::now() + ETCD_PATIENCE;
        loop {
            let Err(e) = self.etcdctl(args, None) else {
                return;
            };
            if done(self) {
                return;
            }
            if Instant::now() > deadline {
                panic!("etcdctl {args:?}: {e}\n{}", self.all_log_tails());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The etcd members' names and ids (`etcdctl member list`); `None` if it gives no answer.
    fn member_list(&self) -> Option<Vec<(String, u64)>> {
        let list = self.etcdctl(&["member", "list", "-w", "json"], None).ok()?;
        let list: serde_json::Value = serde_json::from_str(&list).ok()?;
        let members = list["members"].as_array()?;
        members
            .iter()
            .map(|m| Some((m["name"].as_str()?.to_owned(), m["ID"].as_u64()?)))
            .collect()
    }

    /// Whether a member named `name` is in the cluster's member list (a member added but
    /// not started yet has no name there: its peer URL is looked for too).
    fn listed(&self, name: &str) -> Option<bool> {
        let list = self.etcdctl(&["member", "list", "-w", "json"], None).ok()?;
        let list: serde_json::Value = serde_json::from_str(&list).ok()?;
        let peer = self
            .members
            .iter()
            .find(|m| m.name == name)
            .map(Member::peer_url)?;
        let members = list["members"].as_array()?;
        Some(members.iter().any(|m| {
            m["name"] == name
                || m["peerURLs"]
                    .as_array()
                    .is_some_and(|urls| urls.iter().any(|u| u == peer.as_str()))
        }))
    }

    /// Member `i`'s id in the cluster, if it is in the member list.
    fn member_id(&self, i: usize) -> Option<u64> {
        let list = self.member_list()?;
        let name = &self.members[i].name;
        list.into_iter().find(|(n, _)| n == name).map(|(_, id)| id)
    }

    /// Member `i`'s client URL, `http://127.0.0.1:<port>`.
    pub fn client_url(&self, i: usize) -> String {
        self.members[i].client_url()
    }

    /// Member `i`'s client address, for a [`super::link::Link`] in front of it.
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.members[i].client_port))
    }

    /// Member `i`'s peer port and the Unix user it runs as (if not the test's).
    pub fn peer(&self, i: usize) -> (u16, Option<u32>) {
        (self.members[i].peer_port, self.members[i].uid)
    }

    /// Every member's client URL, in member order (a removed member's too: it stays in
    /// the `--etcd` lists made before).
    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// The client URLs comma-joined, as lockd's `--etcd` takes them.
    pub fn endpoints(&self) -> String {
        self.client_urls().join(",")
    }

    /// A key prefix (`/lockd-test-…/`) no other cluster's front-ends use; front-ends that
    /// share lock state must be given the same one.
    pub fn prefix(&self) -> String {
        format!("/{}/", self.token)
    }

    /// The lockd arguments that put a front-end on this cluster under `prefix`.
    pub fn lockd_args(&self, prefix: &str) -> Vec<String> {
        vec![
            "--etcd".into(),
            self.endpoints(),
            "--etcd-prefix".into(),
            prefix.into(),
        ]
    }

    /// `etcdctl <args>` against every member (v3 API; over TLS with `identity`, a client
    /// certificate and key, on a TLS cluster): its standard output, or its standard error
    /// as the `Err`. For setting up users, roles and `auth enable` as an operator would.
    pub fn etcdctl(
        &self,
        args: &[&str],
        identity: Option<(&Path, &Path)>,
    ) -> Result<String, String> {
        let mut cmd = Command::new(
            std::env::var_os("LOCKD_TEST_ETCDCTL").unwrap_or_else(|| "etcdctl".into()),
        );
        // The members in the cluster now (a removed one would only slow it down).
        let endpoints: Vec<String> = self
            .members
            .iter()
            .filter(|m| !m.removed)
            .map(Member::client_url)
            .collect();
        cmd.arg("--endpoints")
            .arg(endpoints.join(","))
            .arg("--dial-timeout=5s")
            .arg("--command-timeout=10s");
        if let Some((tls, _)) = &self.members[0].tls {
            // etcd's own certificate is signed by the same test CA as the clients'.
            cmd.arg("--cacert").arg(&tls.client_ca);
            if let Some((cert, key)) = identity {
                cmd.arg("--cert").arg(cert).arg("--key").arg(key);
            }
        }
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(key);
            }
        }
        let out = cmd
            .env("ETCDCTL_API", "3")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run etcdctl ({e}): install it (Debian: etcd-client) or set LOCKD_TEST_ETCDCTL")
            });
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Whether member `i`'s process is running (it may still be without a leader).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.members[i].is_running()
    }

    /// Member `i`'s process id, unless it was killed or stopped.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Member `i`'s data directory.
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.members[i].data
    }

    /// The directory holding every member's data directory and log.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The end of member `i`'s log (every run of it, appended), for failure messages.
    pub fn log_tail(&self, i: usize) -> String {
        format!(
            "--- etcd {} ({}) ---\n{}",
            self.members[i].name,
            self.members[i].log.display(),
            tail(&self.members[i].log, TAIL_LINES)
        )
    }

    fn all_log_tails(&self) -> String {
        (0..self.members.len())
            .map(|i| self.log_tail(i))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What member `i`'s `/health` says: `None` if it is not running or gives no answer
    /// (a member without a cluster to join serves nothing), else whether it is healthy.
    pub fn health(&mut self, i: usize) -> Option<bool> {
        if !self.is_running(i) {
            return None;
        }
        let (status, body) = http(self.members[i].http_port(), "GET", "/health", "").ok()?;
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        // The value is the string "true" (etcd 3.4), not a JSON boolean; 503 when unhealthy.
        Some(status == 200 && json["health"] == "true")
    }

    /// Member `i`'s own account of itself (`POST /v3/maintenance/status`, the JSON of the v3
    /// gateway: ids are decimal strings, `leader` is the leader's `header.member_id`, and
    /// `errors` has "etcdserver: no leader" without one); `None` if it gives no answer.
    pub fn status(&mut self, i: usize) -> Option<serde_json::Value> {
        if !self.is_running(i) || self.members[i].tls.is_some() {
            return None;
        }
        let (status, body) = http(
            self.members[i].client_port,
            "POST",
            "/v3/maintenance/status",
            "{}",
        )
        .ok()?;
        if status != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// Member `i`'s /metrics; `None` if it is not running or gives no answer.
    fn metrics(&mut self, i: usize) -> Option<String> {
        if !self.is_running(i) {
            return None;
        }
        let (_, body) = http(self.members[i].http_port(), "GET", "/metrics", "").ok()?;
        Some(body)
    }

    /// Whether member `i` says it is the leader (`etcd_server_is_leader 1` in its /metrics);
    /// `None` if it is not running or gives no answer.
    pub fn is_leader(&mut self, i: usize) -> Option<bool> {
        let body = self.metrics(i)?;
        let value = body
            .lines()
            .find_map(|l| l.strip_prefix("etcd_server_is_leader "))?;
        Some(value.trim() == "1")
    }

    /// How many transactions member `i` has answered (`grpc_server_handled_total` of
    /// `Txn`, every code); `None` if it is not running or gives no answer.
    pub fn txns_handled(&mut self, i: usize) -> Option<u64> {
        let txns = self
            .metrics(i)?
            .lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
            .filter(|l| l.contains("grpc_method=\"Txn\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        Some(txns as u64)
    }

    /// The leader among the running members: `Some` when exactly one of them says it leads.
    /// Two can say so for a moment (a deposed leader that has not heard of the election
    /// yet), which is `None` like no leader at all.
    pub fn leader(&mut self) -> Option<usize> {
        let leaders: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.is_leader(i) == Some(true))
            .collect();
        match leaders[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Waits until the running members have one leader; returns it.
    pub fn wait_leader(&mut self) -> usize {
        let mut leader = None;
        self.wait_for("a leader", |c| {
            leader = c.leader();
            leader.is_some()
        });
        leader.expect("a leader")
    }

    /// Waits until every running member reports healthy. Panics at once if fewer than a
    /// quorum are running: they could never become healthy.
    pub fn wait_healthy(&mut self) {
        let running = (0..self.len()).filter(|&i| self.is_running(i)).count();
        assert!(
            running >= self.quorum(),
            "only {running} of {} etcd members are running; a quorum is {}",
            self.len(),
            self.quorum()
        );
        self.wait_for("every running member healthy", |c| {
            (0..c.len()).all(|i| !c.is_running(i) || c.health(i) == Some(true))
        });
    }

    /// Waits until member `i` answers `/health` with `healthy` (it must be running).
    pub fn wait_member_health(&mut self, i: usize, healthy: bool) {
        self.wait_for(&format!("member {i} healthy={healthy}"), |c| {
            c.health(i) == Some(healthy)
        });
    }

    /// Polls `done` until it holds. Fails at the guard, or as soon as a member that should
    /// be running has exited, with the members' logs.
    pub fn wait_for(&mut self, what: &str, mut done: impl FnMut(&mut EtcdCluster) -> bool) {
        let deadline = Instant::now() + ETCD_PATIENCE;
        loop {
            for i in 0..self.len() {
                if let Some(status) = self.members[i].exited() {
                    panic!(
                        "etcd member {i} exited ({status}) while waiting for {what}:\n{}",
                        self.log_tail(i)
                    );
                }
            }
            if done(self) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "not within {ETCD_PATIENCE:?}: {what}\n{}",
                    self.all_log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL member `i`: no chance to step down or sync; waits until it is gone.
    pub fn kill(&mut self, i: usize) {
        assert!(self.is_running(i), "etcd member {i} is not running");
        self.members[i].kill();
    }

    /// SIGTERM member `i` (a leader hands leadership over first) and wait for it to exit.
    /// Its status is "killed by SIGTERM" even so: etcd 3.4 shuts down, then raises the signal
    /// again on itself with the default action.
    pub fn stop(&mut self, i: usize) -> ExitStatus {
        let pid = self.pid(i).expect("etcd member is not running");
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + ETCD_PATIENCE;
        loop {
            if let Some(status) = self.members[i].exited() {
                self.members[i].child = None;
                return status;
            }
            if Instant::now() > deadline {
                self.members[i].kill();
                panic!(
                    "etcd member {i} did not stop on SIGTERM:\n{}",
                    self.log_tail(i)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts member `i` again with its data directory and ports, and waits until its client
    /// port accepts connections. Not until it is healthy: that needs a quorum, which may be
    /// the test's next step ([`EtcdCluster::wait_healthy`]).
    pub fn restart(&mut self, i: usize) {
        assert!(
            self.members[i].child.is_none(),
            "etcd member {i} was not killed or stopped"
        );
        let deadline = Instant::now() + ETCD_PATIENCE;
        self.spawn(i);
        let port = self.members[i].client_port;
        loop {
            if let Some(status) = self.members[i].exited() {
                self.members[i].child = None;
                // Someone took one of its ports meanwhile (they are not ours while it is
                // down): wait for them to let it go, the member can't move.
                if lost_a_port(&tail(&self.members[i].log, TAIL_LINES)) && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(100));
                    self.spawn(i);
                    continue;
                }
                panic!(
                    "etcd member {i} exited on restart ({status}):\n{}",
                    self.log_tail(i)
                );
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "restarted etcd member {i} not listening within {ETCD_PATIENCE:?}:\n{}",
                    self.log_tail(i)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all_and_wipe();
        if std::thread::panicking() {
            eprintln!("etcd logs kept in {}", self.root.display());
        } else {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// One request line to `addr` on a fresh connection; the first reply line.
fn request(addr: SocketAddr, line: &str) -> io::Result<String> {
    line::request(addr, line, Some(HTTP_TIMEOUT), super::GUARD)
}

/// The real lockd binary as a cluster front-end (`--etcd`, `--etcd-prefix`), on a port of its
/// own that it keeps across [`LockdFrontEnd::kill`] and [`LockdFrontEnd::restart`], so clients
/// can reconnect to the same address. Killed when dropped.
pub struct LockdFrontEnd {
    port: u16,
    lockd: Lockd,
    process: Option<LockdProcess>,
}

impl LockdFrontEnd {
    /// `lockd --etcd <cluster> --etcd-prefix <prefix> <extra>`, answering PING when this
    /// returns.
    pub fn start(cluster: &EtcdCluster, prefix: &str, extra: &[&str]) -> LockdFrontEnd {
        LockdFrontEnd::of(Lockd::new().etcd(&cluster.endpoints(), prefix).args(extra))
    }

    /// lockd with exactly `args` (besides `--listen`): [`LockdFrontEnd::start`] without a
    /// cluster, so the harness can check its own kill and restart with any lockd.
    pub fn spawn(args: Vec<String>) -> LockdFrontEnd {
        LockdFrontEnd::of(Lockd::new().args(args))
    }

    /// [`LockdFrontEnd::spawn`] with extra environment variables, kept across restarts.
    pub fn spawn_with_env(args: Vec<String>, env: Vec<(String, String)>) -> LockdFrontEnd {
        LockdFrontEnd::of(Lockd::new().args(args).envs(&env))
    }

    /// `lockd` as built (its `--listen` is the front-end's own port), on every start and
    /// restart.
    pub fn of(lockd: Lockd) -> LockdFrontEnd {
        for _ in 0..START_ATTEMPTS {
            let mut fe = LockdFrontEnd {
                port: free_ports(1)[0],
                lockd: lockd.clone(),
                process: None,
            };
            match fe.try_run() {
                Ok(()) => return fe,
                // The port was taken between our probe and lockd's bind: take another.
                Err(log) if log.iter().any(|l| l.contains("in use")) => continue,
                Err(log) => panic!("lockd did not start: {log:#?}"),
            }
        }
        panic!("lockd lost its port to someone else {START_ATTEMPTS} times");
    }

    /// Runs lockd on our port and waits until it answers PING; `Err` with its log if it
    /// exits first.
    fn try_run(&mut self) -> Result<(), Vec<String>> {
        assert!(self.process.is_none(), "lockd is already running");
        let listen = format!("127.0.0.1:{}", self.port);
        let process = self.lockd.clone().listen(listen).try_spawn()?;
        // Listening is not serving: a front-end may still be reaching etcd.
        let deadline = Instant::now() + ETCD_PATIENCE;
        loop {
            if let Ok(reply) = request(process.addr, "PING") {
                if reply == "OK PONG" {
                    self.process = Some(process);
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let log = process.kill();
                panic!("lockd did not answer PING within {ETCD_PATIENCE:?}: {log:#?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its address, the same across restarts.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The running process (its log, pid, raw connections). Panics if it is down.
    pub fn process(&self) -> &LockdProcess {
        self.process.as_ref().expect("lockd is not running")
    }

    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// One request on a fresh connection; the first reply line, without a STATUS line's
    /// etcd age ([`super::without_etcd_age`]). For requests answered at once: the reply may
    /// take [`super::GUARD`] at most.
    pub fn request(&self, line: &str) -> String {
        let reply = request(self.addr(), line)
            .unwrap_or_else(|e| panic!("{line:?} to {}: {e}", self.addr()));
        super::without_etcd_age(reply)
    }

    /// SIGKILL (kill -9): no goodbye to etcd, its lease must run out. Returns its log.
    pub fn kill(&mut self) -> Vec<String> {
        self.process.take().expect("lockd is not running").kill()
    }

    /// SIGTERM, and wait for it to exit. Returns its log.
    pub fn stop(&mut self) -> Vec<String> {
        self.process.take().expect("lockd is not running").stop()
    }

    /// Starts it again with the same arguments on the same port; answering PING when this
    /// returns. Waits out a port still held by someone else.
    pub fn restart(&mut self) {
        let deadline = Instant::now() + ETCD_PATIENCE;
        loop {
            match self.try_run() {
                Ok(()) => return,
                Err(log)
                    if log.iter().any(|l| l.contains("in use")) && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(log) => panic!("lockd did not restart: {log:#?}"),
            }
        }
    }
}

/// A front-end whose every link to etcd goes through a [`Link`] the test can cut and heal
/// while both ends run (see [`super::link`]).
pub struct LinkedFrontEnd {
    pub fe: LockdFrontEnd,
    pub links: Vec<Link>,
}

impl LinkedFrontEnd {
    pub fn start(etcd: &EtcdCluster, prefix: &str, extra: &[&str]) -> LinkedFrontEnd {
        let links: Vec<Link> = (0..etcd.len())
            .map(|i| Link::start(etcd.client_addr(i)))
            .collect();
        let endpoints: Vec<String> = links.iter().map(Link::url).collect();
        LinkedFrontEnd {
            fe: LockdFrontEnd::of(Lockd::new().etcd(&endpoints.join(","), prefix).args(extra)),
            links,
        }
    }

    pub fn cut(&self) {
        self.links.iter().for_each(Link::cut);
    }

    /// Its writes still reach etcd and apply; nothing etcd sends reaches it.
    pub fn cut_replies(&self) {
        self.links.iter().for_each(Link::cut_replies);
    }

    pub fn heal(&self) {
        self.links.iter().for_each(Link::heal);
    }

    pub fn addr(&self) -> SocketAddr {
        self.fe.addr()
    }

    pub fn request(&self, line: &str) -> String {
        self.fe.request(line)
    }
}
