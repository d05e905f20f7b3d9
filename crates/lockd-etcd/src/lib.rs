//! lockd's own etcd v3 client: the few KV, Lease, Watch and Auth calls lockd's etcd backend
//! makes, over tonic, with the types and method names the backend was written against. With
//! it, an in-memory etcd ([`mem`]) and the simulated network the cluster simulator runs
//! lockd's front-ends over ([`sim`]): a crate of its own, so that these can be read and
//! tested apart from lockd.
//!
//! The gRPC code is generated from trimmed copies of etcd's protos (`proto/`: etcd's
//! packages, services, field numbers and types, only what lockd uses) and checked in
//! (`generated/`), so that building lockd needs no protoc. After changing a `.proto`,
//! regenerate from the workspace root with
//!
//! ```text
//! cargo run -p etcd-proto-gen
//! ```
//!
//! (it needs protoc); lockd's `tests/it/etcd_proto.rs` checks that the checked-in code is
//! what the protos give.
//!
//! Behaviour kept from the client lockd used before: one channel balanced over every
//! endpoint (a dead member is left out until it answers again), a per-request timeout, a
//! connect timeout, HTTP/2 keep-alives (also while idle), and `hasleader: true` on every call
//! when a leader is required, so that a member cut off from the others refuses at once
//! instead of waiting for a leader. Added since: KV requests go straight to the leader while
//! it answers, else to a member that does ([`route`]). Channels are made in [`Client::connect`] alone (with TLS when
//! [`ConnectOptions::with_tls`] gives it); [`ConnectOptions::with_user`] adds etcd's
//! user/password authentication, its token on every call.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    dead_code,
    rustdoc::all
)]
#[rustfmt::skip]
mod generated;
pub mod mem;
mod route;
pub mod sim;

use generated::etcdserverpb as pb;
use generated::mvccpb;

use pb::auth_client::AuthClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::watch_client::WatchClient;

pub use mvccpb::event::EventType;
pub use mvccpb::{Event, KeyValue};
pub use pb::ResponseHeader;

/// A range read's answer.
pub type GetResponse = pb::RangeResponse;
pub type TxnResponse = pb::TxnResponse;
pub type WatchResponse = pb::WatchResponse;
pub type LeaseGrantResponse = pb::LeaseGrantResponse;
pub type LeaseKeepAliveResponse = pb::LeaseKeepAliveResponse;

/// Requests queued on a stream (a watch's or the lease keep-alive's) before a send waits.
const STREAM_QUEUE: usize = 64;

/// Metadata that makes a member refuse a request while it has no leader.
const REQUIRE_LEADER_KEY: &str = "hasleader";
/// Metadata carrying the token `Authenticate` returned.
const TOKEN_KEY: &str = "token";

