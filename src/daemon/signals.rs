//! The daemon's signals: SIGINT and SIGTERM shut it down, SIGHUP reloads `--auth-file` and
//! the TLS certificate and key.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::auth::Gate;
use crate::tls::ServerTls;

/// Cancels `token` on the first SIGINT or SIGTERM.
pub(super) async fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("signal received");
    token.cancel();
}

/// Reloads the auth file on every SIGHUP. A file that fails to load is logged (never a
/// secret: errors name the line and what is wrong with it) and the users in force stay.
/// Without an auth file SIGHUP is caught all the same and logged: a `systemctl reload`
/// (the unit's ExecReload) must never stop the server.
/// Registers the handler at once (before the server accepts anything), and returns the task
/// that reloads.
#[cfg(unix)]
pub(super) fn reload_on_hangup(
    auth: Option<(Arc<Gate>, PathBuf)>,
    tls: Option<ServerTls>,
) -> impl std::future::Future<Output = ()> + Send {
    use tokio::signal::unix::{signal, SignalKind};
    let hangups = signal(SignalKind::hangup());
    async move {
        let mut hangups = match hangups {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(target: "lockd::auth", error = %e, "cannot catch SIGHUP");
                return;
            }
        };
        reload_each(&mut hangups, auth, tls).await;
    }
}

#[cfg(unix)]
async fn reload_each(
    hangups: &mut tokio::signal::unix::Signal,
    auth: Option<(Arc<Gate>, PathBuf)>,
    tls: Option<ServerTls>,
) {
    while hangups.recv().await.is_some() {
        reload(&auth, &tls);
    }
}

/// What one SIGHUP does: the TLS certificate and key, then the auth file, read again; a
/// file that fails to load is logged and what was loaded before stays in force.
pub(super) fn reload(auth: &Option<(Arc<Gate>, PathBuf)>, tls: &Option<ServerTls>) {
    if let Some(tls) = tls {
        let file = tls.cert_file().display().to_string();
        match tls.reload() {
            Ok(()) => tracing::info!(
                file,
                "TLS certificate and key reloaded: new connections use them"
            ),
            Err(e) => {
                tracing::error!(error = %e, "TLS certificate and key not reloaded; the ones loaded before stay in force")
            }
        }
    }
    let Some((gate, path)) = auth else {
        tracing::info!(target: "lockd::auth", "SIGHUP: no --auth-file, nothing to reload");
        return;
    };
    match gate.reload(path) {
        Ok(users) => tracing::info!(
            target: "lockd::auth",
            file = %path.display(),
            users,
            "auth file reloaded"
        ),
        Err(e) => tracing::error!(
            target: "lockd::auth",
            error = %e,
            "auth file not reloaded; the users loaded before stay in force"
        ),
    }
}

#[cfg(not(unix))]
pub(super) fn reload_on_hangup(
    _auth: Option<(Arc<Gate>, PathBuf)>,
    _tls: Option<ServerTls>,
) -> impl std::future::Future<Output = ()> + Send {
    std::future::ready(())
}
