//! The client lockd's etcd backend holds: [`Client`], with the calls the backend makes (a
//! read, a transaction, a lease grant and its keep-alives, a watch), each sent over gRPC
//! ([`Grpc`]) or to a simulated etcd ([`sim::Link`]), so that nothing above it knows which.

use std::sync::Arc;
use std::time::Duration;

use super::grpc::Grpc;
// Named by the docs of `connect` and `find_leader`.
use super::sim;
#[cfg(doc)]
use super::{connect::members, route};
use super::{
    ConnectOptions, Error, GetOptions, GetResponse, LeaseGrantOptions, LeaseGrantResponse,
    LeaseKeepAliveStream, LeaseKeeper, Txn, TxnResponse, WatchOptions, WatchStream,
};

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
