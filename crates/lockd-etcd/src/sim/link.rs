//! One front-end's connection to the simulated etcd: its requests, keep-alives and watch.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::sleep;

use super::super::mem::MemError;
use super::super::streams::{Incoming, STREAM_QUEUE};
use super::super::{mvccpb, pb};
use super::super::{
    Error, LeaseKeepAliveStream, LeaseKeeper, WatchRequestSender, WatchResponseStream, WatchStream,
};
use super::words::{describe, mem_error, status};
use super::{Net, Rng};

/// One front-end's connection to the simulated etcd (a [`crate::Client`]'s inside).
#[derive(Clone)]
pub struct Link {
    pub(super) net: Net,
    pub(super) fe: usize,
}

impl Link {
    pub(crate) async fn txn(&self, req: pb::TxnRequest) -> Result<pb::TxnResponse, Error> {
        let what = format!("txn {}", describe(&req));
        let fe = self.fe;
        self.net
            .exchange(self.fe, what.clone(), move |w| {
                let before = w.etcd.revision();
                let resp = w.etcd.txn(&req).map_err(|e| {
                    if e == MemError::DuplicateKey {
                        let at = w.now_ms();
                        w.malformed.push((fe, at, what));
                    }
                    mem_error(e)
                })?;
                let rev = w.etcd.revision();
                if rev != before {
                    w.writers.push((rev, fe));
                }
                let how = if resp.succeeded { "then" } else { "else" };
                Ok((resp, how.to_owned()))
            })
            .await
    }

