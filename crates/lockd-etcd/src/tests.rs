//! What lockd's etcd client puts on the wire, checked without an etcd: the ranges a prefix
//! gives, the transactions the builders make, the metadata every call carries.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::metadata::MetadataValue;

use super::auth::{token_refused, Metadata, REQUIRE_LEADER_KEY, TOKEN_KEY};
use super::connect::{endpoint, members};
use super::options::prefix_end;
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
        members(&none, &ConnectOptions::new()),
        Err(Error::InvalidArgs(_))
    ));
    assert!(matches!(
        members(&["http://bad host:1"], &ConnectOptions::new()),
        Err(Error::InvalidArgs(_))
    ));
    // No scheme: http:// is assumed, and nothing is sent until the first request.
    let one = members(&["127.0.0.1:1"], &ConnectOptions::new()).expect("one member");
    assert_eq!(one[0].0, "http://127.0.0.1:1");
    let client = Client::connect(["127.0.0.1:1"], None).await.expect("lazy");
    assert!(!client.routes(), "one endpoint: nothing to route");
    let client = Client::connect(["127.0.0.1:1", "127.0.0.1:2"], None)
        .await
        .expect("lazy");
    assert!(client.routes());
}

#[test]
fn tls_endpoints_and_what_debug_hides() {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
    let (cert, key) = (made.cert.pem(), made.key_pair.serialize_pem());
    let tls = ConnectOptions::new().with_tls(
        TlsOptions::new()
            .with_ca_pem(cert.clone())
            .with_identity_pem(cert.clone(), key),
    );
    // A key that is none is refused when the channel is made, not at the first request.
    let garbage = ConnectOptions::new().with_tls(
        TlsOptions::new()
            .with_ca_pem(cert.clone())
            .with_identity_pem(cert.clone(), "not a key"),
    );
    assert!(endpoint("127.0.0.1:2379", &garbage).is_err());
    // No scheme: https with TLS. An http:// endpoint with TLS, or https:// without, is refused.
    assert!(endpoint("127.0.0.1:2379", &tls).is_ok());
    assert!(endpoint("https://127.0.0.1:2379", &tls).is_ok());
    assert!(matches!(
        endpoint("http://127.0.0.1:2379", &tls),
        Err(Error::InvalidArgs(_))
    ));
    assert!(matches!(
        endpoint("https://127.0.0.1:2379", &ConnectOptions::new()),
        Err(Error::InvalidArgs(_))
    ));
    let shown = format!("{:?}", tls.with_user("lockd", "s3cret"));
    assert!(
        shown.contains("lockd") && !shown.contains("s3cret"),
        "{shown}"
    );
    assert!(!shown.contains("\"ca\""), "{shown}");
}

#[test]
fn a_refused_token_is_told_from_other_refusals() {
    use tonic::{Code, Status};
    assert!(token_refused(&Status::new(
        Code::Unauthenticated,
        "etcdserver: invalid auth token"
    )));
    assert!(token_refused(&Status::new(
        Code::InvalidArgument,
        "etcdserver: invalid auth token"
    )));
    assert!(!token_refused(&Status::new(
        Code::InvalidArgument,
        "etcdserver: authentication failed, invalid user ID or password"
    )));
    assert!(!token_refused(&Status::new(
        Code::Unavailable,
        "etcdserver: no leader"
    )));
}

/// One etcd member with authentication on (user `root`, password `pw`), when `etcd` and
/// `etcdctl` are on PATH. The rest of cluster mode's tests are in lockd's tests/cluster,
/// through lockd; this one needs the client itself.
pub(super) struct AuthEtcd {
    child: std::process::Child,
    dir: std::path::PathBuf,
    pub(super) url: String,
    peer: String,
}

impl AuthEtcd {
    fn start() -> Option<AuthEtcd> {
        let etcd = AuthEtcd::plain()?;
        for args in [
            &["role", "add", "root"][..],
            &["user", "add", "root", "--new-user-password=pw"][..],
            &["user", "grant-role", "root", "root"][..],
            &["auth", "enable"][..],
        ] {
            let ok = std::process::Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={}", etcd.url))
                .args(args)
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "etcdctl {args:?}");
        }
        Some(etcd)
    }

    /// One member of its own, fresh (revision 1), without authentication; `None` (a skip)
    /// when etcd is not installed and the run is not strict.
    pub(super) fn plain() -> Option<AuthEtcd> {
        let found = |p: &str| {
            std::env::var_os("PATH")
                .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
        };
        if !found("etcd") || !found("etcdctl") {
            assert!(
                std::env::var_os("LOCKD_TEST_STRICT").is_none(),
                "needs etcd and etcdctl (apt-get install etcd-server etcd-client)"
            );
            eprintln!("skipped: needs etcd and etcdctl (apt-get install etcd-server etcd-client)");
            return None;
        }
        let port = |_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port")
        };
        let (client, peer) = (port(0), port(1));
        let dir =
            std::env::temp_dir().join(format!("lockd-rpc-auth-{}-{client}", std::process::id()));
        let mut etcd = AuthEtcd {
            child: std::process::Command::new("true").spawn().expect("spawn"),
            dir,
            url: format!("http://127.0.0.1:{client}"),
            peer: format!("http://127.0.0.1:{peer}"),
        };
        etcd.run();
        Some(etcd)
    }

    /// Starts the member (again, on the same data), and waits until it answers.
    fn run(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = std::process::Command::new("etcd")
            .args(["--name", "m", "--data-dir"])
            .arg(&self.dir)
            .args([
                "--listen-client-urls",
                &self.url,
                "--advertise-client-urls",
                &self.url,
            ])
            .args(["--listen-peer-urls", &self.peer])
            .args(["--initial-advertise-peer-urls", &self.peer])
            .arg(format!("--initial-cluster=m={}", self.peer))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn etcd");
        let addr = self.url.trim_start_matches("http://").to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(std::time::Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for AuthEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn a_user_gets_a_token_and_a_new_one_when_etcd_forgets_it() {
    let Some(mut etcd) = AuthEtcd::start() else {
        return;
    };
    let options = || {
        ConnectOptions::new()
            .with_timeout(Duration::from_secs(5))
            .with_require_leader(true)
    };
    // Without the user, etcd refuses; with a wrong password, connect fails.
    let mut anonymous = Client::connect([&etcd.url], Some(options()))
        .await
        .expect("client");
    assert!(anonymous.get("k", None).await.is_err());
    assert!(
        Client::connect([&etcd.url], Some(options().with_user("root", "wrong")))
            .await
            .is_err()
    );
    let mut client = Client::connect([&etcd.url], Some(options().with_user("root", "pw")))
        .await
        .expect("authenticated");
    let put = Txn::new().and_then([TxnOp::put("k", "v", None)]);
    assert!(client.txn(put).await.expect("txn").succeeded());
    // A restarted member forgets its simple tokens: the next call is refused for its token,
    // and the client authenticates again and sends it once more.
    etcd.run();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let got = loop {
        match client.get("k", None).await {
            Ok(got) => break got,
            Err(Error::GRpcStatus(s)) if token_refused(&s) => {
                panic!("the token was not renewed: {s:?}")
            }
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "{e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(got.kvs()[0].value(), b"v");
}
