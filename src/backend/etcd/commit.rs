//! Group commit: while a front-end's transactions are in flight, the ones that come meanwhile
//! (any clients, any names) wait, and then go to etcd together, as few transactions as can
//! carry them (`lockd_etcd::batch`: each request a nested transaction with its own guards,
//! kept apart from any request it shares a key with). A lone request goes at once. etcd's
//! cost is per transaction far more than per operation, so under load a front-end sends
//! fewer, larger transactions instead of queueing many small ones inside etcd.
//!
//! A request waits for the round in flight at most `--etcd-batch-wait`: past it, what waits
//! goes as the next round beside the one in flight, so one slow or lost answer holds the
//! others up that long, not for the request timeout. A batch etcd refuses for its count of
//! operations (an etcd whose `--max-txn-ops` is below its default) is sent again in halves,
//! and batches stay at most half that size from then on.
//!
//! What a batch shares is its fate: it is applied whole or not at all, and its answer is lost
//! or late for all of its requests at once; each request's caller sees exactly what it would
//! see had its own transaction met that fault. A request whose puts name an etcd lease other
//! than this front-end's own (a BREAK rewriting another front-end's keys in place) goes alone:
//! that lease may be gone, and etcd would fail the whole batch for it.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::rpc::batch::{self, Batch, BatchLimits, Footprint};
use super::rpc::{self, Client, Txn};

/// Requests waiting for the batcher at most (a caller past it waits for room).
const QUEUE: usize = 4096;

type Answer = Result<rpc::TxnResponse, rpc::Error>;

/// One request: its transaction, what it touches, and where its answer goes.
struct Request {
    txn: Txn,
    footprint: Footprint,
    /// Goes in a batch of its own.
    alone: bool,
    /// May wait `join_wait` for company while nothing else goes (a join behind a holder of
    /// this front-end, whose release is likely to come: `requests.rs`).
    hold: bool,
    /// When it came to the batcher.
    came: Instant,
    answer: oneshot::Sender<Answer>,
}

/// The way in to the batcher of one front-end, or straight to etcd with batches of one.
pub(super) struct GroupCommit(Way);

enum Way {
    Batches(mpsc::Sender<Request>),
    Alone(Client),
}

impl GroupCommit {
    /// Starts the batcher over `client`: requests in batches of at most `limit` (1: each
    /// alone, as without group commit), each waiting at most `wait` for the batches in
    /// flight, and one that may hold ([`GroupCommit::txn`]) `join_wait` at most for company
    /// (`waits`: both). It ends once this is dropped and its last batch is answered.
    pub(super) fn start(client: Client, limit: usize, waits: (Duration, Duration)) -> GroupCommit {
        if limit <= 1 {
            return GroupCommit(Way::Alone(client));
        }
        let (requests, queue) = mpsc::channel(QUEUE);
        let limits = BatchLimits {
            requests: limit.max(1),
            ..BatchLimits::default()
        };
        tokio::spawn(batcher(client, queue, limits, waits));
        GroupCommit(Way::Batches(requests))
    }

