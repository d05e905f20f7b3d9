//! HTTP Basic authentication against `--auth-file`'s users: the web view's login.
//!
//! The same users, secrets and `read=` rights as the line protocol's AUTH, so an operator
//! keeps one file. A browser asks for the user and secret once and sends them with every
//! request of the page, its event stream too.

use axum::http::{header, HeaderMap};

use crate::auth::Gate;
use crate::locks::UserId;

/// Who asked, as the `Authorization` header proves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Login {
    /// No `--auth-file`: everyone may read every name, as STATUS allows.
    Open,
    /// A user of the file, by its secret.
    User(UserId),
    /// No credentials, credentials not in Basic form, or a wrong user or secret.
    Refused,
}

/// Checks `headers` against the users `gate` has now (a reload applies to the next request).
pub fn login(gate: Option<&Gate>, headers: &HeaderMap) -> Login {
    let Some(gate) = gate else {
        return Login::Open;
    };
    let credentials = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(credentials);
    match credentials {
        Some((user, secret)) => match gate.users().authenticate(&user, &secret) {
            Some(id) => Login::User(id),
            None => Login::Refused,
        },
        None => Login::Refused,
    }
}

/// `user` and `secret` of an `Authorization: Basic <base64 of user:secret>` value.
fn credentials(value: &str) -> Option<(String, String)> {
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(base64_decode(encoded.trim())?).ok()?;
    let (user, secret) = decoded.split_once(':')?;
    Some((user.to_string(), secret.to_string()))
}

/// Standard base64 with padding (RFC 4648), as browsers send Basic credentials; `None` for
/// anything else. Bounded by the header's own size limit.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (i, quad) in bytes.chunks(4).enumerate() {
        let last = i + 1 == bytes.len() / 4;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            n = n << 6 | value(c)?;
        }
        n <<= 6 * pad as u32;
        let [_, a, b, c] = n.to_be_bytes();
        out.extend_from_slice(&[a, b, c][..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_basic_credentials() {
        // "alice:s3cret:with:colons" (a secret may hold colons; a user may not).
        let v = "Basic YWxpY2U6czNjcmV0OndpdGg6Y29sb25z";
        assert_eq!(
            credentials(v),
            Some(("alice".into(), "s3cret:with:colons".into()))
        );
        assert_eq!(credentials("basic YTpi"), Some(("a".into(), "b".into())));
        assert_eq!(base64_decode("YQ=="), Some(b"a".to_vec()));
        assert_eq!(base64_decode("YWI="), Some(b"ab".to_vec()));
        assert_eq!(base64_decode(""), Some(Vec::new()));
    }

    #[test]
    fn refuses_what_is_not_basic_base64() {
        assert_eq!(credentials("Bearer YTpi"), None);
        assert_eq!(credentials("Basic YTpi="), None);
        assert_eq!(credentials("Basic Y=pi"), None);
        assert_eq!(credentials("Basic YQ==YQ=="), None);
        assert_eq!(credentials("Basic ****"), None);
        // No colon: not user:secret.
        assert_eq!(credentials("Basic YWxpY2U="), None);
        assert_eq!(credentials("Basic"), None);
    }
}
