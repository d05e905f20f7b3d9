//! Sets of names (`LOCK <name> <id> and=<name>...`) in cluster mode: one lease over every
//! name, granted whole (one token on every name), queued on every name at once, handed over
//! whole by whichever front-end releases, and ended whole through any of its names.
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::needs::{have, Need};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::blocking::eventually;
use common::etcd::LockdFrontEnd;
use common::line::Line;
use common::{field, token, tokens};

use super::basics::{front_ends, wait_held, wait_waiters};

const PATIENCE: Duration = Duration::from_secs(20);

/// Waits until `fe` shows `name` free with nobody waiting.
fn wait_free(fe: &LockdFrontEnd, name: &str) {
    eventually(PATIENCE, &format!("{name} free"), || {
        fe.request(&format!("STATUS {name}")) == format!("OK {name} free")
    });
}

/// Waits until a LOCK of `name` through `fe` with `wait=0` is refused: someone waits for it
/// (a grant meanwhile is given back at once).
fn wait_queued(fe: &LockdFrontEnd, name: &str) {
    eventually(PATIENCE, &format!("{name} queued"), || {
        let reply = fe.request(&format!("LOCK {name} probe wait=0"));
        if let Some(t) = reply.strip_prefix("OK ") {
            assert_eq!(fe.request(&format!("UNLOCK {name} {t}")), "OK");
        }
        reply.starts_with("ERR TIMEOUT")
    });
}

#[test]
fn a_set_is_granted_whole_with_one_token_on_every_name() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let reply = fes[0].request("LOCK s-a job and=s-b and=s-c ttl=30s");
    let t = tokens(&reply);
    assert_eq!(t.len(), 3, "{reply}");
    assert!(
        t.iter().all(|x| *x == t[0]),
        "one token on every name: {reply}"
    );
    for fe in &fes {
        for name in ["s-a", "s-b", "s-c"] {
            wait_held(fe, name, t[0]);
        }
    }
    // Every front-end's detail names the set's other names, in the LOCK's order.
    for fe in &fes {
        let holder = fe.request("STATUS s-b detail");
        assert!(
            holder.starts_with("HOLDER s-b id=job ") && holder.ends_with(" and=s-a and=s-c"),
            "{holder}"
        );
    }
    // The same id again is a retry: the same token on every name.
    let again = tokens(&fes[1].request("LOCK s-b job and=s-c and=s-a ttl=30s"));
    assert_eq!(again, vec![t[0]; 3]);
    // Another id is refused at once, whole, with wait=0.
    let refused = fes[1].request("LOCK s-c other and=s-d wait=0");
    assert!(refused.starts_with("ERR TIMEOUT"), "{refused}");
    wait_free(&fes[1], "s-d");
    assert_eq!(fes[1].request(&format!("UNLOCK s-a {}", t[0])), "OK");
    for name in ["s-a", "s-b", "s-c"] {
        wait_free(&fes[0], name);
    }
}

#[test]
fn a_set_waits_for_one_held_name_and_is_granted_whole_through_another_front_end() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let held = token(&fes[0].request("LOCK w-b holder ttl=60s"));
    let mut set = Line::connect(fes[1].addr());
    set.send("LOCK w-a set and=w-b ttl=60s");
    // Queued on both names, the free one too (STATUS shows a name without holders as
    // free; a LOCK of it with wait=0 is refused as queued).
    for fe in &fes {
        wait_waiters(fe, "w-b", 1);
        wait_queued(fe, "w-a");
    }
    // Nobody overtakes it on the free name.
    let mut single = Line::connect(fes[0].addr());
    single.send("LOCK w-a single ttl=60s");
    assert_eq!(set.line_within(Duration::from_millis(300)), None);
    // Released through the other front-end: the set is granted whole, after the holder.
    assert_eq!(fes[0].request(&format!("UNLOCK w-b {held}")), "OK");
    let t = tokens(&set.line());
    assert_eq!(t.len(), 2);
    assert_eq!(t[0], t[1]);
    assert!(t[0] > held);
    // The single waiter behind it waits for the set to end.
    assert_eq!(single.line_within(Duration::from_millis(500)), None);
    assert_eq!(set.req(&format!("UNLOCK w-b {}", t[0])), "OK");
    let next = token(&single.line());
    assert!(next > t[0]);
    assert_eq!(single.req(&format!("UNLOCK w-a {next}")), "OK");
}

