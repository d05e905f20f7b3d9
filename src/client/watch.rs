//! WATCH as a stream of typed events: [`Client::events`] gives the connection over to the
//! watch, and [`Events::next`] returns each event as it comes.
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let addr = listener.local_addr()?.to_string();
//! # let stop = tokio_util::sync::CancellationToken::new();
//! # tokio::spawn(lockd::server::run(Default::default(), listener, stop.clone()));
//! use lockd::client::Client;
//! use lockd::locks::EventKind;
//! use lockd::proto::Tie;
//!
//! let mut events = Client::connect(&addr).await?.events(Some("deploy")).await?;
//! let mut other = Client::connect(&addr).await?;
//! let token = other.lock("deploy", "web-1", None, None, Tie::Plain).await?;
//! let event = events.next().await?;
//! assert_eq!((event.kind, event.id.as_str(), event.token), (EventKind::Acquired, "web-1", token));
//! # stop.cancel();
//! # Ok(()) }
//! ```

use super::{Client, ClientError, Result};
use crate::proto::EventLine;

/// A watching connection: nothing else is asked on it.
pub struct Events {
    client: Client,
}

impl Client {
    /// WATCH `name` (every name with `None`), confirmed by the server, then the events
    /// through [`Events::next`].
    pub async fn events(mut self, name: Option<&str>) -> Result<Events> {
        self.watch(name).await?;
        Ok(Events { client: self })
    }
}

impl Events {
    /// The next event. An `ERR` (`LAGGED`: this watcher fell behind; `SHUTDOWN`; a right taken
    /// away) or a closed connection ends the watch; a line this client cannot read (a newer
    /// server's event) is [`ClientError::Unexpected`], after which the watch goes on.
    pub async fn next(&mut self) -> Result<EventLine> {
        match self.client.next_event().await? {
            Ok(event) => Ok(event),
            Err(bad) => Err(ClientError::Unexpected(bad.0)),
        }
    }

    /// The connection back (still watching).
    pub fn into_client(self) -> Client {
        self.client
    }
}