/// Why a call failed. The variants are the ones `cause.rs` reads a plain sentence from (the
/// names of the client lockd used before, hence the `Error` suffixes).
#[allow(clippy::enum_variant_names)]
#[derive(Debug)]
pub enum Error {
    /// A request lockd could not even form (no endpoint, a malformed URL).
    InvalidArgs(String),
    IoError(std::io::Error),
    /// The channel could not be built or used.
    TransportError(tonic::transport::Error),
    /// etcd (or tonic on its behalf: a deadline, a refused connection) answered with a status.
    GRpcStatus(tonic::Status),
    /// A watch stream could not be fed.
    WatchError(String),
    /// The lease keep-alive stream could not be fed, or etcd says the lease is gone.
    LeaseKeepAliveError(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgs(e) => write!(f, "invalid arguments: {e}"),
            Error::IoError(e) => write!(f, "io error: {e}"),
            Error::TransportError(e) => write!(f, "transport error: {e}"),
            Error::GRpcStatus(e) => write!(f, "grpc request error: {e}"),
            Error::WatchError(e) => write!(f, "watch error: {e}"),
            Error::LeaseKeepAliveError(e) => write!(f, "lease keep alive error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::IoError(e) => Some(e),
            Error::TransportError(e) => Some(e),
            Error::GRpcStatus(e) => Some(e),
            _ => None,
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(e: tonic::Status) -> Self {
        Error::GRpcStatus(e)
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Self {
        Error::TransportError(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::IoError(e)
    }
}

/// How to reach etcd.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    /// HTTP/2 keep-alive: (interval, timeout).
    keep_alive: Option<(Duration, Duration)>,
    require_leader: bool,
    tls: Option<TlsOptions>,
    user: Option<Credentials>,
}

/// TLS to etcd: the CA that signed the members' certificates, and this client's own
/// certificate and key when etcd asks for one (`--client-cert-auth`). All PEM.
#[derive(Clone, Default)]
pub struct TlsOptions {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl TlsOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust the members' certificates this CA signed (and no other: lockd has no system
    /// roots for etcd).
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Show etcd this certificate (chain, leaf first) and prove it with this key.
    pub fn with_identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}

/// An etcd user and its password: never shown by `Debug`.
#[derive(Clone)]
struct Credentials {
    name: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("name", &self.name)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl ConnectOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every request fails with a deadline status after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Connecting to one member gives up after `timeout`.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// HTTP/2 pings every `interval` (also on an idle connection); a connection whose ping
    /// goes unanswered for `timeout` is dropped, so a member that vanished is noticed.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }

    /// Sends `hasleader: true` on every call.
    pub fn with_require_leader(mut self, require_leader: bool) -> Self {
        self.require_leader = require_leader;
        self
    }

    /// TLS to every member: an endpoint without a scheme becomes `https://`, and an
    /// `http://` one is refused (it would send the credentials in the clear).
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticate as this etcd user: [`Client::connect`] asks for a token, every call
    /// carries it, and a call refused for an expired or unknown token gets a new one and
    /// is sent once more.
    pub fn with_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(Credentials {
            name: name.into(),
            password: password.into(),
        });
        self
    }
}

/// Each member's URL and endpoint (at least one), from which [`Client::connect`] makes the
/// channels: one balanced over every endpoint (each connected lazily, reconnected when it
/// drops; a request goes to a member whose connection is up), and one per member for the
/// route to the leader.
fn members<E: AsRef<str>>(
    endpoints: &[E],
    options: &ConnectOptions,
) -> Result<Vec<(String, Endpoint)>, Error> {
    let mut list = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        let endpoint = endpoint(e.as_ref(), options)?;
        let url = endpoint.uri().to_string();
        list.push((url.trim_end_matches('/').to_owned(), endpoint));
    }
    if list.is_empty() {
        return Err(Error::InvalidArgs("no etcd endpoint".into()));
    }
    Ok(list)
}

/// One member's endpoint: `http://` assumed when the URL has no scheme (`https://` with TLS).
fn endpoint(url: &str, options: &ConnectOptions) -> Result<Endpoint, Error> {
    let url = if url.contains("://") {
        url.to_owned()
    } else if options.tls.is_some() {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    };
    let https = url.starts_with("https://");
    if options.tls.is_some() && !https {
        return Err(Error::InvalidArgs(format!(
            "etcd endpoint {url}: TLS is set, so the endpoint must be https://"
        )));
    }
    if https && options.tls.is_none() {
        return Err(Error::InvalidArgs(format!(
            "etcd endpoint {url}: https needs the CA that signed etcd's certificate"
        )));
    }
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| Error::InvalidArgs(format!("etcd endpoint {url}: {e}")))?;
    if let Some(tls) = &options.tls {
        endpoint = endpoint.tls_config(tls.config())?;
    }
    if let Some((interval, timeout)) = options.keep_alive {
        endpoint = endpoint
            .keep_alive_while_idle(true)
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(timeout);
    }
    if let Some(timeout) = options.timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if let Some(timeout) = options.connect_timeout {
        endpoint = endpoint.connect_timeout(timeout);
    }
    Ok(endpoint)
}

/// Adds the metadata every call carries: `hasleader`, and the auth token once there is one.
#[derive(Clone)]
pub(crate) struct Metadata {
    require_leader: bool,
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
}

impl tonic::service::Interceptor for Metadata {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let authenticating = request
            .extensions()
            .get::<tonic::GrpcMethod>()
            .is_some_and(|m| m.method() == "Authenticate");
        if !authenticating {
            let token = self.token.read().map(|t| t.clone()).unwrap_or_default();
            if let Some(token) = token {
                request.metadata_mut().insert(TOKEN_KEY, token);
            }
        }
        if self.require_leader {
            request
                .metadata_mut()
                .insert(REQUIRE_LEADER_KEY, MetadataValue::from_static("true"));
        }
        Ok(request)
    }
}

