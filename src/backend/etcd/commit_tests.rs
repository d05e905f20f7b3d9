//! Group commit's batcher over a simulated etcd, on tokio's paused clock.

use std::time::Duration;

use tokio::time::Instant;

use super::commit::GroupCommit;
use super::rpc::batch::Footprint;
use super::rpc::sim::{Faults, Net};
use super::rpc::{Client, Txn, TxnOp};

/// A network that answers at once, without faults.
fn net() -> Net {
    let faults = Faults {
        delay: Duration::ZERO,
        slow_per_mille: 0,
        fail_per_mille: 0,
        lose_per_mille: 0,
        ..Faults::default()
    };
    Net::new(1, faults, Duration::from_secs(2))
}

fn put(key: &str) -> Txn {
    Txn::new().and_then([TxnOp::put(key, "v", None)])
}

/// Sends a put of `key` through `commit` on its own task; its answer's success.
fn spawn_put(commit: &std::sync::Arc<GroupCommit>, key: String) -> tokio::task::JoinHandle<bool> {
    let commit = std::sync::Arc::clone(commit);
    tokio::spawn(async move {
        let txn = put(&key);
        let footprint = Footprint::of(&txn);
        commit.txn(txn, footprint, 0).await.is_ok()
    })
}

/// An etcd whose `--max-txn-ops` is below its default refuses a large batch: its requests are
/// sent again in smaller ones and every one is applied, none refused to its caller.
#[tokio::test(start_paused = true)]
async fn a_batch_refused_as_too_many_operations_goes_again_in_smaller_ones() {
    let net = net();
    net.max_txn_ops(8);
    let commit = std::sync::Arc::new(GroupCommit::start(
        Client::simulated(net.link(0)),
        64,
        Duration::from_millis(10),
    ));
    let puts: Vec<_> = (0..40)
        .map(|i| spawn_put(&commit, format!("/k/{i}")))
        .collect();
    for put in puts {
        assert!(put.await.expect("the put's task"), "every put applied");
    }
    let (_, keys) = net.keys("/k/");
    assert_eq!(keys.len(), 40);
}

/// A request that comes while another's answer is late waits for it `--etcd-batch-wait` at
/// most: then it goes on its own.
#[tokio::test(start_paused = true)]
async fn a_late_answer_holds_up_the_next_request_the_batch_wait_at_most() {
    let net = net();
    let commit = std::sync::Arc::new(GroupCommit::start(
        Client::simulated(net.link(0)),
        64,
        Duration::from_millis(10),
    ));
    // Cut off: the first request goes unanswered until its request timeout (2 s).
    net.cut(0, true);
    let stuck = spawn_put(&commit, "/k/stuck".into());
    tokio::time::sleep(Duration::from_millis(1)).await;
    net.cut(0, false);
    let start = Instant::now();
    let next = spawn_put(&commit, "/k/next".into());
    assert!(next.await.expect("the put's task"), "applied");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "answered after {:?}, not after the stuck one's timeout",
        start.elapsed()
    );
    assert!(
        !stuck.await.expect("the put's task"),
        "the stuck one timed out"
    );
}
