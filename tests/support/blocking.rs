//! Test support for tests that drive external programs (bash, python3) synchronously: a lockd
//! served in-process from its own runtime, and a bounded wait for a child's output.
//!
//! Included with `#[path = "support/blocking.rs"] mod blocking;`, so each test binary gets
//! its own copy; not every test uses every item.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// A lockd serving on 127.0.0.1:0 from its own runtime, stopped on drop.
pub struct Lockd {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Lockd {
    pub fn start() -> Lockd {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let shutdown = CancellationToken::new();
        let config = lockd::server::Config::default();
        runtime.spawn(lockd::server::run(config, listener, shutdown.clone()));
        Lockd {
            addr,
            shutdown,
            runtime: Some(runtime),
        }
    }

    /// One request on a fresh connection; the first reply line.
    pub fn request(&self, line: &str) -> String {
        let mut stream = TcpStream::connect(self.addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        writeln!(stream, "{line}").expect("send");
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply).expect("reply");
        reply.trim_end().to_string()
    }

    /// The holder's token of `name`, from STATUS.
    pub fn holder_token(&self, name: &str) -> Option<u64> {
        let reply = self.request(&format!("STATUS {name}"));
        lockd::proto::field(&reply, "token")?.parse().ok()
    }
}

impl Drop for Lockd {
    fn drop(&mut self) {
        self.shutdown.cancel();
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
