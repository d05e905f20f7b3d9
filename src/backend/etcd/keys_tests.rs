//! Unit tests of `keys.rs`: the layout.

use super::*;

#[test]
fn keys_round_trip_whatever_the_name_holds() {
    let l = Layout::new("/lockd");
    for name in ["job", "a/b", "100%", "ünï", "x=y z"] {
        let k = l.holder(name, "fe1.7");
        assert_eq!(
            l.parse(k.as_bytes()),
            Some(Key::Holder {
                name: name.into(),
                slot: "fe1.7".into()
            })
        );
        assert_eq!(
            l.parse(l.marker(name).as_bytes()),
            Some(Key::Marker { name: name.into() })
        );
        assert!(k.starts_with(&l.holders(name)));
    }
    assert_eq!(l.parse(b"/other/h/x/y"), None);
    assert_eq!(l.parse(l.base().as_bytes()), Some(Key::Base));
}

#[test]
fn a_name_prefix_never_covers_another_name() {
    let l = Layout::new("/lockd/");
    assert!(!l.holder("ab", "u").starts_with(&l.holders("a")));
}
