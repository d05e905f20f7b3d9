//! The options of a read, a put, a delete, a lease grant and a watch, as the backend gives
//! them (the builders of the client lockd used before), and the etcd requests they make: a
//! prefix becomes etcd's range ([`prefix_end`]).

use super::pb;

/// The end of the range of every key that starts with `key` (etcd's convention: the key with
/// its last byte below 0xff incremented and the rest cut; `\0`, every key, if there is none).
pub(crate) fn prefix_end(key: &[u8]) -> Vec<u8> {
    match key.iter().rposition(|b| *b < 0xff) {
        Some(i) => {
            let mut end = key[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

#[derive(Clone, Debug, Default)]
pub struct GetOptions {
    prefix: bool,
    count_only: bool,
}

impl GetOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key starting with the key given.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// Only the number of keys, not the keys.
    pub fn with_count_only(mut self) -> Self {
        self.count_only = true;
        self
    }

    pub(crate) fn request(self, key: Vec<u8>) -> pb::RangeRequest {
        pb::RangeRequest {
            range_end: if self.prefix {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            count_only: self.count_only,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    lease: i64,
}

impl PutOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key is deleted when this lease ends.
    pub fn with_lease(mut self, lease: i64) -> Self {
        self.lease = lease;
        self
    }

    pub(crate) fn request(self, key: Vec<u8>, value: Vec<u8>) -> pb::PutRequest {
        pb::PutRequest {
            key,
            value,
            lease: self.lease,
        }
    }
}

/// A delete's options: none that lockd needs yet (it deletes one key at a time).
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {}

/// A lease grant's options: none that lockd needs yet (etcd chooses the id).
#[derive(Clone, Debug, Default)]
pub struct LeaseGrantOptions {}

#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    prefix: bool,
    start_revision: i64,
}

impl WatchOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key starting with the key given.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// Events from this revision on (0: from now).
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }

    pub(crate) fn request(self, key: Vec<u8>) -> pb::WatchCreateRequest {
        pb::WatchCreateRequest {
            range_end: if self.prefix {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            start_revision: self.start_revision,
        }
    }
}
