//! Properties of the protocol module: no line can make the parser panic or produce a reply of
//! more than one line, every valid request survives formatting and parsing unchanged, and so
//! does every reply: a client reads back each line the server formats.

use std::sync::Arc;
use std::time::Duration;

use lockd::locks::{Event, EventKind, LockRequest, LockStatus, Mode, RenewRequest, WaiterStatus};
use lockd::proto::{
    self, Asked, ErrorCode, EventLine, HeldLine, HolderLine, ProtoError, Received, Reply, Request,
    StatusLine, Tie, WaiterLine,
};
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

/// A note a LOCK may carry: printable text, spaces inside, not at its end (a LOCK's trailing
/// blanks are dropped).
fn note() -> impl Strategy<Value = String> {
    prop_oneof!["[ -~]{0,30}[!-~]", "\\PC{0,30}[!-~]"]
        .prop_filter("printable", |n| !n.chars().any(char::is_control))
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
            ],
            prop::option::of(note()),
            any::<bool>(),
            prop::collection::vec(name(), 0..4)
        )
            .prop_map(
                |(name, id, ttl, wait, tie, mode, note, supersede, mut and)| {
                    // A set: further names, none twice, and never with supersede.
                    let mut seen = vec![name.clone()];
                    and.retain(|n| {
                        let fresh = !seen.contains(n);
                        seen.push(n.clone());
                        fresh
                    });
                    if supersede {
                        and.clear();
                    }
                    Request::Lock(Box::new(LockRequest {
                        name: name.into(),
                        id,
                        ttl,
                        wait,
                        tie,
                        mode,
                        supersede,
                        note: note.map(Into::into),
                        and: and.into(),
                        ..LockRequest::default()
                    }))
                }
            ),
        (name(), 1u64..u64::MAX).prop_map(|(name, token)| Request::Unlock { name, token }),
        (
            name(),
            1u64..u64::MAX,
            prop::option::of(duration()),
            any::<bool>()
        )
            .prop_map(|(name, token, ttl, detach)| Request::Renew(RenewRequest {
                name,
                token,
                ttl,
                detach
            })),
        (name(), 1u64..u64::MAX).prop_map(|(name, token)| Request::Check { name, token }),
        prop::option::of(name()).prop_map(|name| Request::Status { name }),
        prop::option::of(name()).prop_map(|name| Request::Watch { name }),
        Just(Request::Ping),
        Just(Request::Help),
        Just(Request::Quit),
        (name(), prop::option::of(1u64..u64::MAX), any::<bool>())
            .prop_map(|(name, token, force)| Request::Break { name, token, force }),
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

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        Just(Mode::Exclusive),
        Just(Mode::Shared),
        (2u32..=proto::MAX_LIMIT).prop_map(Mode::Limit),
    ]
}

fn millis() -> impl Strategy<Value = Duration> {
    (0u64..u64::MAX / 2).prop_map(Duration::from_millis)
}

fn held_line() -> impl Strategy<Value = HeldLine> {
    (
        name(),
        name(),
        1u64..u64::MAX,
        millis(),
        any::<bool>(),
        any::<usize>(),
        2usize..1_000_000,
        mode(),
        prop::option::of(note()),
    )
        .prop_map(
            |(name, id, token, left, session, waiters, holders, mode, note)| HeldLine {
                name,
                id,
                token,
                left,
                session,
                waiters,
                // An exclusive lock has one holder; its line does not say.
                holders: if mode == Mode::Exclusive { 1 } else { holders },
                mode,
                note,
            },
        )
}

fn status_line() -> impl Strategy<Value = StatusLine> {
    prop_oneof![
        name().prop_map(StatusLine::Free),
        held_line().prop_map(StatusLine::Held),
    ]
}

fn event_kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        Just(EventKind::Acquired),
        Just(EventKind::Released),
        Just(EventKind::Expired),
        Just(EventKind::Dropped),
    ]
}

fn message() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[ -~]{0,60}", "\\PC{0,60}"]
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    (0..ErrorCode::ALL.len()).prop_map(|i| ErrorCode::ALL[i])
}

