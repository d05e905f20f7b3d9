//! Sets as wide as `--max-names` allows, in cluster mode: each of their writes fits in one
//! etcd transaction (etcd takes 128 operations, and counts a nested transaction's against
//! what the outer one leaves).
#![cfg(feature = "etcd")]

use super::basics::{etcd, wait_waiters};
use crate::common;
use crate::common::needs::{have, Need};

use common::etcd::LockdFrontEnd;
use common::line::Line;
use common::{token, tokens};

/// The largest `--max-names` lockd takes.
const WIDEST: usize = 32;

fn set_line(names: &[String], id: &str, extra: &str) -> String {
    let and: Vec<String> = names[1..].iter().map(|n| format!("and={n}")).collect();
    format!("LOCK {} {id} {}{extra}", names[0], and.join(" "))
}

/// Granted (a lease long enough for two requests to queue behind it), queued, expired into the next set, released into a one-name waiter, released
/// again: every write of a set of the widest size etcd accepts, through two front-ends.
#[test]
fn a_set_of_max_names_is_granted_expired_and_released_in_cluster_mode() {
    if !have(Need::Etcd) {
        return;
    }
    let prefix = format!("{}sets-wide/", etcd().prefix());
    let flags = ["--etcd-lease-ttl", "1s", "--max-names", "32"];
    let fes: Vec<LockdFrontEnd> = (0..2)
        .map(|_| LockdFrontEnd::start(etcd(), &prefix, &flags))
        .collect();
    let names: Vec<String> = (0..WIDEST).map(|i| format!("wide-{i}")).collect();
    let last = &names[WIDEST - 1];

    let mut a = Line::connect(fes[0].addr());
    let granted = a.req(&set_line(&names, "a", " ttl=5s"));
    assert_eq!(granted.split_whitespace().count(), WIDEST + 1, "{granted}");
    let ta = tokens(&granted)[0];
    let mut b = Line::connect(fes[1].addr());
    b.send(&set_line(&names, "b", " ttl=1m"));
    wait_waiters(&fes[0], last, 1);
    let mut single = Line::connect(fes[0].addr());
    single.send(&format!("LOCK {last} single"));
    wait_waiters(&fes[1], last, 2);

    // a's lease runs out: the set waiter gets every name.
    let tb = tokens(&b.line())[0];
    assert!(tb > ta, "{tb} after {ta}");
    // b releases: the one-name waiter gets its name, the others are free.
    assert_eq!(b.req(&format!("UNLOCK {} {tb}", names[0])), "OK");
    let ts = token(&single.line());
    assert!(ts > tb, "{ts} after {tb}");
    let mut c = Line::connect(fes[1].addr());
    let first = c.req(&format!("LOCK {} c wait=0", names[0]));
    assert!(first.starts_with("OK "), "{first}");
    assert_eq!(single.req(&format!("UNLOCK {last} {ts}")), "OK");
}