#[test]
fn overlapping_sets_in_opposite_orders_through_two_front_ends_never_deadlock_or_overlap() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let inside = Arc::new(AtomicUsize::new(0));
    let addrs: Vec<_> = fes.iter().map(|fe| fe.addr()).collect();
    let rounds = 25;
    let workers: Vec<_> = [("o-x", "o-y"), ("o-y", "o-x")]
        .into_iter()
        .zip(addrs)
        .enumerate()
        .map(|(i, ((first, second), addr))| {
            let inside = Arc::clone(&inside);
            std::thread::spawn(move || {
                let mut c = Line::connect(addr);
                let mut last = 0;
                for round in 0..rounds {
                    let reply = c.req(&format!("LOCK {first} w{i} and={second} ttl=30s wait=20s"));
                    let t = tokens(&reply);
                    assert_eq!(t.len(), 2, "{reply}");
                    assert!(t[0] > last, "round {round}: token {} after {last}", t[0]);
                    last = t[0];
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    std::thread::sleep(Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    // Released through either name: the whole set goes.
                    let name = if round % 2 == 0 { first } else { second };
                    assert_eq!(c.req(&format!("UNLOCK {name} {}", t[0])), "OK");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker failed");
    }
    for name in ["o-x", "o-y"] {
        wait_free(&fes[0], name);
    }
}

#[test]
fn unlock_or_renew_through_any_name_applies_to_the_whole_set() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let t = tokens(&fes[0].request("LOCK u-a job and=u-b ttl=30s"))[0];
    let renewed = fes[1].request(&format!("RENEW u-b {t} ttl=60s"));
    assert!(renewed.starts_with("OK "), "{renewed}");
    eventually(PATIENCE, "renewed on both names", || {
        ["u-a", "u-b"].iter().all(|name| {
            field(&fes[0].request(&format!("STATUS {name}")), "ttl_ms")
                .and_then(|ms| ms.parse::<u64>().ok())
                .is_some_and(|ms| ms > 30_000)
        })
    });
    assert_eq!(fes[1].request(&format!("UNLOCK u-b {t}")), "OK");
    for fe in &fes {
        wait_free(fe, "u-a");
        wait_free(fe, "u-b");
    }
    let gone = fes[0].request(&format!("RENEW u-a {t}"));
    assert!(gone.starts_with("ERR NOTHELD"), "{gone}");
}

#[test]
fn a_wait_0_refusal_of_a_set_changes_nothing() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let held = token(&fes[0].request("LOCK z-b holder ttl=30s"));
    // Every front-end's STATUS below must show z-b held (their watches caught up).
    for fe in &fes {
        wait_held(fe, "z-b", held);
    }
    let refused = fes[1].request("LOCK z-a set and=z-b and=z-c wait=0");
    assert!(refused.starts_with("ERR TIMEOUT"), "{refused}");
    for fe in &fes {
        assert_eq!(fe.request("STATUS z-a"), "OK z-a free");
        assert_eq!(fe.request("STATUS z-c"), "OK z-c free");
        let b = fe.request("STATUS z-b");
        assert_eq!(field(&b, "waiters").as_deref(), Some("0"), "{b}");
    }
    // The free names are still free for anyone, at once.
    let a = token(&fes[1].request("LOCK z-a other wait=0"));
    assert_eq!(fes[1].request(&format!("UNLOCK z-a {a}")), "OK");
    assert_eq!(fes[0].request(&format!("UNLOCK z-b {held}")), "OK");
}

#[test]
fn a_waiting_set_that_gives_up_leaves_every_queue() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let held = token(&fes[0].request("LOCK g-b holder ttl=30s"));
    let reply = fes[1].request("LOCK g-a set and=g-b wait=1s");
    assert!(reply.starts_with("ERR TIMEOUT"), "{reply}");
    for fe in &fes {
        wait_waiters(fe, "g-b", 0);
        wait_free(fe, "g-a");
    }
    let a = token(&fes[0].request("LOCK g-a other wait=0"));
    assert_eq!(fes[0].request(&format!("UNLOCK g-a {a}")), "OK");
    assert_eq!(fes[0].request(&format!("UNLOCK g-b {held}")), "OK");
}

#[test]
fn expiry_ends_every_name_of_a_set() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let t = tokens(&fes[0].request("LOCK e-a job and=e-b ttl=1s"))[0];
    // A later write, seen by every front-end: a watch delivers etcd's revisions in order, so
    // each has seen the set's grant, and "free" below is its expiry (not a view from before
    // the grant, which the CHECK below would then contradict).
    let mark = token(&fes[0].request("LOCK e-mark m"));
    for fe in &fes {
        wait_held(fe, "e-mark", mark);
        wait_free(fe, "e-a");
        wait_free(fe, "e-b");
    }
    let gone = fes[1].request(&format!("CHECK e-b {t}"));
    assert!(gone.starts_with("ERR NOTHELD"), "{gone}");
    // Both names are free for the next one at once.
    let next = tokens(&fes[1].request("LOCK e-b next and=e-a wait=0"));
    assert!(next[0] > t);
    assert_eq!(fes[1].request(&format!("UNLOCK e-a {}", next[0])), "OK");
}

