//! The in-memory etcd: its own edge cases, and a differential test that sends the same
//! seeded operations to it and to a real etcd and compares every answer.

use std::time::Duration;

use super::super::pb::{compare, request_op, response_op};
use super::super::tests::AuthEtcd;
use super::super::{Client, ConnectOptions, Txn, WatchOptions};
use super::txn::count_ops;
use super::*;
use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};

fn cmp(key: &str, target: T, result: R, union: U) -> pb::Compare {
    pb::Compare {
        result: result as i32,
        target: target as i32,
        key: key.into(),
        range_end: Vec::new(),
        target_union: Some(union),
    }
}

fn op(r: request_op::Request) -> pb::RequestOp {
    pb::RequestOp { request: Some(r) }
}

fn put(key: &str, value: &str, lease: i64) -> pb::RequestOp {
    op(request_op::Request::RequestPut(pb::PutRequest {
        key: key.into(),
        value: value.into(),
        lease,
    }))
}

fn get(key: &str, range_end: &[u8]) -> pb::RequestOp {
    op(request_op::Request::RequestRange(pb::RangeRequest {
        key: key.into(),
        range_end: range_end.to_vec(),
        count_only: false,
    }))
}

fn txn(compare: Vec<pb::Compare>, success: Vec<pb::RequestOp>) -> pb::TxnRequest {
    pb::TxnRequest {
        compare,
        success,
        failure: Vec::new(),
    }
}

#[test]
fn revisions_versions_and_a_missing_key_compare_as_etcd_does() {
    let mut m = MemEtcd::new();
    assert_eq!(m.revision(), 1);
    // A missing key has version, create and mod revision 0, and no value to compare.
    let absent = cmp("a", T::Version, R::Equal, U::Version(0));
    let by_value = cmp("a", T::Value, R::NotEqual, U::Value(b"x".to_vec()));
    let r = m
        .txn(&txn(vec![absent.clone()], vec![put("a", "1", 0)]))
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(m.revision(), 2);
    assert!(!m.txn(&txn(vec![absent], vec![])).unwrap().succeeded);
    m.txn(&txn(vec![], vec![put("a", "2", 0), put("b", "1", 0)]))
        .unwrap();
    assert_eq!(m.revision(), 3, "one revision for a transaction's writes");
    let a = &m.range(&get_req("a")).kvs[0];
    assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 3, 2));
    let none = m.txn(&txn(vec![by_value], vec![])).unwrap();
    assert!(none.succeeded, "a value unlike x");
    let missing = cmp("zz", T::Value, R::NotEqual, U::Value(b"x".to_vec()));
    assert!(!m.txn(&txn(vec![missing], vec![])).unwrap().succeeded);
    // A read-only transaction moves nothing.
    m.txn(&txn(vec![], vec![get("a", &[])])).unwrap();
    assert_eq!(m.revision(), 3);
}

fn get_req(key: &str) -> pb::RangeRequest {
    pb::RangeRequest {
        key: key.into(),
        range_end: Vec::new(),
        count_only: false,
    }
}

#[test]
fn leases_expire_in_a_revision_each_and_a_put_needs_a_live_one() {
    let mut m = MemEtcd::new();
    let id = m.lease_grant(2, 0).id;
    m.txn(&txn(vec![], vec![put("a", "1", id), put("b", "1", id)]))
        .unwrap();
    assert_eq!(
        m.txn(&txn(vec![], vec![put("c", "1", 999)])),
        Err(MemError::LeaseNotFound)
    );
    m.advance(1500);
    assert_eq!(m.keep_alive(id), Ok(2));
    m.advance(3000);
    assert_eq!(m.range(&get_req("a")).count, 1, "kept alive at 1.5s");
    m.advance(3600);
    assert_eq!(m.range(&get_req("a")).count, 0);
    assert_eq!(m.range(&get_req("b")).count, 0);
    assert_eq!(m.revision(), 3, "the expiry is one revision");
    assert_eq!(m.keep_alive(id), Err(MemError::LeaseNotFound));
}

