//! Random histories of sets and single names on the table, checked against its own
//! invariants after every step: at most one exclusive holder per name, an entry only while
//! it has a holder or a waiter, a set's names held with one token and its waiter in every
//! one of its queues, FIFO per name at every grant; and at the end, releasing every holder
//! again and again grants every waiter that still waits without bound (no deadlock).

use std::collections::{HashMap, HashSet};

use std::time::{Duration, Instant};

use super::{
    ConnId, Effect, Limits, LockOutcome, LockRequest, Locks, Mode, Origin, Token, WaiterId, NO_USER,
};

/// A small deterministic generator, so the test needs no crate.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn req(names: &[&str], id: &str, conn: ConnId, wait: Option<Duration>, mode: Mode) -> LockRequest {
    LockRequest {
        name: names[0].into(),
        id: id.into(),
        ttl: Some(Duration::from_secs(3)),
        wait,
        tie: if conn.is_multiple_of(2) {
            super::Tie::Session(Duration::ZERO)
        } else {
            super::Tie::Plain
        },
        conn,
        mode,
        user: NO_USER,
        origin: Origin::default(),
        note: None,
        supersede: false,
        and: names[1..].iter().map(|n| n.to_string()).collect(),
        delay: None,
    }
}

/// The table's invariants, from its insides.
fn check(t: &Locks) {
    let mut held = 0;
    for (name, &slot) in &t.index {
        let entry = t.slab.get(slot).expect("an indexed slot has an entry");
        assert_eq!(&entry.name, name);
        assert!(
            !(entry.is_vacant() && entry.waiters() == 0),
            "{name}: an entry with neither holder nor waiter"
        );
        if entry.is_vacant() {
            assert!(entry.more.as_ref().is_none_or(|m| m.others.is_empty()));
        } else {
            held += 1;
        }
        if entry.mode() == Mode::Exclusive {
            assert!(entry.holder_count() <= 1, "{name}: two exclusive holders");
        }
    }
    assert_eq!(t.len(), held);
    for (token, slots) in &t.sets {
        for &slot in slots.iter() {
            let entry = t.slab.get(slot).expect("a set's slot");
            assert!(entry.holder(*token).is_some(), "a set not held on a name");
        }
    }
    for (waiter, slots) in &t.set_waiters {
        let (_, ticket) = t.waiters[waiter];
        for &slot in slots.iter() {
            let queue = t.slab.get(slot).and_then(|e| e.queue()).expect("a queue");
            assert_eq!(queue.get(&ticket).map(|w| w.waiter), Some(*waiter));
        }
    }
}

/// FIFO at a grant of the waiter at `ticket` on `names`: nobody who came before it still
/// waits on any of them.
fn check_fifo(t: &Locks, ticket: u64, names: &[&str]) {
    for name in names {
        let Some(queue) = t.index.get(*name).and_then(|&s| t.slab.get(s)?.queue()) else {
            continue;
        };
        if let Some((&first, _)) = queue.first_key_value() {
            assert!(
                first > ticket,
                "{name}: granted ticket {ticket} while {first} waits before it"
            );
        }
    }
}