#[test]
fn the_same_id_again_through_another_front_end_replaces_a_waiting_set() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let held = token(&fes[0].request("LOCK r-b holder ttl=60s"));
    let mut first = Line::connect(fes[1].addr());
    first.send("LOCK r-a job and=r-b ttl=60s");
    for fe in &fes {
        wait_waiters(fe, "r-b", 1);
    }
    let mut behind = Line::connect(fes[0].addr());
    behind.send("LOCK r-b behind ttl=60s");
    for fe in &fes {
        wait_waiters(fe, "r-b", 2);
    }
    // The same set by the same id, through the other front-end: the old request is answered
    // REPLACED and the new one keeps its place, ahead of the later waiter.
    let mut second = Line::connect(fes[0].addr());
    second.send("LOCK r-b job and=r-a ttl=60s");
    let replaced = first.line();
    assert!(replaced.starts_with("ERR REPLACED"), "{replaced}");
    wait_waiters(&fes[1], "r-b", 2);
    assert_eq!(fes[1].request(&format!("UNLOCK r-b {held}")), "OK");
    let t = tokens(&second.line());
    assert_eq!(t.len(), 2);
    assert!(t[0] > held);
    assert_eq!(behind.line_within(Duration::from_millis(300)), None);
    assert_eq!(second.req(&format!("UNLOCK r-a {}", t[0])), "OK");
    let b = token(&behind.line());
    // The same id for one name of a waiting set replaces the set, which leaves both queues.
    let mut set = Line::connect(fes[1].addr());
    set.send("LOCK r-a again and=r-b ttl=60s");
    // Once a front-end shows `behind` holding (its grant emptied the queue), one waiter is the
    // set; before that, its view may still show `behind` as the one waiter.
    for fe in &fes {
        wait_held(fe, "r-b", b);
        wait_waiters(fe, "r-b", 1);
    }
    let mut one = Line::connect(fes[0].addr());
    one.send("LOCK r-b again ttl=60s");
    let replaced = set.line();
    assert!(replaced.starts_with("ERR REPLACED"), "{replaced}");
    for fe in &fes {
        wait_waiters(fe, "r-b", 1);
    }
    let a = token(&fes[0].request("LOCK r-a other wait=0"));
    assert_eq!(fes[0].request(&format!("UNLOCK r-a {a}")), "OK");
    assert_eq!(behind.req(&format!("UNLOCK r-b {b}")), "OK");
    let t = token(&one.line());
    assert!(t > b);
    assert_eq!(one.req(&format!("UNLOCK r-b {t}")), "OK");
}

