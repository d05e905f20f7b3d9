//! The web view (`--web`): one read-only page on the HTTP port that shows every held lock, its
//! holders and its queue, and the events WATCH tells, live.
//!
//! The page (`/`, with `/view.js` and `/view.css`, all in the binary) opens `/events`, a
//! server-sent event stream that carries the events as they are published and a new `state`
//! (the board: see [`board`]) whenever what is held or queued changed. Queues change without
//! an event (a LOCK that waits publishes nothing), so the board is also looked at once a
//! second and sent when it differs. `/locks` answers the board once, as JSON, for scripts.
//!
//! With `--auth-file`, every route asks for HTTP Basic credentials of the file's users, and a
//! viewer is shown only the names its `read=` rights cover, as STATUS and WATCH do.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::basic::{login, Login};
use super::board::{self, Filter};
use super::{text, Endpoint};
use crate::auth::{Gate, Right};
use crate::backend::{Backend, Published};

const PAGE: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/view.js");
const STYLE: &str = include_str!("page/view.css");

/// How many recent events a page is shown when it opens (before any arrive live).
pub const RECENT_EVENTS: usize = 100;
/// How often a viewer's board is looked at for queue changes, which publish no event.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How soon after an event the board is sent again (events in one burst share it).
const SETTLE: Duration = Duration::from_millis(100);
/// Messages a viewer's stream holds before it is ended as too slow (the browser reconnects
/// and starts from a fresh board).
const AHEAD: usize = 256;
/// The longest prefix a viewer may filter by.
const MAX_PREFIX: usize = 1024;

/// The web view's settings and what it keeps.
pub struct Web {
    gate: Option<Arc<Gate>>,
    /// At most this many locks on one board (`--web-locks`).
    max_locks: usize,
    /// One permit per open page (`--web-viewers`).
    viewers: Arc<Semaphore>,
    /// The last [`RECENT_EVENTS`] events, for a page that opens.
    recent: Mutex<VecDeque<Arc<Published>>>,
}

impl Web {
    /// A view that logs in through `gate` (none: open), shows at most `max_locks` locks a
    /// board and serves at most `max_viewers` pages at once.
    pub fn new(gate: Option<Arc<Gate>>, max_locks: usize, max_viewers: usize) -> Web {
        Web {
            gate,
            max_locks,
            viewers: Arc::new(Semaphore::new(max_viewers)),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_EVENTS)),
        }
    }

    /// Keeps the recent events of `backend` until `stopping`.
    pub(super) async fn record(self: Arc<Self>, backend: Backend, stopping: CancellationToken) {
        let mut events = backend.subscribe();
        loop {
            let p = tokio::select! {
                _ = stopping.cancelled() => return,
                p = events.recv() => match p {
                    Ok(p) => p,
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return,
                },
            };
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() == RECENT_EVENTS {
                recent.pop_front();
            }
            recent.push_back(p);
        }
    }

    fn recent(&self) -> Vec<Arc<Published>> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.iter().cloned().collect()
    }

    /// Whether `viewer` may read `name` now (a reload of the auth file applies at once).
    fn may_read(&self, viewer: Login, name: &str) -> bool {
        match (viewer, &self.gate) {
            (Login::Open, _) | (_, None) => true,
            (Login::User(user), Some(gate)) => gate.users().may(user, Right::Read, name),
            (Login::Refused, Some(_)) => false,
        }
    }

    /// Whether `viewer` is still a user of the file (a reload may have removed it).
    fn still_there(&self, viewer: Login) -> bool {
        match (viewer, &self.gate) {
            (Login::User(user), Some(gate)) => gate.users().name(user).is_some(),
            _ => true,
        }
    }
}

/// A request the view does not answer, and why.
#[derive(Debug)]
pub(super) struct Refusal {
    status: StatusCode,
    why: &'static str,
}

impl Refusal {
    const LOGIN: Refusal = Refusal {
        status: StatusCode::UNAUTHORIZED,
        why: "log in as a user of lockd's --auth-file",
    };
    const NOT_FOUND: Refusal = Refusal {
        status: StatusCode::NOT_FOUND,
        why: "not found",
    };
    const STARTING: Refusal = Refusal {
        status: StatusCode::SERVICE_UNAVAILABLE,
        why: "starting",
    };

