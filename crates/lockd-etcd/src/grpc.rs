//! The gRPC side of a [`Client`](super::Client): etcd's KV, Watch and Lease clients on one
//! channel balanced over every member, KV requests sent to the leader instead while the route
//! knows it ([`route`]), and every call sent once more with a new token when etcd refused the
//! one it carried.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::auth::{token_refused, Auth, Metadata, Svc};
use super::connect::members;
use super::pb;
use super::pb::auth_client::AuthClient;
use super::pb::kv_client::KvClient;
use super::pb::lease_client::LeaseClient;
use super::pb::watch_client::WatchClient;
use super::route;
use super::streams::{Incoming, STREAM_QUEUE};
use super::{
    ConnectOptions, Error, GetResponse, LeaseGrantResponse, LeaseKeepAliveStream, LeaseKeeper, Txn,
    TxnResponse, WatchRequestSender, WatchResponseStream, WatchStream,
};

/// The gRPC client of [`Client`].
///
/// [`Client`]: super::Client
#[derive(Clone)]
pub(crate) struct Grpc {
    kv: KvClient<Svc>,
    watch: WatchClient<Svc>,
    lease: LeaseClient<Svc>,
    auth: Option<Arc<Auth>>,
    /// With more than one endpoint: KV requests straight to the leader ([`route`]).
    route: Option<Arc<route::Route>>,
}

impl Grpc {
    pub(crate) async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: Option<ConnectOptions>,
    ) -> Result<Self, Error> {
        let options = options.unwrap_or_default();
        let members = members(endpoints.as_ref(), &options)?;
        let token = Arc::new(RwLock::new(None));
        let metadata = Metadata {
            require_leader: options.require_leader,
            token: Arc::clone(&token),
        };
        let route =
            (members.len() > 1).then(|| Arc::new(route::Route::new(members.clone(), &metadata)));
        let channel = Channel::balance_list(members.into_iter().map(|(_, e)| e));
        let svc = InterceptedService::new(channel, metadata);
        let auth = options.user.map(|credentials| {
            Arc::new(Auth {
                credentials,
                client: AuthClient::new(svc.clone()),
                token,
                refreshing: tokio::sync::Mutex::new(()),
            })
        });
        if let Some(auth) = &auth {
            auth.refresh(None).await?;
        }
        Ok(Grpc {
            kv: KvClient::new(svc.clone()),
            watch: WatchClient::new(svc.clone()),
            lease: LeaseClient::new(svc),
            auth,
            route,
        })
    }

    pub(crate) fn routes(&self) -> bool {
        self.route.is_some()
    }

    pub(crate) async fn find_leader(&self, timeout: Duration) -> Option<(String, bool)> {
        let route = self.route.as_ref()?;
        let (url, leader) = route.find(timeout).await?;
        Some((url.to_owned(), leader))
    }

    pub(crate) async fn route_dropped(&self) {
        match &self.route {
            Some(route) => route.dropped().await,
            None => std::future::pending().await,
        }
    }

    /// The KV client for the next request: the chosen member's (with its route, for
    /// [`Client::routed`]) or the balanced one.
    fn kv(&self) -> (Option<usize>, KvClient<Svc>) {
        match self.route.as_ref().and_then(|r| r.kv()) {
            Some((i, kv)) => (Some(i), kv),
            None => (None, self.kv.clone()),
        }
    }

    /// A KV request on `kv` (from [`Client::kv`]) ended so: a failure that may be the
    /// member's (not the request's) drops the route to it.
    fn routed<T>(&self, word: Option<usize>, result: &Result<T, Error>) {
        let (Some(word), Some(route), Err(e)) = (word, &self.route, result) else {
            return;
        };
        let member_failed = match e {
            Error::GRpcStatus(status) => matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::Aborted
            ),
            Error::TransportError(_) | Error::IoError(_) => true,
            _ => false,
        };
        if member_failed {
            route.failed(word);
        }
    }

    /// Makes a call, and once more with a new token if etcd refused the one it carried.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let sent_with = self.auth.as_ref().and_then(|a| a.current());
        match (call().await, &self.auth) {
            (Err(status), Some(auth)) if token_refused(&status) => {
                auth.refresh(sent_with).await?;
                Ok(call().await?.into_inner())
            }
            (result, _) => Ok(result?.into_inner()),
        }
    }

    pub(crate) async fn get(&self, req: pb::RangeRequest) -> Result<GetResponse, Error> {
        let (word, kv) = self.kv();
        let result = self
            .call(|| {
                let mut kv = kv.clone();
                let req = req.clone();
                async move { kv.range(req).await }
            })
            .await;
        self.routed(word, &result);
        result
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        let (word, kv) = self.kv();
        let result = self
            .call(|| {
                let mut kv = kv.clone();
                let req = txn.req.clone();
                async move { kv.txn(req).await }
            })
            .await;
        self.routed(word, &result);
        result
    }

    pub(crate) async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse, Error> {
        let req = pb::LeaseGrantRequest { ttl, id: 0 };
        self.call(|| {
            let mut lease = self.lease.clone();
            async move { lease.lease_grant(req).await }
        })
        .await
    }

    pub(crate) async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Error> {
        self.call(|| {
            let mut lease = self.lease.clone();
            async move {
                let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                let mut keeper = LeaseKeeper { id, tx };
                // Queued before the stream opens: the channel has room.
                let _ = keeper.keep_alive().await;
                let opened = lease.lease_keep_alive(ReceiverStream::new(rx)).await?;
                Ok(opened.map(|inner| {
                    (
                        keeper,
                        LeaseKeepAliveStream(Incoming::Grpc(Box::new(inner))),
                    )
                }))
            }
        })
        .await
    }

    pub(crate) async fn watch(&self, create: pb::WatchCreateRequest) -> Result<WatchStream, Error> {
        self.call(|| {
            let mut watch = self.watch.clone();
            let create = create.clone();
            async move {
                let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                let requests = WatchRequestSender(tx);
                // Queued before the stream opens: the channel has room.
                let _ = requests
                    .send(pb::watch_request::RequestUnion::CreateRequest(create))
                    .await;
                let opened = watch.watch(ReceiverStream::new(rx)).await?;
                Ok(opened.map(|inner| WatchStream {
                    requests,
                    responses: WatchResponseStream(Incoming::Grpc(Box::new(inner))),
                }))
            }
        })
        .await
    }
}
