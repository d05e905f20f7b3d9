//! Test support for tests that drive external programs (bash, python3) synchronously: a lockd
//! served in-process from its own runtime, and a bounded wait for a child's output.
//!
//! Part of the one test harness (`tests/common`): `common::blocking`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lockd::server::Config;

use super::{line, TestServer};

/// A lockd serving on 127.0.0.1:0 from its own runtime ([`super::Lockd::serve_in_background`]),
/// with blocking helpers over one-request connections; stopped on drop.
pub struct Server {
    pub addr: SocketAddr,
    server: Option<TestServer>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Server {
    pub fn start() -> Server {
        let (runtime, server) = super::Lockd::new()
            .config(Config::default())
            .serve_in_background();
        Server {
            addr: server.addr,
            server: Some(server),
            runtime: Some(runtime),
        }
    }

    /// One request on a fresh connection; the first reply line.
    pub fn request(&self, line: &str) -> String {
        request_at(self.addr, line)
    }

    /// A request that waits (a LOCK of a held lock), sent from a thread of its own on a fresh
    /// connection; joining the thread gives the reply.
    pub fn request_in_background(&self, line: &str) -> thread::JoinHandle<String> {
        let (addr, line) = (self.addr, line.to_string());
        thread::spawn(move || request_at(addr, &line))
    }

    /// The holder's token of `name`, from STATUS.
    pub fn holder_token(&self, name: &str) -> Option<u64> {
        let reply = self.request(&format!("STATUS {name}"));
        lockd::proto::field(&reply, "token")?.parse().ok()
    }

    /// Waits until `name` is held, and returns the holder's token.
    pub fn wait_held(&self, name: &str, guard: Duration) -> u64 {
        let mut token = None;
        eventually(guard, &format!("{name} is taken"), || {
            token = self.holder_token(name);
            token.is_some()
        });
        token.expect("token")
    }

    /// The holder's id of `name`, from STATUS.
    pub fn holder_id(&self, name: &str) -> Option<String> {
        let reply = self.request(&format!("STATUS {name}"));
        lockd::proto::field(&reply, "id").map(str::to_string)
    }

    /// How many hold `name` (0 while it is free), from STATUS: its `holders=` field, which
    /// only a shared lock or a semaphore has; an exclusive lock has one holder.
    pub fn holders(&self, name: &str) -> u64 {
        let reply = self.request(&format!("STATUS {name}"));
        match lockd::proto::field(&reply, "holders") {
            Some(n) => n.parse().unwrap_or(0),
            None => u64::from(reply.contains(" held ")),
        }
    }

    /// How many wait for `name` (0 while it is free), from STATUS.
    pub fn waiters(&self, name: &str) -> u64 {
        let reply = self.request(&format!("STATUS {name}"));
        lockd::proto::field(&reply, "waiters")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

/// One request to `addr` on a fresh connection; the first reply line.
fn request_at(addr: SocketAddr, line: &str) -> String {
    line::request(addr, line, None, Duration::from_secs(60)).expect("request")
}

/// Checks that a client killed while it waits never gets the lock. The lock `queue` is held;
/// `start` starts a process that waits for it, which gets `signal` once a second waiter
/// (`next`) queues behind it. It must leave the queue, and when the holder releases, `next`
/// must be granted: the lock never goes to the dead one (which would keep it for its ttl).
pub fn assert_killed_waiter_never_gets_the_lock(
    lockd: &Server,
    signal_to_send: i32,
    guard: Duration,
    start: impl FnOnce(&Server) -> Child,
) {
    let holder = lockd.request("LOCK queue holder ttl=10m");
    let token = holder.strip_prefix("OK ").expect("the holder's token");
    let mut waiter = start(lockd);
    eventually(guard, "the client waits", || lockd.waiters("queue") == 1);
    let next = lockd.request_in_background("LOCK queue next ttl=10m");
    eventually(guard, "the next one waits behind it", || {
        lockd.waiters("queue") == 2
    });
    signal(&waiter, signal_to_send);
    let _ = waiter.wait();
    eventually(guard, "the killed client leaves the queue", || {
        lockd.waiters("queue") == 1
    });
    assert_eq!(lockd.request(&format!("UNLOCK queue {token}")), "OK");
    let granted = next.join().expect("next waiter");
    assert!(granted.starts_with("OK "), "{granted}");
    assert_eq!(lockd.holder_id("queue").as_deref(), Some("next"));
}

/// Checks that a client holding `name` with a session lease of `grace`, through `proxy`,
/// rides out a cut of its connection: it reconnects, and past the grace the lease is still
/// its own.
pub fn assert_rides_out_a_cut(
    lockd: &Server,
    proxy: &Proxy,
    name: &str,
    grace: Duration,
    guard: Duration,
) {
    let token = lockd.wait_held(name, guard);
    assert!(lockd
        .request(&format!("STATUS {name}"))
        .contains(" session=1 "));
    let before = proxy.accepted();
    proxy.cut();
    eventually(guard, "the client reconnects", || proxy.accepted() > before);
    // Waits out the grace of the dropped connection: only a renewal kept the lease.
    thread::sleep(grace + Duration::from_secs(1));
    let checked = lockd.request(&format!("CHECK {name} {token}"));
    assert!(checked.starts_with("OK ttl_ms="), "{checked}");
}

/// Checks that a client holding `name` with a session lease of `grace`, connected through
/// `proxy` (the first of its addresses; the second leads to `lockd` directly), reconnects to
/// the second address when the proxy cuts its connection, not back through the proxy: past
/// the grace the lease is still its own, and the proxy passed no new connection.
pub fn assert_renews_elsewhere_after_a_cut(
    lockd: &Server,
    proxy: &Proxy,
    name: &str,
    grace: Duration,
    guard: Duration,
) {
    let token = lockd.wait_held(name, guard);
    let before = proxy.accepted();
    proxy.cut();
    // Waits out the grace of the dropped connection: only a renewal kept the lease.
    thread::sleep(grace + Duration::from_secs(1));
    let checked = lockd.request(&format!("CHECK {name} {token}"));
    assert!(checked.starts_with("OK ttl_ms="), "{checked}");
    assert_eq!(proxy.accepted(), before, "it reconnected through the proxy");
}

/// Cuts the connection of a client holding `name` through `proxy` and lets it reconnect no
/// more; the server must end the lease (by its grace: the test's ttl is far longer).
pub fn cut_for_good(lockd: &Server, proxy: &Proxy, name: &str, guard: Duration) {
    lockd.wait_held(name, guard);
    proxy.refuse(true);
    proxy.cut();
    eventually(guard, "the server ends the lease", || {
        lockd.request(&format!("STATUS {name}")) == format!("OK {name} free")
    });
}

/// A file through which a child process says it got somewhere (its command runs under the
/// lock): it writes one line there. Unique to this test process and tag; removed on drop.
pub struct Mark {
    pub path: PathBuf,
}

impl Mark {
    pub fn new(tag: &str) -> Mark {
        let path = std::env::temp_dir().join(format!("lockd-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Mark { path }
    }

    /// Waits until the line is written, and returns it.
    pub fn wait(&self, guard: Duration) -> String {
        let mut line = String::new();
        eventually(
            guard,
            &format!("{} is written", self.path.display()),
            || {
                line = std::fs::read_to_string(&self.path).unwrap_or_default();
                line.ends_with('\n')
            },
        );
        line.trim_end().to_string()
    }

    /// Forgets the line, to wait for the next one.
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Polls `check` until it holds; fails the test with `what` if it does not within `guard`.
pub fn eventually(guard: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + guard;
    while !check() {
        assert!(Instant::now() < deadline, "not within {guard:?}: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` to `child`'s process alone (not to its children).
pub fn signal(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) only sends a signal; the child is ours and not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid}");
}

/// A TCP proxy on 127.0.0.1:0 in front of `target`, whose connections a test can cut (as a
/// firewall's reset or a restart would) and whose new connections it can refuse.
pub struct Proxy {
    pub addr: SocketAddr,
    /// Both sockets of every connection still open.
    open: Arc<Mutex<Vec<(TcpStream, TcpStream)>>>,
    accepted: Arc<AtomicUsize>,
    refusing: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let proxy = Proxy {
            addr,
            open: Arc::default(),
            accepted: Arc::default(),
            refusing: Arc::default(),
            stopped: Arc::default(),
        };
        let (open, accepted) = (proxy.open.clone(), proxy.accepted.clone());
        let (refusing, stopped) = (proxy.refusing.clone(), proxy.stopped.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if refusing.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                // Listed before any byte passes, so a cut after a reply covers its connection.
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    open.lock().expect("proxy list").push((c, s));
                }
                accepted.fetch_add(1, Ordering::SeqCst);
                pipe(&client, &server);
                pipe(&server, &client);
            }
        });
        proxy
    }

    /// Closes every open connection on both sides: each end sees its peer close.
    pub fn cut(&self) {
        for (client, server) in self.open.lock().expect("proxy list").drain(..) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    /// From now on (or no longer), new connections are closed at once.
    pub fn refuse(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::SeqCst);
    }

    /// How many connections it has passed on so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.cut();
        let _ = TcpStream::connect(self.addr); // wakes the accept loop to see `stopped`
    }
}

/// Copies `from` to `to` in a thread until either ends, then shuts `to`'s sending side.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.cancel();
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// What a finished child said.
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Feeds `stdin` to `child`, reads both of its pipes (so neither fills up) and waits for it,
/// killing it and failing the test if it outlives `guard`.
pub fn finish(mut child: Child, stdin: &str, guard: Duration) -> Output {
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin.as_bytes());
    }
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + guard;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child still running after {guard:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}

/// A client process against `addr`: `bash` with `contrib/clients/lockd.sh` sourced, or
/// `python3` with `contrib/clients/python`'s client importable, running `script`, its stdio
/// piped.
pub fn client_process(program: &str, addr: &str, script: &str) -> Child {
    use std::process::{Command, Stdio};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients");
    let mut command = Command::new(program);
    if program == "bash" {
        let library = root.join("lockd.sh");
        let full = format!("set -uo pipefail\n. '{}'\n{script}\n", library.display());
        command.arg("-c").arg(full);
    } else {
        let full = format!("import os, sys, lockd_client\n{script}\n");
        command
            .arg("-c")
            .arg(full)
            .current_dir(root.join("python"))
            .env("PYTHONDONTWRITEBYTECODE", "1");
    }
    command
        .env("LOCKD_ADDR", addr)
        .env_remove("LOCKD_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the client's interpreter must be installed")
}
