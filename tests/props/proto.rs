//! Properties of the protocol module: no line can make the parser panic or produce a reply of
//! more than one line, and every valid request survives formatting and parsing unchanged.

use std::time::Duration;

use lockd::locks::Mode;
use lockd::proto::{self, Reply, Request, Tie};
use proptest::prelude::*;

/// Words a client may send, valid or not: names, numbers, options, junk and control characters.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9:._-]{1,12}",
        "(ttl|wait|TTL|Wait)=[0-9a-z.]{0,6}",
        Just("session".to_string()),
        "session=[0-9a-z.]{0,6}",
        Just("detach".to_string()),
        Just("shared".to_string()),
        "limit=[0-9a-z]{0,7}",
        "[0-9]{1,25}",
        any::<String>(),
        "\\PC{0,300}",
    ]
}

fn line() -> impl Strategy<Value = String> {
    let command = prop_oneof![
        Just("LOCK"),
        Just("unlock"),
        Just("Renew"),
        Just("CHECK"),
        Just("STATUS"),
        Just("WATCH"),
        Just("PING"),
        Just("HELP"),
        Just("QUIT"),
        Just("FROB"),
        Just(""),
    ];
    (command, prop::collection::vec(word(), 0..6)).prop_map(|(c, words)| {
        let mut line = c.to_string();
        for w in words {
            line.push(' ');
            line.push_str(&w);
        }
        line
    })
}

fn name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9:._/-]{1,40}"
}

fn duration() -> impl Strategy<Value = Duration> {
    (1u64..86_400_000).prop_map(Duration::from_millis)
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (
            name(),
            name(),
            prop::option::of(duration()),
            prop::option::of(prop_oneof![Just(Duration::ZERO), duration()]),
            prop_oneof![
                Just(Tie::Plain),
                Just(Tie::Detach),
                Just(Tie::Session(Duration::ZERO)),
                duration().prop_map(Tie::Session),
            ],
            prop_oneof![
                Just(Mode::Exclusive),
                Just(Mode::Shared),
                (2u32..=proto::MAX_LIMIT).prop_map(Mode::Limit),
            ]
        )
            .prop_map(|(name, id, ttl, wait, tie, mode)| Request::Lock {
                name,
                id,
                ttl,
                wait,
                tie,
                mode
            }),
        (name(), 1u64..u64::MAX).prop_map(|(name, token)| Request::Unlock { name, token }),
        (name(), 1u64..u64::MAX, prop::option::of(duration()))
            .prop_map(|(name, token, ttl)| Request::Renew { name, token, ttl }),
        (name(), 1u64..u64::MAX).prop_map(|(name, token)| Request::Check { name, token }),
        prop::option::of(name()).prop_map(|name| Request::Status { name }),
        prop::option::of(name()).prop_map(|name| Request::Watch { name }),
        Just(Request::Ping),
        Just(Request::Help),
        Just(Request::Quit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_line_parses_or_is_refused_on_one_line(line in line()) {
        match proto::parse(&line) {
            Ok(request) => prop_assert!(request.validate().is_ok()),
            Err(e) => {
                let reply = Reply::Error(&e).to_string();
                prop_assert!(!reply.contains(['\n', '\r']), "{reply:?}");
                prop_assert!(reply.starts_with("ERR "));
            }
        }
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _ = proto::parse(&text);
        let _ = proto::parse_reply(&text);
    }

    #[test]
    fn valid_requests_round_trip(request in request()) {
        let line = request.to_string();
        prop_assert!(!line.contains('\n'));
        prop_assert_eq!(proto::parse(&line).expect("parses"), request);
    }
}