#[test]
fn a_put_with_a_missing_lease_fails_the_whole_transaction() {
    let mut m = MemEtcd::new();
    let id = m.lease_grant(60, 0).id;
    m.txn(&txn(vec![], vec![put("k", "0", 0)])).unwrap();
    let before = (m.revision(), m.watch(b"", b"\0", 1).unwrap().len());
    // The puts and deletes before the bad one, and in a nested transaction (etcd checks the
    // leases of every branch taken before it writes anything).
    let del = op(request_op::Request::RequestDeleteRange(
        pb::DeleteRangeRequest {
            key: b"k".to_vec(),
            range_end: Vec::new(),
        },
    ));
    let nested = op(request_op::Request::RequestTxn(txn(
        vec![],
        vec![put("c", "1", 999)],
    )));
    for bad in [
        txn(
            vec![],
            vec![put("a", "1", id), del.clone(), put("b", "1", 999)],
        ),
        txn(vec![], vec![put("a", "1", 0), nested]),
    ] {
        assert_eq!(m.txn(&bad), Err(MemError::LeaseNotFound));
        assert_eq!(
            (m.revision(), m.watch(b"", b"\0", 1).unwrap().len()),
            before
        );
        assert_eq!(m.range(&get_req("a")).count, 0);
        assert_eq!(m.range(&get_req("k")).count, 1);
    }
    // A put with a missing lease in the branch not taken is no failure.
    let absent = cmp("zz", T::Version, R::Greater, U::Version(0));
    let mut other = txn(vec![absent], vec![put("b", "1", 999)]);
    other.failure = vec![put("a", "1", id)];
    assert!(!m.txn(&other).unwrap().succeeded);
    assert_eq!(m.range(&get_req("a")).count, 1);
}

#[test]
fn a_watch_from_a_compacted_revision_is_told_so() {
    let mut m = MemEtcd::new();
    for v in ["1", "2", "3"] {
        m.txn(&txn(vec![], vec![put("w/a", v, 0)])).unwrap();
    }
    assert_eq!(m.watch(b"w/", b"w0", 3).unwrap().len(), 2);
    m.compact(3);
    assert_eq!(m.watch(b"w/", b"w0", 2), Err(MemError::Compacted(3)));
    assert_eq!(m.watch(b"w/", b"w0", 4).unwrap().len(), 1);
    let big = pb::TxnRequest {
        success: (0..=MAX_TXN_OPS)
            .map(|i| put(&format!("k{i}"), "v", 0))
            .collect(),
        ..Default::default()
    };
    assert_eq!(m.txn(&big), Err(MemError::TooManyOps));
}

/// Found by the differential test: etcd decides a nested transaction's branch on the store
/// as it was before the whole transaction, not after the writes that come before it.
#[test]
fn nested_compares_see_the_store_before_the_transaction() {
    let mut m = MemEtcd::new();
    let absent = cmp("n", T::Version, R::Equal, U::Version(0));
    let inner = txn(vec![absent.clone()], vec![put("seen-absent", "1", 0)]);
    let outer = txn(
        vec![],
        vec![put("n", "1", 0), op(request_op::Request::RequestTxn(inner))],
    );
    let r = m.txn(&outer).unwrap();
    let Some(response_op::Response::ResponseTxn(inner)) = &r.responses[1].response else {
        panic!("{r:?}");
    };
    assert!(inner.succeeded, "the nested compare saw n absent");
    // One branch may not write a key twice, nor put a key it deletes.
    let twice = txn(vec![], vec![put("k", "1", 0), put("k", "2", 0)]);
    assert_eq!(m.txn(&twice), Err(MemError::DuplicateKey));
    let del = op(request_op::Request::RequestDeleteRange(
        pb::DeleteRangeRequest {
            key: b"k".to_vec(),
            range_end: Vec::new(),
        },
    ));
    assert_eq!(
        m.txn(&txn(vec![], vec![del, put("k", "1", 0)])),
        Err(MemError::DuplicateKey)
    );
    let mut either = txn(vec![absent], vec![put("k", "1", 0)]);
    either.failure = vec![put("k", "2", 0)];
    assert!(m.txn(&either).is_ok(), "two branches may put one key");
}

/// A small seeded source (xorshift): the differential test's operations, the same each run.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

const KEYS: [&str; 4] = ["d/a", "d/b", "d/c", "e/a"];

/// Transactions the differential test sends to both.
const STEPS: usize = 1500;

fn random_compare(rng: &mut Rng, leases: &[i64]) -> pb::Compare {
    let key = KEYS[rng.below(KEYS.len() as u64) as usize];
    let result = [R::Equal, R::NotEqual, R::Greater, R::Less][rng.below(4) as usize];
    let small = rng.below(6) as i64;
    let (target, union) = match rng.below(5) {
        0 => (T::Version, U::Version(small)),
        1 => (T::Create, U::CreateRevision(small)),
        2 => (T::Mod, U::ModRevision(small)),
        3 => (
            T::Value,
            U::Value(format!("v{}", rng.below(3)).into_bytes()),
        ),
        _ => (T::Lease, U::Lease(*leases.first().unwrap_or(&0))),
    };
    let mut c = cmp(key, target, result, union);
    if rng.below(4) == 0 {
        // Over every key under d/.
        c.key = b"d/".to_vec();
        c.range_end = b"d0".to_vec();
    }
    c
}