#[test]
fn random_histories_of_sets_keep_the_invariants_and_never_deadlock() {
    // How many sets were granted after waiting, and ended by each way: the histories must
    // reach them, or the test proves little.
    let (mut sets_granted, mut sets_ended) = (0, 0);
    for seed in 1..=400u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut now = Instant::now();
        let limits = Limits {
            max_waiters: 6,
            ..Limits::default()
        };
        let mut t = Locks::new(limits, 1);
        // Holders (name, token) and waiters (ticket, names) as the test knows them.
        let mut holding: Vec<(&str, Token)> = Vec::new();
        let mut waiting: HashMap<WaiterId, (u64, Vec<&str>)> = HashMap::new();
        for _ in 0..150 {
            now += Duration::from_millis(rng.below(300));
            let conn = 1 + rng.below(4);
            match rng.below(10) {
                0..=4 => {
                    let mut names: Vec<&str> = Vec::new();
                    for _ in 0..=rng.below(3) {
                        let n = NAMES[rng.below(4) as usize];
                        if !names.contains(&n) {
                            names.push(n);
                        }
                    }
                    let wait = match rng.below(4) {
                        0 => Some(Duration::ZERO),
                        1 => Some(Duration::from_millis(500)),
                        _ => None,
                    };
                    let mode = if rng.below(4) == 0 {
                        Mode::Shared
                    } else {
                        Mode::Exclusive
                    };
                    // Ids repeat now and then: retries, conflicts and replaced waits too.
                    let id = format!("c{}", rng.below(8));
                    let mut asked = req(&names, &id, conn, wait, mode);
                    // Newest-wins on one name ends the sets that wait there too.
                    asked.supersede = names.len() == 1 && rng.below(6) == 0;
                    match t.lock(now, asked) {
                        Ok(LockOutcome::Granted { token, .. }) => {
                            holding.extend(names.iter().map(|&n| (n, token)));
                        }
                        Ok(LockOutcome::Queued { waiter }) => {
                            let ticket = t.waiters.get(&waiter).map_or(0, |&(_, tk)| tk);
                            waiting.insert(waiter, (ticket, names));
                        }
                        Err(_) => {}
                    }
                }
                5 | 6 if !holding.is_empty() => {
                    let (name, token) = holding[rng.below(holding.len() as u64) as usize];
                    let _ = t.unlock(now, name, token, NO_USER);
                }
                7 if !waiting.is_empty() => {
                    let keys: Vec<WaiterId> = waiting.keys().copied().collect();
                    let w = keys[rng.below(keys.len() as u64) as usize];
                    if t.cancel_wait(now, w) {
                        waiting.remove(&w);
                    }
                }
                8 => t.close_connection(now, conn),
                _ if !holding.is_empty() => {
                    let (name, _) = holding[rng.below(holding.len() as u64) as usize];
                    let force = rng.below(2) == 0;
                    let _ = t.break_lock(now, name, None, &Origin::default(), force);
                }
                _ => t.expire(now),
            }
            check(&t);
            for effect in t.take_effects() {
                match effect {
                    Effect::Granted { waiter, token, .. } => {
                        let known = waiting.get(&waiter).cloned();
                        let (ticket, names) = known.expect("a waiter the test knows");
                        holding.extend(names.iter().map(|&n| (n, token)));
                        waiting.remove(&waiter);
                        check_fifo(&t, ticket, &names);
                        sets_granted += usize::from(names.len() > 1);
                    }
                    Effect::WaitEnded { waiter, .. } => {
                        waiting.remove(&waiter);
                    }
                    Effect::Event(_) => {}
                }
            }
            let before = holding.len();
            holding.retain(|&(name, token)| t.check(now, name, token).is_ok());
            sets_ended += usize::from(holding.len() + 1 < before);
        }
        // Everyone who still waits is granted in the end: release every holder, again and
        // again (no new requests), until nobody waits.
        let mut rounds = 0;
        while !t.waiters.is_empty() {
            rounds += 1;
            assert!(rounds < 200, "seed {seed}: waiters never granted: deadlock");
            let live: HashSet<(String, Token)> = t
                .slab
                .iter()
                .flat_map(|e| e.holders().map(|h| (e.name.to_string(), h.token)))
                .collect();
            for (name, token) in live {
                let _ = t.unlock(now, &name, token, NO_USER);
                check(&t);
            }
            t.take_effects();
        }
        // Released at last, the table is empty again.
        now += Duration::from_secs(10);
        t.expire(now);
        check(&t);
        assert!(t.is_empty() && t.index.is_empty(), "seed {seed}");
    }
    assert!(
        sets_granted > 100 && sets_ended > 100,
        "{sets_granted} {sets_ended}"
    );
}
