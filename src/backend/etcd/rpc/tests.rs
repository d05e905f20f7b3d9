//! What lockd's etcd client puts on the wire, checked without an etcd: the ranges a prefix
//! gives, the transactions the builders make, the metadata every call carries.

use super::*;

#[test]
fn prefix_end_follows_etcd() {
    assert_eq!(prefix_end(b"/lockd/"), b"/lockd0".to_vec());
    assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    assert_eq!(prefix_end(b""), vec![0]);
}

#[test]
fn a_prefix_compare_covers_the_range() {
    let c = Compare::version("/x/w/", CompareOp::Equal, 0).with_prefix();
    assert_eq!(c.0.key, b"/x/w/".to_vec());
    assert_eq!(c.0.range_end, b"/x/w0".to_vec());
    assert_eq!(c.0.result, pb::compare::CompareResult::Equal as i32);
    assert_eq!(c.0.target, pb::compare::CompareTarget::Version as i32);
    assert_eq!(c.0.target_union, Some(pb::compare::TargetUnion::Version(0)));
    let c = Compare::create_revision("k", CompareOp::Greater, 7);
    assert!(c.0.range_end.is_empty());
    assert_eq!(c.0.target, pb::compare::CompareTarget::Create as i32);
    assert_eq!(
        c.0.target_union,
        Some(pb::compare::TargetUnion::CreateRevision(7))
    );
}

#[test]
fn a_txn_keeps_its_branches_and_nests() {
    let inner = Txn::new()
        .when([Compare::mod_revision("a", CompareOp::Equal, 3)])
        .and_then([TxnOp::delete("a", None)]);
    let txn = Txn::new()
        .when(vec![Compare::version("k", CompareOp::Equal, 0)])
        .and_then([TxnOp::put("k", "v", Some(PutOptions::new().with_lease(42)))])
        .or_else([
            TxnOp::get("p/", Some(GetOptions::new().with_prefix())),
            TxnOp::txn(inner),
        ]);
    let req = txn.req;
    assert_eq!(req.compare.len(), 1);
    use pb::request_op::Request as R;
    match &req.success[..] {
        [pb::RequestOp {
            request: Some(R::RequestPut(put)),
        }] => {
            assert_eq!(
                (&put.key[..], &put.value[..], put.lease),
                (&b"k"[..], &b"v"[..], 42)
            );
        }
        other => panic!("{other:?}"),
    }
    match &req.failure[..] {
        [pb::RequestOp {
            request: Some(R::RequestRange(get)),
        }, pb::RequestOp {
            request: Some(R::RequestTxn(nested)),
        }] => {
            assert_eq!(get.range_end, b"p0".to_vec());
            assert_eq!(nested.compare.len(), 1);
            assert_eq!(nested.success.len(), 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn op_responses_name_each_answer() {
    use pb::response_op::Response as R;
    let nested = TxnResponse {
        succeeded: true,
        ..Default::default()
    };
    let resp = TxnResponse {
        header: Some(ResponseHeader {
            revision: 9,
            ..Default::default()
        }),
        succeeded: false,
        responses: vec![
            pb::ResponseOp {
                response: Some(R::ResponseRange(GetResponse {
                    kvs: vec![KeyValue {
                        key: b"k".to_vec(),
                        create_revision: 4,
                        ..Default::default()
                    }],
                    ..Default::default()
                })),
            },
            pb::ResponseOp {
                response: Some(R::ResponseTxn(nested)),
            },
        ],
    };
    assert_eq!(resp.header().map(|h| h.revision()), Some(9));
    let ops = resp.op_responses();
    assert!(matches!(ops[0], TxnOpResponse::Get(g) if g.kvs()[0].create_revision() == 4));
    assert!(matches!(ops[1], TxnOpResponse::Txn(t) if t.succeeded()));
}

#[test]
fn a_watch_of_a_prefix_from_a_revision() {
    let req = WatchOptions::new()
        .with_prefix()
        .with_start_revision(12)
        .request(b"/x/".to_vec());
    assert_eq!(req.range_end, b"/x0".to_vec());
    assert_eq!(req.start_revision, 12);
}

#[test]
fn every_call_says_it_needs_a_leader_and_carries_the_token() {
    use tonic::service::Interceptor as _;
    let token = Arc::new(RwLock::new(None));
    let mut metadata = Metadata {
        require_leader: true,
        token: Arc::clone(&token),
    };
    let req = metadata.call(tonic::Request::new(())).expect("call");
    assert_eq!(
        req.metadata()
            .get(REQUIRE_LEADER_KEY)
            .map(|v| v.to_str().ok()),
        Some(Some("true"))
    );
    assert!(req.metadata().get(TOKEN_KEY).is_none());
    *token.write().expect("lock") = Some(MetadataValue::from_static("abc.1"));
    let req = metadata.call(tonic::Request::new(())).expect("call");
    assert_eq!(
        req.metadata().get(TOKEN_KEY).map(|v| v.to_str().ok()),
        Some(Some("abc.1"))
    );
    let mut without = Metadata {
        require_leader: false,
        token: Arc::default(),
    };
    let req = without.call(tonic::Request::new(())).expect("call");
    assert!(req.metadata().get(REQUIRE_LEADER_KEY).is_none());
}

#[tokio::test]
async fn connect_needs_an_endpoint_and_a_url() {
    let none: [&str; 0] = [];
    assert!(matches!(
        connect(&none, &ConnectOptions::new()),
        Err(Error::InvalidArgs(_))
    ));
    assert!(matches!(
        connect(&["http://bad host:1"], &ConnectOptions::new()),
        Err(Error::InvalidArgs(_))
    ));
    // No scheme: http:// is assumed, and nothing is sent until the first request.
    assert!(connect(&["127.0.0.1:1"], &ConnectOptions::new()).is_ok());
}