    fn bad(why: &'static str) -> Refusal {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            why,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut refused = text(self.status, format!("{}\n", self.why));
        if self.status == StatusCode::UNAUTHORIZED {
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"lockd\", charset=\"UTF-8\""),
            );
        }
        refused
    }
}

/// Who asks, or a refusal: 401 with a Basic challenge, after the same pause as a failed
/// AUTH, so secrets can't be tried quickly.
async fn viewer(web: &Web, headers: &HeaderMap) -> Result<Login, Refusal> {
    match login(web.gate.as_deref(), headers) {
        Login::Refused => {
            tokio::time::sleep(crate::AUTH_FAILURE_DELAY).await;
            Err(Refusal::LOGIN)
        }
        viewer => Ok(viewer),
    }
}

/// The prefix of `?prefix=<p>` (a trailing `*` allowed, as in `STATUS <prefix>*`).
fn prefix(query: Option<&str>) -> Result<Option<String>, Refusal> {
    let bad = Refusal::bad;
    let Some(value) = query
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("prefix="))
    else {
        return Ok(None);
    };
    if value.len() > MAX_PREFIX * 3 {
        return Err(bad("the prefix is too long"));
    }
    let decoded =
        percent_decode(value).ok_or_else(|| bad("the prefix is not percent-encoded UTF-8"))?;
    let decoded = decoded.strip_suffix('*').unwrap_or(&decoded).to_string();
    if decoded.len() > MAX_PREFIX {
        return Err(bad("the prefix is too long"));
    }
    Ok((!decoded.is_empty()).then_some(decoded))
}

/// `%XX` escapes and `+` (a space, as forms send it) decoded.
fn percent_decode(value: &str) -> Option<String> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // Nothing from elsewhere: no CDN, no inline script, not in a frame.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn web(ep: &Endpoint) -> Result<&Arc<Web>, Refusal> {
    ep.web.as_ref().ok_or(Refusal::NOT_FOUND)
}

/// `/`: the page.
pub(super) async fn page(State(ep): State<Endpoint>, headers: HeaderMap) -> Response {
    asset_for(&ep, &headers, "text/html; charset=utf-8", PAGE).await
}

/// `/view.js`: the page's script.
pub(super) async fn script(State(ep): State<Endpoint>, headers: HeaderMap) -> Response {
    asset_for(&ep, &headers, "text/javascript; charset=utf-8", SCRIPT).await
}

/// `/view.css`: the page's style.
pub(super) async fn style(State(ep): State<Endpoint>, headers: HeaderMap) -> Response {
    asset_for(&ep, &headers, "text/css; charset=utf-8", STYLE).await
}

async fn asset_for(
    ep: &Endpoint,
    headers: &HeaderMap,
    content_type: &'static str,
    body: &'static str,
) -> Response {
    let web = match web(ep) {
        Ok(web) => web,
        Err(refused) => return refused.into_response(),
    };
    match viewer(web, headers).await {
        Ok(_) => asset(content_type, body),
        Err(refused) => refused.into_response(),
    }
}

/// `/locks[?prefix=p]`: the board once, as JSON.
pub(super) async fn locks(viewing: Viewing) -> Response {
    match viewing.board().await {
        Ok(b) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            b.json.to_string(),
        )
            .into_response(),
        Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// One viewer's look at the locks: who, through which filter, of which backend. Taken from
/// a request (its login and `?prefix=`), or refused.
pub(super) struct Viewing {
    web: Arc<Web>,
    viewer: Login,
    prefix: Option<String>,
    backend: Backend,
}

impl FromRequestParts<Endpoint> for Viewing {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, ep: &Endpoint) -> Result<Viewing, Refusal> {
        Viewing::open(ep, &parts.headers, parts.uri.query()).await
    }
}

