//! Unit tests of `mirror.rs`: the front-ends' own keys (`fe/<id>`) as the mirror shows them.

use super::*;
use crate::backend::etcd::keys::Layout;
use crate::backend::etcd::stepping::{del, put};

/// A front-end whose key does not say its keys are in slots is of an older lockd: the watch
/// says so in the log.
#[test]
fn a_front_end_of_an_older_lockd_is_told_apart() {
    let l = Layout::new("/p/");
    let mut m = Mirror::default();
    let a = m.apply(
        &l,
        &[
            put(l.front_end("new"), FRONT_END_VALUE.into(), 2, 2),
            put(l.front_end("old"), String::new(), 3, 3),
        ],
        3,
        Instant::now(),
        0,
    );
    assert_eq!(a.older_front_ends, vec!["old".to_owned()]);
    assert_eq!(m.front_ends.len(), 2);
}

/// A front-end's own key is gone only once the mirror has applied its last put and shows
/// no key: a put not seen yet is no key gone.
#[test]
fn a_registration_is_gone_once_the_mirror_caught_up_with_its_put_and_shows_no_key() {
    let l = Layout::new("/p/");
    let mut m = Mirror::default();
    assert!(!m.registration_gone("a", 0), "never put");
    m.apply(
        &l,
        &[put(l.front_end("a"), FRONT_END_VALUE.into(), 2, 2)],
        2,
        Instant::now(),
        0,
    );
    assert!(!m.registration_gone("a", 2));
    // Put again at 5, not seen yet; then seen, then deleted (its etcd lease lapsed).
    assert!(!m.registration_gone("a", 5));
    m.apply(
        &l,
        &[put(l.front_end("a"), FRONT_END_VALUE.into(), 2, 5)],
        5,
        Instant::now(),
        0,
    );
    assert!(!m.registration_gone("a", 5));
    m.apply(&l, &[del(l.front_end("a"), 7)], 7, Instant::now(), 0);
    assert!(m.registration_gone("a", 5));
    assert!(
        !m.registration_gone("a", 9),
        "a put after the delete, not seen yet"
    );
}
