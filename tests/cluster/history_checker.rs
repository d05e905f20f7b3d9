//! The chaos runs' history checker ([`common::history`]) against histories with planted
//! bugs: each kind of violation is found, and a clean history has none. A checker that
//! passes everything would make every chaos run look green.

use crate::common;

use std::time::Duration;

use common::history::{check, Call, Op, Queue, Seen, Sharing};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn lock(client: usize, id: &str, invoke: u64, complete: u64, reply: &str) -> Op {
    lock_set(client, id, &["x"], (invoke, complete), reply)
}

fn unlock(client: usize, token: u64, invoke: u64) -> Op {
    unlock_of(client, "x", token, invoke)
}

fn seen(kind: &str, id: &str, token: u64, at: u64) -> Seen {
    Seen {
        kind: kind.into(),
        name: "x".into(),
        id: id.into(),
        token,
        at: ms(at),
    }
}

/// Two clients take turns, by the rules.
fn clean() -> Vec<Op> {
    vec![
        lock(0, "a1", 0, 1, "OK 10"),
        lock(1, "b1", 2, 11, "OK 12"),
        unlock(0, 10, 10),
        unlock(1, 12, 20),
        lock(0, "a2", 21, 22, "OK 14"),
        unlock(0, 14, 30),
    ]
}

#[test]
fn a_clean_history_has_no_violation() {
    let queue = Queue {
        name: "x".into(),
        ids: vec!["b1".into()],
        invoke: ms(3),
        complete: ms(4),
    };
    let v = check(&clean(), &[queue], &[seen("acquired", "a1", 10, 1)]);
    assert!(v.violations.is_empty(), "{:#?}", v.violations);
    assert_eq!((v.ops, v.grants), (6, 3));
}