type Svc = InterceptedService<Channel, Metadata>;

/// Whether etcd refused a call for its token (expired, or unknown to this member after a
/// restart): a new token helps, and the call was not applied.
fn token_refused(status: &tonic::Status) -> bool {
    let m = status.message();
    status.code() == tonic::Code::Unauthenticated
        || m.contains("invalid auth token")
        || m.contains("auth token is expired")
}

/// The user a client authenticates as, and where its token goes.
struct Auth {
    credentials: Credentials,
    client: AuthClient<Svc>,
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
    /// One re-authentication at a time: calls refused together wait for one new token.
    refreshing: tokio::sync::Mutex<()>,
}

impl Auth {
    /// Asks etcd for a token, unless another call got a new one since `stale` was sent.
    async fn refresh(&self, stale: Option<AsciiMetadataValue>) -> Result<(), Error> {
        let _one = self.refreshing.lock().await;
        let current = self.token.read().map(|t| t.clone()).unwrap_or_default();
        if current.is_some() && current != stale {
            return Ok(());
        }
        let req = pb::AuthenticateRequest {
            name: self.credentials.name.clone(),
            password: self.credentials.password.clone(),
        };
        let token = self
            .client
            .clone()
            .authenticate(req)
            .await?
            .into_inner()
            .token;
        let token = AsciiMetadataValue::try_from(token.as_str())
            .map_err(|_| Error::InvalidArgs("etcd returned a token that is no header".into()))?;
        if let Ok(mut slot) = self.token.write() {
            *slot = Some(token);
        }
        Ok(())
    }

    fn current(&self) -> Option<AsciiMetadataValue> {
        self.token.read().map(|t| t.clone()).unwrap_or_default()
    }
}

/// A client of one etcd cluster; cheap to clone (clones share the channels, the token and
/// the route to the leader). A simulated one ([`sim`]) talks to an in-memory etcd instead.
#[derive(Clone)]
pub struct Client {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Grpc(Arc<Grpc>),
    Sim(sim::Link),
}

