//! One connection to the lock or unlock port: read its message within the read timeout,
//! hand it to the owning task, write the answer it decides, close.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::message::{self, Kind, Message};
use crate::backend::Backend;
use crate::locks::{Token, NO_USER};

/// Longest message line accepted, in bytes: `unlock:` + a 255-byte id + `:` + 20 digits fits.
const MAX_MESSAGE: usize = 512;

/// A well-formed message, handed to the owning task; `done` carries what to answer.
pub(super) struct CompatRequest {
    pub kind: Kind,
    pub msg: Message,
    /// The client's address, for the log and the lease's record.
    pub peer: SocketAddr,
    pub done: oneshot::Sender<Answer>,
}

/// What a connection answers.
#[derive(Debug)]
pub(super) enum Answer {
    /// Nothing: close. The lock changed hands before the message arrived; the client retries.
    Nothing,
    /// `oklocked`; if it can't be written, the grant with this token is given back.
    Locked(Token),
    /// `okunlocked`.
    Unlocked,
}

/// What every connection task needs.
#[derive(Clone)]
pub(super) struct ConnCtx {
    pub backend: Backend,
    pub name: Arc<str>,
    pub read_timeout: Duration,
    pub requests: mpsc::Sender<CompatRequest>,
    pub shutdown: CancellationToken,
}

/// One connection: read its message, have the owning task act on it, answer, close.
pub(super) async fn serve(mut stream: TcpStream, peer: SocketAddr, kind: Kind, ctx: ConnCtx) {
    let shutdown = ctx.shutdown.clone();
    tokio::select! {
        _ = handle(&mut stream, peer, kind, &ctx) => {}
        _ = shutdown.cancelled() => {}
    }
}

async fn handle(stream: &mut TcpStream, peer: SocketAddr, kind: Kind, ctx: &ConnCtx) {
    let msg = match read_line(stream, ctx.read_timeout).await {
        Ok(line) => match message::parse(kind, &line) {
            Some(msg) => msg,
            None => {
                let text = String::from_utf8_lossy(&line);
                tracing::info!(%peer, line = %text.escape_debug(), "not {} message", kind.with_article());
                return;
            }
        },
        Err(why) => {
            tracing::info!(%peer, "not {} message ({why})", kind.with_article());
            return;
        }
    };
    let (done, answer) = oneshot::channel();
    if ctx
        .requests
        .send(CompatRequest {
            kind,
            msg,
            peer,
            done,
        })
        .await
        .is_err()
    {
        return;
    }
    // With --data-dir, the change is on disk before the answer says it was made (the backend
    // returns once it is), as on the line protocol; if it never will be (the store failed),
    // the client hears nothing.
    match answer.await {
        Ok(Answer::Locked(token)) => {
            if write_reply(stream, b"oklocked\n", ctx.read_timeout)
                .await
                .is_err()
            {
                // The client never learned it holds the lock: give it back at once.
                tracing::info!(%peer, "could not answer oklocked; releasing the lock");
                let _ = ctx.backend.unlock(&ctx.name, token, NO_USER).await;
                return;
            }
        }
        Ok(Answer::Unlocked) => {
            let _ = write_reply(stream, b"okunlocked\n", ctx.read_timeout).await;
        }
        Ok(Answer::Nothing) | Err(_) => return,
    }
    linger(stream, ctx.read_timeout).await;
}

/// Reads one line (without its `\n`; a last line ended by the client closing counts too).
/// The error says why there is no line, for the log.
async fn read_line(stream: &mut TcpStream, timeout: Duration) -> Result<Vec<u8>, &'static str> {
    let mut line = Vec::new();
    let mut reader = BufReader::new((&mut *stream).take(MAX_MESSAGE as u64 + 1));
    let read = reader.read_until(b'\n', &mut line);
    match tokio::time::timeout(timeout, read).await {
        Err(_) => Err("nothing sent in time"),
        Ok(Err(_)) => Err("read error"),
        Ok(Ok(0)) => Err("empty connection"),
        Ok(Ok(_)) => match line.strip_suffix(b"\n") {
            Some(l) => Ok(l.to_vec()),
            None if line.len() > MAX_MESSAGE => Err("line too long"),
            None => Ok(line),
        },
    }
}

async fn write_reply(stream: &mut TcpStream, reply: &[u8], timeout: Duration) -> io::Result<()> {
    tokio::time::timeout(timeout, stream.write_all(reply))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// Ends the connection after a reply: half-closes so the client's netcat sees the end at once
/// and exits, then reads until it closes its side. Closing with unread input would reset the
/// connection instead, and a reset can make the client drop a reply it has not read yet.
async fn linger(stream: &mut TcpStream, timeout: Duration) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 256];
    let drain = async {
        let mut left = 64 * 1024usize;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(timeout, drain).await;
}