fn random_op(rng: &mut Rng, leases: &[i64], depth: u32) -> pb::RequestOp {
    let key = KEYS[rng.below(KEYS.len() as u64) as usize];
    match rng.below(if depth < 2 { 5 } else { 4 }) {
        0 => get(key, &[]),
        1 => get("d/", b"d0"),
        2 => {
            let lease = match rng.below(3) {
                0 => *leases
                    .get(rng.below(leases.len() as u64) as usize)
                    .unwrap_or(&0),
                _ => 0,
            };
            put(key, &format!("v{}", rng.below(3)), lease)
        }
        3 => op(request_op::Request::RequestDeleteRange(
            pb::DeleteRangeRequest {
                key: if rng.below(3) == 0 {
                    b"d/".to_vec()
                } else {
                    key.into()
                },
                range_end: if rng.below(3) == 0 {
                    b"d0".to_vec()
                } else {
                    Vec::new()
                },
            },
        )),
        _ => op(request_op::Request::RequestTxn(random_txn(
            rng,
            leases,
            depth + 1,
        ))),
    }
}

pub(crate) fn random_txn(rng: &mut Rng, leases: &[i64], depth: u32) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: (0..rng.below(3))
            .map(|_| random_compare(rng, leases))
            .collect(),
        success: (0..rng.below(4))
            .map(|_| random_op(rng, leases, depth))
            .collect(),
        failure: (0..rng.below(3))
            .map(|_| random_op(rng, leases, depth))
            .collect(),
    }
}

/// What two answers must agree on: headers (member and raft ids, and the revision of inner
/// answers, which etcd fills in and the in-memory one leaves out) are not compared.
pub(crate) fn normalized(mut r: pb::TxnResponse) -> pb::TxnResponse {
    r.header = None;
    for op in &mut r.responses {
        match &mut op.response {
            Some(response_op::Response::ResponseRange(g)) => g.header = None,
            Some(response_op::Response::ResponsePut(p)) => p.header = None,
            Some(response_op::Response::ResponseDeleteRange(d)) => d.header = None,
            Some(response_op::Response::ResponseTxn(t)) => *t = normalized(t.clone()),
            None => {}
        }
    }
    r
}

#[tokio::test]
async fn the_in_memory_etcd_answers_as_a_real_one() {
    let Some(etcd) = AuthEtcd::plain() else {
        return;
    };
    let options = ConnectOptions::new().with_timeout(Duration::from_secs(5));
    let mut real = Client::connect([&etcd.url], Some(options))
        .await
        .expect("client");
    let mut mem = MemEtcd::new();
    let mut leases = Vec::new();
    for _ in 0..2 {
        let granted = real.lease_grant(60, None).await.expect("lease");
        mem.lease_grant(60, granted.id());
        leases.push(granted.id());
    }
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (mut ops, mut writes, mut refused) = (0, 0, 0);
    for step in 0..STEPS {
        let req = random_txn(&mut rng, &leases, 0);
        let theirs = real.txn(Txn { req: req.clone() }).await;
        let ours = mem.txn(&req);
        let (theirs, ours) = match (theirs, ours) {
            (Ok(theirs), Ok(ours)) => (theirs, ours),
            (Err(e), Err(MemError::DuplicateKey)) if format!("{e:?}").contains("duplicate key") => {
                refused += 1;
                continue;
            }
            (theirs, ours) => panic!("step {step}: etcd {theirs:?}, in memory {ours:?}: {req:?}"),
        };
        let rev = theirs.header.as_ref().map_or(0, |h| h.revision);
        assert_eq!(rev, mem.revision(), "step {step}: revision after {req:?}");
        assert_eq!(normalized(theirs), normalized(ours), "step {step}: {req:?}");
        ops += count_ops(&req);
        writes += usize::from(rev > 1);
    }
    // Every event from the first revision on, as a watch of etcd delivers them.
    let want = mem.watch(b"d/", b"d0", 1).expect("history");
    let opts = WatchOptions::new().with_prefix().with_start_revision(1);
    let (_requests, mut stream) = real.watch("d/", Some(opts)).await.expect("watch").split();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < want.len() {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .expect("every event within the guard")
            .expect("watch")
            .expect("a message");
        got.extend(message.events.into_iter());
    }
    assert_eq!(got, want);
    eprintln!(
        "in-memory etcd: {STEPS} transactions ({ops} operations, {refused} refused for a duplicate \
         key, writes up to revision {}), {} watch events, as etcd answered them",
        mem.revision(),
        want.len()
    );
    let _ = writes;
}
