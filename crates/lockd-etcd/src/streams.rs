//! The two streams a client keeps open: a lease's keep-alives ([`LeaseKeeper`] sends them,
//! [`LeaseKeepAliveStream`] brings their answers) and a watch ([`WatchStream`], split into
//! [`WatchRequestSender`] and [`WatchResponseStream`]). Their answers come from tonic or from
//! the simulated etcd alike ([`Incoming`]), so that the backend reads both the same way.

use tokio::sync::mpsc;

use super::pb;
use super::{Error, LeaseKeepAliveResponse, WatchResponse};

/// Requests queued on a stream (a watch's or the lease keep-alive's) before a send waits.
pub(crate) const STREAM_QUEUE: usize = 64;

/// The answers of a stream: tonic's, or a simulated etcd's.
#[derive(Debug)]
pub(crate) enum Incoming<T> {
    Grpc(Box<tonic::Streaming<T>>),
    Sim(mpsc::Receiver<Result<T, Error>>),
}

impl<T> Incoming<T> {
    async fn message(&mut self) -> Result<Option<T>, Error> {
        match self {
            Incoming::Grpc(stream) => Ok(stream.message().await?),
            Incoming::Sim(rx) => rx.recv().await.transpose(),
        }
    }
}

/// Sends a lease's keep-alives on its stream.
#[derive(Clone, Debug)]
pub struct LeaseKeeper {
    pub(crate) id: i64,
    pub(crate) tx: mpsc::Sender<pb::LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// Sends one keep-alive (its answer comes on the [`LeaseKeepAliveStream`]).
    pub async fn keep_alive(&mut self) -> Result<(), Error> {
        self.tx
            .send(pb::LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Error::LeaseKeepAliveError("the keep-alive stream is closed".into()))
    }
}

/// The answers to a lease's keep-alives.
#[derive(Debug)]
pub struct LeaseKeepAliveStream(pub(crate) Incoming<pb::LeaseKeepAliveResponse>);

impl LeaseKeepAliveStream {
    /// The next answer, `None` once the stream ended.
    pub async fn message(&mut self) -> Result<Option<LeaseKeepAliveResponse>, Error> {
        self.0.message().await
    }
}

/// A watch stream: the requests (more watches, progress) and the responses.
#[derive(Debug)]
pub struct WatchStream {
    pub(crate) requests: WatchRequestSender,
    pub(crate) responses: WatchResponseStream,
}

impl WatchStream {
    pub fn split(self) -> (WatchRequestSender, WatchResponseStream) {
        (self.requests, self.responses)
    }
}

/// The request half of a watch stream.
#[derive(Clone, Debug)]
pub struct WatchRequestSender(pub(crate) mpsc::Sender<pb::WatchRequest>);

impl WatchRequestSender {
    pub(crate) async fn send(&self, req: pb::watch_request::RequestUnion) -> Result<(), Error> {
        let req = pb::WatchRequest {
            request_union: Some(req),
        };
        self.0
            .send(req)
            .await
            .map_err(|_| Error::WatchError("the watch stream is closed".into()))
    }

    /// Asks for a progress answer: no events, and a header whose revision every event before
    /// it was delivered up to.
    pub async fn request_progress(&mut self) -> Result<(), Error> {
        let progress = pb::WatchProgressRequest {};
        self.send(pb::watch_request::RequestUnion::ProgressRequest(progress))
            .await
    }
}

/// The response half of a watch stream.
#[derive(Debug)]
pub struct WatchResponseStream(pub(crate) Incoming<pb::WatchResponse>);

impl WatchResponseStream {
    /// The next response, `None` once the stream ended.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        self.0.message().await
    }
}