#[test]
fn a_session_set_whose_connection_closes_leaves_every_queue_or_ends_on_every_name() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let held = token(&fes[0].request("LOCK c-b holder ttl=60s"));
    let mut set = Line::connect(fes[1].addr());
    set.send("LOCK c-a set and=c-b ttl=60s session");
    for fe in &fes {
        wait_waiters(fe, "c-b", 1);
        wait_queued(fe, "c-a");
    }
    drop(set);
    for fe in &fes {
        wait_waiters(fe, "c-b", 0);
    }
    let a = token(&fes[0].request("LOCK c-a other wait=0"));
    assert_eq!(fes[0].request(&format!("UNLOCK c-a {a}")), "OK");
    assert_eq!(fes[1].request(&format!("UNLOCK c-b {held}")), "OK");
    // A session set held: its connection's close ends it on every name.
    let mut set = Line::connect(fes[1].addr());
    let t = tokens(&set.req("LOCK c-a set and=c-b ttl=60s session"))[0];
    for fe in &fes {
        wait_held(fe, "c-a", t);
        wait_held(fe, "c-b", t);
    }
    drop(set);
    for fe in &fes {
        wait_free(fe, "c-a");
        wait_free(fe, "c-b");
    }
}

#[test]
fn sets_and_single_names_through_three_front_ends_never_overlap_and_all_finish() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(3);
    let names = ["m-x", "m-y", "m-z"];
    // Per name: how many hold it now (a client's count, up before it is used, down before
    // its UNLOCK is sent).
    let inside: Arc<Vec<AtomicUsize>> =
        Arc::new(names.iter().map(|_| AtomicUsize::new(0)).collect());
    // (the names each worker takes: a set, or one name)
    let asks: [&[usize]; 6] = [&[0, 1], &[1, 2], &[2, 0], &[0], &[1], &[2, 1, 0]];
    let workers: Vec<_> = asks
        .iter()
        .enumerate()
        .map(|(i, ask)| {
            let inside = Arc::clone(&inside);
            let addr = fes[i % fes.len()].addr();
            let ask: Vec<usize> = ask.to_vec();
            std::thread::spawn(move || {
                let mut c = Line::connect(addr);
                let first = names[ask[0]];
                let and: String = ask[1..]
                    .iter()
                    .map(|n| format!(" and={}", names[*n]))
                    .collect();
                for round in 0..10 {
                    let reply = c.req(&format!("LOCK {first} w{i}{and} ttl=30s wait=30s"));
                    let t = tokens(&reply);
                    assert_eq!(t.len(), ask.len(), "{reply}");
                    for n in &ask {
                        let was = inside[*n].fetch_add(1, Ordering::SeqCst);
                        assert_eq!(was, 0, "two holders of {} (round {round})", names[*n]);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    for n in &ask {
                        inside[*n].fetch_sub(1, Ordering::SeqCst);
                    }
                    let last = names[*ask.last().unwrap_or(&0)];
                    assert_eq!(c.req(&format!("UNLOCK {last} {}", t[0])), "OK");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker failed");
    }
    for name in names {
        wait_free(&fes[0], name);
    }
}

#[test]
fn a_break_of_one_name_of_a_set_ends_every_name_and_its_holder_is_told_on_each() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let mut watch = Line::connect(fes[0].addr());
    assert_eq!(watch.req("WATCH k-b"), "OK watching k-b");
    let mut holder = Line::connect(fes[0].addr());
    let t = tokens(&holder.req("LOCK k-a stuck and=k-b ttl=60s"))[0];
    let mut waiter = Line::connect(fes[0].addr());
    waiter.send("LOCK k-b next ttl=60s");
    wait_waiters(&fes[1], "k-b", 1);
    assert_eq!(fes[1].request("BREAK k-a force"), "OK broken=1");
    // The whole set ended: the waiter on the other name is granted.
    let next = token(&waiter.line());
    assert!(next > t);
    wait_free(&fes[1], "k-a");
    // Its holder is told it was broken, on either name.
    for name in ["k-a", "k-b"] {
        let reply = holder.req(&format!("RENEW {name} {t}"));
        let want = format!("ERR NOTHELD {name}: lease {t} was broken by ");
        assert!(reply.starts_with(&want), "{reply}");
    }
    // One event per name: k-b's watchers see it broken, then the next grant.
    let saw: Vec<String> = (0..3).map(|_| watch.line()).collect();
    assert!(
        saw[0].starts_with(&format!("EVENT acquired k-b stuck {t} ")),
        "{saw:?}"
    );
    assert!(
        saw[1].starts_with(&format!("EVENT broken k-b stuck {t} ")),
        "{saw:?}"
    );
    assert!(
        saw[2].starts_with(&format!("EVENT acquired k-b next {next} ")),
        "{saw:?}"
    );
    assert_eq!(waiter.req(&format!("UNLOCK k-b {next}")), "OK");
}

#[test]
fn a_supersede_of_one_name_takes_a_waiting_set_out_of_all_its_queues() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let held = token(&fes[0].request("LOCK p-b holder ttl=60s"));
    let mut set = Line::connect(fes[1].addr());
    set.send("LOCK p-a set and=p-b ttl=60s");
    for fe in &fes {
        wait_waiters(fe, "p-b", 1);
        wait_queued(fe, "p-a");
    }
    let mut newest = Line::connect(fes[0].addr());
    newest.send("LOCK p-b newest supersede ttl=60s");
    let ended = set.line();
    assert!(ended.starts_with("ERR SUPERSEDED"), "{ended}");
    // Its place on the other name went too: that name is free for anyone at once.
    eventually(PATIENCE, "p-a free of the set", || {
        let reply = fes[1].request("LOCK p-a other wait=0");
        match reply.strip_prefix("OK ") {
            Some(t) => fes[1].request(&format!("UNLOCK p-a {t}")) == "OK",
            None => false,
        }
    });
    assert_eq!(fes[1].request(&format!("UNLOCK p-b {held}")), "OK");
    let t = token(&newest.line());
    assert_eq!(newest.req(&format!("UNLOCK p-b {t}")), "OK");
}

#[test]
fn a_set_of_the_most_names_allowed_waits_and_is_granted_and_released_whole() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let names: Vec<String> = (0..16).map(|i| format!("big-{i}")).collect();
    let held = token(&fes[0].request("LOCK big-15 holder ttl=60s"));
    let and: String = names[1..].iter().map(|n| format!(" and={n}")).collect();
    let mut set = Line::connect(fes[1].addr());
    set.send(&format!("LOCK {} set{and} ttl=60s", names[0]));
    for fe in &fes {
        wait_waiters(fe, "big-15", 1);
    }
    assert_eq!(fes[0].request(&format!("UNLOCK big-15 {held}")), "OK");
    let t = tokens(&set.line());
    assert_eq!(t.len(), 16);
    assert!(t.iter().all(|x| *x == t[0] && *x > held));
    let renewed = set.req(&format!("RENEW big-7 {} ttl=90s", t[0]));
    assert!(renewed.starts_with("OK "), "{renewed}");
    assert_eq!(set.req(&format!("UNLOCK big-3 {}", t[0])), "OK");
    for name in &names {
        wait_free(&fes[0], name);
    }
}

/// A set waiter whose front-end died keeps its place on every name when its client sends the
/// same LOCK through another front-end before the dead one's etcd lease runs out: it is
/// granted before a waiter that came after it.
#[test]
fn a_waiting_set_whose_front_end_died_keeps_its_place_through_another() {
    if !have(Need::Etcd) {
        return;
    }
    let prefix = format!("{}multi-died/", super::basics::etcd().prefix());
    let mut dies =
        LockdFrontEnd::start(super::basics::etcd(), &prefix, &["--etcd-lease-ttl", "10s"]);
    let stays = LockdFrontEnd::start(super::basics::etcd(), &prefix, &[]);
    let held = token(&stays.request("LOCK d-b holder ttl=60s"));
    let mut a = Line::connect(dies.addr());
    a.send("LOCK d-a a and=d-b ttl=60s");
    wait_waiters(&stays, "d-b", 1);
    let mut b = Line::connect(stays.addr());
    b.send("LOCK d-b b ttl=60s");
    wait_waiters(&stays, "d-b", 2);
    dies.kill();
    drop(a);
    let mut a = Line::connect(stays.addr());
    a.send("LOCK d-a a and=d-b ttl=60s");
    assert_eq!(stays.request(&format!("UNLOCK d-b {held}")), "OK");
    let t = tokens(&a.line());
    assert_eq!(t.len(), 2);
    assert!(t[0] > held);
    assert_eq!(
        b.line_within(Duration::from_secs(1)),
        None,
        "b was granted ahead of a"
    );
    assert_eq!(a.req(&format!("UNLOCK d-a {}", t[0])), "OK");
    assert!(token(&b.line()) > t[0]);
}

/// A LOCK of one name by the id of a waiting set takes over the set's place on that name (as
/// the table does), ahead of a waiter that came after the set; the set's place on its other
/// names goes. Through the set's own front-end and through another.
#[test]
fn a_lock_of_one_name_by_a_waiting_sets_id_takes_its_place_on_that_name() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    for (round, through) in [(0, 1), (1, 0)] {
        let (a, b) = (format!("t{round}-a"), format!("t{round}-b"));
        let held = token(&fes[0].request(&format!("LOCK {b} holder ttl=60s")));
        let mut set = Line::connect(fes[1].addr());
        set.send(&format!("LOCK {a} job and={b} ttl=60s"));
        for fe in &fes {
            wait_waiters(fe, &b, 1);
            wait_queued(fe, &a);
        }
        let mut later = Line::connect(fes[0].addr());
        later.send(&format!("LOCK {a} later ttl=60s"));
        assert_eq!(later.line_within(Duration::from_millis(300)), None);
        // The same id, one name: granted at once in the set's place (its name is free),
        // ahead of `later`; the set is answered REPLACED and leaves the other queue.
        let mut one = Line::connect(fes[through].addr());
        let t = token(&one.req(&format!("LOCK {a} job ttl=60s")));
        let replaced = set.line();
        assert!(replaced.starts_with("ERR REPLACED"), "{replaced}");
        for fe in &fes {
            wait_waiters(fe, &b, 0);
        }
        assert_eq!(later.line_within(Duration::from_millis(300)), None);
        assert_eq!(one.req(&format!("UNLOCK {a} {t}")), "OK");
        let l = token(&later.line());
        assert!(l > t);
        assert_eq!(later.req(&format!("UNLOCK {a} {l}")), "OK");
        assert_eq!(fes[0].request(&format!("UNLOCK {b} {held}")), "OK");
    }
}

#[test]
fn shared_sets_hold_together_and_an_exclusive_set_waits_for_both() {
    if !have(Need::Etcd) {
        return;
    }
    let fes = front_ends(2);
    let r1 = tokens(&fes[0].request("LOCK sh-a r1 shared and=sh-b ttl=60s"))[0];
    let r2 = tokens(&fes[1].request("LOCK sh-b r2 shared and=sh-a ttl=60s"))[0];
    assert!(r2 > r1);
    let mut writer = Line::connect(fes[1].addr());
    writer.send("LOCK sh-a w and=sh-b ttl=60s");
    for fe in &fes {
        wait_waiters(fe, "sh-a", 1);
    }
    assert_eq!(fes[1].request(&format!("UNLOCK sh-a {r1}")), "OK");
    assert_eq!(writer.line_within(Duration::from_millis(300)), None);
    assert_eq!(fes[0].request(&format!("UNLOCK sh-a {r2}")), "OK");
    let w = tokens(&writer.line());
    assert!(w[0] > r2 && w[0] == w[1]);
    assert_eq!(writer.req(&format!("UNLOCK sh-b {}", w[0])), "OK");
}
