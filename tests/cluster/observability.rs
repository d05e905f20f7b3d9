//! contrib/grafana's dashboard and contrib/prometheus's alert rules against what cluster
//! front-ends really export (`tests/common/promql.rs` has the checks; the `it` binary runs
//! them against an embedded lockd, leaving cluster mode's series to this test): every
//! expression names series a cluster front-end or an embedded lockd serves, and the
//! dashboard shows every series of both.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::net::SocketAddr;
use std::time::Duration;

use common::blocking::eventually;
use common::etcd::{http_get, EtcdCluster, LockdFrontEnd};
use common::line::Line;
use common::promql::{alert_problems, dashboard_problems, scrape_embedded, Exported};
use common::{free_port, token};

const PATIENCE: Duration = Duration::from_secs(30);

/// A front-end with metrics and a tracked name, after a grant at once, a wait, a grant after
/// waiting and releases: its exposition.
fn scrape_front_end() -> Exported {
    let etcd = EtcdCluster::start(1);
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let fe = LockdFrontEnd::start(
        &etcd,
        &etcd.prefix(),
        &[
            "--metrics-listen",
            &metrics.to_string(),
            "--metrics-names",
            "tracked",
        ],
    );
    eventually(PATIENCE, "ready", || http_get(metrics, "/readyz").0 == 200);
    let first = token(&fe.request("LOCK tracked a ttl=1m"));
    let mut b = Line::connect(fe.addr());
    b.send("LOCK tracked b ttl=1m");
    eventually(PATIENCE, "b waits", || {
        fe.request("STATUS tracked").contains("waiters=1")
    });
    assert_eq!(fe.request(&format!("UNLOCK tracked {first}")), "OK");
    let second = token(&b.line());
    assert_eq!(fe.request(&format!("UNLOCK tracked {second}")), "OK");
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{body}");
    let exported = Exported::parse(&body);
    assert!(
        exported.samples.contains_key("lockd_cluster_locks_held"),
        "not a front-end's metrics:\n{body}"
    );
    exported
}

/// What either mode exports.
fn both() -> Exported {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut all = rt.block_on(scrape_embedded());
    all.elsewhere.clear();
    for (name, labels) in scrape_front_end().samples {
        all.samples.entry(name).or_default().extend(labels);
    }
    all
}

#[test]
fn the_dashboard_shows_every_series_of_both_modes_and_only_those() {
    if !have(Need::Etcd) {
        return;
    }
    let problems = dashboard_problems(&both());
    assert!(
        problems.is_empty(),
        "the dashboard:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_alert_rules_ask_only_for_series_of_either_mode() {
    if !have(Need::Etcd) {
        return;
    }
    if !have(Need::PythonYaml) {
        return;
    }
    let problems = alert_problems(&both());
    assert!(
        problems.is_empty(),
        "the alert rules:\n{}",
        problems.join("\n")
    );
}

/// A front-end does not export the per-server table gauges that a `sum()` over front-ends
/// would count once per front-end: only their `lockd_cluster_*` twins, whose help says to
/// take the max; and its build info says it is a front-end.
#[test]
fn a_front_end_exports_the_cluster_s_gauges_under_their_own_names() {
    if !have(Need::Etcd) {
        return;
    }
    let exported = scrape_front_end();
    for per_server in ["lockd_locks_held", "lockd_waiters", "lockd_lock_holders"] {
        assert!(
            !exported.samples.contains_key(per_server),
            "a front-end exports {per_server}"
        );
    }
    let build = &exported.samples["lockd_build_info"];
    assert!(
        build
            .iter()
            .any(|l| l.get("backend").map(String::as_str) == Some("etcd")),
        "{build:?}"
    );
}
