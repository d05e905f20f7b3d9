//! WATCH as a stream of typed events: [`Client::events`] gives the connection over to the
//! watch, and [`Events::next`] returns each event as it comes.
//!
//! ```no_run
//! # async fn demo() -> lockd::client::Result<()> {
//! use lockd::client::Client;
//! use lockd::locks::EventKind;
//!
//! let client = Client::connect("127.0.0.1:5001").await?;
//! let mut events = client.events(Some("deploy")).await?;
//! while let Ok(event) = events.next().await {
//!     if event.kind == EventKind::Acquired {
//!         println!("{} took {} (token {})", event.id, event.name, event.token);
//!     }
//! }
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
