//! A connection on a server with an auth file: who it is, what it may do, its AUTH.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use crate::auth::{Gate, Right, Users};
use crate::backend::PeerField;
use crate::locks::{ConnId, Origin, RenewRequest, UserId, NO_USER};
use crate::proto::{ErrorCode, ProtoError, Reply, Request, Secret};

use super::{Flow, Handler};

/// A connection's standing on a server with an auth file.
pub(super) struct LoginState {
    /// The users in force; a reload replaces them and wakes the handler.
    pub(super) users: watch::Receiver<Arc<Users>>,
    /// The user this connection authenticated as, and its name; `None` until AUTH.
    pub(super) user: Option<(UserId, String)>,
    /// Wrong AUTHs so far.
    pub(super) failures: u32,
    /// Why this connection may do nothing at all (its client certificate names several
    /// users): the answer to its first request, which closes it.
    pub(super) refusal: Option<ProtoError>,
}

impl LoginState {
    /// The standing of connection `number` from `peer` when it opens, on a server whose users
    /// `gate` has; `cns` are the common names of its verified client certificate
    /// ([`crate::tls::client_cns`]). Mutual TLS: a certificate whose one common name is a
    /// user logs the connection in as that user, no secret sent; any other name must AUTH. A
    /// certificate with more than one CN names nobody for sure (lockd would have to pick
    /// one): every request of the connection, AUTH included, is refused and closes it.
    pub(super) fn new(
        gate: &Gate,
        cns: Option<Vec<String>>,
        number: ConnId,
        peer: Option<SocketAddr>,
    ) -> Self {
        let mut login = LoginState {
            users: gate.subscribe(),
            user: None,
            failures: 0,
            refusal: None,
        };
        let peer = PeerField(peer);
        match cns.as_deref() {
            Some([cn]) => {
                let found = login.users.borrow().find(cn);
                if let Some(user) = found {
                    tracing::info!(conn = number, user = cn.as_str(), %peer, "authenticated by client certificate");
                    login.user = Some((user, cn.clone()));
                }
            }
            Some(cns) if cns.len() > 1 => {
                tracing::warn!(conn = number, %peer, common_names = cns.len(), "client certificate refused: more than one common name (CN)");
                login.refusal = Some(ProtoError::new(
                    ErrorCode::Denied,
                    format!(
                        "the client certificate has {} common names (CN); lockd logs in \
                         a certificate with one only; closing",
                        cns.len()
                    ),
                ));
            }
            _ => {}
        }
        login
    }
}

/// Whether a request may run: what [`Handler::admit`] decides before every command.
pub(super) enum Admit {
    Yes,
    /// `ERR ...`, nothing changes, the connection stays.
    Refuse(ProtoError),
    /// `ERR ...`, and the connection is closed: its user was removed.
    Close(ProtoError),
}

impl Handler {
    /// Who this connection acts as in the table: its user, or [`NO_USER`] without an auth
    /// file.
    pub(super) fn user(&self) -> UserId {
        self.login
            .as_ref()
            .and_then(|l| l.user.as_ref())
            .map_or(NO_USER, |(number, _)| *number)
    }

    /// Whether this connection's user has `right` on `name` under the users in force now
    /// (always, without an auth file).
    pub(super) fn may(&self, right: Right, name: &str) -> bool {
        let Some(login) = &self.login else {
            return true;
        };
        login
            .user
            .as_ref()
            .is_some_and(|(user, _)| login.users.borrow().may(*user, right, name))
    }

    /// The refusal that closes this connection if its user is gone from the users in force.
    pub(super) fn removed(&self) -> Option<ProtoError> {
        let login = self.login.as_ref()?;
        let (user, name) = login.user.as_ref()?;
        let gone = login.users.borrow().name(*user).is_none();
        gone.then(|| ProtoError::user_removed(name))
    }

