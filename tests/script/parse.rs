//! A `.lockd` script as steps; the grammar is in tests/scripts/README.md.

use std::time::Duration;

/// Which backends a script runs on (`# backends:`); both unless it says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Embedded,
    Etcd,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Embedded => "embedded",
            BackendKind::Etcd => "etcd",
        }
    }
}

/// What a `<conn>: <action>` line does.
#[derive(Clone, Debug)]
pub enum Action {
    /// Open the connection now (it is opened on first use anyway).
    Connect,
    /// Open it, and open it again while the server refuses it with `ERR LIMIT` (a slot still
    /// taken by a connection the server has not yet seen closed, such as the harness's own
    /// start probe): for scripts about connection limits. Costs a PING round trip. `true`:
    /// with a small receive buffer, as `connect small`.
    ConnectServed(bool),
    /// Open it with a small receive buffer (a client that reads slowly fills it at once).
    ConnectSmall,
    /// Close it (both directions); the name may be used again for a new connection.
    Close,
    /// Close it with a reset instead of a FIN.
    Reset,
    /// Close its sending side only (a half-close: the server sees end of input).
    Shutdown,
    /// The server closed it in order: a clean end of stream, no line before it.
    Eof,
    /// The server closed it: end of stream or a reset, no line before it.
    Closed,
    /// Nothing is pending on it: a PING sent now is answered by the very next line.
    Quiet,
    /// Nothing arrives on it for a moment (for a connection whose LOCK waits, where a PING
    /// would wait too): fails only if a line does arrive, never because the server is slow.
    Silent,
    /// Send the bytes as written, without a newline.
    SendRaw(String),
    /// Send the bytes as written, without a newline, for a script that expects the server to
    /// stop taking them (a client that does not read): a send that fails or stalls past the
    /// guard is not a failure.
    TrySend(String),
    /// Read to the end of the connection (end of stream or a reset), dropping the lines.
    Drain,
    /// Read lines, dropping them, until one matches the pattern.
    SkipUntil(String),
}

#[derive(Clone, Debug)]
pub enum Step {
    /// `a> line`: send the line and a `\n`.
    Send {
        conn: String,
        text: String,
    },
    /// `a< pattern`: the next line `a` receives matches.
    Expect {
        conn: String,
        pattern: String,
    },
    /// `a? request => pattern`: send the request again and again until its (one line)
    /// reply matches.
    Poll {
        conn: String,
        request: String,
        pattern: String,
    },
    Act {
        conn: String,
        action: Action,
    },
    /// `sleep <dur>`: only to let time pass (a lease run out); never to assert a timing.
    Sleep(Duration),
    /// `assert <a> <op> <b>`: captured values or numbers compared.
    Assert {
        a: String,
        op: String,
        b: String,
    },
    /// `server: stop`: SIGTERM to lockd (it starts shutting down; the script reads on).
    StopServer,
    /// `server: users <spec> | <spec> ...`: the auth file rewritten with these users (none:
    /// `server: users` alone), then SIGHUP to lockd, which reloads it.
    ReloadUsers(Vec<String>),
    /// `repeat N` ... `end`: the body N times, `$i` counting from 0; what the body captures
    /// is forgotten after each round.
    Repeat {
        count: usize,
        body: Vec<Line>,
    },
}

/// A step and the line of the script it came from.
#[derive(Clone, Debug)]
pub struct Line {
    pub number: usize,
    pub source: String,
    pub step: Step,
}

#[derive(Clone, Debug)]
pub struct Script {
    pub name: String,
    /// lockd's flags (`# flags:`), after the ones that choose the backend.
    pub flags: Vec<String>,
    /// Users of an auth file (`# user: <name> [rights]`); none: no `--auth-file`.
    pub users: Vec<String>,
    pub backends: Vec<BackendKind>,
    /// What the script says about a backend that differs (`# etcd differs: ...`).
    pub notes: Vec<String>,
    /// `# one front-end: <why>`: on a simulated cluster every connection goes to the first
    /// front-end, for a script about what one server does (its connection limits, its own
    /// connections); why, in words.
    pub one_front_end: Option<String>,
    pub steps: Vec<Line>,
}

impl Script {
    /// The names of the script's connections, in the order each first appears: on a
    /// simulated cluster connection `k` of this list is served by front-end `k mod n`.
    pub fn conn_names(&self) -> Vec<String> {
        fn walk(lines: &[Line], names: &mut Vec<String>) {
            for line in lines {
                let conn = match &line.step {
                    Step::Send { conn, .. }
                    | Step::Expect { conn, .. }
                    | Step::Poll { conn, .. }
                    | Step::Act { conn, .. } => conn,
                    Step::Repeat { body, .. } => {
                        walk(body, names);
                        continue;
                    }
                    _ => continue,
                };
                if !names.contains(conn) {
                    names.push(conn.clone());
                }
            }
        }
        let mut names = Vec::new();
        walk(&self.steps, &mut names);
        names
    }

    /// Whether the script says `# <backend> differs:` (and so is not run there as a test).
    pub fn differs_on(&self, backend: BackendKind) -> bool {
        let mark = format!("{} differs:", backend.name());
        self.notes.iter().any(|n| n.starts_with(&mark))
    }
}

