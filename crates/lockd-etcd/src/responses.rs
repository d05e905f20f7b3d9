//! What etcd's answers say, read through the accessors the backend was written against
//! (`kvs()`, `events()`, `revision()`, ...): the messages are the generated ones, the method
//! names those of the client lockd used before.

use super::{
    Event, EventType, GetResponse, KeyValue, LeaseGrantResponse, LeaseKeepAliveResponse,
    ResponseHeader, WatchResponse,
};

impl GetResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
}

impl LeaseGrantResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    pub fn id(&self) -> i64 {
        self.id
    }
}

impl LeaseKeepAliveResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// The lease's new time to live in seconds; 0 or less: etcd has no such lease.
    pub fn ttl(&self) -> i64 {
        self.ttl
    }
}

impl WatchResponse {
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    pub fn canceled(&self) -> bool {
        self.canceled
    }

    /// Non-zero when the watch asked for a revision that was compacted away (the oldest one
    /// still there); the watch is cancelled then.
    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }

    pub fn cancel_reason(&self) -> &str {
        &self.cancel_reason
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

impl Event {
    pub fn event_type(&self) -> EventType {
        self.r#type()
    }

    /// The key as the event left it (for a delete: the key and the revision of the delete).
    pub fn kv(&self) -> Option<&KeyValue> {
        self.kv.as_ref()
    }
}

impl KeyValue {
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn value(&self) -> &[u8] {
        &self.value
    }

    pub fn value_str(&self) -> Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(&self.value)
    }

    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }

    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }

    pub fn lease(&self) -> i64 {
        self.lease
    }
}

impl ResponseHeader {
    /// The store's revision when the request was served.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}
