//! Runs tests/it/compat/nc.sh: old bash clients talking to `lockd --compat` through real netcat.
//! Without netcat it is skipped with a message (a failure with `LOCKD_TEST_STRICT`, as in CI).

use std::process::Command;

use crate::common::free_ports;
use crate::common::needs::{have, Need};

#[test]
fn four_netcat_clients_take_turns_without_overlap() {
    if !have(Need::Nc) {
        return;
    }
    let [lock_port, unlock_port] = free_ports(2)[..] else {
        unreachable!()
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/compat/nc.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_lockd"))
        .env("SERVER_ADDR", "127.0.0.1")
        .env("LOCK_PORT", lock_port.to_string())
        .env("UNLOCK_PORT", unlock_port.to_string())
        .env("UNLOCK_PORT_TIMEOUT", "30")
        // The script starts lockd; settings of the caller's own lockd must not leak in.
        .env_remove("LOCKD_LISTEN")
        .env_remove("LOCKD_COMPAT_NAME")
        .env_remove("RUST_LOG")
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "compat_nc.sh failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    assert!(stdout.contains("none overlapping"), "{stdout}");
}
