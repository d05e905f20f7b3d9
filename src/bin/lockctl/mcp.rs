//! `lockctl mcp`: lockd's locks as tools for AI agents, over the Model Context Protocol's
//! stdio transport (JSON-RPC 2.0, one message per line on stdin, answers on stdout).
//!
//! Written against `serde_json::Value` rather than the `rmcp` SDK: four tools and three
//! methods (`initialize`, `tools/list`, `tools/call`) are a page of code, and lockctl stays
//! free of a second async stack and a schema generator. Every lock is a session lease of this
//! process's own connection to lockd: when the agent's host closes it (or dies), its locks
//! end after `--session-grace`. Nothing renews them behind the agent's back: a lock lasts its
//! ttl unless the agent calls `renew`.

use std::time::Duration;

use lockd::client::{Client, ClientError};
use lockd::locks::Mode;
use lockd::proto::Tie;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

use crate::cli::McpArgs;
use crate::fail::Failure;
use crate::net::Server;

/// The protocol versions this server speaks, newest first: it answers an `initialize` with
/// the client's version when it is one of these, else with the newest.
const VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];
/// The longest message taken from stdin: a tool call is a few hundred bytes.
const MAX_MESSAGE: u64 = 1 << 20;
/// A lock's ttl unless the call gives one.
const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// The longest `wait` a call may ask for: a tool call that blocks longer stalls the agent.
const MAX_WAIT: Duration = Duration::from_secs(300);

/// JSON-RPC's error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// Serves MCP on stdin and stdout until stdin ends (exit 0).
pub async fn serve(server: &Server, id: &str, args: &McpArgs) -> Result<u8, Failure> {
    let mut tools = Tools {
        server,
        id,
        grace: args.session_grace,
        client: None,
    };
    let mut input = BufReader::new(tokio::io::stdin());
    let mut output = tokio::io::stdout();
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut input)
            .take(MAX_MESSAGE + 1)
            .read_until(b'\n', &mut line)
            .await;
        match read {
            Ok(0) | Err(_) => return Ok(0),
            Ok(_) => {}
        }
        let answer = if line.len() as u64 > MAX_MESSAGE {
            // The rest of the line is not read: the stream can't be followed any more.
            let too_long = error(Value::Null, INVALID_REQUEST, "message longer than 1 MiB");
            write(&mut output, &too_long).await?;
            return Ok(0);
        } else {
            match serde_json::from_slice::<Value>(&line) {
                Ok(message) => tools.answer(message).await,
                Err(_) if line.iter().all(u8::is_ascii_whitespace) => None,
                Err(e) => Some(error(Value::Null, PARSE_ERROR, &format!("not JSON: {e}"))),
            }
        };
        if let Some(answer) = answer {
            write(&mut output, &answer).await?;
        }
    }
}