fn conn_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_action(conn: &str, rest: &str) -> Result<Step, String> {
    let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
    let action = match (word, arg.trim()) {
        ("connect", "") => Action::Connect,
        ("connect", "small") => Action::ConnectSmall,
        ("connect", "served") => Action::ConnectServed(false),
        ("connect", "small served") => Action::ConnectServed(true),
        ("close", "") => Action::Close,
        ("reset", "") => Action::Reset,
        ("shutdown", "") => Action::Shutdown,
        ("eof", "") => Action::Eof,
        ("closed", "") => Action::Closed,
        ("quiet", "") => Action::Quiet,
        ("silent", "") => Action::Silent,
        ("send", raw) if !raw.is_empty() => Action::SendRaw(arg.to_owned()),
        ("try-send", raw) if !raw.is_empty() => Action::TrySend(arg.to_owned()),
        ("drain", "") => Action::Drain,
        ("skip-until", p) if !p.is_empty() => Action::SkipUntil(p.to_owned()),
        ("stop", "") if conn == "server" => return Ok(Step::StopServer),
        ("users", specs) if conn == "server" => {
            return Ok(Step::ReloadUsers(
                specs
                    .split('|')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ))
        }
        _ => return Err(format!("unknown action {rest:?}")),
    };
    Ok(Step::Act {
        conn: conn.to_owned(),
        action,
    })
}

fn parse_step(text: &str) -> Result<Step, String> {
    if let Some(dur) = text.strip_prefix("sleep ") {
        let d = humantime::parse_duration(dur.trim()).map_err(|e| format!("sleep: {e}"))?;
        return Ok(Step::Sleep(d));
    }
    if let Some(rest) = text.strip_prefix("assert ") {
        let w: Vec<&str> = rest.split_whitespace().collect();
        let [a, op, b] = w[..] else {
            return Err("assert takes `<a> <op> <b>`".into());
        };
        if !["<", "<=", ">", ">=", "==", "!="].contains(&op) {
            return Err(format!("assert: unknown comparison {op:?}"));
        }
        return Ok(Step::Assert {
            a: a.into(),
            op: op.into(),
            b: b.into(),
        });
    }
    let split = text
        .find(['>', '<', '?', ':'])
        .filter(|&i| conn_name(&text[..i]))
        .ok_or("not a step: expected `<conn>> `, `<conn>< `, `<conn>? `, `<conn>: `")?;
    let conn = &text[..split];
    let op = text.as_bytes()[split];
    let rest = match text[split + 1..].strip_prefix(' ') {
        Some(rest) => rest,
        // `a>` alone sends an empty line.
        None if op == b'>' && split + 1 == text.len() => "",
        None => return Err("a space must follow `>`, `<`, `?` or `:`".into()),
    };
    Ok(match op {
        b'>' => Step::Send {
            conn: conn.into(),
            text: rest.into(),
        },
        b'<' => Step::Expect {
            conn: conn.into(),
            pattern: rest.into(),
        },
        b'?' => {
            let (request, pattern) = rest
                .split_once(" => ")
                .ok_or("a poll is `<conn>? <request> => <pattern>`")?;
            Step::Poll {
                conn: conn.into(),
                request: request.into(),
                pattern: pattern.into(),
            }
        }
        _ => parse_action(conn, rest.trim_end())?,
    })
}

/// Parses a script; an error names its line.
pub fn parse(name: &str, text: &str) -> Result<Script, String> {
    let mut script = Script {
        name: name.into(),
        flags: Vec::new(),
        users: Vec::new(),
        backends: vec![BackendKind::Embedded, BackendKind::Etcd],
        notes: Vec::new(),
        one_front_end: None,
        steps: Vec::new(),
    };
    // Open `repeat` blocks: their first line and the steps read so far.
    let mut stack: Vec<(usize, String, usize, Vec<Line>)> = Vec::new();
    let mut in_header = true;
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        let at = |e: String| format!("{name}.lockd:{number}: {e}: {raw:?}");
        let line = raw.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            if in_header {
                let comment = comment.trim();
                if let Some(flags) = comment.strip_prefix("flags:") {
                    script
                        .flags
                        .extend(flags.split_whitespace().map(str::to_owned));
                } else if let Some(user) = comment.strip_prefix("user:") {
                    script.users.push(user.trim().to_owned());
                } else if let Some(list) = comment.strip_prefix("backends:") {
                    let list = list.split('#').next().unwrap_or("");
                    script.backends = list
                        .split([',', ' '])
                        .filter(|w| !w.is_empty())
                        .map(|w| match w {
                            "embedded" => Ok(BackendKind::Embedded),
                            "etcd" => Ok(BackendKind::Etcd),
                            other => Err(at(format!("unknown backend {other:?}"))),
                        })
                        .collect::<Result<_, _>>()?;
                } else if let Some(why) = comment.strip_prefix("one front-end:") {
                    let why = why.trim();
                    if why.is_empty() {
                        return Err(at("`# one front-end:` says why".into()));
                    }
                    script.one_front_end = Some(why.to_owned());
                } else if comment.contains("differs:") {
                    script.notes.push(comment.to_owned());
                }
            }
            continue;
        }
        in_header = false;
        let trimmed = line.trim_start();
        if let Some(count) = trimmed.strip_prefix("repeat ") {
            let count = count
                .trim()
                .parse()
                .map_err(|_| at("repeat takes a count".into()))?;
            stack.push((number, line.to_owned(), count, Vec::new()));
            continue;
        }
        if trimmed == "end" {
            let (number, source, count, body) = stack
                .pop()
                .ok_or_else(|| at("`end` without `repeat`".into()))?;
            let step = Line {
                number,
                source,
                step: Step::Repeat { count, body },
            };
            match stack.last_mut() {
                Some(open) => open.3.push(step),
                None => script.steps.push(step),
            }
            continue;
        }
        let step = Line {
            number,
            source: trimmed.to_owned(),
            step: parse_step(trimmed).map_err(at)?,
        };
        match stack.last_mut() {
            Some(open) => open.3.push(step),
            None => script.steps.push(step),
        }
    }
    if let Some((number, ..)) = stack.last() {
        return Err(format!("{name}.lockd:{number}: `repeat` without `end`"));
    }
    Ok(script)
}
