//! A real browser for the web view's tests: headless Chromium driven over the DevTools
//! protocol on a pipe (`--remote-debugging-pipe`: commands on the child's fd 3, answers and
//! events on its fd 4, each a JSON message ended by a NUL byte). No WebDriver, no port: the
//! browser talks to the test alone.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long one command may take before the test fails (a guard against a hang, not a bound
/// on speed).
const GUARD: Duration = Duration::from_secs(60);

/// A headless Chromium with one page open.
pub struct Browser {
    child: Child,
    commands: std::fs::File,
    answers: mpsc::Receiver<Value>,
    next_id: u64,
    session: String,
    _profile: TempProfile,
}

struct TempProfile(PathBuf);

impl Drop for TempProfile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    /// Starts Chromium and opens one blank page.
    pub fn start() -> Browser {
        let program = std::env::var_os("LOCKD_TEST_CHROMIUM").unwrap_or_else(|| "chromium".into());
        let profile = std::env::temp_dir().join(format!(
            "lockd-chromium-{}-{}",
            std::process::id(),
            super::free_port()
        ));
        std::fs::create_dir_all(&profile).expect("make the browser's profile directory");
        let (to_child, commands) = std::io::pipe().expect("pipe");
        let (answers, from_child) = std::io::pipe().expect("pipe");
        let (to_child, from_child): (OwnedFd, OwnedFd) = (to_child.into(), from_child.into());
        let (read_fd, write_fd) = (to_child.as_raw_fd(), from_child.as_raw_fd());
        let mut command = Command::new(program);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-quic",
                "--remote-debugging-pipe",
                "--window-size=1100,560",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: fcntl and dup2 are async-signal-safe, and nothing else runs between fork
        // and exec. The pipe's ends are first copied above 4, since either may itself be 3 or
        // 4 (then dup2 onto itself would keep its close-on-exec flag, or the first dup2 would
        // close the other end).
        unsafe {
            command.pre_exec(move || {
                let read = libc::fcntl(read_fd, libc::F_DUPFD, 10);
                let write = libc::fcntl(write_fd, libc::F_DUPFD, 10);
                if read < 0 || write < 0 || libc::dup2(read, 3) < 0 || libc::dup2(write, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("start chromium");
        drop((to_child, from_child));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(answers);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                message.pop_if(|b| *b == 0);
                if let Ok(value) = serde_json::from_slice::<Value>(&message) {
                    if tx.send(value).is_err() {
                        return;
                    }
                }
            }
        });
        let mut browser = Browser {
            child,
            commands: std::fs::File::from(OwnedFd::from(commands)),
            answers: rx,
            next_id: 0,
            session: String::new(),
            _profile: TempProfile(profile),
        };
        let target = browser.call(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        let attached = browser.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        browser.page("Page.enable", json!({}));
        browser
    }

    /// Sends `method` (to the page's session, or to the browser) and waits for its answer.
    fn call(&mut self, session: Option<String>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = Value::String(session);
        }
        let mut bytes = message.to_string().into_bytes();
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .unwrap_or_else(|e| panic!("send {method} to chromium: {e}"));
        let deadline = Instant::now() + GUARD;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .answers
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer from chromium to {method}: {e}"));
            if answer["id"].as_u64() == Some(id) {
                if let Some(error) = answer.get("error") {
                    panic!("chromium refused {method}: {error}");
                }
                return answer["result"].clone();
            }
        }
    }

    fn page(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.call(Some(session), method, params)
    }

    /// Opens `url` in the page.
    pub fn navigate(&mut self, url: &str) {
        let answer = self.page("Page.navigate", json!({ "url": url }));
        if let Some(error) = answer.get("errorText") {
            panic!("navigate to {url}: {error}");
        }
    }

    /// The value of the JavaScript `expression` in the page (thrown errors fail the test).
    pub fn eval(&mut self, expression: &str) -> Value {
        let answer = self.page(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        if let Some(thrown) = answer.get("exceptionDetails") {
            panic!("{expression}: {thrown}");
        }
        answer["result"]["value"].clone()
    }

    /// Evaluates `expression` until `done` accepts its value; fails after a generous guard
    /// with the last value and what `describe` says about the page.
    pub fn until(
        &mut self,
        expression: &str,
        done: impl Fn(&Value) -> bool,
        describe: &str,
    ) -> Value {
        let deadline = Instant::now() + GUARD;
        loop {
            let value = self.eval(expression);
            if done(&value) {
                return value;
            }
            if Instant::now() > deadline {
                let page = self.eval(describe);
                panic!("{expression} is still {value}; the page: {page}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A PNG of the page as it is shown.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.page("Page.captureScreenshot", json!({ "format": "png" }));
        let data = shot["data"].as_str().expect("screenshot data");
        base64_decode(data)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (what DevTools sends a screenshot in).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    let mut bits = 0u32;
    let mut count = 0;
    for c in text
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
    {
        // Only the bits not yet out matter: fewer than 8, and 6 more.
        bits = (bits << 6 | value(c)) & 0x3fff;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}
