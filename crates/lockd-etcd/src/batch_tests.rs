//! Group commit's batches: requests that share one keep to what each would have done alone.

use super::*;
use crate::mem::tests::{normalized, random_txn, Rng};
use crate::mem::MemEtcd;
use crate::{Compare, CompareOp, PutOptions};

fn keys(m: &MemEtcd) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    let all = pb::RangeRequest {
        key: vec![0],
        range_end: vec![0],
        count_only: false,
    };
    m.range(&all)
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.lease))
        .collect()
}

/// The property group commit rests on: a batch of requests that [`Batch::fits`] took gives
/// each request the answer it would have had going alone right after those before it, and
/// leaves the store as they would have one after the other, on random nested transactions
/// over shared keys. (Revisions aside: a batch's writes share one, where one after the other
/// each writing request has its own.)
#[test]
fn a_batch_answers_each_request_as_if_it_went_alone() {
    let mut rng = Rng(0x0bad_5eed_0000_0042);
    let mut store = MemEtcd::new();
    let limits = BatchLimits::default();
    let (mut batched, mut left_out, mut biggest) = (0, 0, 0);
    for round in 0..3000 {
        let mut batch = Batch::new();
        let mut members = Vec::new();
        for _ in 0..1 + rng.below(8) {
            let txn = Txn {
                req: random_txn(&mut rng, &[], 0),
            };
            // A request etcd refuses alone (a key written twice) is never sent by lockd.
            if store.clone().txn(&txn.req).is_err() {
                continue;
            }
            let footprint = Footprint::of(&txn);
            if batch.fits(&txn, &footprint, &limits) {
                batch.push(txn.clone(), footprint);
                members.push(txn);
            } else {
                left_out += 1;
            }
        }
        if members.is_empty() {
            continue;
        }
        batched += members.len();
        biggest = biggest.max(members.len());
        let mut together = store.clone();
        let answer = together
            .txn(&batch.txn().req)
            .unwrap_or_else(|e| panic!("round {round}: the batch was refused: {e:?}"));
        let answers = split(answer, members.len()).expect("one answer per request");
        let mut forward = store.clone();
        let alone: Vec<_> = members
            .iter()
            .map(|t| forward.txn(&t.req).expect("alone"))
            .collect();
        let batch_rev = together.revision();
        let at_batch = |r| one_revision(normalized(r), batch_rev);
        for (i, (got, want)) in answers.into_iter().zip(alone).enumerate() {
            assert!(
                got.header.is_some(),
                "round {round}: each answer has the header"
            );
            assert_eq!(
                at_batch(got),
                at_batch(want),
                "round {round}: request {i} of {}",
                members.len()
            );
        }
        assert_eq!(keys(&together), keys(&forward), "round {round}: the store");
        store = together;
    }
    assert!(
        batched > 3000 && biggest > 3 && left_out > 100,
        "{batched} {biggest} {left_out}"
    );
}

/// `r` with every revision the batch's writes made (at `rev` together, from `rev` on one
/// after the other) as `rev`.
fn one_revision(mut r: pb::TxnResponse, rev: i64) -> pb::TxnResponse {
    for op in &mut r.responses {
        match &mut op.response {
            Some(response_op::Response::ResponseRange(g)) => {
                for kv in &mut g.kvs {
                    kv.create_revision = kv.create_revision.min(rev);
                    kv.mod_revision = kv.mod_revision.min(rev);
                }
            }
            Some(response_op::Response::ResponseTxn(t)) => *t = one_revision(t.clone(), rev),
            _ => {}
        }
    }
    r
}