    /// Sends `txn` (of footprint `footprint`) with the next batch; `lease`: this
    /// front-end's etcd lease (a request whose puts name another goes alone); `hold`: it may
    /// wait for company while nothing else goes.
    pub(super) async fn txn(
        &self,
        txn: Txn,
        footprint: Footprint,
        lease: i64,
        hold: bool,
    ) -> Answer {
        let requests = match &self.0 {
            Way::Batches(requests) => requests,
            Way::Alone(client) => return client.clone().txn(txn).await,
        };
        let alone = footprint.leases().iter().any(|l| *l != lease);
        let (answer, answered) = oneshot::channel();
        let request = Request {
            txn,
            footprint,
            alone,
            hold,
            came: Instant::now(),
            answer,
        };
        if requests.send(request).await.is_err() {
            return Err(stopped());
        }
        answered.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// The batcher: the requests queued while nothing is in flight go at once, as batches; those
/// that come meanwhile wait until every batch in flight is answered, or `wait` since the last
/// were sent. Requests that may hold (joins behind a holder of this front-end), when they are
/// all that waits, wait up to `join_wait` for a request to go before them in one batch:
/// that holder's release, typically.
async fn batcher(
    client: Client,
    mut queue: mpsc::Receiver<Request>,
    mut limits: BatchLimits,
    (wait, join_wait): (Duration, Duration),
) {
    let mut waiting: Vec<Request> = Vec::new();
    let mut in_flight: JoinSet<Option<Refused>> = JoinSet::new();
    let mut sent = Instant::now();
    let mut open = true;
    loop {
        let overdue = !waiting.is_empty() && Instant::now() >= sent + wait;
        if in_flight.is_empty() || overdue {
            while let Ok(request) = queue.try_recv() {
                waiting.push(request);
            }
            let held =
                held_until(&waiting, join_wait).filter(|until| open && Instant::now() < *until);
            if in_flight.is_empty() && held.is_some() {
                tokio::select! {
                    request = queue.recv() => match request {
                        Some(request) => waiting.push(request),
                        None => open = false,
                    },
                    () = tokio::time::sleep_until(held.unwrap_or(sent)) => {}
                }
                continue;
            }
            for (batch, members) in gather(&mut waiting, &limits) {
                in_flight.spawn(send(client.clone(), batch, members));
                sent = Instant::now();
            }
        }
        if in_flight.is_empty() {
            if !open {
                return;
            }
            match queue.recv().await {
                Some(request) => waiting.push(request),
                None => return,
            }
            continue;
        }
        tokio::select! {
            biased;
            Some(done) = in_flight.join_next() => {
                if let Ok(Some(refused)) = done {
                    refused_for_its_size(&mut limits, refused, &mut waiting);
                }
            }
            request = queue.recv(), if open => match request {
                Some(request) => waiting.push(request),
                // Dropped: send what waits, finish what is in flight, then stop.
                None => open = false,
            },
            () = tokio::time::sleep_until(sent + wait), if !waiting.is_empty() => {}
        }
    }
}

/// Until when `waiting` is held back: while every request of it may hold, `join_wait` from
/// the first.
fn held_until(waiting: &[Request], join_wait: Duration) -> Option<Instant> {
    if join_wait.is_zero() || !waiting.iter().all(|r| r.hold) {
        return None;
    }
    waiting
        .iter()
        .map(|r| r.came)
        .min()
        .map(|first| first + join_wait)
}

/// A batch etcd refused for its count of operations: nothing of it applied.
struct Refused {
    ops: usize,
    members: Vec<Request>,
}

/// Batches at most half the refused one's operations from now on; its requests go first in
/// the next round.
fn refused_for_its_size(limits: &mut BatchLimits, refused: Refused, waiting: &mut Vec<Request>) {
    let ops = (refused.ops / 2).max(1);
    if ops < limits.ops {
        tracing::warn!(
            refused = refused.ops,
            now = ops,
            "etcd refused a batch as too many operations (its --max-txn-ops is below 128): \
             batches are smaller from now on"
        );
        limits.ops = ops;
    }
    let later = std::mem::take(waiting);
    waiting.extend(refused.members);
    waiting.extend(later);
}

/// The batches `waiting` goes in, in its order but joins last (so they may follow others):
/// each request joins the first batch it fits. Requests whose caller stopped waiting are
/// dropped unsent.
fn gather(waiting: &mut Vec<Request>, limits: &BatchLimits) -> Vec<(Batch, Vec<Request>)> {
    let mut batches: Vec<(Batch, Vec<Request>)> = Vec::new();
    waiting.sort_by_key(|r| r.footprint.is_last());
    for request in waiting.drain(..) {
        if request.answer.is_closed() {
            continue;
        }
        let home = match request.alone {
            true => None,
            false => batches.iter_mut().find(|(batch, members)| {
                !members.first().is_some_and(|m| m.alone)
                    && batch.fits(&request.txn, &request.footprint, limits)
            }),
        };
        let (txn, footprint) = (request.txn.clone(), request.footprint.clone());
        match home {
            Some((batch, members)) => {
                batch.push(txn, footprint);
                members.push(request);
            }
            None => {
                let mut batch = Batch::new();
                batch.push(txn, footprint);
                batches.push((batch, vec![request]));
            }
        }
    }
    batches
}

/// One batch to etcd, and each request's answer back; or, refused for its size, the batch's
/// requests to send again.
async fn send(mut client: Client, batch: Batch, members: Vec<Request>) -> Option<Refused> {
    let answer = client.txn(batch.txn()).await;
    if members.len() > 1 && answer.as_ref().is_err_and(batch::too_many_ops) {
        return Some(Refused {
            ops: batch.ops(),
            members,
        });
    }
    match answer.map(|a| batch::split(a, members.len())) {
        Ok(Some(answers)) => {
            for (m, a) in members.into_iter().zip(answers) {
                let _ = m.answer.send(Ok(a));
            }
        }
        Ok(None) => {
            for m in members {
                let _ = m.answer.send(Err(rpc::Error::InvalidArgs(
                    "etcd's answer to a batch is not one answer per request".into(),
                )));
            }
        }
        Err(e) => {
            for m in members {
                let _ = m.answer.send(Err(e.clone()));
            }
        }
    }
    None
}

/// The batcher is gone (its front-end is stopping).
fn stopped() -> rpc::Error {
    rpc::Error::InvalidArgs("this front-end is stopping".into())
}