impl Client {
    /// A client over the channels of [`members`]. Without a user nothing is sent yet (the first
    /// request connects); with one, its token is asked for here.
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: Option<ConnectOptions>,
    ) -> Result<Self, Error> {
        let grpc = Grpc::connect(endpoints, options).await?;
        Ok(Client {
            inner: Inner::Grpc(Arc::new(grpc)),
        })
    }

    /// A client of a simulated etcd.
    pub fn simulated(link: sim::Link) -> Client {
        Client {
            inner: Inner::Sim(link),
        }
    }

    /// Whether KV requests can be routed to the leader (more than one endpoint).
    pub fn routes(&self) -> bool {
        match &self.inner {
            Inner::Grpc(g) => g.routes(),
            Inner::Sim(_) => false,
        }
    }

    /// Asks every endpoint for its status (each within `timeout`), and sends KV requests
    /// from now on to the leader, or to a member that answered if the leader did not
    /// ([`route`]): that member's URL and whether it is the leader, or `None` (the balanced
    /// channel) if no answer names a leader.
    pub async fn find_leader(&self, timeout: Duration) -> Option<(String, bool)> {
        match &self.inner {
            Inner::Grpc(g) => g.find_leader(timeout).await,
            Inner::Sim(_) => None,
        }
    }

    /// Waits until a request on the chosen member's channel failed and the route was dropped
    /// (never returns for a client of one endpoint).
    pub async fn route_dropped(&self) {
        match &self.inner {
            Inner::Grpc(g) => g.route_dropped().await,
            Inner::Sim(_) => std::future::pending().await,
        }
    }

    /// Reads one key, or a range (see [`GetOptions`]).
    pub async fn get(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse, Error> {
        let req = options.unwrap_or_default().request(key.into());
        match &self.inner {
            Inner::Grpc(g) => g.get(req).await,
            Inner::Sim(link) => link.get(req).await,
        }
    }

    pub async fn txn(&mut self, txn: Txn) -> Result<TxnResponse, Error> {
        match &self.inner {
            Inner::Grpc(g) => g.txn(txn).await,
            Inner::Sim(link) => link.txn(txn.req).await,
        }
    }

    /// A new lease of `ttl` seconds (the id etcd chooses).
    pub async fn lease_grant(
        &mut self,
        ttl: i64,
        _options: Option<LeaseGrantOptions>,
    ) -> Result<LeaseGrantResponse, Error> {
        match &self.inner {
            Inner::Grpc(g) => g.lease_grant(ttl).await,
            Inner::Sim(link) => link.lease_grant(ttl).await,
        }
    }

    /// Opens the keep-alive stream of lease `id` and sends its first keep-alive. Fails with
    /// [`Error::LeaseKeepAliveError`] ("lease not found") if etcd says the lease is gone.
    pub async fn lease_keep_alive(
        &mut self,
        id: i64,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Error> {
        let (keeper, mut stream) = match &self.inner {
            Inner::Grpc(g) => g.lease_keep_alive(id).await?,
            Inner::Sim(link) => link.lease_keep_alive(id),
        };
        match stream.message().await? {
            Some(resp) if resp.ttl > 0 => Ok((keeper, stream)),
            Some(_) => Err(Error::LeaseKeepAliveError("lease not found".into())),
            None => Err(Error::LeaseKeepAliveError(
                "the keep-alive stream closed at once".into(),
            )),
        }
    }

    /// Opens a watch stream and creates one watch on it, of `key` (or the range the options
    /// give).
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream, Error> {
        let create = options.unwrap_or_default().request(key.into());
        match &self.inner {
            Inner::Grpc(g) => g.watch(create).await,
            Inner::Sim(link) => Ok(link.watch(create)),
        }
    }
}

/// The gRPC client of [`Client`].
#[derive(Clone)]
struct Grpc {
    kv: KvClient<Svc>,
    watch: WatchClient<Svc>,
    lease: LeaseClient<Svc>,
    auth: Option<Arc<Auth>>,
    /// With more than one endpoint: KV requests straight to the leader ([`route`]).
    route: Option<Arc<route::Route>>,
}

impl Grpc {
    async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
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

    fn routes(&self) -> bool {
        self.route.is_some()
    }

    async fn find_leader(&self, timeout: Duration) -> Option<(String, bool)> {
        let route = self.route.as_ref()?;
        let (url, leader) = route.find(timeout).await?;
        Some((url.to_owned(), leader))
    }

    async fn route_dropped(&self) {
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

    async fn get(&self, req: pb::RangeRequest) -> Result<GetResponse, Error> {
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

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
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

    async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse, Error> {
        let req = pb::LeaseGrantRequest { ttl, id: 0 };
        self.call(|| {
            let mut lease = self.lease.clone();
            async move { lease.lease_grant(req).await }
        })
        .await
    }

    async fn lease_keep_alive(
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

    async fn watch(&self, create: pb::WatchCreateRequest) -> Result<WatchStream, Error> {
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

/// The answers of a stream: tonic's, or a simulated etcd's.
#[derive(Debug)]
enum Incoming<T> {
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
    id: i64,
    tx: mpsc::Sender<pb::LeaseKeepAliveRequest>,
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
pub struct LeaseKeepAliveStream(Incoming<pb::LeaseKeepAliveResponse>);

impl LeaseKeepAliveStream {
    /// The next answer, `None` once the stream ended.
    pub async fn message(&mut self) -> Result<Option<LeaseKeepAliveResponse>, Error> {
        self.0.message().await
    }
}

/// A watch stream: the requests (more watches, progress) and the responses.
#[derive(Debug)]
pub struct WatchStream {
    requests: WatchRequestSender,
    responses: WatchResponseStream,
}

impl WatchStream {
    pub fn split(self) -> (WatchRequestSender, WatchResponseStream) {
        (self.requests, self.responses)
    }
}

/// The request half of a watch stream.
#[derive(Clone, Debug)]
pub struct WatchRequestSender(mpsc::Sender<pb::WatchRequest>);

impl WatchRequestSender {
    async fn send(&self, req: pb::watch_request::RequestUnion) -> Result<(), Error> {
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
pub struct WatchResponseStream(Incoming<pb::WatchResponse>);

impl WatchResponseStream {
    /// The next response, `None` once the stream ended.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        self.0.message().await
    }
}

/// The end of the range of every key that starts with `key` (etcd's convention: the key with
/// its last byte below 0xff incremented and the rest cut; `\0`, every key, if there is none).
fn prefix_end(key: &[u8]) -> Vec<u8> {
    match key.iter().rposition(|b| *b < 0xff) {
        Some(i) => {
            let mut end = key[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

#[derive(Clone, Debug, Default)]
pub struct GetOptions {
    prefix: bool,
    count_only: bool,
}

impl GetOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key starting with the key given.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// Only the number of keys, not the keys.
    pub fn with_count_only(mut self) -> Self {
        self.count_only = true;
        self
    }

    fn request(self, key: Vec<u8>) -> pb::RangeRequest {
        pb::RangeRequest {
            range_end: if self.prefix {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            count_only: self.count_only,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    lease: i64,
}

impl PutOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key is deleted when this lease ends.
    pub fn with_lease(mut self, lease: i64) -> Self {
        self.lease = lease;
        self
    }

    fn request(self, key: Vec<u8>, value: Vec<u8>) -> pb::PutRequest {
        pb::PutRequest {
            key,
            value,
            lease: self.lease,
        }
    }
}

/// A delete's options: none that lockd needs yet (it deletes one key at a time).
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {}

/// A lease grant's options: none that lockd needs yet (etcd chooses the id).
#[derive(Clone, Debug, Default)]
pub struct LeaseGrantOptions {}

#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    prefix: bool,
    start_revision: i64,
}

impl WatchOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key starting with the key given.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// Events from this revision on (0: from now).
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }

    fn request(self, key: Vec<u8>) -> pb::WatchCreateRequest {
        pb::WatchCreateRequest {
            range_end: if self.prefix {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            start_revision: self.start_revision,
        }
    }
}

/// How a [`Compare`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    Greater,
    Less,
}

impl CompareOp {
    fn result(self) -> pb::compare::CompareResult {
        use pb::compare::CompareResult as R;
        match self {
            CompareOp::Equal => R::Equal,
            CompareOp::Greater => R::Greater,
            CompareOp::Less => R::Less,
        }
    }
}

/// One condition of a transaction, on a key (or, [`Compare::with_prefix`], on every key of
/// a prefix: true only if it holds for each of them).
#[derive(Clone, Debug)]
pub struct Compare(pb::Compare);

impl Compare {
    fn new(
        key: impl Into<Vec<u8>>,
        op: CompareOp,
        target: pb::compare::CompareTarget,
        value: pb::compare::TargetUnion,
    ) -> Self {
        Compare(pb::Compare {
            result: op.result() as i32,
            target: target as i32,
            key: key.into(),
            target_union: Some(value),
            range_end: Vec::new(),
        })
    }

    /// On the key's version (0: the key does not exist).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Self {
        use pb::compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Version,
            TargetUnion::Version(version),
        )
    }

    /// On the revision that created the key.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        use pb::compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Create,
            TargetUnion::CreateRevision(revision),
        )
    }

    /// On the revision that last changed the key.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        use pb::compare::{CompareTarget, TargetUnion};
        Self::new(
            key,
            op,
            CompareTarget::Mod,
            TargetUnion::ModRevision(revision),
        )
    }

    /// The key compared (the first of the range, with a prefix).
    #[cfg(any(test, feature = "test-util"))]
    pub fn key(&self) -> &[u8] {
        &self.0.key
    }

    /// Compares every key that starts with this one.
    pub fn with_prefix(mut self) -> Self {
        self.0.range_end = prefix_end(&self.0.key);
        self
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug)]
pub struct TxnOp(pb::request_op::Request);

impl TxnOp {
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Self {
        let req = options.unwrap_or_default().request(key.into());
        TxnOp(pb::request_op::Request::RequestRange(req))
    }

    pub fn put(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Self {
        let req = options
            .unwrap_or_default()
            .request(key.into(), value.into());
        TxnOp(pb::request_op::Request::RequestPut(req))
    }

    pub fn delete(key: impl Into<Vec<u8>>, _options: Option<DeleteOptions>) -> Self {
        let req = pb::DeleteRangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        TxnOp(pb::request_op::Request::RequestDeleteRange(req))
    }

    /// A transaction inside this one (etcd 3.3 and later).
    pub fn txn(txn: Txn) -> Self {
        TxnOp(pb::request_op::Request::RequestTxn(txn.req))
    }

    fn op(self) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(self.0),
        }
    }
}

/// A transaction: if every [`Txn::when`] comparison holds, the [`Txn::and_then`] operations,
/// else the [`Txn::or_else`] ones, all at one revision.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    req: pb::TxnRequest,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn when(mut self, compares: impl Into<Vec<Compare>>) -> Self {
        self.req
            .compare
            .extend(compares.into().into_iter().map(|c| c.0));
        self
    }

    pub fn and_then(mut self, ops: impl Into<Vec<TxnOp>>) -> Self {
        self.req
            .success
            .extend(ops.into().into_iter().map(TxnOp::op));
        self
    }

    pub fn or_else(mut self, ops: impl Into<Vec<TxnOp>>) -> Self {
        self.req
            .failure
            .extend(ops.into().into_iter().map(TxnOp::op));
        self
    }
}

/// The answer to one operation of a transaction.
#[derive(Clone, Copy, Debug)]
pub enum TxnOpResponse<'a> {
    Get(&'a GetResponse),
    /// A put's or a delete's answer: nothing lockd reads.
    Put,
    Delete,
    Txn(&'a TxnResponse),
}

impl TxnResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// Whether the comparisons held (the `and_then` branch ran).
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }

    /// The answers of the branch that ran, in order.
    pub fn op_responses(&self) -> Vec<TxnOpResponse<'_>> {
        use pb::response_op::Response as R;
        self.responses
            .iter()
            .filter_map(|r| {
                Some(match r.response.as_ref()? {
                    R::ResponseRange(r) => TxnOpResponse::Get(r),
                    R::ResponsePut(_) => TxnOpResponse::Put,
                    R::ResponseDeleteRange(_) => TxnOpResponse::Delete,
                    R::ResponseTxn(r) => TxnOpResponse::Txn(r),
                })
            })
            .collect()
    }
}