/// Every reply a client may receive, with what it asked.
fn received() -> impl Strategy<Value = (Received, Asked)> {
    prop_oneof![
        (1u64..u64::MAX).prop_map(|t| (Received::Token(t), Asked::Lock)),
        prop::collection::vec(1u64..u64::MAX, 2..17)
            .prop_map(|t| (Received::Tokens(t), Asked::Lock)),
        Just((Received::Done, Asked::Unlock)),
        (0usize..1000).prop_map(|n| (Received::Broken(n), Asked::Break)),
        (name(), name(), 1u64..u64::MAX, any::<u64>(), name()).prop_map(
            |(name, id, token, unix_ms, by)| (
                Received::Event(EventLine {
                    kind: EventKind::Broken,
                    name,
                    id,
                    token,
                    unix_ms,
                    note: None,
                    by: Some(by),
                }),
                Asked::Watch
            )
        ),
        prop_oneof![Just(Asked::Renew), Just(Asked::Check)]
            .prop_flat_map(|a| millis().prop_map(move |d| (Received::Lease(d), a))),
        Just((Received::Pong, Asked::Ping)),
        name().prop_map(|u| (Received::Authenticated(u), Asked::Auth)),
        Just((Received::Help, Asked::Help)),
        Just((Received::Bye, Asked::Quit)),
        prop::option::of(name()).prop_map(|n| (Received::Watching(n), Asked::Watch)),
        prop_oneof![Just(Asked::Status), Just(Asked::Detail)]
            .prop_flat_map(|a| status_line().prop_map(move |s| (Received::Status(s), a))),
        held_line().prop_map(|h| (Received::Info(h), Asked::StatusAll)),
        any::<usize>().prop_map(|n| (Received::Count(n), Asked::StatusAll)),
        (
            name(),
            name(),
            1u64..u64::MAX,
            millis(),
            millis(),
            any::<bool>(),
            mode(),
            prop::option::of(name()),
            prop::option::of(any::<u64>()),
            prop::option::of(name()),
            prop::collection::vec(name(), 0..3),
            (prop::option::of(note()), any::<bool>()),
        )
            .prop_map(
                |(
                    name,
                    id,
                    token,
                    held,
                    left,
                    session,
                    mode,
                    user,
                    granted,
                    peer,
                    and,
                    (note, lingering),
                )| (
                    Received::Holder(HolderLine {
                        name,
                        id,
                        token,
                        held,
                        left,
                        session,
                        mode,
                        user,
                        granted_unix_ms: granted,
                        peer,
                        and,
                        note,
                        lingering,
                    }),
                    Asked::Detail
                )
            ),
        (
            name(),
            1usize..100_000,
            name(),
            millis(),
            any::<bool>(),
            mode(),
            prop::collection::vec(name(), 0..3),
        )
            .prop_map(|(name, position, id, waited, session, mode, and)| (
                Received::Waiter(WaiterLine {
                    name,
                    position,
                    id,
                    waited,
                    session,
                    mode,
                    and,
                }),
                Asked::Detail
            )),
        (
            event_kind(),
            name(),
            name(),
            1u64..u64::MAX,
            any::<u64>(),
            prop::option::of(note())
        )
            .prop_map(|(kind, name, id, token, unix_ms, note)| (
                Received::Event(EventLine {
                    kind,
                    name,
                    id,
                    token,
                    unix_ms,
                    note,
                    by: None,
                }),
                Asked::Watch
            )),
        (error_code(), message())
            .prop_map(|(code, m)| (Received::Error(ProtoError::new(code, m)), Asked::Lock)),
    ]
}

fn lock_status() -> impl Strategy<Value = LockStatus> {
    (held_line(), millis(), set()).prop_map(|(h, held, set)| LockStatus {
        name: h.name.into(),
        holder: h.id.into(),
        token: h.token,
        left: h.left,
        held,
        session: h.session,
        waiters: h.waiters,
        holders: h.holders,
        mode: h.mode,
        origin: Default::default(),
        granted_unix_ms: 0,
        note: h.note.map(Into::into),
        set,
        lingering: h.session && h.token % 2 == 0,
    })
}

/// A set's names (empty: a lease of one name); the line's own name may be among them or not.
fn set() -> impl Strategy<Value = Box<[Arc<str>]>> {
    prop::collection::vec(name(), 0..4).prop_map(|names| names.into_iter().map(Arc::from).collect())
}

/// What a `HOLDER` or `WAITER` line of `name` lists as `and=`: the set's other names.
fn and_of(set: &[Arc<str>], name: &str) -> Vec<String> {
    set.iter()
        .filter(|n| &***n != name)
        .map(|n| n.to_string())
        .collect()
}