#[test]
fn spans_overlap_as_etcd_ranges_do() {
    let key = |k: &str| Span::of(k.as_bytes(), &[]);
    let range = |k: &str, e: &str| Span::of(k.as_bytes(), e.as_bytes());
    let from = |k: &str| Span::of(k.as_bytes(), &[0]);
    assert!(key("a").overlaps(&key("a")));
    assert!(!key("a").overlaps(&key("a\0")), "the next key is another");
    assert!(!key("a").overlaps(&key("ab")));
    assert!(range("h/x/", "h/x0").overlaps(&key("h/x/1")));
    assert!(!range("h/x/", "h/x0").overlaps(&key("h/y/1")));
    assert!(
        !range("h/x/", "h/x0").overlaps(&key("h/x0")),
        "the end is not in it"
    );
    assert!(from("m").overlaps(&key("z")));
    assert!(!from("m").overlaps(&key("l")));
    assert!(from("m").overlaps(&from("a")));
}

#[test]
fn a_write_goes_after_what_compares_or_reads_its_key_and_reads_share() {
    let put = |k: &str| Txn::new().and_then([TxnOp::put(k, "v", None)]);
    let guarded = |k: &str, w: &str| {
        Txn::new()
            .when([Compare::version(k, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(w, "v", None)])
    };
    let get = |k: &str| Txn::new().and_then([TxnOp::get(k, None)]);
    let fp = Footprint::of;
    assert!(fp(&put("a")).conflicts(&fp(&put("a"))));
    assert!(!fp(&put("a")).conflicts(&fp(&put("b"))));
    // A compare is made before the batch: never after a write of its key, but a write of it
    // may come after.
    assert!(
        !fp(&guarded("a", "b")).may_follow(&fp(&put("a"))),
        "a compare"
    );
    assert!(fp(&put("a")).may_follow(&fp(&guarded("a", "b"))));
    // A read sees the writes before it: it may follow a write, a write may not follow it.
    assert!(fp(&get("a")).may_follow(&fp(&put("a"))));
    assert!(!fp(&put("a")).may_follow(&fp(&get("a"))));
    assert!(!fp(&get("a")).conflicts(&fp(&get("a"))), "reads share");
    assert!(!fp(&guarded("a", "b")).conflicts(&fp(&guarded("a", "c"))));
    let compared = |k: &str| fp(&put(k)).also_compares("queue");
    assert!(!compared("a").may_follow(&fp(&put("b")).also_writes("queue")));
    assert!(fp(&put("b"))
        .also_writes("queue")
        .may_follow(&compared("a")));
    let nested = Txn::new().and_then([TxnOp::txn(put("n"))]);
    assert!(fp(&nested).conflicts(&fp(&put("n"))), "nested writes count");
    assert!(!fp(&put("a")).is_last() && fp(&put("a")).last().is_last());
    let marked = |k: &str| fp(&put(k)).also_writes("token");
    assert!(
        marked("a").conflicts(&marked("b")),
        "a key of the caller's own"
    );
    let leased = Txn::new().and_then([TxnOp::put("a", "v", Some(PutOptions::new().with_lease(7)))]);
    assert_eq!(fp(&leased).leases(), &[7]);
}

#[test]
fn a_batch_stays_within_etcd_s_bound_on_operations() {
    let wide = |i: usize| {
        Txn::new()
            .when([Compare::version(format!("c{i}"), CompareOp::Equal, 0)])
            .and_then(
                (0..3)
                    .map(|j| TxnOp::put(format!("k{i}/{j}"), "v", None))
                    .collect::<Vec<_>>(),
            )
    };
    let limits = BatchLimits {
        requests: 1000,
        bytes: 1 << 30,
        ..BatchLimits::default()
    };
    let mut batch = Batch::new();
    let mut i = 0;
    while batch.fits(&wide(i), &Footprint::of(&wide(i)), &limits) {
        batch.push(wide(i), Footprint::of(&wide(i)));
        i += 1;
    }
    assert_eq!(batch.len(), MAX_TXN_OPS / 3, "three operations each");
    assert!(MemEtcd::new().txn(&batch.txn().req).is_ok());
    let one = Batch::new();
    assert!(
        one.fits(
            &wide(0),
            &Footprint::of(&wide(0)),
            &BatchLimits {
                requests: 0,
                ops: 0,
                bytes: 0
            }
        ),
        "one request always goes"
    );
    assert!(split(MemEtcd::new().txn(&wide(0).req).unwrap(), 2).is_none());
}

/// etcd takes the largest batches [`Batch::fits`] makes, of requests shaped as lockd's
/// (guarded writes with a read on the other branch), and answers each as split expects.
#[tokio::test]
async fn etcd_takes_the_largest_batches() {
    let Some(etcd) = crate::tests::AuthEtcd::plain() else {
        return;
    };
    let options = crate::ConnectOptions::new().with_timeout(std::time::Duration::from_secs(5));
    let mut real = crate::Client::connect([&etcd.url], Some(options))
        .await
        .expect("client");
    let request = |i: usize, width: usize| {
        Txn::new()
            .when([
                Compare::version(format!("h/{i}/0"), CompareOp::Equal, 0),
                Compare::create_revision(format!("h/{i}/"), CompareOp::Less, 1_000_000)
                    .with_prefix(),
            ])
            .and_then(
                (0..width)
                    .map(|j| TxnOp::put(format!("h/{i}/{j}"), "v", None))
                    .collect::<Vec<_>>(),
            )
            .or_else([TxnOp::get(
                format!("h/{i}/"),
                Some(crate::GetOptions::new().with_prefix()),
            )])
    };
    for width in [1, 2, 3, 6] {
        let limits = BatchLimits {
            requests: 1000,
            bytes: 1 << 20,
            ..BatchLimits::default()
        };
        let mut batch = Batch::new();
        let mut i = 0;
        while batch.fits(
            &request(i, width),
            &Footprint::of(&request(i, width)),
            &limits,
        ) {
            batch.push(request(i, width), Footprint::of(&request(i, width)));
            i += 1;
        }
        let answer = real
            .txn(batch.txn())
            .await
            .unwrap_or_else(|e| panic!("a batch of {i} requests of width {width}: {e:?}"));
        let answers = split(answer, i).expect("one answer per request");
        assert!(answers.iter().all(|a| a.succeeded), "width {width}");
        // Every key again: the second time each request's comparison fails, and reads.
        let again = real.txn(batch.txn()).await.expect("again");
        let answers = split(again, i).expect("one answer per request");
        assert!(answers
            .iter()
            .all(|a| !a.succeeded && a.responses.len() == 1));
        eprintln!("etcd took a batch of {i} requests of {width} writes each");
        let mut wipe = pb::TxnRequest::default();
        wipe.success.push(pb::RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                pb::DeleteRangeRequest {
                    key: b"h/".to_vec(),
                    range_end: b"h0".to_vec(),
                },
            )),
        });
        real.txn(Txn { req: wipe }).await.expect("wipe");
    }
}

