//! The shortest lease is 1ms: a LOCK or RENEW that asks for less is refused with ERR BADARG
//! and changes nothing, instead of answering OK for a lease that has already ended; and lockd
//! refuses to start with a default or maximum ttl below it.

use crate::common;

use common::{field, status_shape, Lockd};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_under_a_millisecond_is_refused() {
    let server = Lockd::new().serve().await;
    let mut c = server.raw().await;
    for ttl in ["1ns", "999us", "999999ns", "0.0009", "0.0001s"] {
        let reply = c.req(&format!("LOCK x me ttl={ttl}")).await;
        assert!(reply.starts_with("ERR BADARG "), "ttl={ttl}: {reply}");
        assert!(reply.contains("at least 1ms"), "ttl={ttl}: {reply}");
        assert_eq!(c.req("STATUS x").await, "OK x free", "ttl={ttl}");
    }

    // Exactly the minimum is a lease; so is the minimum in plain seconds.
    let t = c.lock("m me ttl=1ms").await;
    assert!(t > 0);
    let t = c.lock("s me ttl=0.001").await;
    assert!(t > 0);

    // RENEW: refused, and the lease is as it was.
    let t = c.lock("r me ttl=30s").await;
    for ttl in ["1ns", "500us"] {
        let reply = c.req(&format!("RENEW r {t} ttl={ttl}")).await;
        assert!(reply.starts_with("ERR BADARG "), "ttl={ttl}: {reply}");
        let status = c.req("STATUS r").await;
        assert_eq!(
            status_shape(&status),
            format!("OK r held id=me token={t} ttl_ms=* session=0 waiters=0")
        );
        let left: u64 = field(&status, "ttl_ms").unwrap().parse().unwrap();
        assert!(
            left > 20_000,
            "the refused RENEW shortened the lease: {status}"
        );
    }
    let renewed = c.req(&format!("RENEW r {t} ttl=1ms")).await;
    assert!(renewed.starts_with("OK ttl_ms="), "{renewed}");
    server.shutdown().await;
}

#[test]
fn lockd_refuses_a_default_or_maximum_ttl_under_a_millisecond() {
    for args in [
        ["--default-ttl", "1ns"],
        ["--default-ttl", "999us"],
        ["--max-ttl", "500us"],
    ] {
        let out = Lockd::new()
            .args(args)
            .command()
            .output()
            .expect("run lockd");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("at least 1ms"), "{args:?}: {stderr}");
    }
}