#[test]
fn a_planted_double_grant_is_found() {
    // B is told it holds x while A has not unlocked yet.
    let mut ops = clean();
    ops[1] = lock(1, "b1", 2, 5, "OK 12");
    let v = check(&ops, &[], &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(v.violations[0].starts_with("two holders of x"), "{v:?}");
}

/// `op`, a LOCK, holding as `sharing` says.
fn holding(mut op: Op, sharing: Sharing) -> Op {
    if let Call::Lock { sharing: h, .. } = &mut op.call {
        *h = sharing;
    }
    op
}

#[test]
fn shares_may_overlap_and_a_semaphore_s_holders_up_to_its_slots() {
    // Three clients hold x at once: as shares, fine; as slots of a semaphore of three, fine;
    // of two, one too many; as a share beside an exclusive holder, two kinds at once.
    let three = |sharing: [Sharing; 3]| {
        vec![
            holding(lock(0, "a1", 0, 1, "OK 10"), sharing[0]),
            holding(lock(1, "b1", 2, 3, "OK 11"), sharing[1]),
            holding(lock(2, "c1", 4, 5, "OK 12"), sharing[2]),
            unlock(0, 10, 10),
            unlock(1, 11, 11),
            unlock(2, 12, 12),
        ]
    };
    for fine in [[Sharing::Shared; 3], [Sharing::Slots(3); 3]] {
        let v = check(&three(fine), &[], &[]);
        assert!(v.violations.is_empty(), "{fine:?}: {:#?}", v.violations);
    }
    let v = check(&three([Sharing::Slots(2); 3]), &[], &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(
        v.violations[0].starts_with("3 holders of x, a semaphore of 2"),
        "{v:?}"
    );
    let v = check(
        &three([Sharing::Shared, Sharing::Alone, Sharing::Shared]),
        &[],
        &[],
    );
    assert!(!v.violations.is_empty(), "{v:?}");
    assert!(
        v.violations[0].starts_with("x held two ways at once"),
        "{v:?}"
    );
}

#[test]
fn a_planted_token_regression_is_found() {
    // A's second grant was asked for after B's grant completed, yet has a smaller token.
    let mut ops = clean();
    ops[4] = lock(0, "a2", 21, 22, "OK 11");
    ops[5] = unlock(0, 11, 30);
    let v = check(&ops, &[], &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(v.violations[0].starts_with("token regressed on x"), "{v:?}");
}

#[test]
fn a_planted_token_regression_across_names_is_found() {
    // A's grant of y was asked for after B's grant of x completed, yet has a smaller token.
    let mut ops = clean();
    ops[4] = lock_set(0, "a2", &["y"], (21, 22), "OK 11");
    ops[5] = unlock_of(0, "y", 11, 30);
    let v = check(&ops, &[], &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(v.violations[0].starts_with("token regressed on y"), "{v:?}");
    assert!(v.violations[0].contains("after 12 of x"), "{v:?}");
}

#[test]
fn a_planted_token_granted_twice_is_found() {
    // Two LOCKs of two names granted together, with one token.
    let ops = vec![
        lock(0, "a1", 0, 1, "OK 10"),
        lock_set(1, "b1", &["y"], (0, 1), "OK 10"),
        unlock(0, 10, 10),
        unlock_of(1, "y", 10, 10),
    ];
    let v = check(&ops, &[], &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(
        v.violations[0].starts_with("token 10 granted twice"),
        "{v:?}"
    );
    // A set's names share its one token.
    let set = vec![
        lock_set(0, "a1", &["x", "y"], (0, 1), "OK 10 10"),
        unlock(0, 10, 10),
    ];
    assert!(check(&set, &[], &[]).violations.is_empty());
}

#[test]
fn a_planted_grant_to_a_waiter_that_left_is_found() {
    // C's wait ran out at 3; a grant asked for at 21 (token 14) came before C's (token 16).
    let mut ops = clean();
    ops.push(lock(2, "c1", 1, 3, "ERR TIMEOUT x: not granted within 2ms"));
    let events = [
        seen("acquired", "c1", 16, 31),
        seen("released", "c1", 16, 40),
    ];
    let v = check(&ops, &[], &events);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(
        v.violations[0].contains("after it was told its wait ended"),
        "{v:?}"
    );
    // Taken back at once it is fine; sitting out its ttl is not.
    let events = [
        seen("acquired", "c1", 11, 9),
        seen("expired", "c1", 11, 9000),
    ];
    let v = check(&ops, &[], &events);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(v.violations[0].contains("sat out its ttl"), "{v:?}");
    let events = [seen("acquired", "c1", 11, 9), seen("dropped", "c1", 11, 10)];
    assert!(check(&ops, &[], &events).violations.is_empty());
    // A grant that ran out before its client was told anything (its answer lost, the LOCK
    // told TIMEOUT on a later try): the lease proto.md lets end with its ttl.
    let mut late = clean();
    late.push(lock(
        2,
        "c1",
        1,
        9500,
        "ERR TIMEOUT x: not granted within 2ms",
    ));
    let events = [
        seen("acquired", "c1", 11, 9),
        seen("expired", "c1", 11, 9000),
    ];
    assert!(check(&late, &[], &events).violations.is_empty());
}

#[test]
fn a_planted_fifo_inversion_is_found() {
    // The queue showed b1 ahead of c1, yet c1 was granted first.
    let ops = vec![
        lock(0, "a1", 0, 1, "OK 10"),
        lock(1, "b1", 2, 21, "OK 14"),
        lock(2, "c1", 3, 11, "OK 12"),
        unlock(0, 10, 10),
        unlock(2, 12, 20),
        unlock(1, 14, 30),
    ];
    let queue = Queue {
        name: "x".into(),
        ids: vec!["b1".into(), "c1".into()],
        invoke: ms(5),
        complete: ms(6),
    };
    let v = check(&ops, std::slice::from_ref(&queue), &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(
        v.violations[0].starts_with("FIFO: b1 was ahead of c1"),
        "{v:?}"
    );
    // A LOCK sent again rightly goes to the back: no violation then.
    let mut resent = ops.clone();
    resent[1].call = Call::Lock {
        name: "x".into(),
        and: Vec::new(),
        id: "b1".into(),
        again: true,
        sharing: Sharing::Alone,
    };
    assert!(check(&resent, &[queue], &[]).violations.is_empty());
}

/// A LOCK of `names`: the first is the LOCK's own, the rest its `and=` (a set).
fn lock_set(client: usize, id: &str, names: &[&str], at: (u64, u64), reply: &str) -> Op {
    Op {
        client,
        call: Call::Lock {
            name: names[0].into(),
            and: names[1..].iter().map(|n| n.to_string()).collect(),
            id: id.into(),
            again: false,
            sharing: Sharing::Alone,
        },
        invoke: ms(at.0),
        complete: ms(at.1),
        reply: Some(reply.into()),
    }
}

fn unlock_of(client: usize, name: &str, token: u64, invoke: u64) -> Op {
    Op {
        client,
        call: Call::Unlock {
            name: name.into(),
            token,
        },
        invoke: ms(invoke),
        complete: ms(invoke + 1),
        reply: Some("OK".into()),
    }
}

#[test]
fn a_set_holds_every_name_until_the_unlock_of_any_of_them() {
    // A holds x until 10; the set {y, x} is granted at 11 and released through y at 20;
    // C's x comes after.
    let ops = vec![
        lock(0, "a1", 0, 1, "OK 10"),
        lock_set(1, "s1", &["y", "x"], (2, 11), "OK 12 12"),
        unlock(0, 10, 10),
        unlock_of(1, "y", 12, 20),
        lock(2, "c1", 3, 21, "OK 14"),
        unlock(2, 14, 30),
    ];
    let v = check(&ops, &[], &[]);
    assert!(v.violations.is_empty(), "{:#?}", v.violations);
    assert_eq!(v.grants, 4, "the set is a holder of both its names");

    // Granted while A still held x: two holders of x, found through the set's second name.
    let mut early = ops.clone();
    early[1] = lock_set(1, "s1", &["y", "x"], (2, 5), "OK 12 12");
    let v = check(&early, &[], &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(v.violations[0].starts_with("two holders of x"), "{v:?}");

    // C granted x before the set's UNLOCK (through y) was sent: two holders of x again.
    let mut overlap = ops.clone();
    overlap[4] = lock(2, "c1", 3, 15, "OK 14");
    let v = check(&overlap, &[], &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(v.violations[0].starts_with("two holders of x"), "{v:?}");

    // A set's grant with a token missing is a violation of its own.
    let mut short = ops;
    short[1] = lock_set(1, "s1", &["y", "x"], (2, 11), "OK 12");
    let v = check(&short, &[], &[]);
    assert!(
        v.violations
            .iter()
            .any(|m| m.contains("1 tokens for 2 names")),
        "{v:?}"
    );
}

#[test]
fn fifo_is_judged_on_each_name_a_set_waits_on() {
    // The queue of x showed the set s1 ahead of c1, yet c1 was granted x first.
    let ops = vec![
        lock(0, "a1", 0, 1, "OK 10"),
        lock_set(1, "s1", &["y", "x"], (2, 21), "OK 14 14"),
        lock(2, "c1", 3, 11, "OK 12"),
        unlock(0, 10, 10),
        unlock(2, 12, 20),
        unlock_of(1, "x", 14, 30),
    ];
    let queue = Queue {
        name: "x".into(),
        ids: vec!["s1".into(), "c1".into()],
        invoke: ms(5),
        complete: ms(6),
    };
    let v = check(&ops, std::slice::from_ref(&queue), &[]);
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    assert!(
        v.violations[0].starts_with("FIFO: s1 was ahead of c1 in the queue of x"),
        "{v:?}"
    );
}

#[test]
fn a_violation_comes_with_the_trail_of_the_ids_it_names() {
    let history = common::history::History::new();
    for op in clean() {
        history.add(op);
    }
    history.add(lock(2, "c1", 1, 3, "ERR TIMEOUT x: not granted within 2ms"));
    history.add_event(seen("acquired", "c1", 11, 9));
    history.add_event(seen("expired", "c1", 11, 9000));
    history.mark("front-end 0 killed");
    let v = history.check();
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
    // c1's LOCK and both of its events; nobody else's operations.
    let c1 = |l: &String| l.contains("c1");
    assert_eq!(
        v.trail.iter().filter(|l| c1(l)).count(),
        3,
        "{:#?}",
        v.trail
    );
    assert!(
        !v.trail.iter().any(|l| l.contains("a1") || l.contains("b1")),
        "{:#?}",
        v.trail
    );
    // The mark, made within the span of c1's lines (they run to 9 s), is shown.
    assert!(
        v.trail.iter().any(|l| l.contains("front-end 0 killed")),
        "{:#?}",
        v.trail
    );
    // A clean history has no trail.
    let clean_history = common::history::History::new();
    for op in clean() {
        clean_history.add(op);
    }
    assert!(clean_history.check().trail.is_empty());
}