#[test]
fn a_request_that_only_creates_keys_guarded_as_absent() {
    let absent = |k: &str| Compare::version(k, CompareOp::Equal, 0);
    let create = |k: &str| {
        Txn::new()
            .when([absent(k)])
            .and_then([TxnOp::put(k, "v", None), TxnOp::get("other", None)])
    };
    assert!(creates_only(&create("a")));
    // Guarded by a transaction around it.
    let around = Txn::new().when([absent("a")]).and_then([TxnOp::txn(
        Txn::new().and_then([TxnOp::put("a", "v", None)]),
    )]);
    assert!(creates_only(&around));
    let plain = Txn::new().and_then([TxnOp::put("a", "v", None)]);
    assert!(!creates_only(&plain));
    let other_key = Txn::new()
        .when([absent("b")])
        .and_then([TxnOp::put("a", "v", None)]);
    assert!(!creates_only(&other_key));
    let else_branch = Txn::new()
        .when([absent("a")])
        .or_else([TxnOp::put("a", "v", None)]);
    assert!(!creates_only(&else_branch), "the compare failed there");
    let deletes = Txn::new()
        .when([absent("a")])
        .and_then([TxnOp::put("a", "v", None), TxnOp::delete("c", None)]);
    assert!(!creates_only(&deletes));
    let existing = Txn::new()
        .when([Compare::version("a", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("a", "v", None)]);
    assert!(!creates_only(&existing));
}
