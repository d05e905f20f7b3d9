//! Cluster tokens (`src/backend/etcd/tokens.rs`): the grants one front-end sends to etcd
//! together, in one transaction, each get a token of their own, and every later grant a larger
//! one; a token names its own holder only; a prefix an older lockd began keeps its tokens.
#![cfg(feature = "etcd")]

use crate::basics::{etcd, front_ends, unique};
use crate::common;
use crate::common::needs::{have, Need};

use common::etcd::LockdFrontEnd;
use common::line::Line;

/// The create revision of `prefix`'s one holder key of `name`.
fn holder_revision(prefix: &str, name: &str) -> u64 {
    let key = format!("{prefix}h/{name}/");
    let out = etcd()
        .etcdctl(&["get", "--prefix", &key, "-w", "json"], None)
        .expect("etcdctl get");
    let got: serde_json::Value = serde_json::from_str(&out).expect("etcdctl's json");
    got["kvs"][0]["create_revision"]
        .as_u64()
        .unwrap_or_else(|| panic!("no holder key of {name}: {out}"))
}

/// The base an older lockd chose for its prefix (a bare number in `meta/base`).
const OLDER_BASE: u64 = 1_700_000_000_000_000;

/// Writes `prefix`'s token base as an operator (or an older lockd) would.
fn put_base(prefix: &str, value: &str) {
    etcd()
        .etcdctl(&["put", &format!("{prefix}meta/base"), value], None)
        .expect("etcdctl put");
}

/// A prefix of its own, begun by an older lockd (its base [`OLDER_BASE`]), and a front-end on it.
fn older_prefix() -> (String, LockdFrontEnd) {
    let prefix = format!("{}{}/", etcd().prefix(), unique());
    put_base(&prefix, &OLDER_BASE.to_string());
    let fe = LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "1s"]);
    (prefix, fe)
}

fn base_value(prefix: &str) -> String {
    etcd()
        .etcdctl(
            &["get", &format!("{prefix}meta/base"), "--print-value-only"],
            None,
        )
        .expect("etcdctl get")
        .trim()
        .to_owned()
}

#[test]
fn grants_sent_together_get_tokens_of_their_own_and_later_grants_larger_ones() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(1);
    let addr = fes[0].addr();
    let mut last = 0;
    for round in 0..5 {
        // 24 clients at once, a name each: their grants meet in the front-end's batches.
        let mut tokens: Vec<u64> = std::thread::scope(|s| {
            let clients: Vec<_> = (0..24)
                .map(|i| {
                    s.spawn(move || {
                        let mut c = Line::connect(addr);
                        let t = c.lock(&format!("t{i} c{i}"));
                        assert_eq!(c.req(&format!("UNLOCK t{i} {t}")), "OK");
                        t
                    })
                })
                .collect();
            clients
                .into_iter()
                .map(|c| c.join().expect("a client"))
                .collect()
        });
        let first = *tokens.iter().min().expect("tokens");
        assert!(first > last, "round {round}: token {first} after {last}");
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), 24, "round {round}: a token granted twice");
        last = *tokens.last().expect("tokens");
    }
}

#[test]
fn a_token_names_its_own_holder_only_and_says_its_revision() {
    if !have(Need::Etcd) {
        return;
    }
    let prefix = format!("{}{}/", etcd().prefix(), unique());
    let fe = LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "1s"]);
    let (mut a, mut b) = (Line::connect(fe.addr()), Line::connect(fe.addr()));
    let x = a.lock("x c1");
    let y = b.lock("y c2");
    assert!(b.req(&format!("UNLOCK y {x}")).starts_with("ERR NOTHELD"));
    assert!(a
        .req(&format!("RENEW x {y} ttl=10s"))
        .starts_with("ERR NOTHELD"));
    // proto.md: the base, plus 128 times the granting transaction's revision, plus 0 to 127.
    let value = base_value(&prefix);
    let base: u64 = value
        .strip_prefix("base=")
        .and_then(|v| v.strip_suffix(" per_revision=128"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a dense prefix's base: {value:?}"));
    assert_eq!((x - base) / 128, holder_revision(&prefix, "x"));
    assert_eq!((y - base) / 128, holder_revision(&prefix, "y"));
    assert_eq!(a.req(&format!("UNLOCK x {x}")), "OK");
    assert_eq!(b.req(&format!("UNLOCK y {y}")), "OK");
}

#[test]
fn a_prefix_an_older_lockd_began_keeps_its_tokens() {
    if !have(Need::Etcd) {
        return;
    }
    let (prefix, fe) = older_prefix();
    let base = OLDER_BASE;
    let mut last = 0;
    for i in 0..4 {
        let mut c = Line::connect(fe.addr());
        let t = c.lock(&format!("old{i} me"));
        assert_eq!(t - base, holder_revision(&prefix, &format!("old{i}")));
        assert!(t > last);
        last = t;
        assert_eq!(c.req(&format!("UNLOCK old{i} {t}")), "OK");
    }
    assert_eq!(base_value(&prefix), base.to_string());
}

#[test]
fn an_older_prefix_moved_to_dense_tokens_keeps_its_holders_tokens() {
    if !have(Need::Etcd) {
        return;
    }
    // README, "Tokens and upgrades": every front-end stopped, the base rewritten, started again.
    let (prefix, mut old) = older_prefix();
    let base = OLDER_BASE;
    let kept = Line::connect(old.addr()).lock("kept me ttl=60s");
    assert_eq!(kept - base, holder_revision(&prefix, "kept"));
    old.stop();
    put_base(&prefix, &format!("base={base} per_revision=128"));
    let fe = LockdFrontEnd::start(etcd(), &prefix, &["--etcd-lease-ttl", "1s"]);
    let mut c = Line::connect(fe.addr());
    let later = c.lock("later me");
    assert!(later > kept, "token {later} after {kept}");
    assert_eq!((later - base) / 128, holder_revision(&prefix, "later"));
    // The plain lease from before keeps its token.
    assert_eq!(c.req(&format!("UNLOCK kept {kept}")), "OK");
    assert_eq!(c.req(&format!("UNLOCK later {later}")), "OK");
}
