//! Where a waiter of this front-end is in its wait, as one value: which request of it is out,
//! and so which answer decides what comes next. Every change of a waiter's phase is a method
//! here; the rest of the backend asks it questions (may it be granted now? is it settled by
//! an answer still to come?) and never sets its parts by hand.
//!
//! A waiter's requests can overlap: its wait may run out while this front-end's grant of it
//! is out, and another front-end may grant it (on this one's etcd lease) while its own key's
//! write or this front-end's grant is still out. etcd orders them all; the phase remembers
//! the one whose answer decides, and what it goes back to if etcd says another came first.

/// The phase of a waiter of this front-end (see the module's comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    /// Its key's write (a put, or the takeover of an older request's key) is out: until the
    /// answer says which key is its own, a grant tried now would use the wrong one.
    Writing,
    /// In the queue, nothing of it out. `failed_at`: the name's last change when this
    /// front-end's grant of it last failed its guards; it is not tried again before the name
    /// changes.
    Queued { failed_at: Option<i64> },
    /// This front-end's grant of it is out, tried at the name's last change `at`.
    Granting { at: i64 },
    /// Granted by another front-end on this one's etcd lease, being confirmed
    /// (`Cluster::confirm`): `writes` is the holder's value the confirmation writes, by which
    /// the watch tells that write when its answer is late or lost.
    Confirming { writes: String },
    /// Its `wait=` ran out and the write taking its place out is on its way
    /// (`Cluster::wait_over`): that answer says how the wait ends, so nothing else grants it
    /// or ends it meanwhile. `before`: where it was, and goes back to if a grant came first.
    Leaving { before: Box<Phase> },
}

impl Phase {
    /// Its key's write was answered: it waits in the queue (unless a grant made meanwhile by
    /// another front-end is being confirmed).
    pub(super) fn written(&mut self) {
        if *self == Phase::Writing {
            *self = Phase::Queued { failed_at: None };
        }
    }

    /// Whether nothing of it is out: the watch, a read or a cut-off link may end its wait.
    /// Otherwise the answer still to come decides.
    pub(super) fn settled(&self) -> bool {
        matches!(self, Phase::Queued { .. })
    }

    /// Tries this front-end's grant of it if it may be tried now, the name's last change
    /// being `last_rev`: it is in the queue, and no grant of it failed since the name last
    /// changed. Whether it was.
    pub(super) fn try_grant(&mut self, last_rev: i64) -> bool {
        match self {
            Phase::Queued { failed_at } if *failed_at != Some(last_rev) => {
                *self = Phase::Granting { at: last_rev };
                true
            }
            _ => false,
        }
    }

    /// This front-end's grant of it failed: its guards (`unreachable` false; not tried again
    /// before the name changes) or etcd did not answer (tried again after a pause). Whether
    /// the name, whose last change is now `last_rev`, should be looked at again now.
    pub(super) fn grant_failed(&mut self, unreachable: bool, last_rev: i64) -> bool {
        match self {
            Phase::Granting { at } => {
                let failed_at = (!unreachable).then_some(*at);
                *self = Phase::Queued { failed_at };
                failed_at != Some(last_rev)
            }
            Phase::Leaving { before } => before.grant_failed(unreachable, last_rev),
            // (A grant by another front-end came first: its confirmation decides.)
            Phase::Confirming { .. } => true,
            Phase::Writing | Phase::Queued { .. } => false,
        }
    }

    /// Another front-end granted it on this one's etcd lease, and its confirmation (none is
    /// out yet) writes `writes`. Its leaving, if it was leaving, is over: the grant came
    /// first, and the confirmation decides.
    pub(super) fn confirm(&mut self, writes: String) {
        debug_assert!(self.confirming().is_none(), "one confirmation at a time");
        *self = Phase::Confirming { writes };
    }

    /// The confirmation's own write, as it was finally encoded.
    pub(super) fn confirms_with(&mut self, value: &str) {
        if let Phase::Confirming { writes } = self {
            value.clone_into(writes);
        }
    }

    /// What its confirmation writes, while one is out.
    pub(super) fn confirming(&self) -> Option<&str> {
        match self {
            Phase::Confirming { writes } => Some(writes),
            _ => None,
        }
    }

    /// Its `wait=` ran out. Whether the write taking its place out is to be sent: not while
    /// a grant of it is being confirmed (that grant came first; the confirmation decides),
    /// nor twice.
    pub(super) fn leave(&mut self) -> bool {
        if matches!(self, Phase::Confirming { .. } | Phase::Leaving { .. }) {
            return false;
        }
        let before = std::mem::replace(self, Phase::Writing);
        *self = Phase::Leaving {
            before: Box::new(before),
        };
        true
    }

    /// The write taking its place out found it granted, or taken over, first: it is back
    /// where it was, and that grant's answer, the watch or its confirmation decides.
    pub(super) fn stays(&mut self) {
        if let Phase::Leaving { before } = self {
            let before = std::mem::replace(&mut **before, Phase::Writing);
            *self = before;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Phase;

    fn queued() -> Phase {
        let mut p = Phase::Writing;
        p.written();
        p
    }

    #[test]
    fn a_waiter_is_granted_once_written_and_not_twice_at_once() {
        let mut p = Phase::Writing;
        assert!(!p.try_grant(5), "not before its write is answered");
        p.written();
        assert!(p.settled());
        assert!(p.try_grant(5));
        assert!(!p.try_grant(5), "one grant out at a time");
        assert!(!p.settled());
    }

    #[test]
    fn a_failed_grant_waits_for_the_name_to_change_and_an_unanswered_one_does_not() {
        let mut p = queued();
        assert!(p.try_grant(5));
        assert!(!p.grant_failed(false, 5));
        assert!(!p.try_grant(5), "the name did not change");
        assert!(p.try_grant(6));
        assert!(p.grant_failed(true, 6));
        assert!(p.try_grant(6), "etcd did not answer: tried again");
    }

    #[test]
    fn a_wait_that_runs_out_during_a_grant_goes_back_to_it_when_the_grant_came_first() {
        let mut p = queued();
        assert!(p.try_grant(5));
        assert!(p.leave());
        assert!(!p.leave(), "one leaving write");
        assert!(!p.settled());
        p.stays();
        assert_eq!(p, Phase::Granting { at: 5 });
        // Its grant failed while it was leaving: back in the queue, not tried at 5 again.
        assert!(p.leave());
        assert!(!p.grant_failed(false, 5));
        p.stays();
        assert_eq!(p, Phase::Queued { failed_at: Some(5) });
    }

    #[test]
    fn a_confirmation_wins_over_the_write_the_grant_and_the_leaving() {
        for mut p in [Phase::Writing, queued(), Phase::Granting { at: 3 }] {
            p.confirm("v".into());
            p.written();
            assert!(p.grant_failed(false, 3));
            assert!(!p.leave(), "the grant came first");
            p.stays();
            assert_eq!(p.confirming(), Some("v"));
            assert!(!p.settled());
        }
        let mut p = queued();
        assert!(p.leave());
        p.confirm("v".into());
        p.stays();
        assert_eq!(
            p.confirming(),
            Some("v"),
            "the leaving's answer changes nothing"
        );
    }
}
