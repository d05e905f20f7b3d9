//! What some tests need beyond the Rust toolchain, gcc and python3 (all a fresh machine is
//! sure to have), and what to do when it is missing. A test that needs a tool asks
//! [`have`] first: with the tool it runs; without it, it says on stderr (past the test
//! harness's capture) `skipped: needs nc (apt-get install netcat-openbsd)` and passes, so a
//! newcomer's first `cargo test` ends green. With `LOCKD_TEST_STRICT` set, as `.ci/run` sets
//! it, a missing tool fails the test instead: in CI nothing goes untested.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A tool some tests need, and the Debian package that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// netcat, for the two-port mode's old clients and half-closing readers.
    Nc,
    /// script(1), for lockctl at a pseudo-terminal.
    Script,
    /// An etcd server binary (`LOCKD_TEST_ETCD`, else `etcd` on PATH).
    Etcd,
    /// Prometheus's promtool, for the alert rules and their unit tests.
    Promtool,
    /// Debian's python3 with the Prometheus client's OpenMetrics parser.
    PythonPrometheus,
    /// Debian's python3 with PyYAML, to read the alert rules.
    PythonYaml,
    /// etcdctl, to set up etcd users and roles.
    Etcdctl,
    /// protoc (`PROTOC`, else on PATH), to regenerate the etcd gRPC code and compare it with
    /// the checked-in one (building lockd never needs it).
    Protoc,
    /// Debian's chromium (`LOCKD_TEST_CHROMIUM`, else on PATH), headless, for the web view.
    Chromium,
}

impl Need {
    fn what(self) -> (&'static str, &'static str) {
        match self {
            Need::Nc => ("nc", "netcat-openbsd"),
            Need::Script => ("script(1)", "bsdutils"),
            Need::Etcd => ("etcd", "etcd-server"),
            Need::Promtool => ("promtool", "prometheus"),
            Need::PythonPrometheus => (
                "/usr/bin/python3 with prometheus_client",
                "python3-prometheus-client",
            ),
            Need::PythonYaml => ("/usr/bin/python3 with yaml", "python3-yaml"),
            Need::Etcdctl => ("etcdctl", "etcd-client"),
            Need::Protoc => ("protoc", "protobuf-compiler"),
            Need::Chromium => ("chromium", "chromium"),
        }
    }

    fn present(self) -> bool {
        match self {
            Need::Nc => on_path("nc"),
            Need::Script => on_path("script"),
            Need::Etcd => std::env::var_os("LOCKD_TEST_ETCD")
                .map(|p| Path::new(&p).is_file())
                .unwrap_or_else(|| on_path("etcd")),
            Need::Promtool => on_path("promtool"),
            Need::Chromium => std::env::var_os("LOCKD_TEST_CHROMIUM")
                .map(|p| Path::new(&p).is_file())
                .unwrap_or_else(|| on_path("chromium")),
            Need::PythonPrometheus => python_imports("prometheus_client"),
            Need::PythonYaml => python_imports("yaml"),
            Need::Etcdctl => on_path("etcdctl"),
            Need::Protoc => std::env::var_os("PROTOC")
                .map(|p| Path::new(&p).is_file())
                .unwrap_or_else(|| on_path("protoc")),
        }
    }
}

/// Whether `need` is here (see the module's doc for what happens when it is not).
pub fn have(need: Need) -> bool {
    static SEEN: [OnceLock<bool>; 9] = [const { OnceLock::new() }; 9];
    let present = *SEEN[need as usize].get_or_init(|| need.present());
    if present {
        return true;
    }
    let (tool, package) = need.what();
    if std::env::var_os("LOCKD_TEST_STRICT").is_some() {
        panic!("this test needs {tool} (apt-get install {package}); LOCKD_TEST_STRICT is set, so it does not skip");
    }
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {}: needs {tool} (apt-get install {package})",
        std::thread::current().name().unwrap_or("a test")
    );
    false
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            let file = dir.join(program);
            std::fs::metadata(&file).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
    })
}

fn python_imports(module: &str) -> bool {
    Command::new("/usr/bin/python3")
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
