//! A front-end's waiter and holder keys are used again (`src/backend/etcd/slots.rs`): on a
//! busy name it makes as many key slots as it had requests at once, not one per request,
//! and every slot is free again once the name is.
#![cfg(feature = "etcd")]

use super::basics::etcd;
use crate::common;
use crate::common::needs::{have, Need};

use std::net::SocketAddr;
use std::time::Duration;

use common::blocking::eventually;
use common::etcd::{http_get, LockdFrontEnd};
use common::line::Line;
use common::{free_port, token, tokens};

const PATIENCE: Duration = Duration::from_secs(30);

/// `lockd_etcd_key_slots{state}` as `metrics` serves it.
fn slots(metrics: SocketAddr, state: &str) -> u64 {
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{body}");
    let sample = format!("lockd_etcd_key_slots{{state=\"{state}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&sample))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {sample} in\n{body}"))
}

#[test]
fn a_busy_name_uses_its_keys_again_and_frees_them_all() {
    if !have(Need::Etcd) {
        return;
    }
    const CLIENTS: usize = 4;
    const CYCLES: usize = 30;
    let prefix = format!("{}slots/", etcd().prefix());
    let metrics: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    let fes: Vec<LockdFrontEnd> = metrics
        .iter()
        .map(|m| LockdFrontEnd::start(etcd(), &prefix, &["--metrics-listen", &m.to_string()]))
        .collect();
    // Clients on both front-ends take one name in turn, most of them after a wait, and a
    // set with it now and then.
    let workers: Vec<_> = (0..2 * CLIENTS)
        .map(|i| {
            let addr = fes[i % 2].addr();
            std::thread::spawn(move || {
                let mut c = Line::connect(addr);
                for n in 0..CYCLES {
                    if n % 10 == 9 {
                        let reply = c.req(&format!("LOCK busy c{i} and=other-{i} ttl=30s"));
                        let t = tokens(&reply)[0];
                        assert_eq!(c.req(&format!("UNLOCK busy {t}")), "OK");
                    } else {
                        let t = token(&c.req(&format!("LOCK busy c{i} ttl=30s")));
                        assert_eq!(c.req(&format!("UNLOCK busy {t}")), "OK");
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a client");
    }
    for m in &metrics {
        // A request's slot is free once its front-end saw its last key go; a client that
        // asks again before that takes another, so a few more than it had at once.
        let made = slots(*m, "made");
        assert!(
            made <= 3 * CLIENTS as u64,
            "{made} slots made for {CLIENTS} clients' {CYCLES} requests each"
        );
        eventually(PATIENCE, "every slot free", || slots(*m, "taken") == 0);
    }
    // And what the front-ends know is what etcd has: the name is free.
    let mut c = Line::connect(fes[1].addr());
    let t = token(&c.req("LOCK busy last wait=0"));
    assert_eq!(c.req(&format!("UNLOCK busy {t}")), "OK");
}

/// What etcd holds at `key` (`None`: nothing).
fn value_at(key: &str) -> Option<String> {
    let out = etcd()
        .etcdctl(&["get", key, "--print-value-only"], None)
        .expect("etcdctl get");
    let value = out.trim_end_matches('\n');
    (!value.is_empty()).then(|| value.to_owned())
}

/// A key in a slot the front-end thinks free (here one it can't read, put there by hand)
/// fails the write that would have put a request's key there: the key is never overwritten,
/// and the request takes another slot, at once or after a wait.
#[test]
fn a_key_in_a_slot_thought_free_is_never_overwritten() {
    if !have(Need::Etcd) {
        return;
    }
    let prefix = format!("{}slot-taken/", etcd().prefix());
    let fe = LockdFrontEnd::start(etcd(), &prefix, &[]);
    let t1 = token(&fe.request("LOCK x a"));
    assert_eq!(fe.request(&format!("UNLOCK x {t1}")), "OK");
    let listed = etcd()
        .etcdctl(
            &["get", "--prefix", &format!("{prefix}fe/"), "--keys-only"],
            None,
        )
        .expect("etcdctl get");
    let id = listed
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{prefix}fe/")))
        .expect("the front-end's key")
        .to_owned();
    // Its first grant's slot (1) is free again once the watch shows the release; the next
    // grant at once takes it, the wait after it the next free one (3: the grant takes 2).
    let holder_key = format!("{prefix}h/x/{id}.1");
    let waiter_key = format!("{prefix}q/x/{id}.3");
    let stray = "not a record of lockd's";
    eventually(PATIENCE, "the release seen", || {
        fe.request("STATUS x") == "OK x free"
    });
    etcd()
        .etcdctl(&["put", &holder_key, stray], None)
        .expect("etcdctl put");
    let t2 = token(&fe.request("LOCK x b"));
    assert!(t2 > t1, "{t2} after {t1}");
    assert_eq!(value_at(&holder_key).as_deref(), Some(stray));
    etcd()
        .etcdctl(&["put", &waiter_key, stray], None)
        .expect("etcdctl put");
    let mut c = Line::connect(fe.addr());
    c.send("LOCK x c");
    eventually(PATIENCE, "c waits", || {
        fe.request("STATUS x").contains("waiters=1")
    });
    assert_eq!(value_at(&waiter_key).as_deref(), Some(stray));
    // (A stray key in the queue, older than c's, would stand ahead of it for ever.)
    etcd()
        .etcdctl(&["del", &waiter_key], None)
        .expect("etcdctl del");
    assert_eq!(fe.request(&format!("UNLOCK x {t2}")), "OK");
    let t3 = token(&c.line());
    assert!(t3 > t2, "{t3} after {t2}");
    assert_eq!(c.req(&format!("UNLOCK x {t3}")), "OK");
    assert_eq!(value_at(&holder_key).as_deref(), Some(stray));
}
