//! What this front-end knows of BREAKs: who is breaking which lease through it (for the
//! markers of their ends), and why a token is not held (a BREAK's record in etcd says so).

use crate::backend::BackendError;
use crate::locks::{Origin, TableError, Token};

use super::breaking;
use super::Cluster;

impl Cluster {
    /// `result` of a request about lease `token` of `name`, a `NotHeld` refusal told as a
    /// BREAK's while its record says so (its holder hears who broke it, as from one server).
    pub(super) async fn explained<T>(
        &self,
        name: &str,
        token: Token,
        result: Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        match result {
            Err(BackendError::Table(TableError::NotHeld)) => {
                Err(Box::pin(self.why_not_held(name, token)).await)
            }
            other => other,
        }
    }

    /// Why `token` is not a live lease of `name`: `Broken` while its record says so (read
    /// from etcd: the BREAK may have come through another front-end), else `NotHeld`
    /// ([`breaking::broken_record`]).
    pub async fn why_not_held(&self, name: &str, token: Token) -> BackendError {
        let Ok(resp) = self.get(self.layout.broken(name, token), None).await else {
            return TableError::NotHeld.into();
        };
        match breaking::broken_record(resp.kvs(), self.wall_ms()) {
            Some(b) => TableError::Broken {
                token,
                by: b.by.as_str().into(),
                at_unix_ms: b.at_ms,
            }
            .into(),
            None => TableError::NotHeld.into(),
        }
    }

    /// Who is breaking the holder of create revision `rev` through this front-end, if a
    /// BREAK is.
    pub(super) fn breaker(&self, rev: i64) -> Origin {
        self.breaker_where(|r, _| r == rev)
    }

    /// The same, by the lease's token.
    pub(super) fn breaker_of(&self, token: Token) -> Origin {
        self.breaker_where(|_, t| t == token)
    }

    fn breaker_where(&self, this: impl Fn(i64, Token) -> bool) -> Origin {
        self.breaking_guard()
            .iter()
            .find(|(rev, token, _)| this(*rev, *token))
            .map(|(_, _, by)| by.clone())
            .unwrap_or_default()
    }

    pub(super) fn breaking_guard(&self) -> std::sync::MutexGuard<'_, Vec<(i64, Token, Origin)>> {
        self.breaking
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