async fn write(output: &mut tokio::io::Stdout, message: &Value) -> Result<(), Failure> {
    let mut text = message.to_string();
    text.push('\n');
    let written = async {
        output.write_all(text.as_bytes()).await?;
        output.flush().await
    };
    // The agent's host went away: nothing more to say to anyone.
    written.await.map_err(|_| Failure::silent(0))
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn result(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The tools' state: one connection to lockd, made at the first call that needs it.
struct Tools<'a> {
    server: &'a Server,
    id: &'a str,
    grace: Duration,
    client: Option<Client>,
}

/// A tool's failure, told to the agent as the call's result (`isError`), not as a protocol
/// error: the agent reads it and decides.
struct ToolError(String);

impl From<ClientError> for ToolError {
    fn from(e: ClientError) -> ToolError {
        match e {
            ClientError::Refused(e) => {
                ToolError(format!("lockd refused: ERR {} {}", e.code, e.message))
            }
            e => ToolError(format!(
                "the connection to lockd failed ({e}); locks taken through it end after their \
                 session grace unless renewed (the next call connects again)"
            )),
        }
    }
}

impl Tools<'_> {
    /// The answer to one message; `None` for a notification.
    async fn answer(&mut self, message: Value) -> Option<Value> {
        let Some(object) = message.as_object() else {
            return Some(error(
                Value::Null,
                INVALID_REQUEST,
                "not a JSON-RPC message",
            ));
        };
        let method = object.get("method").and_then(Value::as_str);
        let Some(id) = object.get("id").cloned() else {
            // A notification (`notifications/initialized`, `notifications/cancelled`), or an
            // answer to a request this server never sends: nothing to say.
            return None;
        };
        let Some(method) = method else {
            return Some(error(id, INVALID_REQUEST, "no method"));
        };
        let params = object.get("params").cloned().unwrap_or(Value::Null);
        Some(match method {
            "initialize" => result(id, initialized(&params)),
            "ping" => result(id, json!({})),
            "tools/list" => result(id, json!({"tools": tool_list()})),
            "tools/call" => match self.call(&params).await {
                Ok(done) => result(id, done),
                Err(message) => error(id, INVALID_PARAMS, &message),
            },
            other => error(id, METHOD_NOT_FOUND, &format!("no method {other}")),
        })
    }

    /// `tools/call`: the tool's result, or (for an unknown tool or arguments that are not an
    /// object) a protocol error's message.
    async fn call(&mut self, params: &Value) -> Result<Value, String> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let none = json!({});
        let args = params.get("arguments").unwrap_or(&none);
        if !args.is_object() {
            return Err("arguments must be an object".into());
        }
        let done = match name {
            "lock" => self.lock(args).await,
            "renew" => self.renew(args).await,
            "unlock" => self.unlock(args).await,
            "status" => self.status(args).await,
            other => return Err(format!("no tool {other:?}; tools/list names them")),
        };
        Ok(match done {
            Ok((text, structured)) => json!({
                "content": [{"type": "text", "text": text}],
                "structuredContent": structured,
                "isError": false,
            }),
            Err(ToolError(text)) => json!({
                "content": [{"type": "text", "text": text}],
                "isError": true,
            }),
        })
    }

    async fn client(&mut self) -> Result<&mut Client, ToolError> {
        if self.client.is_none() {
            let client =
                self.server.connect().await.map_err(|f| {
                    ToolError(f.message.unwrap_or_else(|| "cannot reach lockd".into()))
                })?;
            self.client = Some(client);
        }
        self.client
            .as_mut()
            .ok_or_else(|| ToolError("no connection".into()))
    }

    /// Runs `request` on the connection; a connection that failed is dropped, so that the
    /// next call makes a new one.
    async fn on_lockd<T>(
        &mut self,
        request: impl AsyncFnOnce(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ToolError> {
        let client = self.client().await?;
        let answer = request(client).await;
        if let Err(ClientError::Io(_) | ClientError::Closed) = &answer {
            self.client = None;
        }
        answer.map_err(ToolError::from)
    }

    async fn lock(&mut self, args: &Value) -> Result<(String, Value), ToolError> {
        let name = text(args, "name")?.to_owned();
        let ttl = duration(args, "ttl")?.unwrap_or(DEFAULT_TTL);
        let wait = duration(args, "wait")?.unwrap_or(Duration::ZERO);
        if wait > MAX_WAIT {
            return Err(ToolError(format!(
                "wait may be at most {}",
                humantime::format_duration(MAX_WAIT)
            )));
        }
        let note = args.get("note").and_then(Value::as_str).map(str::to_owned);
        let (id, grace) = (self.id.to_owned(), self.grace);
        let token = self
            .on_lockd(async |c: &mut Client| {
                let terms = (Some(ttl), Some(wait));
                let tie = Tie::Session(grace);
                c.lock_with(
                    &name,
                    &id,
                    terms,
                    tie,
                    Mode::Exclusive,
                    false,
                    note.as_deref(),
                )
                .await
            })
            .await?;
        let text = format!(
            "locked {name}: token {token}, for {} (call renew to keep it longer, unlock when \
             done; pass the token to both)",
            humantime::format_duration(ttl)
        );
        Ok((
            text,
            json!({"name": name, "token": token, "ttl_ms": ttl.as_millis() as u64}),
        ))
    }

    async fn renew(&mut self, args: &Value) -> Result<(String, Value), ToolError> {
        let name = text(args, "name")?.to_owned();
        let token = token(args)?;
        let ttl = duration(args, "ttl")?;
        let left = self
            .on_lockd(async |c: &mut Client| c.renew(&name, token, ttl).await)
            .await?;
        let text = format!(
            "renewed {name}: {} left",
            humantime::format_duration(round_ms(left))
        );
        Ok((
            text,
            json!({"name": name, "token": token, "ttl_ms": left.as_millis() as u64}),
        ))
    }

    async fn unlock(&mut self, args: &Value) -> Result<(String, Value), ToolError> {
        let name = text(args, "name")?.to_owned();
        let token = token(args)?;
        self.on_lockd(async |c: &mut Client| c.unlock(&name, token).await)
            .await?;
        Ok((
            format!("unlocked {name}"),
            json!({"name": name, "token": token}),
        ))
    }

    async fn status(&mut self, args: &Value) -> Result<(String, Value), ToolError> {
        let name = text(args, "name")?.to_owned();
        let lock = self
            .on_lockd(async |c: &mut Client| c.detail(&name).await)
            .await?;
        let holders: Vec<Value> = lock
            .holders
            .iter()
            .map(|h| {
                json!({
                    "id": h.id, "token": h.token, "note": h.note,
                    "held_ms": h.held.as_millis() as u64, "ttl_ms": h.left.as_millis() as u64,
                    "over": h.lingering,
                })
            })
            .collect();
        let queue: Vec<Value> = lock
            .waiters
            .iter()
            .map(|w| json!({"id": w.id, "waited_ms": w.waited.as_millis() as u64}))
            .collect();
        let mut text = match lock.holders.first() {
            None => format!("{name} is free"),
            Some(h) => format!(
                "{name} is held by {} (token {}, for {} so far, {} left{})",
                h.id,
                h.token,
                humantime::format_duration(round_ms(h.held)),
                humantime::format_duration(round_ms(h.left)),
                h.note
                    .as_ref()
                    .map_or(String::new(), |n| format!("; note: {n}"))
            ),
        };
        if !lock.waiters.is_empty() {
            let ids: Vec<&str> = lock.waiters.iter().map(|w| w.id.as_str()).collect();
            text.push_str(&format!("; waiting, in order: {}", ids.join(", ")));
        }
        Ok((
            text,
            json!({"name": name, "holders": holders, "queue": queue}),
        ))
    }
}

/// A required string argument.
fn text<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    args.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ToolError(format!("{key} is required (a string)")))
}

