//! The protocol as checked-in conversations: every tests/scripts/*.lockd, each against a
//! fresh lockd, on the embedded backend and (feature `etcd`) on a real etcd cluster. See
//! tests/scripts/README.md for the format. `LOCKD_TEST_SCRIPTS=name,...` runs only some.

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

#[cfg(feature = "etcd")]
#[test]
fn scripts_on_etcd() {
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
