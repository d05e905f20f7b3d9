//! The clients' conformance scenarios (contrib/clients/conformance/scenarios.json; its README
//! says the format) played by the library's own client (`lockd::client`) against the real
//! `lockd` binary, one per scenario. The same file is played by the Go, Node, Ruby, Python and
//! bash runners, so every client is held to the same behaviour.
//!
//! A `lock` is [`Connector::lock_on`] (sent again through the next address within its wait;
//! its `and` names are [`LockOptions::and`], its tokens [`lockd::client::Locked::tokens`]),
//! a `hold` the library's helper, [`lockd::client::hold`], whose block records the token and
//! the time its lease's loss was signalled. The `hold` scenarios are played a second time
//! with `lockctl run` as a child process (its keeper is the binary's own), whose job records
//! the token and, when lockctl stops it (SIGTERM: the lease is lost), the time.
//! `LOCKD_CONFORMANCE=<name>,...` plays only those scenarios.

mod common;

use std::collections::HashMap;
use std::io::{BufRead as _, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::pki::Pki;
use common::{Lockd, LockdProcess};
use lockd::client::{
    Addrs, Client, ClientError, ConnectError, Connector, Credentials, LockError, LockOptions, Tls,
};
use lockd::locks::{Mode, Token};
use lockd::proto::{Secret, StatusLine, Tie};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What this runner's client can do beyond requests and replies (the scenarios' `needs`).
const HAS: &[&str] = &["watch", "tls", "hold", "resend"];
/// Longest wait for anything a step waits for: only a guard against a hang.
const GUARD: Duration = Duration::from_secs(10);

/// The answer to a LOCK (a token per name), with the connection it leaves, and the wall
/// clock's milliseconds when it came, to compare with the time a helper signalled its loss.
type Answer = (Option<Client>, Result<Vec<Token>, LockError>, u128);

/// A LOCK sent in the background.
struct Pending {
    /// The client it went on.
    owner: String,
    /// Its names, its own first, then its `and` names: each name's token is saved under
    /// `<as>.<name>`.
    names: Vec<String>,
    /// Its answer to come.
    task: JoinHandle<Answer>,
}

/// Who plays the `hold` steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HoldBy {
    /// [`lockd::client::hold`].
    Library,
    /// `lockctl run`, a child process.
    Lockctl,
}

