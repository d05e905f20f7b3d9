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
    let txn = put(&key);
    let footprint = Footprint::of(&txn);
    spawn_txn(commit, txn, footprint, false)
}

/// Sends `txn` (of `footprint`; `hold`: it may wait for company) through `commit` on its own
/// task; its answer's success.
fn spawn_txn(
    commit: &std::sync::Arc<GroupCommit>,
    txn: Txn,
    footprint: Footprint,
    hold: bool,
) -> tokio::task::JoinHandle<bool> {
    let commit = std::sync::Arc::clone(commit);
    tokio::spawn(async move { commit.txn(txn, footprint, 0, hold).await.is_ok() })
}

fn start(net: &Net, join_wait: Duration) -> std::sync::Arc<GroupCommit> {
    let waits = (Duration::from_millis(10), join_wait);
    std::sync::Arc::new(GroupCommit::start(
        Client::simulated(net.link(0)),
        64,
        waits,
    ))
}

/// A join that may hold waits `--etcd-join-wait` at most for a request to go before it, and
/// then they go as one transaction (one revision), the other first; with nobody coming, it
/// goes alone once the wait is over.
#[tokio::test(start_paused = true)]
async fn a_held_join_waits_for_company_the_join_wait_at_most() {
    let net = net();
    let commit = start(&net, Duration::from_millis(2));
    // The join reads the key the release writes: in one batch it must go second.
    let join = Txn::new().and_then([TxnOp::put("/k/join", "v", None), TxnOp::get("/k/rel", None)]);
    let joins = |txn: &Txn| Footprint::of(txn).last();
    let held = spawn_txn(&commit, join.clone(), joins(&join), true);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let release = spawn_put(&commit, "/k/rel".into());
    assert!(held.await.expect("the join's task") && release.await.expect("the release's task"));
    let (_, keys) = net.keys("/k/");
    let revs: Vec<i64> = keys.iter().map(|(_, rev)| *rev).collect();
    assert_eq!(revs.len(), 2);
    assert_eq!(revs[0], revs[1], "one transaction: {keys:?}");

    let alone = Txn::new().and_then([TxnOp::put("/k/alone", "v", None)]);
    let start_at = Instant::now();
    let held = spawn_txn(&commit, alone.clone(), joins(&alone), true);
    assert!(held.await.expect("the join's task"));
    let waited = start_at.elapsed();
    assert!(
        waited >= Duration::from_millis(2) && waited < Duration::from_secs(1),
        "{waited:?}"
    );
    // One that may not hold goes at once.
    let start_at = Instant::now();
    assert!(spawn_put(&commit, "/k/now".into())
        .await
        .expect("the put's task"));
    assert!(start_at.elapsed() < Duration::from_millis(2));
}

/// An etcd whose `--max-txn-ops` is below its default refuses a large batch: its requests are
/// sent again in smaller ones and every one is applied, none refused to its caller.
#[tokio::test(start_paused = true)]
async fn a_batch_refused_as_too_many_operations_goes_again_in_smaller_ones() {
    let net = net();
    net.max_txn_ops(8);
    let commit = start(&net, Duration::ZERO);
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
    let commit = start(&net, Duration::ZERO);
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