fn as_held(s: &LockStatus) -> HeldLine {
    HeldLine {
        name: s.name.to_string(),
        id: s.holder.to_string(),
        token: s.token,
        left: s.left,
        session: s.session,
        waiters: s.waiters,
        holders: s.holders,
        mode: s.mode,
        note: s.note.as_deref().map(str::to_owned),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_reply_round_trips((reply, asked) in received()) {
        let line = reply.to_string();
        prop_assert!(!line.contains(['\n', '\r']), "{line:?}");
        prop_assert_eq!(Received::parse(&line, asked), Ok(reply));
    }

    #[test]
    fn clients_read_what_the_server_formats(
        status in lock_status(),
        waiter in (name(), 1usize..100_000, millis(), any::<bool>(), mode(), set()),
        event in (event_kind(), 1u64..u64::MAX, any::<u64>()),
    ) {
        let parse = |r: Reply<'_>, asked| Received::parse(&r.to_string(), asked);
        prop_assert_eq!(
            parse(Reply::Status(&status.name, Some(&status)), Asked::Status),
            Ok(Received::Status(StatusLine::Held(as_held(&status))))
        );
        prop_assert_eq!(
            parse(Reply::Status(&status.name, None), Asked::Detail),
            Ok(Received::Status(StatusLine::Free(status.name.to_string())))
        );
        prop_assert_eq!(
            parse(Reply::Info(&status), Asked::StatusAll),
            Ok(Received::Info(as_held(&status)))
        );
        prop_assert_eq!(
            parse(Reply::Holder(&status), Asked::Detail),
            Ok(Received::Holder(HolderLine {
                name: status.name.to_string(),
                id: status.holder.to_string(),
                token: status.token,
                held: status.held,
                left: status.left,
                session: status.session,
                mode: status.mode,
                user: None,
                granted_unix_ms: None,
                peer: None,
                and: and_of(&status.set, &status.name),
                note: status.note.as_deref().map(str::to_owned),
                lingering: status.lingering,
            }))
        );
        let (id, position, waited, session, mode, set) = waiter;
        let and = and_of(&set, &status.name);
        let w = WaiterStatus { id: Arc::from(id.as_str()), waited, session, mode, set };
        prop_assert_eq!(
            parse(Reply::Waiter(&status.name, position, &w), Asked::Detail),
            Ok(Received::Waiter(WaiterLine {
                name: status.name.to_string(),
                position,
                id,
                waited,
                session,
                mode,
                and,
            }))
        );
        let (kind, token, unix_ms) = event;
        let e = Event {
            kind,
            name: status.name.clone(),
            id: status.holder.clone(),
            token,
            held: Duration::ZERO,
            waited: None,
            origin: Default::default(),
            note: status.note.clone(),
            broken_by: Default::default(),
        };
        prop_assert_eq!(
            parse(Reply::Event(&e, unix_ms), Asked::Watch),
            Ok(Received::Event(EventLine {
                kind,
                name: status.name.to_string(),
                id: status.holder.to_string(),
                token,
                unix_ms,
                // Only an acquired event shows its holder's note.
                note: status
                    .note
                    .as_deref()
                    .filter(|_| kind == EventKind::Acquired)
                    .map(str::to_owned),
                by: None,
            }))
        );
    }

    #[test]
    fn any_note_encodes_to_one_printable_word_and_back(text in any::<String>()) {
        let word = proto::note::Encoded(&text).to_string();
        prop_assert!(word.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{}", word);
        prop_assert_eq!(proto::note::decode_note(&word), Some(text));
    }

    #[test]
    fn a_lock_s_note_is_the_rest_of_its_line(head in "LOCK [a-z]{1,5} [a-z]{1,5}( ttl=1s)?", note in note()) {
        let line = format!("{head} note={note} \t ");
        match proto::parse(&line) {
            Ok(Request::Lock(req)) => {
                prop_assert_eq!(req.note.as_deref(), Some(note.as_str()))
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn any_reply_text_is_read_or_refused(text in any::<String>(), asked in prop_oneof![
        Just(Asked::Lock), Just(Asked::Unlock), Just(Asked::Renew), Just(Asked::Status),
        Just(Asked::StatusAll), Just(Asked::Detail), Just(Asked::Watch), Just(Asked::Auth),
        Just(Asked::Ping), Just(Asked::Quit), Just(Asked::Break),
    ]) {
        let _ = Received::parse(&text, asked);
        for prefix in ["OK ", "INFO ", "HOLDER ", "WAITER ", "EVENT ", "OK a held "] {
            let _ = Received::parse(&format!("{prefix}{text}"), asked);
        }
    }
}
