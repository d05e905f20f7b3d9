//! What every call carries, and the token in it: `hasleader` when a leader is required, and
//! for a user ([`ConnectOptions::with_user`](super::ConnectOptions::with_user)) etcd's auth
//! token, asked for at connect and again when etcd refuses it (expired, or unknown to a
//! restarted member): one interceptor on every channel, so that no call can go without them.

use std::fmt;
use std::sync::{Arc, RwLock};

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::pb;
use super::pb::auth_client::AuthClient;
use super::Error;

/// Metadata that makes a member refuse a request while it has no leader.
pub(crate) const REQUIRE_LEADER_KEY: &str = "hasleader";
/// Metadata carrying the token `Authenticate` returned.
pub(crate) const TOKEN_KEY: &str = "token";

/// An etcd user and its password: never shown by `Debug`.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) name: String,
    pub(crate) password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("name", &self.name)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// Adds the metadata every call carries: `hasleader`, and the auth token once there is one.
#[derive(Clone)]
pub(crate) struct Metadata {
    pub(crate) require_leader: bool,
    pub(crate) token: Arc<RwLock<Option<AsciiMetadataValue>>>,
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

pub(crate) type Svc = InterceptedService<Channel, Metadata>;

/// Whether etcd refused a call for its token (expired, or unknown to this member after a
/// restart): a new token helps, and the call was not applied.
pub(crate) fn token_refused(status: &tonic::Status) -> bool {
    let m = status.message();
    status.code() == tonic::Code::Unauthenticated
        || m.contains("invalid auth token")
        || m.contains("auth token is expired")
}

/// The user a client authenticates as, and where its token goes.
pub(crate) struct Auth {
    pub(crate) credentials: Credentials,
    pub(crate) client: AuthClient<Svc>,
    pub(crate) token: Arc<RwLock<Option<AsciiMetadataValue>>>,
    /// One re-authentication at a time: calls refused together wait for one new token.
    pub(crate) refreshing: tokio::sync::Mutex<()>,
}

impl Auth {
    /// Asks etcd for a token, unless another call got a new one since `stale` was sent.
    pub(crate) async fn refresh(&self, stale: Option<AsciiMetadataValue>) -> Result<(), Error> {
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

    pub(crate) fn current(&self) -> Option<AsciiMetadataValue> {
        self.token.read().map(|t| t.clone()).unwrap_or_default()
    }
}
