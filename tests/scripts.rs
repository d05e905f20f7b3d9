//! The protocol as checked-in conversations: every tests/scripts/*.lockd, each against a
//! fresh lockd, on the embedded backend and (feature `etcd`) on a real etcd cluster and on
//! two simulated front-ends over the in-memory etcd. See tests/scripts/README.md for the
//! format. `LOCKD_TEST_SCRIPTS=name,...` runs only some.

mod common;
mod script;

use script::Target;

/// Scripts run this many at once (each on its own lockd): they assert no timing, so a busy
/// machine only makes them slower.
const JOBS: usize = 3;

#[test]
fn scripts_on_embedded() {
    script::run_all(&Target::Embedded, JOBS);
}

/// Every command, LOCK option, ERR code and limit flag of proto.md that one server can produce is
/// exercised by some script, and tests/scripts/README.md lists exactly which.
#[test]
fn coverage_is_complete_and_listed() {
    use script::coverage;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = std::fs::read_to_string(root.join("proto.md")).expect("proto.md");
    let scripts: Vec<script::Script> = script::load_all()
        .into_iter()
        .map(|(name, s)| s.unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();
    let codes = coverage::proto_codes(&proto);
    let commands = coverage::proto_commands(&proto);
    let flags = coverage::proto_limit_flags(&proto);
    assert!(codes.len() >= 15, "proto.md's Errors table: {codes:?}");
    assert!(commands.len() >= 10, "proto.md's commands: {commands:?}");
    assert!(flags.len() >= 10, "proto.md's limit flags: {flags:?}");
    let rows = coverage::rows(&scripts, &commands, &codes, &flags);
    let table = coverage::table(&rows);
    let missing: Vec<&str> = rows
        .iter()
        .filter(|(what, names)| {
            names.is_empty()
                && !coverage::NOT_SCRIPTED
                    .iter()
                    .any(|(code, _)| what.trim_matches('`') == format!("ERR {code}"))
                && !coverage::FLAGS_NOT_SCRIPTED
                    .iter()
                    .any(|(flag, _)| what.trim_matches('`') == *flag)
        })
        .map(|(what, _)| what.as_str())
        .collect();
    assert!(missing.is_empty(), "no script exercises {missing:?}");
    let path = script::dir().join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let (head, rest) = readme
        .split_once(coverage::BEGIN)
        .expect("README.md has the coverage markers");
    let (listed, tail) = rest
        .split_once(coverage::END)
        .expect("README.md has the coverage end marker");
    let listed = listed.trim();
    if std::env::var_os("LOCKD_TEST_SCRIPTS_README").is_some() && listed != table.trim() {
        let new = format!("{head}{}\n{table}{}{tail}", coverage::BEGIN, coverage::END);
        std::fs::write(&path, new).expect("write README.md");
        return;
    }
    assert_eq!(
        listed,
        table.trim(),
        "tests/scripts/README.md's coverage table is out of date (LOCKD_TEST_SCRIPTS_README=1 \
         rewrites it); between its markers it should read:\n{table}"
    );
}

#[cfg(feature = "etcd")]
#[test]
fn scripts_on_etcd() {
    if !common::needs::have(common::needs::Need::Etcd) {
        return;
    }
    // One member: the scripts are about what one front-end answers, not about etcd's quorum.
    let etcd = common::etcd::EtcdCluster::start(1);
    script::run_all(
        &Target::Etcd {
            endpoints: etcd.endpoints(),
            prefix: etcd.prefix(),
        },
        JOBS,
    );
}

/// Every script on two lockd front-ends in this process over one in-memory etcd (the cluster
/// simulator's network, faults off; tests/script/sim.rs), the script's connections spread
/// over both: cluster mode as `scripts_on_etcd` runs it, with hand-overs between front-ends,
/// and no etcd binary needed.
#[cfg(feature = "etcd")]
#[test]
fn scripts_on_simulated_cluster() {
    script::run_all(&Target::Simulated, JOBS);
}