/// The `token` argument: a number, or a string of digits (as some hosts send large integers).
fn token(args: &Value) -> Result<u64, ToolError> {
    let got = args.get("token");
    got.and_then(Value::as_u64)
        .or_else(|| got.and_then(Value::as_str).and_then(|s| s.parse().ok()))
        .ok_or_else(|| ToolError("token is required (the number lock returned)".into()))
}

/// An optional duration argument, as lockd's flags write one ("30s", "5m", "1h").
fn duration(args: &Value, key: &str) -> Result<Option<Duration>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => humantime::parse_duration(s)
            .map(Some)
            .map_err(|e| ToolError(format!("{key} {s:?} is no duration (as 30s, 5m): {e}"))),
        Some(_) => Err(ToolError(format!("{key} must be a string, as \"30s\""))),
    }
}

/// Whole milliseconds, for people.
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// `initialize`'s result: the protocol version, the tools capability, who this is.
fn initialized(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| VERSIONS.contains(v))
        .unwrap_or(VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "lockctl", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Locks held by lockd, shared with every other agent, script and \
            machine that uses the same lockd. Take a lock (lock) before working on a shared \
            resource, pass its token to renew and unlock, and unlock when done. A lock ends at \
            its ttl unless renewed, and when this MCP server stops (after its session grace).",
    })
}

/// The tools, with their input schemas.
fn tool_list() -> Value {
    let name = json!({"type": "string", "description": "The lock's name, as every user of it writes it (deploy/prod, repo:main, file:/srv/data)."});
    let token = json!({"type": "integer", "description": "The token lock returned."});
    json!([
        {
            "name": "lock",
            "title": "Take a lock",
            "description": "Take the lock <name> for this agent, exclusively. Returns its fencing token. If another holder has it, waits up to `wait` (default 0s: answers at once that it is held, and by whom). The lock ends after `ttl` (default 10m) unless renewed, and when this MCP server stops.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "name": name,
                    "wait": {"type": "string", "description": "How long to wait if it is held (0s to 5m), as \"30s\"."},
                    "ttl": {"type": "string", "description": "How long the lock lasts unless renewed, as \"10m\"."},
                    "note": {"type": "string", "description": "What holds it and why, shown to others who find it held."}
                },
                "required": ["name"]
            }
        },
        {
            "name": "renew",
            "title": "Renew a lock",
            "description": "Extend a lock this agent holds, by its ttl (or `ttl`) from now. Fails if the lock was lost (it ran out, or an operator broke it): then stop the work it guarded.",
            "inputSchema": {
                "type": "object",
                "properties": {"name": name, "token": token, "ttl": {"type": "string", "description": "The new ttl from now, as \"10m\"."}},
                "required": ["name", "token"]
            }
        },
        {
            "name": "unlock",
            "title": "Release a lock",
            "description": "Release a lock this agent holds: the next waiter gets it.",
            "inputSchema": {
                "type": "object",
                "properties": {"name": name, "token": token},
                "required": ["name", "token"]
            }
        },
        {
            "name": "status",
            "title": "Who holds a lock",
            "description": "Who holds the lock <name> (id, token, note, how long held and left) and who waits for it, in the order they will get it.",
            "inputSchema": {
                "type": "object",
                "properties": {"name": name},
                "required": ["name"]
            },
            "annotations": {"readOnlyHint": true}
        }
    ])
}