impl GetResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
}

impl LeaseGrantResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    pub fn id(&self) -> i64 {
        self.id
    }
}

impl LeaseKeepAliveResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// The lease's new time to live in seconds; 0 or less: etcd has no such lease.
    pub fn ttl(&self) -> i64 {
        self.ttl
    }
}

impl WatchResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    pub fn canceled(&self) -> bool {
        self.canceled
    }

    /// Non-zero when the watch asked for a revision that was compacted away (the oldest one
    /// still there); the watch is cancelled then.
    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }

    pub fn cancel_reason(&self) -> &str {
        &self.cancel_reason
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

impl Event {
    pub fn event_type(&self) -> EventType {
        self.r#type()
    }

    /// The key as the event left it (for a delete: the key and the revision of the delete).
    pub fn kv(&self) -> Option<&KeyValue> {
        self.kv.as_ref()
    }
}

impl KeyValue {
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn value(&self) -> &[u8] {
        &self.value
    }

    pub fn value_str(&self) -> Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(&self.value)
    }

    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }

    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }

    pub fn lease(&self) -> i64 {
        self.lease
    }
}

impl ResponseHeader {
    /// The store's revision when the request was served.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

/// A transaction's answer as etcd would give it: `succeeded`, at `revision`, with one read
/// that found `kvs`. For the tests of code that reads answers.
#[cfg(any(test, feature = "test-util"))]
pub fn txn_answer(succeeded: bool, revision: i64, kvs: Vec<KeyValue>) -> TxnResponse {
    use pb::response_op::Response as R;
    TxnResponse {
        header: Some(ResponseHeader {
            revision,
            ..Default::default()
        }),
        succeeded,
        responses: vec![pb::ResponseOp {
            response: Some(R::ResponseRange(GetResponse {
                kvs,
                ..Default::default()
            })),
        }],
    }
}

#[cfg(test)]
mod tests;
