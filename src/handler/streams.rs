//! The two answers that stream: STATUS of every lock, and WATCH.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;

use crate::auth::Right;
use crate::backend::Published;
use crate::connection::{Frame, WRITE_CHUNK};
use crate::proto::{self, ProtoError, Reply};

use super::{reloaded, Flow, Handler};

impl Handler {
    /// STATUS of every lock: streamed from a snapshot shared with other STATUS requests, a
    /// [`WRITE_CHUNK`] at a time, so a client that does not read holds a reference to the
    /// snapshot and a bounded buffer, never a copy of its own.
    pub(super) async fn status_all(&mut self, pattern: Option<String>) -> io::Result<Flow> {
        let backend = self.backend.clone();
        let view = tokio::select! {
            view = backend.status_snapshot() => match view {
                Ok(view) => view,
                Err(e) => {
                    self.refuse(e.refusal("")).await?;
                    return Ok(Flow::Continue);
                }
            },
            _ = self.shutdown.cancelled() => {
                self.refuse(ProtoError::shutdown()).await?;
                return Ok(Flow::Close);
            }
        };
        // With an auth file, only the names the user may read: filtered as they are sent, so
        // the snapshot stays shared.
        let mut shown = 0;
        let covered = |name: &str| pattern.as_deref().is_none_or(|p| proto::covers(p, name));
        for status in view.iter() {
            if covered(&status.name) && self.may(Right::Read, &status.name) {
                self.conn.queue(Reply::Info(&status)).await?;
                shown += 1;
            }
        }
        // In cluster mode, how old the view may be (proto.md, STATUS).
        let confirmed = self.backend.view_age();
        self.conn.queue(Reply::summary(shown, confirmed)).await?;
        Ok(Flow::Continue)
    }

    /// Streams events until the client or the server ends it.
    ///
    /// Events are taken from the broadcast as they come, whether or not the client reads, so
    /// falling behind is noticed while a write is stuck: more than `--watch-buffer` events not
    /// yet handed to the connection is `ERR LAGGED` and the end of the connection. Meanwhile
    /// at most a [`WRITE_CHUNK`] is formatted ahead, and the write timeout applies.
    pub(super) async fn watch(&mut self, name: Option<String>) -> io::Result<Flow> {
        let mut events = self.backend.subscribe();
        let _counted = self.backend.metrics().watcher();
        self.conn.push(Reply::Watching(name.as_deref()));
        let mut behind: VecDeque<Arc<Published>> = VecDeque::new();
        loop {
            while self.conn.unsent() < WRITE_CHUNK {
                let Some(p) = behind.pop_front() else { break };
                self.conn.push(Reply::Event(&p.event, p.unix_ms));
            }
            let lag = tokio::select! {
                event = events.recv() => match event {
                    Ok(p) => {
                        // Rights as they are now: a reload may have changed them.
                        if name.as_deref().is_none_or(|n| proto::covers(n, &p.event.name))
                            && self.may(Right::Read, &p.event.name)
                        {
                            behind.push_back(p);
                        }
                        (behind.len() > self.limits.watch_buffer).then_some(behind.len() as u64)
                    }
                    Err(RecvError::Lagged(missed)) => Some(behind.len() as u64 + missed),
                    Err(RecvError::Closed) => return Ok(Flow::Close),
                },
                pumped = self.conn.pump(true) => {
                    pumped?;
                    // A watch connection only streams; QUIT (or a bad line) ends it.
                    while let Some(frame) = self.conn.next_frame() {
                        match frame {
                            Frame::Eof => break,
                            Frame::Line(line) if line.trim().eq_ignore_ascii_case("quit") => {
                                self.conn.push(Reply::Bye);
                                return Ok(Flow::Close);
                            }
                            Frame::TooLong => {
                                self.push_refusal(ProtoError::too_long(self.limits.max_line));
                                return Ok(Flow::Close);
                            }
                            Frame::Line(_) | Frame::BadUtf8 => {}
                        }
                    }
                    None
                }
                _ = self.shutdown.cancelled() => {
                    self.push_refusal(ProtoError::shutdown());
                    return Ok(Flow::Close);
                }
                () = reloaded(&mut self.login) => {
                    if let Some(e) = self.removed() {
                        self.push_refusal(e);
                        return Ok(Flow::Close);
                    }
                    None
                }
            };
            if let Some(behind) = lag {
                self.backend.metrics().watcher_lagged();
                self.push_refusal(ProtoError::lagged(behind));
                return Ok(Flow::Close);
            }
        }
    }
}
