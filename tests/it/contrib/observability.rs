//! contrib/grafana's dashboard and contrib/prometheus's alert rules against an embedded
//! lockd (the checks are `tests/common/promql.rs`; cluster mode's series are checked by
//! `tests/cluster/observability.rs`), and the checks' own scanner.

use crate::common;
use crate::common::needs::{have, Need};

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use common::promql::{
    alert_problems, check, check_variable_query, dashboard_problems, is_duration, scan,
    scrape_embedded, Exported, Matcher, Selector,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_every_lockd_series_and_only_those() {
    let problems = dashboard_problems(&scrape_embedded().await);
    assert!(
        problems.is_empty(),
        "the dashboard:\n{}",
        problems.join("\n")
    );
}

/// Prometheus's own checker loads the rules, and its unit tests of them
/// (contrib/prometheus/lockd-alerts.test.yml) pass: an idle fleet pages nobody, a stuck
/// cluster queue raises one alert, not one per front-end.
#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    if !have(Need::Promtool) {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contrib/prometheus");
    for args in [
        ["check", "rules", "lockd-alerts.yml"],
        ["test", "rules", "lockd-alerts.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool is needed (Debian's prometheus: apt-get install prometheus)");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alert_rules_ask_only_for_lockd_series_and_tell_what_to_do() {
    if !have(Need::PythonYaml) {
        return;
    }
    let problems = alert_problems(&scrape_embedded().await);
    assert!(
        problems.is_empty(),
        "the alert rules:\n{}",
        problems.join("\n")
    );
}

// The scanner finds what the checks rely on.

fn exported_fixture() -> Exported {
    Exported::parse(
        "# TYPE lockd_releases counter\n\
         lockd_releases_total{kind=\"unlock\"} 0\n\
         lockd_releases_total{kind=\"expired\"} 1\n\
         lockd_wait_seconds_bucket{le=\"0.001\"} 0\n\
         lockd_wait_seconds_count 0\n\
         lockd_waiters 0\n\
         # EOF\n",
    )
}

#[test]
fn the_scanner_reads_selectors_matchers_and_grouping() {
    let q = scan(
        "histogram_quantile(0.99, sum by (instance, le) (rate(lockd_wait_seconds_bucket\
         {instance=~\"$instance\"}[$__rate_interval]))) > 4 * avg without(kind) (x offset 1d)",
    )
    .unwrap();
    assert_eq!(
        q.selectors,
        [
            Selector {
                metric: "lockd_wait_seconds_bucket".into(),
                matchers: vec![Matcher {
                    label: "instance".into(),
                    op: "=~",
                    value: "$instance".into(),
                }],
            },
            Selector {
                metric: "x".into(),
                matchers: vec![],
            },
        ]
    );
    assert_eq!(q.grouping, ["instance", "le", "kind"]);
    assert!(scan("sum({job=\"x\"})").is_err(), "a selector needs a name");
    let either = scan("{__name__=~\"a|b\", name=\"n\"}").unwrap();
    let metrics: Vec<&str> = either.selectors.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(metrics, ["a", "b"]);
    assert!(either.selectors.iter().all(|s| s.matchers.len() == 1));
    assert!(scan("x{a=\"b}").is_err());
}

#[test]
fn the_check_catches_unknown_series_labels_and_values() {
    let exported = exported_fixture();
    let mut used = BTreeSet::new();
    let ok = "sum by (job, instance, kind) (rate(lockd_releases_total{kind=\"expired\"}[5m])) \
              and on (instance) lockd_waiters > 0 or up{job=\"lockd\"} == 0";
    assert_eq!(check(ok, &exported, &mut used), Vec::<String>::new());
    assert_eq!(
        used,
        BTreeSet::from(["lockd_releases_total".into(), "lockd_waiters".into()])
    );
    for bad in [
        "rate(lockd_release_total[5m])",
        "lockd_releases_total{kind=\"expiry\"}",
        "lockd_releases_total{code=\"LIMIT\"}",
        "sum by (code) (lockd_releases_total)",
        "vector(1)",
    ] {
        assert_eq!(check(bad, &exported, &mut used).len(), 1, "{bad}");
    }
    assert_eq!(
        exported.family("lockd_wait_seconds_count"),
        "lockd_wait_seconds"
    );
    assert_eq!(exported.family("lockd_waiters"), "lockd_waiters");
    assert!(check_variable_query(
        "label_values(lockd_waiters, instance)",
        &exported,
        &mut used
    )
    .is_empty());
    assert_eq!(
        check_variable_query("label_values(lockd_waiters, name)", &exported, &mut used).len(),
        1
    );
}

#[test]
fn durations_are_prometheus_durations() {
    for ok in ["30s", "2m", "1h30m", "1d", "500ms", "1m30s500ms"] {
        assert!(is_duration(ok), "{ok}");
    }
    for bad in ["", "5", "m", "30 s", "1m1h", "1.5h", "5mm"] {
        assert!(!is_duration(bad), "{bad}");
    }
}