    pub(crate) async fn get(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse, Error> {
        let what = format!("read {}", String::from_utf8_lossy(&req.key));
        self.net
            .exchange(self.fe, what, move |w| {
                Ok((w.etcd.range(&req), String::new()))
            })
            .await
    }

    pub(crate) async fn lease_grant(&self, ttl: i64) -> Result<pb::LeaseGrantResponse, Error> {
        let fe = self.fe;
        self.net
            .exchange(self.fe, "lease grant".to_owned(), move |w| {
                let resp = w.etcd.lease_grant(ttl, 0);
                w.owners.push((resp.id, fe));
                let how = format!("lease {}", resp.id);
                Ok((resp, how))
            })
            .await
    }

    /// A keep-alive stream: each keep-alive answered late, or not at all while cut off.
    pub(crate) fn lease_keep_alive(&self, id: i64) -> (LeaseKeeper, LeaseKeepAliveStream) {
        let (tx, mut requests) = mpsc::channel::<pb::LeaseKeepAliveRequest>(STREAM_QUEUE);
        let _ = tx.try_send(pb::LeaseKeepAliveRequest { id });
        let (answers, rx) = mpsc::channel(STREAM_QUEUE);
        let link = self.clone();
        tokio::spawn(async move {
            while let Some(req) = requests.recv().await {
                let delay = link.net.world().delay();
                sleep(delay).await;
                let answer = {
                    let mut w = link.net.world();
                    if !w.reachable(link.fe) || w.leaderless {
                        None
                    } else {
                        w.tick();
                        let ttl = w.etcd.keep_alive(req.id).unwrap_or(0);
                        Some(pb::LeaseKeepAliveResponse {
                            header: Some(pb::ResponseHeader {
                                revision: w.etcd.revision(),
                                ..Default::default()
                            }),
                            id: req.id,
                            ttl,
                        })
                    }
                };
                // Unreachable, or no leader: the stream breaks (HTTP/2 keep-alive finds the
                // link dead; etcd without a leader refuses), and the keeper opens another.
                let broke = || {
                    status(
                        tonic::Code::Unavailable,
                        "simulated: keep-alive stream broke",
                    )
                };
                let ended = answer.is_none();
                if answers.send(answer.ok_or_else(broke)).await.is_err() || ended {
                    return;
                }
            }
        });
        (
            LeaseKeeper { id, tx },
            LeaseKeepAliveStream(Incoming::Sim(rx)),
        )
    }

    /// A watch stream of `create`'s range from its start revision: the history delivered in
    /// batches cut at random revisions, each late; compacted history ends it with the
    /// compaction's revision; progress asked for is answered once everything before it
    /// was sent.
    pub(crate) fn watch(&self, create: pb::WatchCreateRequest) -> WatchStream {
        let (tx, requests) = mpsc::channel(STREAM_QUEUE);
        let (answers, rx) = mpsc::channel(STREAM_QUEUE);
        let link = self.clone();
        tokio::spawn(link.feed_watch(create, requests, answers));
        WatchStream {
            requests: WatchRequestSender(tx),
            responses: WatchResponseStream(Incoming::Sim(rx)),
        }
    }

    async fn feed_watch(
        self,
        create: pb::WatchCreateRequest,
        mut requests: mpsc::Receiver<pb::WatchRequest>,
        answers: mpsc::Sender<Result<pb::WatchResponse, Error>>,
    ) {
        let mut next = create.start_revision;
        let mut progress = false;
        let created = {
            let mut w = self.net.world();
            if next == 0 {
                next = w.etcd.revision() + 1;
            }
            w.watches.push((self.fe, Some(next)));
            header_only(w.etcd.revision(), true)
        };
        if answers.send(Ok(created)).await.is_err() {
            return;
        }
        loop {
            let pause = self.net.world().delay().max(Duration::from_millis(1));
            tokio::select! {
                biased;
                req = requests.recv() => match req {
                    None => return,
                    Some(_) => progress = true,
                },
                () = sleep(pause) => {}
            }
            let answer = {
                let mut w = self.net.world();
                if !w.reachable(self.fe) {
                    if w.front(self.fe).dead || w.rng.chance(50) {
                        let _ = answers.try_send(Err(status(
                            tonic::Code::Unavailable,
                            "simulated: watch stream broke",
                        )));
                        return;
                    }
                    continue;
                }
                w.tick();
                match w.etcd.watch(&create.key, &create.range_end, next) {
                    Err(MemError::Compacted(rev)) => {
                        let mut resp = header_only(w.etcd.revision(), false);
                        resp.compact_revision = rev;
                        resp.canceled = true;
                        w.note(format_args!(
                            "fe{}: watch from {next} compacted (at {rev})",
                            self.fe
                        ));
                        w.watches.push((self.fe, None));
                        let _ = answers.try_send(Ok(resp));
                        return;
                    }
                    Err(_) => return,
                    Ok(events) if events.is_empty() => {
                        if !std::mem::take(&mut progress) {
                            continue;
                        }
                        let rev = w.etcd.revision();
                        w.learned(self.fe, rev);
                        header_only(rev, false)
                    }
                    Ok(events) => {
                        let upto = cut_at(&mut w.rng, &events);
                        let batch: Vec<mvccpb::Event> = events
                            .into_iter()
                            .filter(|e| event_rev(e) <= upto)
                            .collect();
                        next = upto + 1;
                        w.learned(self.fe, upto);
                        w.note(format_args!(
                            "fe{}: watch delivers {} events up to revision {upto}",
                            self.fe,
                            batch.len()
                        ));
                        let mut resp = header_only(upto, false);
                        resp.events = batch;
                        resp
                    }
                }
            };
            if answers.send(Ok(answer)).await.is_err() {
                return;
            }
        }
    }
}

/// Where a batch of `events` (in revision order, not empty) is cut: at one of its revisions.
fn cut_at(rng: &mut Rng, events: &[mvccpb::Event]) -> i64 {
    let first = event_rev(&events[0]);
    let last = event_rev(&events[events.len() - 1]);
    if rng.chance(500) {
        last
    } else {
        let pick = event_rev(&events[rng.below(events.len() as u64) as usize]);
        pick.clamp(first, last)
    }
}

fn event_rev(e: &mvccpb::Event) -> i64 {
    e.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

fn header_only(revision: i64, created: bool) -> pb::WatchResponse {
    pb::WatchResponse {
        header: Some(pb::ResponseHeader {
            revision,
            ..Default::default()
        }),
        created,
        ..Default::default()
    }
}
