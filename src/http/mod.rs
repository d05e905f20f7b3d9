//! The operators' HTTP endpoint (`--metrics-listen`): `/metrics`, `/healthz`, `/readyz`,
//! and with `--web` the web view ([`web`]).
//!
//! It listens from the very start, before a data directory is recovered, so a probe can tell
//! "starting" (`/readyz` 503) from "down" (no answer). The lock table is handed over through
//! [`Endpoint::serving`] once it exists.

use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::tls::ServerTls;

mod basic;
mod board;
mod tls;
mod web;

pub use web::Web;

/// What the endpoint reports on.
#[derive(Clone, Default)]
pub struct Endpoint {
    backend: Arc<OnceLock<Backend>>,
    /// Names whose own series are exported (`--metrics-names`).
    names: Arc<Vec<String>>,
    stopping: CancellationToken,
    /// A listener serves the network without authentication (`--insecure-open`): shown as
    /// `lockd_open_without_auth 1` and in `/healthz`, so that it is seen, not only logged.
    open_without_auth: bool,
    /// The web view, with `--web`.
    web: Option<Arc<Web>>,
}

impl Endpoint {
    /// An endpoint that exports per-name series for `names`.
    pub fn new(names: Vec<String>) -> Self {
        Endpoint {
            names: Arc::new(names),
            ..Endpoint::default()
        }
    }

    /// Says whether a listener serves the network without authentication.
    pub fn open_without_auth(mut self, open: bool) -> Self {
        self.open_without_auth = open;
        self
    }

    /// Serves the web view too.
    pub fn web(mut self, web: Web) -> Self {
        self.web = Some(Arc::new(web));
        self
    }

    /// The table is recovered and the server accepts connections.
    pub fn serving(&self, backend: &Backend) {
        if self.backend.set(backend.clone()).is_ok() {
            if let Some(web) = &self.web {
                let recording = Arc::clone(web).record(backend.clone(), self.stopping.clone());
                tokio::spawn(recording);
            }
        }
    }

    /// The server is shutting down: no longer ready, no longer healthy.
    pub fn stopping(&self) {
        self.stopping.cancel();
    }

    /// Serves `listener` until `shutdown`, over TLS with `tls` (`--metrics-tls`: the
    /// certificate of `--tls-cert`, no client certificate asked for, handshakes bounded by
    /// `handshake_timeout`).
    pub async fn run(
        self,
        listener: TcpListener,
        tls: Option<(ServerTls, Duration)>,
        shutdown: CancellationToken,
    ) -> io::Result<()> {
        if let Ok(addr) = listener.local_addr() {
            let tls = tls.is_some();
            tracing::info!(%addr, tls, web = self.web.is_some(), "serving metrics");
        }
        let mut app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz));
        if self.web.is_some() {
            app = app
                .route("/", get(web::page))
                .route("/view.js", get(web::script))
                .route("/view.css", get(web::style))
                .route("/locks", get(web::locks))
                .route("/events", get(web::events));
        }
        let app = app.with_state(self);
        let stopped = async move { shutdown.cancelled().await };
        match tls {
            Some((tls, timeout)) => {
                let listener = tls::TlsListener::new(listener, tls, timeout);
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            }
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            }
        }
    }

    fn backend(&self) -> Option<&Backend> {
        self.backend.get()
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

async fn healthz(State(ep): State<Endpoint>) -> Response {
    if ep.stopping.is_cancelled() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "stopping\n");
    }
    if ep.open_without_auth {
        return text(
            StatusCode::OK,
            "ok; open without authentication (--insecure-open)\n",
        );
    }
    text(StatusCode::OK, "ok\n")
}

async fn readyz(State(ep): State<Endpoint>) -> Response {
    match ep.backend() {
        _ if ep.stopping.is_cancelled() => text(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        None => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: recovering state\n",
        ),
        Some(backend) => match backend.health().ready {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
    }
}

async fn metrics(State(ep): State<Endpoint>) -> Response {
    let Some(backend) = ep.backend() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "starting\n");
    };
    let m = backend.metrics();
    let (held, waiters) = backend.counts();
    m.open_without_auth.set(i64::from(ep.open_without_auth));
    m.held.set(held as i64);
    m.waiters.set(waiters as i64);
    let health = backend.health();
    backend.scrape();
    m.journal_backlog
        .set(health.journal_backlog.map_or(0.0, |age| age.as_secs_f64()));
    for name in ep.names.iter() {
        let key = [("name", name.clone())];
        let status = backend.status(name).await.ok().flatten();
        m.name_held
            .get_or_create(&key)
            .set(status.as_ref().map_or(0, |s| s.holders as i64));
        m.name_waiters
            .get_or_create(&key)
            .set(status.as_ref().map_or(0, |s| s.waiters as i64));
        m.name_held_seconds.get_or_create(&key).set(
            status
                .as_ref()
                .map_or(Duration::ZERO, |s| s.held)
                .as_secs_f64(),
        );
    }
    match m.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n"),
    }
}
