//! BREAK from the Python client (`break_lock`) and the bash client (`lockd_break`), against
//! a real lockd: the broken holder's next renewal is refused with who broke it.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::blocking::{finish, Server};

const GUARD: Duration = Duration::from_secs(60);

#[test]
fn python_break_lock_ends_one_token_or_every_holder() {
    let lockd = Server::start();
    let script = r#"
import os, lockd_client
from lockd_client import Client, NotHeld
ADDR = os.environ["LOCKD_ADDR"]
with Client(ADDR, id="stuck") as stuck, Client(ADDR, id="ops") as ops:
    t = stuck.lock("py-deploy", ttl=60)
    assert ops.break_lock("py-deploy", t) == 1
    # Still in its place until its holder lets go: a waiter is not granted yet.
    with Client(ADDR, id="next") as nxt:
        try:
            nxt.lock("py-deploy", ttl=60, wait=0)
            raise SystemExit("granted beside a broken lease")
        except lockd_client.Timeout:
            pass
    try:
        stuck.renew("py-deploy", t)
        raise SystemExit("renewed a broken lease")
    except NotHeld as e:
        assert "was broken by" in e.message, e.message
    stuck.unlock("py-deploy", t)
    try:
        ops.break_lock("py-deploy")
        raise SystemExit("broke a free name")
    except NotHeld:
        pass
    a = stuck.lock("py-docs", shared=True)
    with Client(ADDR, id="other") as other:
        b = other.lock("py-docs", shared=True)
        assert ops.break_lock("py-docs", force=True) == 2
print("ok")
"#;
    let child = Command::new("python3")
        .args(["-c", script])
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/python"))
        .env("LOCKD_ADDR", lockd.addr.to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (CI installs it)");
    let out = finish(child, "", GUARD);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), "ok", "{}", out.stderr);
}

#[test]
fn bash_lockd_break_prints_how_many_and_returns_4_on_nothing_held() {
    let lockd = Server::start();
    let library = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/clients/lockd.sh");
    let script = format!(
        r#"set -uo pipefail
. '{}'
lockd_lock sh-deploy ttl=1m >/dev/null || exit 10
t=$LOCKD_TOKEN
n=$(lockd_break sh-deploy "$t") || exit 11
[[ $n == 1 ]] || exit 12
lockd_renew sh-deploy "$t" >/dev/null 2>&1
rc=$?
[[ $rc == 4 ]] || exit 13
lockd_break sh-deploy "$t" force >/dev/null || exit 17
lockd_break sh-deploy 2>/dev/null
rc=$?
[[ $rc == 4 ]] || exit 14
lockd_break 2>/dev/null
[[ $? == 2 ]] || exit 15
lockd_break sh-deploy x 2>/dev/null
[[ $? == 2 ]] || exit 16
echo ok
"#,
        library.display()
    );
    let child = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("LOCKD_ADDR", lockd.addr.to_string())
        .env_remove("LOCKD_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash must be installed");
    let out = finish(child, "", GUARD);
    assert!(
        out.status.success(),
        "{:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert_eq!(out.stdout.trim(), "ok", "{}", out.stderr);
}