impl Viewing {
    /// What every data route needs: the view, the logged-in viewer, its prefix, the backend.
    async fn open(
        ep: &Endpoint,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Viewing, Refusal> {
        let web = web(ep)?;
        let viewer = viewer(web, headers).await?;
        let prefix = prefix(query)?;
        let backend = ep.backend().ok_or(Refusal::STARTING)?;
        Ok(Viewing {
            web: Arc::clone(web),
            viewer,
            prefix,
            backend: backend.clone(),
        })
    }

    /// Whether the viewer is shown `name`.
    fn shows(&self, name: &str) -> bool {
        let prefix = self.prefix.as_deref();
        prefix.is_none_or(|p| name.starts_with(p)) && self.web.may_read(self.viewer, name)
    }

    /// The board this viewer is shown.
    async fn board(&self) -> Result<board::Board, String> {
        let may_read = |name: &str| self.web.may_read(self.viewer, name);
        let filter = Filter {
            prefix: self.prefix.as_deref(),
            may_read: &may_read,
        };
        board::board(&self.backend, &filter, self.web.max_locks).await
    }
}

/// `/events[?prefix=p]`: the live stream of one page (see the module's comment).
pub(super) async fn events(State(ep): State<Endpoint>, viewing: Viewing) -> Response {
    let Ok(permit) = Arc::clone(&viewing.web.viewers).try_acquire_owned() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many pages open at once (--web-viewers)\n",
        );
    };
    let (tx, rx) = mpsc::channel(AHEAD);
    let feed = Feed { viewing, tx };
    let stopping = ep.stopping.clone();
    tokio::spawn(async move {
        let _permit = permit;
        feed.run(stopping).await;
    });
    let mut stream = Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response();
    stream
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    stream
}

/// One page's stream: events as they come, the board when it changed.
struct Feed {
    viewing: Viewing,
    tx: mpsc::Sender<Result<Event, Infallible>>,
}

impl Feed {
    async fn run(self, stopping: CancellationToken) {
        // Subscribed before the first board, so nothing falls between the two.
        let mut events = self.viewing.backend.subscribe();
        let reconnect = Event::default()
            .retry(Duration::from_secs(1))
            .comment("lockd");
        if !self.send(reconnect) {
            return;
        }
        for p in self.viewing.web.recent() {
            if self.viewing.shows(&p.event.name) && !self.send_event("lock", board::event(&p)) {
                return;
            }
        }
        let mut shown: Option<u64> = None;
        let mut due = Some(Instant::now());
        let mut look = tokio::time::interval(LOOK_EVERY);
        look.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let settle = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.tx.closed() => return,
                () = stopping.cancelled() => return,
                p = events.recv() => match p {
                    Ok(p) => {
                        if self.viewing.shows(&p.event.name) {
                            if !self.send_event("lock", board::event(&p)) {
                                return;
                            }
                            due.get_or_insert_with(|| Instant::now() + SETTLE);
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        if !self.send_event("lagged", json!({ "missed": missed })) {
                            return;
                        }
                        due.get_or_insert_with(Instant::now);
                    }
                    Err(RecvError::Closed) => return,
                },
                () = settle => {
                    due = None;
                    if !self.board(&mut shown).await {
                        return;
                    }
                }
                _ = look.tick() => {
                    if !self.viewing.web.still_there(self.viewing.viewer) || !self.board(&mut shown).await {
                        return;
                    }
                }
            }
        }
    }

    /// Sends the board if it differs from the one `shown` last; false once the page is gone.
    async fn board(&self, shown: &mut Option<u64>) -> bool {
        match self.viewing.board().await {
            Ok(b) if *shown == Some(b.shape) => true,
            Ok(b) => {
                *shown = Some(b.shape);
                self.send_event("state", b.json)
            }
            Err(why) => {
                *shown = None;
                self.send_event("unavailable", json!({ "why": why }))
            }
        }
    }

    fn send_event(&self, kind: &str, data: Value) -> bool {
        self.send(Event::default().event(kind).data(data.to_string()))
    }

    /// Queues `event`; false when the page is gone or too far behind (its stream then ends
    /// and the browser starts again from a fresh board).
    fn send(&self, event: Event) -> bool {
        self.tx.try_send(Ok(event)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_prefix_of_the_query() {
        let p = |q: &str| prefix(Some(q)).ok().flatten();
        assert_eq!(p("prefix=deploy%2F"), Some("deploy/".into()));
        assert_eq!(p("x=1&prefix=deploy/*"), Some("deploy/".into()));
        assert_eq!(p("prefix=a+b%2a"), Some("a b".into()));
        assert_eq!(p("prefix="), None);
        assert_eq!(p("other=1"), None);
        assert!(prefix(Some("prefix=%zz")).is_err());
        assert!(prefix(Some("prefix=%ff")).is_err());
        assert!(prefix(Some(&format!("prefix={}", "a".repeat(MAX_PREFIX + 1)))).is_err());
        assert_eq!(prefix(None).ok().flatten(), None);
    }
}
