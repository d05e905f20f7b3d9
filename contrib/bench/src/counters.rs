//! What a cluster run costs, from outside the systems measured: etcd's own counters (each
//! member's `/metrics`) and the CPU time of the processes (`/proc/PID/stat`), read once every
//! client has connected and once every client has finished its last request, before any
//! connection closes. The difference is the work of the run's lock requests alone: not the
//! clients' connections, etcd leases and their revocations, nor anything between runs.
//!
//! The counters (all three members; each is a Prometheus text line):
//! - `etcd_server_proposals_committed_total`: the member's raft commit index. Every etcd write
//!   is one proposal (a Txn, Put or DeleteRange from a client, the writes etcd's own Lock and
//!   Unlock make inside etcd, a lease grant or revocation); reads are not. It counts the same
//!   for lockd and for etcd's lock API, so it is what "etcd transactions" means here. The
//!   largest index among the members (the leader's) is taken.
//! - `grpc_server_handled_total` by `grpc_method`, summed over codes and members: the RPCs
//!   etcd answered over gRPC (`Txn`, `Range`; `Lock`, `Unlock` of the v3lock service). etcd's
//!   lock service calls its key-value store inside the process, not over gRPC: its Txn and
//!   Range counts stay 0.
//! - `grpc_server_msg_received_total`, every other method (watch and lease keep-alive stream
//!   messages, lease grants, puts, deletes...): the rest of what etcd was sent.
//!
//! etcd's mvcc counter of transactions (`etcd_debugging_mvcc_txn_total` in etcd 3.4,
//! `etcd_mvcc_txn_total` later) is not used: it counts only transactions of more than one
//! operation, so an Unlock's single delete is not in it while lockd's writes are.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Out;

/// The largest `/metrics` answer read; etcd's is about 150 KiB.
const MAX_BODY: u64 = 16 << 20;
/// A member slower than this to answer fails the run.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The RPC methods counted on their own (by `grpc_server_handled_total`).
const TXN: &str = "Txn";
const RANGE: &str = "Range";
const LOCK: &str = "Lock";
const UNLOCK: &str = "Unlock";

/// Where a run's costs are read from; any part may be empty.
#[derive(Clone, Default)]
pub struct Probe {
    /// The etcd members' client addresses, where they serve `/metrics`.
    pub metrics: Vec<SocketAddr>,
    /// The lockd front-ends' processes.
    pub frontends: Vec<u32>,
    /// The etcd members' processes.
    pub members: Vec<u32>,
}

/// One reading of every counter, the etcd ones summed over the members.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    proposals: f64,
    txn: f64,
    range: f64,
    lock_rpcs: f64,
    other_msgs: f64,
    frontend_cpu: f64,
    member_cpu: f64,
}

impl Probe {
    /// Reads every member's counters (at once) and the processes' CPU time.
    pub async fn read(&self) -> io::Result<Reading> {
        let mut r = Reading::default();
        let asks: Vec<_> = self
            .metrics
            .iter()
            .map(|&a| tokio::spawn(metrics(a)))
            .collect();
        for ask in asks {
            let m = parse(&ask.await.map_err(io::Error::other)??);
            r.proposals = r.proposals.max(m.proposals);
            r.txn += m.txn;
            r.range += m.range;
            r.lock_rpcs += m.lock_rpcs;
            r.other_msgs += m.other_msgs;
        }
        for &pid in &self.frontends {
            r.frontend_cpu += crate::peer::cpu_seconds(pid)?;
        }
        for &pid in &self.members {
            r.member_cpu += crate::peer::cpu_seconds(pid)?;
        }
        Ok(r)
    }

    /// Writes the rows of a run (see `costs`).
    pub fn rows(&self, out: &Out, key: &str, a: Reading, b: Reading, cycles: u64, requests: u64) {
        for (k, v) in self.costs(key, a, b, cycles, requests) {
            out.row(&k, v);
        }
    }

    /// The costs of a run of `cycles` cycles (contended: grants) of `requests` requests,
    /// between the readings `a` and `b`: per cycle, etcd's transactions (proposals) and RPCs;
    /// requests per transaction; the CPU per request, in µs. Only what the probe reads.
    fn costs(
        &self,
        key: &str,
        a: Reading,
        b: Reading,
        cycles: u64,
        requests: u64,
    ) -> Vec<(String, f64)> {
        let mut rows = Vec::new();
        if cycles == 0 || requests == 0 {
            return rows;
        }
        let (cycles, requests) = (cycles as f64, requests as f64);
        let mut row = |what: &str, v: f64| rows.push((format!("{key}.{what}"), v));
        if !self.metrics.is_empty() {
            let txns = b.proposals - a.proposals;
            row("etcd_txn_pc", txns / cycles);
            row("txn_rpc_pc", (b.txn - a.txn) / cycles);
            row("range_rpc_pc", (b.range - a.range) / cycles);
            row("lock_rpc_pc", (b.lock_rpcs - a.lock_rpcs) / cycles);
            row("other_rpc_pc", (b.other_msgs - a.other_msgs) / cycles);
            if txns > 0.0 {
                row("req_per_txn", requests / txns);
            }
        }
        if !self.frontends.is_empty() {
            row(
                "fe_cpu_us",
                (b.frontend_cpu - a.frontend_cpu) * 1e6 / requests,
            );
        }
        if !self.members.is_empty() {
            row(
                "etcd_cpu_us",
                (b.member_cpu - a.member_cpu) * 1e6 / requests,
            );
        }
        rows
    }
}

