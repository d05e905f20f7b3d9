//! A holder's fencing token in cluster mode, from its key's create revision and its slot:
//! pure, no I/O.
//!
//! A token is the prefix's base (chosen once, `P meta/base`, from the wall clock as the
//! embedded backend starts its tokens) plus a number that grows with the holder key's create
//! revision. etcd gives every key one transaction writes one revision, so with tokens of
//! `base + revision` (the plain form, a prefix an older lockd started) two grants could never
//! share a transaction, and group commit carried at most one grant per round to etcd. A
//! prefix this version starts is dense: each revision has [`PER_REVISION`] tokens, `base +
//! revision * 128 + the slot's number mod 128` (a slot is `<fe>.<n>`, `slots.rs`), and group
//! commit keeps two grants whose slots share that number out of one transaction
//! (`footprints.rs`). So every grant's token still differs from every other's, and tokens
//! still rise with every grant across names: a later transaction's revision is larger, and
//! `revision * 128` outgrows any slot's part. A set's keys share a slot and a transaction:
//! one token, as before. Every front-end derives the same token from the key alone.
//!
//! The base key says which form (`base=<n> per_revision=128`; an older lockd, which reads a
//! bare number only, refuses to start on such a prefix rather than hand out tokens of the
//! plain form below the dense ones). A holder created before the base key last changed keeps
//! the plain form, whatever the key says now.

use crate::locks::Token;

/// Tokens per revision on a dense prefix: etcd's bound on a transaction's operations, so a
/// transaction can never hold more grants than that.
pub const PER_REVISION: u64 = 128;

/// How this prefix makes tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub base: Token,
    /// Dense for holders created after this revision (the base key's mod revision).
    dense_after: Option<i64>,
}

impl Tokens {
    /// Tokens of an older lockd's prefix: `base` plus the revision.
    #[cfg(test)]
    pub fn plain(base: Token) -> Tokens {
        Tokens {
            base,
            dense_after: None,
        }
    }

    /// The base key's value for a prefix this front-end starts: dense from its first grant.
    pub fn fresh_value(base: Token) -> String {
        format!("base={base} per_revision={PER_REVISION}")
    }

    /// The base key's value (a bare number: plain, an older lockd's), written at `mod_rev`.
    pub fn parse(value: &[u8], mod_rev: i64) -> Option<Tokens> {
        let text = std::str::from_utf8(value).ok()?;
        if let Ok(base) = text.parse() {
            return Some(Tokens {
                base,
                dense_after: None,
            });
        }
        let mut base = None;
        let mut dense = false;
        for word in text.split(' ') {
            match word.split_once('=')? {
                ("base", n) => base = Some(n.parse().ok()?),
                ("per_revision", n) => dense = n.parse::<u64>().ok()? == PER_REVISION,
                _ => {}
            }
        }
        Some(Tokens {
            base: base?,
            dense_after: dense.then_some(mod_rev),
        })
    }

    /// Whether grants made from now on are dense.
    pub fn dense(&self) -> bool {
        self.dense_after.is_some()
    }

    /// Whether a grant created at revision `rev` is dense.
    pub fn dense_at(&self, rev: i64) -> bool {
        self.dense_after.is_some_and(|after| rev > after)
    }

    /// The part of a dense token a slot gives: the number of `<fe>.<n>` mod [`PER_REVISION`]
    /// (0 for a slot of another shape). Two grants with one part never share a transaction.
    pub fn part(slot: &str) -> u64 {
        slot.rsplit_once('.')
            .and_then(|(_, n)| n.parse::<u64>().ok())
            .map_or(0, |n| n % PER_REVISION)
    }

    /// The token of a holder created at `rev` in `slot`.
    pub fn of(&self, rev: i64, slot: &str) -> Token {
        let rev = rev.max(0) as Token;
        if self.dense_at(rev as i64) {
            self.base
                .saturating_add(rev.saturating_mul(PER_REVISION))
                .saturating_add(Tokens::part(slot))
        } else {
            self.base.saturating_add(rev)
        }
    }

    /// The create revision a token stands for, if it can be one of this prefix's: the
    /// holder it names is the one created then whose [`Tokens::of`] is `token` (a dense
    /// revision has several).
    pub fn rev_of(&self, token: Token) -> Option<i64> {
        let n = token.checked_sub(self.base).filter(|n| *n > 0)?;
        let rev = match self.dense_after {
            Some(after) if n > after.max(0) as Token => n / PER_REVISION,
            _ => n,
        };
        i64::try_from(rev)
            .ok()
            .filter(|r| self.dense_at(*r) == (rev != n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(base: Token, after: i64) -> Tokens {
        Tokens::parse(Tokens::fresh_value(base).as_bytes(), after).expect("dense")
    }

    #[test]
    fn a_bare_number_is_an_older_lockds_plain_base() {
        let plain = Tokens::parse(b"1000", 7).expect("plain");
        assert!(!plain.dense());
        assert_eq!(plain.of(42, "a.3"), 1042);
        assert_eq!(plain.rev_of(1042), Some(42));
        assert_eq!(Tokens::parse(b"x", 7), None);
        assert_eq!(Tokens::parse(b"base=x per_revision=128", 7), None);
    }

    #[test]
    fn dense_tokens_differ_within_a_revision_and_rise_with_it() {
        let t = dense(1000, 5);
        assert_eq!(t.of(6, "a.3"), 1000 + 6 * 128 + 3);
        assert_ne!(t.of(6, "a.3"), t.of(6, "b.4"));
        // Slot 127 of one revision is below slot 0 of the next.
        assert!(t.of(6, "a.127") < t.of(7, "a.128"));
        assert_eq!(Tokens::part("a.129"), 1);
        assert_eq!(Tokens::part("an-older-uid"), 0);
        for (rev, slot) in [(6, "a.3"), (7, "b.127"), (900, "c.0")] {
            assert_eq!(t.rev_of(t.of(rev, slot)), Some(rev));
        }
    }

    #[test]
    fn holders_from_before_the_base_changed_keep_their_plain_tokens() {
        let t = dense(1000, 50);
        assert_eq!(t.of(49, "a.3"), 1049);
        assert_eq!(t.rev_of(1049), Some(49));
        // Every dense token is above every plain one; none stands between.
        assert!(t.of(51, "a.0") > t.of(50, "a.127"));
        assert_eq!(t.rev_of(1000 + 51), None);
        assert_eq!(t.rev_of(1000 + 50 * 128 + 5), None);
        assert_eq!(t.rev_of(999), None);
    }
}
