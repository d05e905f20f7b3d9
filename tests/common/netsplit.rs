//! Cuts the links between etcd members while every member keeps running: a network
//! partition on loopback, with nftables (Debian's nftables, which `.ci/run` installs).
//!
//! Loopback gives every member the same address, so packets are told apart by who sends
//! them: each member runs as its own Unix user ([`EtcdCluster::start_as_users`]), and a rule
//! in the output hook marks each connection between two members (conntrack mark: one bit
//! per member at either end) from the first packet its initiator sends to the other's peer
//! port. Cutting member `i` off adds one rule that drops every packet of a connection whose
//! mark has bit `i`, both ways (on loopback both ends' packets leave through the output hook);
//! new connections are marked and dropped the same way. Only the test's own members' peer
//! ports are matched, so nothing else on the machine is touched.
//!
//! Everything lives in one nftables table named after the test process, deleted when the
//! [`NetSplit`] is dropped (even on a failed assertion); tables left by test processes that
//! no longer run are deleted when the next one starts.

use std::io::Write as _;
use std::process::{Command, Stdio};

use super::etcd::EtcdCluster;

/// The prefix of every table this harness makes.
const TABLE_PREFIX: &str = "lockd_test_";

pub struct NetSplit {
    table: String,
}

/// Runs `nft` with `script` on its standard input.
fn nft(script: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft failed: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether this process may use nftables (root, nft installed); why not, if not.
pub fn available() -> Result<(), String> {
    // SAFETY: geteuid(2) only reads this process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (packet filters, members as their own users)".into());
    }
    let listed = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .map_err(|e| format!("needs nft (apt-get install nftables): {e}"))?;
    if !listed.status.success() {
        return Err(format!(
            "nft list tables: {}",
            String::from_utf8_lossy(&listed.stderr)
        ));
    }
    // Tables of test processes that are gone.
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let Some(name) = line.strip_prefix("table inet ") else {
            continue;
        };
        let Some(pid) = name.strip_prefix(TABLE_PREFIX) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = nft(&format!("delete table inet {name}\n"));
        }
    }
    Ok(())
}

impl NetSplit {
    /// Marks every connection between two of `etcd`'s members (started with
    /// [`EtcdCluster::start_as_users`]).
    pub fn new(etcd: &EtcdCluster) -> Result<NetSplit, String> {
        available()?;
        let table = format!("{TABLE_PREFIX}{}", std::process::id());
        let mut marks = String::new();
        for a in 0..etcd.len() {
            for b in 0..etcd.len() {
                let ((_, uid), (port, _)) = (etcd.peer(a), etcd.peer(b));
                let Some(uid) = uid.filter(|_| a != b) else {
                    continue;
                };
                let bits = (1u32 << a) | (1u32 << b);
                marks.push_str(&format!(
                    "    meta skuid {uid} tcp dport {port} ct mark set {bits:#x}\n"
                ));
            }
        }
        let script = format!(
            "table inet {table} {{\n\
             \x20 chain marking {{\n    type filter hook output priority -10; policy accept;\n{marks}  }}\n\
             \x20 chain cutting {{\n    type filter hook output priority 0; policy accept;\n  }}\n\
             }}\n"
        );
        nft(&script)?;
        Ok(NetSplit { table })
    }

    /// Cuts member `i` off from every other member (both keep running).
    pub fn isolate(&self, i: usize) {
        let bit = 1u32 << i;
        nft(&format!(
            "add rule inet {} cutting ct mark and {bit:#x} == {bit:#x} drop\n",
            self.table
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Restores every link.
    pub fn heal(&self) {
        nft(&format!("flush chain inet {} cutting\n", self.table))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for NetSplit {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {}\n", self.table));
    }
}