/// The library's helper holding a lock for a `hold` step.
struct Helper {
    task: JoinHandle<Result<(), LockError>>,
    /// The token, until the `hold` (or the `await` of an `async` one) takes it.
    token: Option<oneshot::Receiver<Token>>,
    end: Option<oneshot::Sender<()>>,
    /// The wall clock's milliseconds when the loss was signalled; 0 before.
    lost_at: Arc<AtomicU64>,
    ttl_ms: u128,
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// `lockctl run` holding a lock for a `hold` step: its job's files start with `files`.
struct Held {
    child: Child,
    files: PathBuf,
    ttl_ms: u128,
}

/// A TCP forwarder to lockd that, once cut, passes nothing and closes nothing; told to drop,
/// it closes every connection through it, both sides.
struct Proxy {
    addr: String,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let flag = Arc::clone(&cut);
        let open = Arc::clone(&conns);
        std::thread::spawn(move || {
            for inner in listener.incoming().flatten() {
                let Ok(outer) = TcpStream::connect(&target) else {
                    continue;
                };
                if let (Ok(a), Ok(b)) = (inner.try_clone(), outer.try_clone()) {
                    open.lock().expect("proxy list").extend([a, b]);
                }
                for (mut from, mut to) in [
                    (inner.try_clone(), outer.try_clone()),
                    (outer.try_clone(), inner.try_clone()),
                ]
                .into_iter()
                .filter_map(|(a, b)| a.ok().zip(b.ok()))
                {
                    let flag = Arc::clone(&flag);
                    std::thread::spawn(move || {
                        let mut buf = [0; 4096];
                        while let Ok(n @ 1..) = from.read(&mut buf) {
                            if flag.load(Ordering::SeqCst) {
                                // Cut: the bytes go nowhere, the sockets stay open.
                                std::thread::sleep(Duration::from_secs(3600));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Proxy { addr, cut, conns }
    }

    /// Closes every connection through it, both sides: as a front-end that dies.
    fn drop_all(&self) {
        for conn in self.conns.lock().expect("proxy list").drain(..) {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A fake cluster front-end cut off from etcd: `PING` is `OK PONG`, every other line `ERR
/// UNAVAILABLE`.
fn unavailable_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake front-end");
    let addr = listener.local_addr().expect("its address").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(mut out) = conn.try_clone() else {
                    return;
                };
                for line in std::io::BufReader::new(conn).lines() {
                    let Ok(line) = line else { return };
                    let reply = match line.trim() {
                        "PING" => "OK PONG\n",
                        _ => "ERR UNAVAILABLE etcd has no leader; try again\n",
                    };
                    if out.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One scenario's world: its lockd, its clients and their background LOCKs.
struct World<'a> {
    doc: &'a Value,
    lockd: Option<LockdProcess>,
    args: Vec<String>,
    pki: Option<Pki>,
    clients: HashMap<String, Client>,
    connectors: HashMap<String, Connector>,
    /// Clients connected with `"id": "default"`: each LOCK of theirs takes a default id of
    /// its own ([`lockd::client::default_id`]), as a program that names none does.
    default_ids: std::collections::HashSet<String>,
    tokens: HashMap<String, Token>,
    pending: HashMap<String, Pending>,
    granted_at: HashMap<String, u128>,
    holds: HashMap<String, Held>,
    helpers: HashMap<String, Helper>,
    hold_by: HoldBy,
    proxy: Option<Proxy>,
    unavailable: Option<String>,
    froze_at: u128,
    tmp: PathBuf,
}

/// An error's ERR code, read from its type.
trait Coded: std::fmt::Display {
    fn err_code(&self) -> Option<lockd::proto::ErrorCode>;
}

impl Coded for ClientError {
    fn err_code(&self) -> Option<lockd::proto::ErrorCode> {
        self.code()
    }
}

impl Coded for LockError {
    fn err_code(&self) -> Option<lockd::proto::ErrorCode> {
        self.code()
    }
}

fn code(e: &impl Coded) -> String {
    match e.err_code() {
        Some(code) => code.to_string(),
        None => format!("no ERR code ({e})"),
    }
}

impl World<'_> {
    /// Whether `of` names a `hold` (its `await` and `pending` are the helper's grant).
    fn is_hold(&self, of: &str) -> bool {
        match self.hold_by {
            HoldBy::Library => self.helpers.contains_key(of),
            HoldBy::Lockctl => self.holds.contains_key(of),
        }
    }

    fn addr(&self) -> String {
        self.lockd.as_ref().expect("lockd runs").addr.to_string()
    }

    /// The runner's proxy to lockd (started the first time it is named).
    fn proxy_addr(&mut self) -> String {
        let live = self.addr();
        self.proxy
            .get_or_insert_with(|| Proxy::start(live))
            .addr
            .clone()
    }

    /// A connector to `addrs`, with the scenario's CA and client certificate if it has TLS.
    fn connector(&self, addrs: Vec<String>) -> Result<Connector, String> {
        let mut connector = Connector::new(Addrs::new(addrs).expect("addrs"), GUARD);
        if let Some(pki) = &self.pki {
            let (cert, key) = pki.client("conformance-client");
            let tls = Tls::new(Some(&pki.ca()), Some((&cert, &key)))?;
            connector = connector.tls(Some(tls));
        }
        Ok(connector)
    }

    fn token(&self, v: &Value) -> Token {
        match v {
            Value::Number(n) => n.as_u64().expect("a token number"),
            Value::String(s) => self.tokens[s.as_str()],
            other => panic!("not a token: {other}"),
        }
    }

    fn client(&mut self, step: &Value) -> &mut Client {
        let name = step["client"].as_str().expect("client");
        self.clients
            .get_mut(name)
            .unwrap_or_else(|| panic!("client {name} is busy or not connected"))
    }

    async fn connect(&mut self, step: &Value) -> Result<(), String> {
        let name = step["client"].as_str().expect("client").to_string();
        let live = self.addr();
        let mut addrs = Vec::new();
        for a in step["addrs"].as_array().into_iter().flatten() {
            addrs.push(match a.as_str() {
                Some("dead") => common::dead_addr(),
                Some("proxy") => self.proxy_addr(),
                Some("unavailable") => self
                    .unavailable
                    .get_or_insert_with(unavailable_server)
                    .clone(),
                _ => live.clone(),
            });
        }
        if addrs.is_empty() {
            addrs.push(live);
        }
        let mut connector = self.connector(addrs)?;
        if let Some(user) = step["user"].as_str() {
            let secret = self.doc["users"][user]["secret"].as_str().expect("secret");
            let credentials = match step["secret"].as_str() {
                Some("env") => {
                    // Only this runner's scenarios, one at a time, read the variable.
                    std::env::set_var(lockd::client::auth::SECRET_VAR, secret);
                    let got = Credentials::from_env(user);
                    std::env::remove_var(lockd::client::auth::SECRET_VAR);
                    got?
                }
                Some("file") => {
                    let file = self.tmp.join(format!("{user}.secret"));
                    std::fs::write(&file, format!("{secret}\n")).expect("write the secret");
                    Credentials::from_file(user, &file)?
                }
                _ => Credentials::new(user.into(), Secret::new("not-the-secret-0123456789")),
            };
            connector = connector.auth(Some(credentials));
        }
        let connected = match connector.connect().await {
            Ok(mut client) => match client.ping().await {
                Ok(()) => Ok(client),
                Err(e) => return Err(format!("PING failed: {e}")),
            },
            Err(e) => Err(e),
        };
        match (connected, step["expect"].as_str()) {
            (Ok(client), None) => {
                if step["id"].as_str() == Some("default") {
                    self.default_ids.insert(name.clone());
                }
                self.clients.insert(name.clone(), client);
                self.connectors.insert(name, connector);
                Ok(())
            }
            (Err(ConnectError::Denied(_)), Some("DENIED")) => Ok(()),
            (Ok(_), Some(want)) => Err(format!("connected; expected {want}")),
            (Err(e), want) => Err(format!("connect failed: {e}; expected {want:?}")),
        }
    }

    async fn lock(&mut self, step: &Value) -> Result<(), String> {
        let ms = |key: &str| step[key].as_u64().map(Duration::from_millis);
        let name = step["name"].as_str().expect("name").to_string();
        let client = step["client"].as_str().expect("client").to_string();
        let id = match self.default_ids.contains(&client) {
            true => lockd::client::default_id(),
            false => client.clone(),
        };
        let tie = if step["session"].as_bool() == Some(true) {
            Tie::Session(ms("grace_ms").unwrap_or_default())
        } else if step["detach"].as_bool() == Some(true) {
            Tie::Detach
        } else {
            Tie::Plain
        };
        let mode = match (step["shared"].as_bool(), step["limit"].as_u64()) {
            (Some(true), _) => Mode::Shared,
            (_, Some(n)) => Mode::limit(n as u32),
            _ => Mode::Exclusive,
        };
        let and: Vec<String> = step["and"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n.as_str().expect("an and name").to_string())
            .collect();
        let names = std::iter::once(name.clone()).chain(and.clone()).collect();
        let opts = LockOptions {
            ttl: ms("ttl_ms"),
            wait: ms("wait_ms"),
            tie,
            mode,
            supersede: step["supersede"].as_bool() == Some(true),
            note: step["note"].as_str().map(str::to_string),
            and,
        };
        let connector = self.connectors[&client].clone();
        let owner = client.clone();
        let client = self
            .clients
            .remove(&client)
            .unwrap_or_else(|| panic!("client {client} is busy or not connected"));
        let task = tokio::spawn(async move {
            match connector.lock_on(client, &name, &id, &opts).await {
                Ok(locked) => (Some(locked.client), Ok(locked.tokens), unix_ms()),
                // The connection went with the LOCK: a new one for the client's next step.
                Err(e) => {
                    let at = unix_ms();
                    (connector.connect().await.ok(), Err(e), at)
                }
            }
        });
        let label = step["as"].as_str().unwrap_or("_").to_string();
        self.pending
            .insert(label.clone(), Pending { owner, names, task });
        if step["async"].as_bool() == Some(true) {
            return Ok(());
        }
        self.await_lock(&label, step["expect"].as_str()).await
    }

    async fn await_lock(&mut self, of: &str, want: Option<&str>) -> Result<(), String> {
        let Pending { owner, names, task } = self.pending.remove(of).expect("a LOCK under way");
        let (client, got, at) = tokio::time::timeout(GUARD, task)
            .await
            .map_err(|_| format!("LOCK {of} not answered within {GUARD:?}"))?
            .expect("LOCK task");
        if let Some(client) = client {
            self.clients.insert(owner, client);
        }
        match (got, want) {
            (Ok(tokens), None) if tokens.len() != names.len() => Err(format!(
                "granted {tokens:?}: not a token for each of {names:?}"
            )),
            (Ok(tokens), None) => {
                // `<as>` is the first name's token, `<as>.<name>` each name's.
                self.tokens.insert(of.to_string(), tokens[0]);
                for (name, token) in names.iter().zip(&tokens) {
                    self.tokens.insert(format!("{of}.{name}"), *token);
                }
                self.granted_at.insert(of.to_string(), at);
                Ok(())
            }
            (Err(e), Some(want)) if code(&e) == want => Ok(()),
            (Ok(tokens), Some(want)) => Err(format!("granted {tokens:?}; expected {want}")),
            (Err(e), want) => Err(format!("{e}; expected {want:?}")),
        }
    }

    /// `lockctl run` on the lock, its job a shell that writes the token, then waits for the
    /// end (a file) or lockctl's SIGTERM (the lease is lost), whose time it writes.
    /// The library's helper on the lock: its block sends the token and waits for `end`; a
    /// task of its own records when the lease's loss is signalled.
    async fn hold_library(&mut self, step: &Value) -> Result<(), String> {
        let label = step["as"].as_str().expect("as").to_string();
        let ttl_ms = step["ttl_ms"].as_u64().expect("ttl_ms");
        let addr = match step["via"].as_str() {
            Some("proxy") => self.proxy_addr(),
            _ => self.addr(),
        };
        let connector = self.connector(vec![addr])?;
        let name = step["name"].as_str().expect("name").to_string();
        let id = match step["id"].as_str() {
            Some("default") => lockd::client::default_id(),
            _ => step["client"].as_str().expect("client").to_string(),
        };
        let opts = LockOptions::new().ttl(Duration::from_millis(ttl_ms));
        let (token_tx, token_rx) = oneshot::channel();
        let (end, end_rx) = oneshot::channel::<()>();
        let lost_at = Arc::new(AtomicU64::new(0));
        let at = Arc::clone(&lost_at);
        let task = tokio::spawn(async move {
            connector
                .hold(&name, &id, &opts, |lease| async move {
                    let lost = lease.lost();
                    tokio::spawn(async move {
                        lost.await;
                        at.store(unix_ms() as u64, Ordering::SeqCst);
                    });
                    let _ = token_tx.send(lease.token());
                    let _ = end_rx.await;
                })
                .await
        });
        self.helpers.insert(
            label.clone(),
            Helper {
                task,
                token: Some(token_rx),
                end: Some(end),
                lost_at,
                ttl_ms: u128::from(ttl_ms),
            },
        );
        if step["async"].as_bool() == Some(true) {
            return Ok(());
        }
        self.hold_granted(&label).await
    }

    /// Waits for the block of the hold `of` to start, and saves its token.
    async fn hold_granted(&mut self, of: &str) -> Result<(), String> {
        let token = match self.hold_by {
            HoldBy::Library => {
                let helper = self.helpers.get_mut(of).expect("a hold");
                let rx = helper.token.take().expect("a hold not yet granted");
                tokio::time::timeout(GUARD, rx)
                    .await
                    .map_err(|_| "the helper did not get the lock".to_string())?
                    .map_err(|_| "the helper ended without the lock".to_string())?
            }
            HoldBy::Lockctl => {
                let token_file = self.holds[of].files.with_extension("token");
                eventually(|| read_token(&token_file))
                    .await
                    .ok_or("lockctl run did not get the lock")?
            }
        };
        self.tokens.insert(of.to_string(), token);
        Ok(())
    }

    /// Whether the block of the hold `of` has started (the lock granted).
    fn hold_started(&mut self, of: &str) -> bool {
        match self.hold_by {
            HoldBy::Library => {
                let helper = self.helpers.get_mut(of).expect("a hold");
                let rx = helper.token.as_mut().expect("a hold not yet granted");
                // A token sent, or a helper that ended without one: either way no longer
                // waiting.
                !matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty))
            }
            HoldBy::Lockctl => {
                let token_file = self.holds[of].files.with_extension("token");
                read_token(&token_file).is_some()
            }
        }
    }

    /// `end`: the helper returns its block's value and has released the lock; `lost`: it
    /// signalled the loss (in time) and returns it as its error.
    async fn helper_end(&mut self, op: &str, step: &Value) -> Result<(), String> {
        let of = step["of"].as_str().expect("of");
        let helper = self.helpers.get_mut(of).expect("a hold");
        if op == "end" {
            if let Some(end) = helper.end.take() {
                let _ = end.send(());
            }
        }
        let got = tokio::time::timeout(GUARD, &mut helper.task)
            .await
            .map_err(|_| "the helper did not return".to_string())?
            .map_err(|e| format!("the helper panicked: {e}"))?;
        if op == "end" {
            return match got {
                Ok(()) => Ok(()),
                Err(e) => Err(format!("the helper returned {e}")),
            };
        }
        match got {
            Err(e) if e.is_lost() => {}
            Ok(()) => return Err("the helper returned without a loss".into()),
            Err(e) => return Err(format!("the helper returned {e}, not the loss")),
        }
        // The task that records it may run a moment after the helper returned.
        let at = &helper.lost_at;
        let lost_at = eventually(|| match at.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(u128::from(ms)),
        })
        .await
        .ok_or("the block was never told the lease was lost")?;
        let ttl_ms = helper.ttl_ms;
        self.judge_loss(step, lost_at, ttl_ms)
    }

    /// Whether a loss signalled at `lost_at` came in time for the `lost` step.
    fn judge_loss(&self, step: &Value, lost_at: u128, ttl_ms: u128) -> Result<(), String> {
        if let Some(before) = step["before"].as_str() {
            let granted = self.granted_at[before];
            if lost_at >= granted {
                return Err(format!(
                    "the loss was signalled {}ms after {before} was granted",
                    lost_at - granted
                ));
            }
        }
        if step["within_ttl_of_freeze"].as_bool() == Some(true) && lost_at > self.froze_at + ttl_ms
        {
            return Err(format!(
                "the loss was signalled {}ms after the freeze",
                lost_at - self.froze_at
            ));
        }
        Ok(())
    }

    async fn hold(&mut self, step: &Value) -> Result<(), String> {
        if self.hold_by == HoldBy::Library {
            return self.hold_library(step).await;
        }
        let label = step["as"].as_str().expect("as").to_string();
        let ttl_ms = u128::from(step["ttl_ms"].as_u64().expect("ttl_ms"));
        let addr = match step["via"].as_str() {
            Some("proxy") => self.proxy_addr(),
            _ => self.addr(),
        };
        let files = self.tmp.join(format!("hold-{label}"));
        let job = r#"trap 'date +%s%3N >"$0.lost"; exit 143' TERM
            echo "$LOCKD_TOKEN" >"$0.token"
            while [ ! -e "$0.end" ]; do sleep 0.02; done"#;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockctl"));
        cmd.args(["run", "--server", &addr]);
        // Without `--id`, lockctl takes its default id.
        if step["id"].as_str() != Some("default") {
            cmd.args(["--id", step["client"].as_str().expect("client")]);
        }
        cmd.args(["--ttl", &format!("{ttl_ms}ms"), "--kill-grace", "100ms"])
            .args([step["name"].as_str().expect("name"), "--", "sh", "-c", job])
            .arg(&files)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (key, _) in std::env::vars() {
            if key.starts_with("LOCKD_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd.spawn().map_err(|e| format!("lockctl run: {e}"))?;
        self.holds.insert(
            label.clone(),
            Held {
                child,
                files,
                ttl_ms,
            },
        );
        if step["async"].as_bool() == Some(true) {
            return Ok(());
        }
        self.hold_granted(&label).await
    }

    /// `end`: the job ends and lockctl exits 0; `lost`: lockctl stops the job (in time) and
    /// exits 4.
    async fn held_end(&mut self, op: &str, step: &Value) -> Result<(), String> {
        if self.hold_by == HoldBy::Library {
            return self.helper_end(op, step).await;
        }
        let of = step["of"].as_str().expect("of");
        let held = self.holds.get_mut(of).expect("a hold");
        if op == "end" {
            std::fs::write(held.files.with_extension("end"), "").expect("write the end file");
        }
        let status = eventually(|| held.child.try_wait().ok().flatten())
            .await
            .ok_or("lockctl run did not exit")?;
        if op == "end" {
            return match status.code() {
                Some(0) => Ok(()),
                other => Err(format!("lockctl run exited {other:?}")),
            };
        }
        if status.code() != Some(4) {
            return Err(format!(
                "lockctl run exited {:?}, not 4 (lease lost)",
                status.code()
            ));
        }
        let lost_at: u128 = std::fs::read_to_string(held.files.with_extension("lost"))
            .map_err(|_| "the job was never told the lease was lost")?
            .trim()
            .parse()
            .expect("a time");
        let ttl_ms = held.ttl_ms;
        self.judge_loss(step, lost_at, ttl_ms)
    }

    async fn step(&mut self, step: &Value) -> Result<(), String> {
        let want = step["expect"].as_str();
        let name = step["name"].as_str().unwrap_or_default().to_string();
        let op = step["op"].as_str().expect("op");
        let outcome: Result<Value, ClientError> = match op {
            "connect" => return self.connect(step).await,
            "lock" => return self.lock(step).await,
            "await" => {
                let of = step["of"].as_str().expect("of").to_string();
                if self.is_hold(&of) {
                    return self.hold_granted(&of).await;
                }
                return self.await_lock(&of, want).await;
            }
            "pending" => {
                let pause = step["ms"].as_u64().unwrap_or(300);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let of = step["of"].as_str().expect("of");
                let answered = match self.is_hold(of) {
                    true => self.hold_started(of),
                    false => self.pending[of].task.is_finished(),
                };
                return match answered {
                    false => Ok(()),
                    true => Err(format!("{of} was answered; it should still wait")),
                };
            }
            "distinct" => {
                let names: Vec<&str> = step["tokens"]
                    .as_array()
                    .expect("tokens")
                    .iter()
                    .map(|t| t.as_str().expect("a token's name"))
                    .collect();
                let tokens: Vec<Token> = names.iter().map(|t| self.tokens[*t]).collect();
                let unique: std::collections::HashSet<&Token> = tokens.iter().collect();
                return match unique.len() == tokens.len() {
                    true => Ok(()),
                    false => Err(format!("tokens {names:?} are {tokens:?}: not all different")),
                };
            }
            "sleep" => {
                let pause = step["ms"].as_u64().expect("ms");
                tokio::time::sleep(Duration::from_millis(pause)).await;
                return Ok(());
            }
            "hold" => return self.hold(step).await,
            "end" | "lost" => return self.held_end(op, step).await,
            "cut" => {
                let proxy = self.proxy.as_ref().expect("a hold through the proxy");
                proxy.cut.store(true, Ordering::SeqCst);
                return Ok(());
            }
            "drop" => {
                self.proxy.as_ref().expect("a proxy").drop_all();
                return Ok(());
            }
            "freeze" => {
                self.froze_at = unix_ms();
                let pid = self.lockd.as_ref().expect("lockd").pid() as libc::pid_t;
                // SAFETY: kill(2) on our own child's pid; no memory is involved.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                tokio::time::sleep(Duration::from_millis(step["ms"].as_u64().expect("ms"))).await;
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
                return Ok(());
            }
            "restart" => {
                let addr = self.addr();
                drop(self.lockd.take().map(LockdProcess::kill));
                self.lockd = Some(Lockd::new().listen(addr).args(&self.args).spawn());
                return Ok(());
            }
            "unlock" => {
                let token = self.token(&step["token"]);
                self.client(step).unlock(&name, token).await.map(|()| Value::Null)
            }
            "renew" | "check" => {
                let token = self.token(&step["token"]);
                let ttl = step["ttl_ms"].as_u64().map(Duration::from_millis);
                let c = self.client(step);
                let left = match op {
                    "renew" => c.renew(&name, token, ttl).await,
                    _ => c.check(&name, token).await,
                };
                left.map(|d| Value::from(d.as_millis() as u64))
            }
            "status" => self.client(step).lock_status(&name).await.map(|s| match s {
                StatusLine::Free(_) => serde_json::json!({"free": true}),
                StatusLine::Held(h) => serde_json::json!({"id": h.id, "token": h.token,
                    "waiters": h.waiters, "session": h.session, "mode": h.mode.to_string(),
                    "holders": h.holders, "note": h.note}),
            }),
            "status_all" => self.client(step).held_locks().await.map(|held| {
                serde_json::json!({"names": held.iter().map(|h| h.name.clone()).collect::<Vec<_>>()})
            }),
            "detail" => self.client(step).detail(&name).await.map(|d| match d.status {
                StatusLine::Free(_) => serde_json::json!({"free": true}),
                StatusLine::Held(_) => serde_json::json!({
                    // A holder's note, and a set's other names (`and`), are named only where
                    // it has them (the lists compare whole).
                    "holders": d.holders.iter().map(|h| {
                        let mut one = serde_json::json!(
                            {"id": h.id, "token": h.token, "mode": h.mode.to_string()});
                        if let Some(note) = &h.note {
                            one["note"] = note.clone().into();
                        }
                        if !h.and.is_empty() {
                            one["and"] = h.and.clone().into();
                        }
                        one
                    }).collect::<Vec<_>>(),
                    "waiters": d.waiters.iter().map(|w| {
                        let mut one = serde_json::json!(
                            {"id": w.id, "position": w.position, "mode": w.mode.to_string()});
                        if !w.and.is_empty() {
                            one["and"] = w.and.clone().into();
                        }
                        one
                    }).collect::<Vec<_>>(),
                }),
            }),
            "watch" => {
                let name = step["name"].as_str();
                self.client(step).watch(name).await.map(|()| Value::Null)
            }
            "event" => match tokio::time::timeout(GUARD, self.client(step).next_event()).await {
                Err(_) => return Err("no event within the guard".into()),
                Ok(got) => got.map(|e| match e {
                    Ok(e) => serde_json::json!({"kind": format!("{:?}", e.kind).to_lowercase(),
                        "name": e.name, "id": e.id, "token": e.token}),
                    Err(bad) => serde_json::json!({"bad": bad.0}),
                }),
            },
            other => panic!("unknown op {other}"),
        };
        match (outcome, want) {
            (Ok(got), None) => self.compare(op, &got, &step["result"]),
            (Err(e), Some(want)) if code(&e) == want => Ok(()),
            (Ok(got), Some(want)) => Err(format!("answered {got}; expected {want}")),
            (Err(e), want) => Err(format!("{e}; expected {want:?}")),
        }
    }

    /// The fields of `result` in `got` (tokens named in `result` compared as their values).
    fn compare(&self, op: &str, got: &Value, result: &Value) -> Result<(), String> {
        if matches!(op, "renew" | "check") && got.as_u64() == Some(0) {
            return Err("no lease left".into());
        }
        let want = self.resolve(result);
        let fits = match (&want, got) {
            (Value::Null, _) => true,
            (Value::Object(want), Value::Object(got)) => {
                want.iter().all(|(k, v)| got.get(k) == Some(v))
            }
            _ => false,
        };
        fits.then_some(())
            .ok_or_else(|| format!("answered {got}; expected {want}"))
    }

    fn resolve(&self, v: &Value) -> Value {
        match v {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| match (k.as_str(), v) {
                        ("token", Value::String(t)) => {
                            (k.clone(), Value::from(self.tokens[t.as_str()]))
                        }
                        _ => (k.clone(), self.resolve(v)),
                    })
                    .collect(),
            ),
            Value::Array(list) => Value::Array(list.iter().map(|v| self.resolve(v)).collect()),
            other => other.clone(),
        }
    }
}

async fn play(doc: &Value, scenario: &Value, hold_by: HoldBy) -> Result<(), String> {
    let server = &scenario["server"];
    let mut args = Vec::new();
    let mut pki = None;
    let dir = std::env::temp_dir().join(format!(
        "lockd-conformance-{}-{}-{hold_by:?}",
        std::process::id(),
        scenario["name"].as_str().unwrap_or("scenario")
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    if server["tls"].as_bool() == Some(true) {
        let p = Pki::new("conformance");
        let (cert, key) = p.server();
        for (flag, path) in [
            ("--tls-cert", cert),
            ("--tls-key", key),
            ("--tls-client-ca", p.ca()),
        ] {
            args.extend([flag.to_string(), path.display().to_string()]);
        }
        pki = Some(p);
    }
    if server["auth"].as_bool() == Some(true) {
        let file = auth_file(doc, &dir);
        args.extend(["--auth-file".to_string(), file.display().to_string()]);
    }
    let lockd = Lockd::new().args(&args).spawn();
    let mut world = World {
        doc,
        lockd: Some(lockd),
        args,
        pki,
        clients: HashMap::new(),
        connectors: HashMap::new(),
        default_ids: Default::default(),
        tokens: HashMap::new(),
        pending: HashMap::new(),
        granted_at: HashMap::new(),
        holds: HashMap::new(),
        helpers: HashMap::new(),
        hold_by,
        proxy: None,
        unavailable: None,
        froze_at: 0,
        tmp: dir.clone(),
    };
    for (i, step) in scenario["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .enumerate()
    {
        world
            .step(step)
            .await
            .map_err(|e| format!("step {} {step}: {e}", i + 1))?;
    }
    for (_, pending) in world.pending.drain() {
        pending.task.abort();
    }
    for (_, helper) in world.helpers.drain() {
        helper.task.abort();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Polls `probe` every 20ms until it gives something, for at most the guard.
/// The token a `lockctl run` job wrote, once it has.
fn read_token(file: &std::path::Path) -> Option<Token> {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| t.trim().parse::<Token>().ok())
}

async fn eventually<T>(mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The auth file of the scenarios' users, each line made by `lockd --auth-hash`.
fn auth_file(doc: &Value, dir: &std::path::Path) -> PathBuf {
    use std::io::Write as _;
    let mut text = String::new();
    for (user, u) in doc["users"].as_object().expect("users") {
        let spec = format!("{user} {}", u["rights"].as_str().expect("rights"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["--auth-hash", &spec])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("lockd --auth-hash");
        let secret = u["secret"].as_str().expect("secret");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(format!("{secret}\n").as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("lockd --auth-hash");
        assert!(out.status.success(), "lockd --auth-hash {spec} failed");
        text.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let file = dir.join("users");
    std::fs::write(&file, text).expect("write the auth file");
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_of_the_conformance_suite() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("contrib/clients/conformance/scenarios.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("scenarios.json"))
        .expect("scenarios.json is JSON");
    let only = std::env::var("LOCKD_CONFORMANCE").ok();
    let mut failed = Vec::new();
    let mut played = 0;
    for scenario in doc["scenarios"].as_array().expect("scenarios") {
        let name = scenario["name"].as_str().expect("name");
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n == name))
        {
            continue;
        }
        let needs: Vec<&str> = scenario["needs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if let Some(lack) = needs.iter().find(|n| !HAS.contains(n)) {
            eprintln!("conformance: skipped {name}: the library client has no {lack:?}");
            continue;
        }
        // The held-lock scenarios once more with `lockctl run`: its keeper is the binary's.
        let by: &[HoldBy] = match needs.contains(&"hold") {
            true => &[HoldBy::Library, HoldBy::Lockctl],
            false => &[HoldBy::Library],
        };
        for &hold_by in by {
            played += 1;
            let label = match hold_by {
                HoldBy::Library => name.to_string(),
                HoldBy::Lockctl => format!("{name} (lockctl run)"),
            };
            match play(&doc, scenario, hold_by).await {
                Ok(()) => eprintln!("conformance: passed {label}"),
                Err(e) => {
                    eprintln!("conformance: FAILED {label}: {e}");
                    failed.push(format!("{label}: {e}"));
                }
            }
        }
    }
    assert!(played > 0, "no scenario played");
    assert!(
        failed.is_empty(),
        "failed scenarios:\n{}",
        failed.join("\n")
    );
}

/// The examples contrib/clients/README.md shows are the ones the clients' own tests run: the
/// lines between `README begin` and `README end` of each example file are in it as they are.
#[test]
fn the_readme_shows_the_tested_examples() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients");
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("contrib/clients/README.md");
    for file in [
        "go/example_test.go",
        "node/example.mjs",
        "ruby/example.rb",
        "python/example.py",
        "example.sh",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).expect("example file");
        let block: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.contains("README begin"))
            .skip(1)
            .take_while(|l| !l.contains("README end"))
            .collect();
        assert!(!block.is_empty(), "{file} has no README begin/end lines");
        let block = block.join("\n");
        assert!(
            readme.contains(&block),
            "{file}'s example is not in the README as it is:\n{block}"
        );
    }
    // Rust's is the first doctest of the library's client module, without its hidden lines.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let module =
        std::fs::read_to_string(root.join("src/client/mod.rs")).expect("src/client/mod.rs");
    let block: Vec<&str> = module
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !(l.starts_with("# ") || *l == "#"))
        .collect();
    assert!(block.len() >= 5, "no doctest in src/client/mod.rs");
    let block = block.join("\n");
    for doc in [
        readme,
        std::fs::read_to_string(root.join("README.md")).expect("README.md"),
    ] {
        assert!(
            doc.contains(&block),
            "the Rust example (src/client/mod.rs) is not in the README as it is:\n{block}"
        );
    }
}
