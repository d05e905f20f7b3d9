//! `lockctl mcp`: a scripted MCP conversation over stdin and stdout, as an agent's host has
//! it: initialize, the tool list, each tool called, a refusal, a protocol error, and the
//! locks gone with the process.

use std::process::Stdio;
use std::time::Duration;

use lockd::proto::Tie;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::timeout;

use super::common::lockctl::*;

const GUARD: Duration = Duration::from_secs(30);

struct Host {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl Host {
    fn start(d: &Server, args: &[&str]) -> Host {
        let mut cmd = d.lockctl(args);
        cmd.stdin(Stdio::piped());
        let mut child = spawn(cmd);
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Host {
            child,
            stdin,
            stdout,
            next_id: 1,
        }
    }

    async fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    async fn receive(&mut self) -> Value {
        let line = timeout(GUARD, self.stdout.next_line())
            .await
            .expect("an answer");
        let line = line.unwrap().expect("lockctl mcp ended");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// A request; its answer (checked to carry the request's id).
    async fn ask(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let answer = self.receive().await;
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }

    /// A tool call's result.
    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self
            .ask("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        answer["result"].clone()
    }
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_takes_renews_and_releases_a_lock_through_mcp() {
    let d = lockd().await;
    let mut host = Host::start(&d, &["--id", "agent-1", "mcp", "--session-grace", "0s"]);

    let init = host
        .ask(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test-host", "version": "1"}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "lockctl");
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );
    host.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;

    let list = host.ask("tools/list", json!({})).await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lock", "renew", "unlock", "status"]);
    for tool in list["result"]["tools"].as_array().unwrap() {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }

    // lock: the token, held by the host's id, with its note, as a session lease.
    let locked = host
        .call(
            "lock",
            json!({"name": "repo:main", "ttl": "2m", "note": "refactoring"}),
        )
        .await;
    assert_eq!(locked["isError"], false, "{locked}");
    let token = locked["structuredContent"]["token"].as_u64().unwrap();
    assert!(text(&locked).contains(&token.to_string()));
    let status = d.status_line("repo:main").await;
    assert!(
        status.contains("id=agent-1") && status.contains("session=1"),
        "{status}"
    );
    assert_eq!(d.holder("repo:main").await, Some(token));

    // status: who holds it, and who waits, in order.
    let mut other = d.client().await;
    let waiter = tokio::spawn(async move {
        other
            .lock("repo:main", "human", None, None, Tie::Plain)
            .await
    });
    d.wait_waiters("repo:main", 1).await;
    let status = host.call("status", json!({"name": "repo:main"})).await;
    assert_eq!(status["isError"], false, "{status}");
    let s = &status["structuredContent"];
    assert_eq!(s["holders"][0]["id"], "agent-1", "{status}");
    assert_eq!(s["holders"][0]["note"], "refactoring", "{status}");
    assert_eq!(s["queue"][0]["id"], "human", "{status}");
    assert!(
        text(&status).contains("waiting, in order: human"),
        "{status}"
    );

    // renew, with the token as a string too (some hosts send large integers so).
    let renewed = host
        .call(
            "renew",
            json!({"name": "repo:main", "token": token.to_string(), "ttl": "5m"}),
        )
        .await;
    assert_eq!(renewed["isError"], false, "{renewed}");
    assert!(renewed["structuredContent"]["ttl_ms"].as_u64().unwrap() > 120_000);

    // A refusal: another name held by someone else, no wait: told by whom, as a result the
    // agent reads (isError), not a protocol error.
    d.client()
        .await
        .lock("deploy", "ci", None, None, Tie::Plain)
        .await
        .unwrap();
    let refused = host.call("lock", json!({"name": "deploy"})).await;
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(
        text(&refused).contains("TIMEOUT") && text(&refused).contains("ci"),
        "{refused}"
    );
    let bad = host
        .call("lock", json!({"name": "x", "wait": "soon"}))
        .await;
    assert_eq!(bad["isError"], true, "{bad}");
    assert!(text(&bad).contains("no duration"), "{bad}");

    // unlock: the waiter gets it.
    let unlocked = host
        .call("unlock", json!({"name": "repo:main", "token": token}))
        .await;
    assert_eq!(unlocked["isError"], false, "{unlocked}");
    let next = timeout(GUARD, waiter).await.unwrap().unwrap().unwrap();
    assert!(next > token);

    // Protocol errors: an unknown tool, an unknown method, a line that is no JSON.
    let unknown = host
        .ask("tools/call", json!({"name": "nosuch", "arguments": {}}))
        .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    let no_method = host.ask("resources/list", json!({})).await;
    assert_eq!(no_method["error"]["code"], -32601, "{no_method}");
    host.stdin.write_all(b"{not json\n").await.unwrap();
    let parse = host.receive().await;
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    assert_eq!(parse["id"], Value::Null);
    let ping = host.ask("ping", json!({})).await;
    assert_eq!(ping["result"], json!({}));

    // The host goes away (stdin ends): lockctl exits 0, and its locks end with its session
    // (no grace here).
    let again = host.call("lock", json!({"name": "scratch"})).await;
    assert_eq!(again["isError"], false, "{again}");
    drop(host.stdin);
    let status = timeout(GUARD, host.child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    d.wait_free("scratch").await;
}