    /// Decides, before a command runs, whether this connection may send it: before AUTH only
    /// PING, HELP, QUIT and AUTH; after it, what its user's rights allow on the name (on
    /// every name of a set). STATUS
    /// and WATCH without a name pass, and show only what the user may read.
    pub(super) fn admit(&self, request: &Request) -> Admit {
        let Some(login) = &self.login else {
            return Admit::Yes;
        };
        if let Some(e) = &login.refusal {
            return Admit::Close(e.clone());
        }
        let (right, name) = match request {
            Request::Auth { .. } | Request::Ping | Request::Help | Request::Quit => {
                return Admit::Yes
            }
            Request::Lock(req) => (Right::Lock, Some(&*req.name)),
            Request::Unlock { name, .. } | Request::Renew(RenewRequest { name, .. }) => {
                (Right::Lock, Some(name.as_str()))
            }
            // A prefix (`<prefix>*`), as no name: each name under it is shown only to a user
            // who may read it.
            Request::Status { name: Some(name) } | Request::Watch { name: Some(name) }
                if crate::proto::prefix_of(name).is_some() =>
            {
                (Right::Read, None)
            }
            Request::Check { name, .. }
            | Request::StatusDetail { name }
            | Request::Status { name: Some(name) }
            | Request::Watch { name: Some(name) } => (Right::Read, Some(name.as_str())),
            Request::Status { name: None } | Request::Watch { name: None } => (Right::Read, None),
            Request::Break { name, .. } => (Right::Admin, Some(name.as_str())),
        };
        let Some((_, user)) = &login.user else {
            return Admit::Refuse(ProtoError::no_auth());
        };
        if let Some(e) = self.removed() {
            return Admit::Close(e);
        }
        // A set (`and=`) needs the right on every one of its names, or it is refused whole.
        let and = match request {
            Request::Lock(req) => &req.and[..],
            _ => &[],
        };
        match name
            .into_iter()
            .chain(and.iter().map(String::as_str))
            .find(|name| !self.may(right, name))
        {
            Some(name) => Admit::Refuse(ProtoError::denied(user, right.as_str(), name)),
            None => Admit::Yes,
        }
    }

    /// AUTH. A wrong one is answered after [`crate::AUTH_FAILURE_DELAY`], and the
    /// [`crate::AUTH_FAILURES`]th closes the connection.
    pub(super) async fn auth(&mut self, name: String, secret: Secret) -> io::Result<Flow> {
        let Some(login) = self.login.as_mut() else {
            self.refuse(ProtoError::auth_off()).await?;
            return Ok(Flow::Continue);
        };
        if let Some((_, current)) = &login.user {
            let e = ProtoError::already_authenticated(current);
            self.refuse(e).await?;
            return Ok(Flow::Continue);
        }
        let (found, known) = {
            let users = login.users.borrow();
            (
                users.authenticate(&name, secret.expose()),
                users.find(&name).is_some(),
            )
        };
        let peer = PeerField(self.peer);
        if let Some(user) = found {
            tracing::info!(conn = self.number, user = name.as_str(), %peer, "authenticated");
            self.conn.queue(Reply::Authenticated(&name)).await?;
            self.origin = Origin::new(Some(&name), self.peer);
            login.user = Some((user, name));
            return Ok(Flow::Continue);
        }
        login.failures += 1;
        let failures = login.failures;
        let closing = failures >= crate::AUTH_FAILURES;
        // One stable shape for fail2ban (`contrib/fail2ban/lockd.conf`): the address first,
        // right after the message, before the name the client chose (quoted), so a name can't
        // pose as an address. A name that is no user is not logged (`user=?`): it may be the
        // secret, sent in the user's place.
        let ip = self.peer.map(|p| p.ip());
        {
            let unknown = tracing::field::display("?");
            let user: &dyn tracing::Value = if known { &name.as_str() } else { &unknown };
            match ip {
                Some(ip) => {
                    tracing::warn!(%ip, %peer, conn = self.number, user, failures, "authentication failed")
                }
                None => {
                    tracing::warn!(%peer, conn = self.number, user, failures, "authentication failed")
                }
            }
        }
        self.conn.flush().await?;
        tokio::select! {
            _ = tokio::time::sleep(crate::AUTH_FAILURE_DELAY) => {}
            _ = self.shutdown.cancelled() => {
                self.refuse(ProtoError::shutdown()).await?;
                return Ok(Flow::Close);
            }
        }
        self.refuse(ProtoError::bad_auth(closing)).await?;
        Ok(if closing { Flow::Close } else { Flow::Continue })
    }
}

/// Resolves when the users in force are replaced (a reload); never without an auth file, or
/// before this connection has a user (a reload changes nothing for it until then).
pub(super) async fn reloaded(login: &mut Option<LoginState>) {
    match login {
        Some(login) if login.user.is_some() => {
            if login.users.changed().await.is_err() {
                // The gate is gone: the server is stopping.
                std::future::pending::<()>().await;
            }
        }
        _ => std::future::pending().await,
    }
}