/// One member's `/metrics`, as text. HTTP/1.0, so that the answer is not chunked.
async fn metrics(addr: SocketAddr) -> io::Result<String> {
    let get = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nAccept: text/plain\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        stream.take(MAX_BODY).read_to_end(&mut answer).await?;
        Ok::<_, io::Error>(answer)
    };
    let answer = tokio::time::timeout(TIMEOUT, get)
        .await
        .map_err(|_| io::Error::other(format!("{addr}/metrics: no answer within {TIMEOUT:?}")))??;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("{addr}/metrics: no end of headers")))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(io::Error::other(format!(
            "{addr}/metrics answered {status:?}"
        )));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(io::Error::other(format!(
            "{addr}/metrics: a chunked answer"
        )));
    }
    Ok(body.to_string())
}

/// The value of `label` in a line's `{...}`.
fn label<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let labels = line.split_once('{')?.1.rsplit_once('}')?.0;
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == label).then(|| v.trim().trim_matches('"'))
    })
}

/// One member's counters, from its `/metrics` text.
fn parse(text: &str) -> Reading {
    let mut r = Reading::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let name = name_labels.split('{').next().unwrap_or_default();
        let method = label(name_labels, "grpc_method");
        match (name, method) {
            ("etcd_server_proposals_committed_total", _) => r.proposals = value,
            ("grpc_server_handled_total", Some(TXN)) => r.txn += value,
            ("grpc_server_handled_total", Some(RANGE)) => r.range += value,
            ("grpc_server_handled_total", Some(LOCK | UNLOCK)) => r.lock_rpcs += value,
            ("grpc_server_msg_received_total", Some(TXN | RANGE | LOCK | UNLOCK)) => {}
            ("grpc_server_msg_received_total", Some(_)) => r.other_msgs += value,
            _ => {}
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_etcd_counters() {
        let text = "\
# HELP etcd_server_proposals_committed_total The total number of consensus proposals committed.
# TYPE etcd_server_proposals_committed_total gauge
etcd_server_proposals_committed_total 7483
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 40
grpc_server_handled_total{grpc_code=\"FailedPrecondition\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 2
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 5
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Lock\",grpc_service=\"v3lockpb.Lock\",grpc_type=\"unary\"} 3704
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Unlock\",grpc_service=\"v3lockpb.Lock\",grpc_type=\"unary\"} 3703
grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 42
grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 4
grpc_server_msg_received_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 6
etcd_debugging_mvcc_txn_total 3705
";
        let r = parse(text);
        assert_eq!(
            r,
            Reading {
                proposals: 7483.0,
                txn: 42.0,
                range: 5.0,
                lock_rpcs: 7407.0,
                other_msgs: 10.0,
                ..Reading::default()
            }
        );
        assert_eq!(label("x{a=\"1\",b=\"two\"}", "b"), Some("two"));
        assert_eq!(label("x 1", "b"), None);
    }

    #[test]
    fn costs_are_per_cycle_and_per_request() {
        let a = Reading {
            proposals: 1000.0,
            txn: 10.0,
            frontend_cpu: 1.0,
            member_cpu: 5.0,
            ..Reading::default()
        };
        let b = Reading {
            proposals: 1200.0,
            txn: 210.0,
            other_msgs: 1.0,
            frontend_cpu: 1.05,
            member_cpu: 5.2,
            ..a
        };
        let all = Probe {
            metrics: vec!["127.0.0.1:1".parse().unwrap()],
            frontends: vec![1],
            members: vec![2, 3, 4],
        };
        let costs = all.costs("k", a, b, 100, 200);
        let get = |k: &str| costs.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(get("k.etcd_txn_pc"), Some(2.0));
        assert_eq!(get("k.txn_rpc_pc"), Some(2.0));
        assert_eq!(get("k.range_rpc_pc"), Some(0.0));
        assert_eq!(get("k.lock_rpc_pc"), Some(0.0));
        assert_eq!(get("k.other_rpc_pc"), Some(0.01));
        assert_eq!(get("k.req_per_txn"), Some(1.0));
        assert!((get("k.fe_cpu_us").unwrap() - 250.0).abs() < 1e-6);
        assert!((get("k.etcd_cpu_us").unwrap() - 1000.0).abs() < 1e-6);
        // What the probe does not read is left out, and so is a run of nothing.
        let cpu_only = Probe {
            frontends: vec![1],
            ..Probe::default()
        };
        let names: Vec<String> = cpu_only
            .costs("k", a, b, 100, 200)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["k.fe_cpu_us"]);
        assert!(all.costs("k", a, b, 0, 0).is_empty());
    }
}
